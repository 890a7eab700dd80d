"""The node guard (templates/hpcdl-nodes.sh) run by bash against stand-ins for srun,
scontrol, sinfo and squeue: which nodes it excludes and why, what it gives back, when it
relaunches and when it stops. tests/integration/test_spares.py kills real nodes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hpcdl.core.resources import templates_dir
from hpcdl.launch.nodes import HARDWARE_ERRORS, PROBE_SLOW_NAME, SRUN_TASK_ENDED

# Seconds of bash loops each (the guard polls every second): make test runs them.
pytestmark = pytest.mark.slow

# The gate's srun: one "hpcdl-gate NODE ok" line per node of --nodelist, none for a node
# listed in $FAKE/dead (a dead node does not answer; srun then fails), "bad: ..." for one
# in $FAKE/sick.
FAKES = {
    "srun": r"""#!/bin/bash
echo "srun $*" >> "$FAKE/log"
for a in "$@"; do case $a in --nodelist=*) list=${a#--nodelist=} ;; esac; done
rc=0
for n in ${list//,/ }; do
  if grep -qx "$n" "$FAKE/dead" 2>/dev/null; then rc=1; continue; fi
  if grep -qx "$n" "$FAKE/sick" 2>/dev/null; then echo "hpcdl-gate $n bad: 0 of 1 GPUs visible"; continue; fi
  echo "hpcdl-gate $n ok"
done
exit $rc
""",
    "scontrol": r"""#!/bin/bash
echo "scontrol $*" >> "$FAKE/log"
if [[ $1 == show && $2 == hostnames ]]; then tr ',' '\n' <<<"$3"; fi
# A job Slurm cannot update now (a shrunk job without accounting): every update refused.
[[ $1 == update && -e $FAKE/no_update ]] && exit 1
# A shrink leaves slurm_job_N_resize.sh in the working directory; N is the job number
# before any array task index (the guard must not assume it is $SLURM_JOB_ID).
if [[ $1 == update && $3 == NodeList=* ]]; then
  id=${2#JobId=}
  echo "echo \"resized $3\" >> \"\$FAKE/log\"" > "slurm_job_${id%%_*}_resize.sh"
fi
exit 0
""",
    "sinfo": "#!/bin/bash\nexit 0\n",
    "squeue": "#!/bin/bash\necho 10:00\n",
}

# Each launch k (1, 2, ...) does what line k of $FAKE/plan says: "ok", "fail" (exit 1, a
# code failure), "dies NODE" (NODE stops answering, its rank's srun line, exit 1), "hw
# TASK" (task TASK prints a hardware error, exit 1). The node list it ran on is logged.
DRIVER = r"""
set +e
source "$NODES_FILE"
hpcdl_launch() {
  local k
  k=$(( $(cat "$FAKE/launches" 2>/dev/null || echo 0) + 1 ))
  echo "$k" > "$FAKE/launches"
  echo "launch $k on $HPCDL_NODELIST" >> "$FAKE/log"
  set -- $(sed -n "${k}p" "$FAKE/plan")
  case $1 in
    ok) exit 0 ;;
    fail) echo "srun: error: a: task 0: Exited with exit code 1" >&2; exit 1 ;;
    dies) echo "$2" >> "$FAKE/dead"; echo "srun: error: $2: task 1: Exited with exit code 1" >&2; exit 1 ;;
    hw) echo "$2: RuntimeError: CUDA error: uncorrectable ECC error encountered" >&2; exit 1 ;;
  esac
}
# --probe-first: $PROBE is "none" (no slow node), "slow NODE..." (those named, exit 1) or
# "fails" (exit 2: bad input, the job ends).
if [[ -n ${PROBE:-} ]]; then
  hpcdl_probe() {
    echo "probe on $HPCDL_NODELIST ($HPCDL_STEP_NODES nodes, $HPCDL_STEP_TASKS tasks)" >> "$FAKE/log"
    set -- $PROBE
    case $1 in
      none) : > "$HPCDL_PROBE_SLOW"; return 0 ;;
      slow) shift; printf '%s\tprobe: slow: best link 0.025 GB/s, 3%% of the median\n' "$@" > "$HPCDL_PROBE_SLOW"; return 1 ;;
      fails) return 2 ;;
    esac
  }
fi
hpcdl_cause=""
hpcdl_nodes_init "$WANT"
hpcdl_supervise
echo "rc=$? cause=$hpcdl_cause"
"""


def guard(tmp_path: Path, nodes: str, plan: list[str], *, want: int = 2,
          max_relaunches: int = 3, dead: tuple[str, ...] = (),
          sick: tuple[str, ...] = (), known_bad: str = "",
          probe: str = "", slurm_env: dict[str, str] | None = None) -> tuple[str, str, Path]:
    """Run the guard over ``nodes`` with launches doing ``plan``; returns (its last
    stdout line, the stand-ins' log, the run directory). ``slurm_env``: Slurm's job
    variables (default: job 7, not an array task)."""
    fake, run, bin_dir = tmp_path / "fake", tmp_path / "run", tmp_path / "bin"
    for d in (fake, run, bin_dir):
        d.mkdir()
    for name, text in FAKES.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (fake / "plan").write_text("\n".join(plan) + "\n")
    if known_bad:  # bad-nodes.tsv as an earlier attempt of the job left it
        (run / "bad-nodes.tsv").write_text(known_bad)
    (fake / "dead").write_text("".join(f"{n}\n" for n in dead))
    (fake / "sick").write_text("".join(f"{n}\n" for n in sick))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE": str(fake),
           "NODES_FILE": str(templates_dir() / "hpcdl-nodes.sh"), "WANT": str(want),
           "HPCDL_RUN_DIR": str(run), **(slurm_env or {"SLURM_JOB_ID": "7"}),
           "SLURM_JOB_NODELIST": nodes,
           "SLURMD_NODENAME": nodes.split(",")[0], "HPCDL_NODES_FILE": "unused",
           "HPCDL_TASKS_PER_NODE": "1", "HPCDL_MAX_RELAUNCHES": str(max_relaunches),
           "HPCDL_GATE_TIMEOUT": "20", "HPCDL_STUCK_S": "2", "HPCDL_STALL_S": "60",
           "HPCDL_MIN_LEFT_S": "60", "HPCDL_TASK_ENDED": SRUN_TASK_ENDED,
           "HPCDL_HW_PATTERN": "|".join(HARDWARE_ERRORS), "PROBE": probe,
           "HPCDL_PROBE_SLOW": str(run / PROBE_SLOW_NAME)}
    res = subprocess.run(["bash", "-c", DRIVER], capture_output=True, text=True, env=env,
                         timeout=120, check=False)
    last = (res.stdout.strip().splitlines() or [""])[-1]
    return last, (fake / "log").read_text(), run


def launches(log: str) -> list[str]:
    return [line.split(" on ")[1] for line in log.splitlines() if line.startswith("launch ")]


def test_a_node_that_dies_is_excluded_released_and_the_spare_takes_its_place(
        tmp_path: Path) -> None:
    last, log, run = guard(tmp_path, "a,b,c", ["dies b", "ok"])
    assert last == "rc=0 cause="
    assert launches(log) == ["a,b", "a,c"]
    assert "scontrol update JobId=7 NodeList=a,c" in log
    assert (run / "bad-nodes.tsv").read_text().startswith("b\tgate: no answer in ")
    (line,) = (run / "recoveries.tsv").read_text().splitlines()
    cols = line.split("\t")
    assert cols[:3] == ["7", "0", "1"] and cols[4] == "b" and cols[7] == "a,c"
    assert cols[5].startswith("b: gate: no answer") and cols[6] != "-"


def test_an_array_task_releases_the_dead_node_and_records_it_under_its_task_id(
        tmp_path: Path) -> None:
    """A sweep's task (hpcdl sweep --spares): scontrol and the run's records name the
    task (7_1), not its SLURM_JOB_ID (which may be the array's: every task)."""
    task = {"SLURM_JOB_ID": "9", "SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "1"}
    last, log, run = guard(tmp_path, "a,b,c", ["dies b", "ok"], slurm_env=task)
    assert last == "rc=0 cause="
    assert launches(log) == ["a,b", "a,c"]
    assert "scontrol update JobId=7_1 NodeList=a,c" in log
    assert "resized NodeList=a,c" in log  # Slurm's resize file read, whatever its number
    assert "JobId=9" not in log and "JobId=7 " not in log
    (line,) = (run / "recoveries.tsv").read_text().splitlines()
    assert line.split("\t")[:3] == ["7_1", "0", "1"]


def test_a_failure_on_healthy_nodes_is_the_codes_own_and_not_relaunched(
        tmp_path: Path) -> None:
    last, log, run = guard(tmp_path, "a,b,c", ["fail", "ok"])
    assert last == "rc=1 cause="
    assert launches(log) == ["a,b"]
    assert not (run / "recoveries.tsv").exists() and "NodeList=" not in log


def test_a_hardware_error_of_a_rank_excludes_its_node(tmp_path: Path) -> None:
    last, log, run = guard(tmp_path, "a,b,c", ["hw 1", "ok"])
    assert last == "rc=0 cause="
    assert launches(log) == ["a,b", "a,c"]
    bad = (run / "bad-nodes.tsv").read_text()
    assert bad.startswith("b\trank 1: RuntimeError: CUDA error: uncorrectable ECC error"), bad


def test_the_gate_before_the_first_rank_replaces_a_sick_node(tmp_path: Path) -> None:
    last, log, run = guard(tmp_path, "a,b,c", ["ok"], sick=("a",))
    assert last == "rc=0 cause="
    assert launches(log) == ["b,c"]
    # The batch host (a) runs this shell: it stays in the allocation, unused.
    assert "NodeList=" not in log
    assert (run / "bad-nodes.tsv").read_text() == "a\tgate: 0 of 1 GPUs visible\n"


def test_relaunches_stop_at_max_restarts(tmp_path: Path) -> None:
    last, log, run = guard(tmp_path, "a,b,c,d", ["dies b", "dies c", "ok"], max_relaunches=1)
    assert last == "rc=1 cause="
    assert launches(log) == ["a,b", "a,c"]
    lines = (run / "recoveries.tsv").read_text().splitlines()
    assert [line.split("\t")[6] == "-" for line in lines] == [False, True]


def test_out_of_healthy_nodes_the_job_says_so(tmp_path: Path) -> None:
    last, log, run = guard(tmp_path, "a,b,c", ["dies b", "dies c"])
    assert last == "rc=1 cause=NODES"
    assert launches(log) == ["a,b", "a,c"]
    assert {line.split("\t")[0] for line in (run / "bad-nodes.tsv").read_text().splitlines()} \
        == {"b", "c"}


def test_bad_nodes_of_an_earlier_attempt_stay_excluded(tmp_path: Path) -> None:
    last, log, run = guard(tmp_path, "a,b,c", ["ok"], known_bad="b\tgate: no answer in 11 s\n")
    assert last == "rc=0 cause="
    assert launches(log) == ["a,c"]


def test_the_probe_before_the_first_rank_excludes_the_node_it_names_slow(
        tmp_path: Path) -> None:
    last, log, run = guard(tmp_path, "a,b,c", ["ok"], probe="slow b")
    assert last == "rc=0 cause="
    # Over every node the gate passed, then the training without the slow one.
    assert "probe on a,b,c (3 nodes, 3 tasks)" in log
    assert launches(log) == ["a,c"]
    assert (run / "bad-nodes.tsv").read_text() == \
        "b\tprobe: slow: best link 0.025 GB/s, 3% of the median\n"
    assert "scontrol update JobId=7 NodeList=a,c" in log  # given back before the training


def test_the_probe_runs_once_and_a_healthy_verdict_changes_nothing(tmp_path: Path) -> None:
    last, log, _ = guard(tmp_path, "a,b,c", ["dies b", "ok"], probe="none")
    assert last == "rc=0 cause="
    assert launches(log) == ["a,b", "a,c"]
    assert log.count("probe on ") == 1  # not again before the relaunch


def test_a_probe_that_names_too_many_slow_nodes_leaves_too_few(tmp_path: Path) -> None:
    last, log, _ = guard(tmp_path, "a,b,c", ["ok"], probe="slow b c")
    assert last == "rc=1 cause=NODES"
    assert launches(log) == []


def test_a_probe_that_fails_otherwise_ends_the_job_before_the_training(
        tmp_path: Path) -> None:
    fake = tmp_path / "fake"
    last, log, _ = guard(tmp_path, "a,b,c", ["ok"], probe="fails")
    assert last == ""  # the job script ended in the probe, with its exit status
    assert launches(log) == [] and "probe on a,b,c" in log
    assert not (fake / "launches").exists()


REQUEUE = r"""
source "$NODES_FILE"
declare -A hpcdl_bad=([b]="gate: no answer in 11 s" [c]="Slurm: node state down*")
hpcdl_exclude_and_requeue
"""


@pytest.mark.parametrize("updatable", [True, False])
def test_out_of_spares_requeues_with_the_bad_nodes_excluded_or_plainly(
        tmp_path: Path, updatable: bool) -> None:
    fake = tmp_path / "fake"
    bin_dir = tmp_path / "bin"
    fake.mkdir()
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(FAKES["scontrol"])
    (bin_dir / "scontrol").chmod(0o755)
    if not updatable:
        (fake / "no_update").touch()
    res = subprocess.run(["bash", "-c", REQUEUE], capture_output=True, text=True, timeout=60,
                         check=False, env={**os.environ, "FAKE": str(fake), "SLURM_JOB_ID": "7",
                                           "PATH": f"{bin_dir}:{os.environ['PATH']}",
                                           "NODES_FILE": str(templates_dir() / "hpcdl-nodes.sh")})
    calls = [line.split(" ", 2)[1:] for line in (fake / "log").read_text().splitlines()]
    if updatable:
        assert [c[0] for c in calls] == ["update", "requeuehold", "update", "release"]
        assert calls[2][1] in ("JobId=7 ExcNodeList=b,c", "JobId=7 ExcNodeList=c,b")
        assert "hpcdl: requeued with ExcNodeList=" in res.stderr
    else:
        assert calls[-1] == ["requeue", "7"] and "requeuehold" not in str(calls)
        assert "requeued without ExcNodeList" in res.stderr


def test_an_array_task_out_of_spares_requeues_itself_alone(tmp_path: Path) -> None:
    """Every scontrol call names the task (7_1): the bare 7 (its SLURM_JOB_ID here) would
    hold, change and requeue every task of the array."""
    fake, bin_dir = tmp_path / "fake", tmp_path / "bin"
    fake.mkdir()
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(FAKES["scontrol"])
    (bin_dir / "scontrol").chmod(0o755)
    env = {**os.environ, "FAKE": str(fake), "SLURM_JOB_ID": "7", "SLURM_ARRAY_JOB_ID": "7",
           "SLURM_ARRAY_TASK_ID": "1", "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "NODES_FILE": str(templates_dir() / "hpcdl-nodes.sh")}
    subprocess.run(["bash", "-c", REQUEUE], capture_output=True, text=True, timeout=60,
                   check=False, env=env)
    calls = [line.split(" ", 2)[1:] for line in (fake / "log").read_text().splitlines()]
    assert [c[0] for c in calls] == ["update", "requeuehold", "update", "release"]
    assert [c[1].split(" ")[0] for c in calls] == ["JobId=7_1", "7_1", "JobId=7_1", "7_1"]
