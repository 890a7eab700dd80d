"""The node guard (templates/hpcdl-nodes.sh) run by bash against stand-ins for srun,
scontrol, sinfo and squeue: which nodes it excludes and why, what it gives back, when it
relaunches and when it stops. tests/integration/test_spares.py kills real nodes."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from hpcdl.core.resources import templates_dir
from hpcdl.launch.nodes import HARDWARE_ERRORS, PROBE_SLOW_NAME, SRUN_TASK_ENDED

# Seconds of bash loops each (the guard polls every second): make test runs them.
pytestmark = pytest.mark.slow

# The heartbeat's srun (--job-name=hpcdl-heartbeat): "hpcdl-beat NODE" for every node of
# --nodelist not in $FAKE/dead, every 0.3 s until killed, its step in $FAKE/steps; with
# $FAKE/hb_fails, srun's error and exit 1 at once; a node in $FAKE/hb_task_dies has its
# task killed (srun says so) and beats no more, alive.
# The gate's srun: one "hpcdl-gate NODE ok" line per node of --nodelist, none for a node
# listed in $FAKE/dead (a dead node does not answer; srun then fails), "bad: ..." for one
# in $FAKE/sick; with $FAKE/gate_hangs, a gate whose check is stuck (srun ignores TERM, as
# one waiting on a node blocked in the kernel may); a node not in $FAKE/held (when it
# is there) fails the whole step, as Slurm's srun does.
# squeue: steps from $FAKE/steps (-s), time left from $FAKE/left (%L), the comment from
# $FAKE/comment (%k), the job's nodes from $FAKE/held (%N), as Slurm prints them; with
# $FAKE/squeue_fails, slurmctld's error. Its calls go to $FAKE/squeue.log.
# sinfo: the "NODE STATE" lines of $FAKE/sinfo for the nodes of -n. scancel: logged.
FAKES = {
    "srun": r"""#!/bin/bash
echo "srun $*" >> "$FAKE/log"
for a in "$@"; do case $a in --nodelist=*) list=${a#--nodelist=} ;; esac; done
# A node the job no longer holds ($FAKE/held, when there is one) fails the whole step.
if [[ -s $FAKE/held ]]; then
  for n in ${list//,/ }; do
    tr ',' '\n' <"$FAKE/held" | grep -qx "$n" && continue
    echo "srun: error: Unable to create step for job 7: Requested node configuration is not available" >&2
    exit 1
  done
fi
if [[ " $* " == *" --job-name=hpcdl-heartbeat "* ]]; then
  [[ -e $FAKE/hb_fails ]] && { echo "srun: error: Unable to create step" >&2; exit 1; }
  echo "7.hb$(wc -l < "$FAKE/log") hpcdl-heartbeat" >> "$FAKE/steps"
  while :; do
    for n in ${list//,/ }; do
      grep -qx "$n" "$FAKE/dead" 2>/dev/null && continue
      if grep -qx "$n" "$FAKE/hb_task_dies" 2>/dev/null; then
        [[ -n ${told:-} ]] || echo "srun: error: $n: task 1: Killed" >&2
        told=1
        continue
      fi
      echo "hpcdl-beat $n"
    done
    sleep 0.3
  done
fi
if [[ -e $FAKE/gate_hangs ]]; then trap '' TERM; while :; do sleep 0.1; done; fi
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
[[ $1 == update && -e $FAKE/no_update ]] && { echo "slurm_update error: Job is being resized" >&2; exit 1; }
# Slurm's requeue TERMs every process of the batch step (here: of the session) as the
# requeuehold returns; the update of ExcNodeList that follows takes a second. Slurm's TERM
# may come at any instant of the update's start: the update and the process that started
# it must ignore TERM from the first (one that catches it, as timeout does, passes it on,
# and timeout's child exits 143 on one before its exec).
if [[ $1 == requeuehold && -e $FAKE/term_on_hold ]]; then
  sid=$(ps -o sid= -p $$ | tr -d ' ')
  ( trap '' TERM; sleep 0.3; kill -TERM $(ps -o pid= -s "$sid") ) >/dev/null 2>&1 &
fi
if [[ $1 == update && $3 == ExcNodeList=* && -e $FAKE/term_on_hold ]]; then
  for p in $$ $PPID; do
    ign=$(awk '/^SigIgn:/ {print $2}' "/proc/$p/status")
    (( (16#$ign >> 14) & 1 )) || { echo "$(cat "/proc/$p/comm") does not ignore TERM" >&2; exit 143; }
  done
  sleep 1
fi
[[ $1 == release && -e $FAKE/no_release ]] && { echo "Job is no longer pending execution for job $2" >&2; exit 1; }
# A shrink leaves slurm_job_N_resize.sh in the working directory; N is the job number
# before any array task index (the guard must not assume it is $SLURM_JOB_ID).
if [[ $1 == update && $3 == NodeList=* ]]; then
  id=${2#JobId=}
  echo "echo \"resized $3\" >> \"\$FAKE/log\"" > "slurm_job_${id%%_*}_resize.sh"
fi
exit 0
""",
    "sinfo": r"""#!/bin/bash
# (-n: the nodes asked about, as Slurm answers)
while (( $# )); do [[ $1 == -n ]] && { shift; nodes=",$1,"; }; shift; done
while read -r n state; do
  [[ -n $n && ( -z ${nodes:-} || $nodes == *",$n,"* ) ]] && echo "$n $state"
done < <(cat "$FAKE/sinfo" 2>/dev/null)
exit 0
""",
    "squeue": r"""#!/bin/bash
echo "squeue $*" >> "$FAKE/squeue.log"
if [[ -e $FAKE/squeue_fails ]]; then
  echo "squeue: error: slurm_load_jobs error: Socket timed out on send/recv operation" >&2
  exit 1
fi
case " $* " in
  *" -s "*) cat "$FAKE/steps" 2>/dev/null ;;
  *" %L "*) cat "$FAKE/left" 2>/dev/null || echo 10:00 ;;
  *" %k "*) cat "$FAKE/comment" 2>/dev/null || echo "(null)" ;;
  *" %N "*) cat "$FAKE/held" 2>/dev/null ;;
esac
exit 0
""",
    "scancel": "#!/bin/bash\necho \"scancel $*\" >> \"$FAKE/log\"\nexit 0\n",
}

# Each launch k (1, 2, ...) is step 7.k for squeue, and does what line k of $FAKE/plan
# says: "ok", "fail" (exit 1, a code failure), "dies NODE" (NODE stops answering, its
# rank's srun line, exit 1), "hw TASK" (task TASK prints a hardware error, exit 1), "hangs
# NODE" (NODE stops answering, srun goes on without a word), "gone NODE" (Slurm declared
# NODE down and took it out of the job: srun's "Node failure", sinfo not yet saying
# so), "asks" (the hang watchdog
# asks for a relaunch, srun goes on), "churns NODE" (NODE stops answering while the
# ranks write into the run's code/ copy), "chatty" (3000 lines of stderr, then "hw 1"),
# "runs S" (S seconds, then exit 0).
# The node list it ran on is logged.
DRIVER = r"""
# As job.sbatch runs the guard: sourced and set up under its `set -euo pipefail`, the
# supervisor after `set +e` (-u and pipefail stay). With $BASH4 set, bash 5's clocks are
# unset first: bash 5 then has neither (unset, they lose their special meaning for good),
# as bash 4.4 has not, and `set -u` ends the script at a mention of either.
[[ -n ${BASH4:-} ]] && unset EPOCHREALTIME EPOCHSECONDS
set -euo pipefail
source "$NODES_FILE"
hpcdl_launch() {
  local k
  k=$(( $(cat "$FAKE/launches" 2>/dev/null || echo 0) + 1 ))
  echo "$k" > "$FAKE/launches"
  echo "launch $k on $HPCDL_NODELIST" >> "$FAKE/log"
  echo "7.$k" >> "$FAKE/steps"
  set -- $(sed -n "${k}p" "$FAKE/plan")
  case $1 in
    ok) exit 0 ;;
    fail) echo "srun: error: a: task 0: Exited with exit code 1" >&2; exit 1 ;;
    dies) [[ -n ${HPCDL_HB_DEAD_S:-} ]] && sleep 1.5  # (once the heartbeat beat: as a node dies mid-run)
          echo "$2" >> "$FAKE/dead"; echo "srun: error: $2: task 1: Exited with exit code 1" >&2; exit 1 ;;
    hw) echo "$2: RuntimeError: CUDA error: uncorrectable ECC error encountered" >&2; exit 1 ;;
    hangs) echo "$2" >> "$FAKE/dead"; exec sleep 60 ;;
    gone) echo "$2" >> "$FAKE/dead"
          tr ',' '\n' <<<"$SLURM_JOB_NODELIST" | grep -vx "$2" | paste -sd, - > "$FAKE/held"
          echo "srun: error: Node failure on $2" >&2; exit 1 ;;
    asks) printf -- '-\tno step for 30 s\n' > "$HPCDL_RUN_DIR/relaunch.request"; exec sleep 60 ;;
    runs) sleep "$2"; exit 0 ;;
    churns) echo "$2" >> "$FAKE/dead"
            while :; do date > "$HPCDL_RUN_DIR/code/x.pyc"; sleep 0.2; done ;;
    chatty) for i in $(seq 3000); do echo "0: step $i: loss 0.5, a line the guard has no use for"; done >&2
            sleep 0.5
            wc -c < "$hpcdl_err" > "$FAKE/errsize"
            echo "1: RuntimeError: CUDA error: uncorrectable ECC error encountered" >&2; exit 1 ;;
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
hpcdl_nodes_init "$WANT"
set +e
hpcdl_cause=""
hpcdl_supervise
echo "rc=$? cause=$hpcdl_cause"
"""


def install_fakes(tmp_path: Path) -> tuple[Path, Path]:
    """The stand-ins in tmp_path/bin, their records in tmp_path/fake: (fake, bin)."""
    fake, bin_dir = tmp_path / "fake", tmp_path / "bin"
    for d in (fake, bin_dir):
        d.mkdir(exist_ok=True)
    for name, text in FAKES.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (fake / "log").touch()
    return fake, bin_dir


def guard(tmp_path: Path, nodes: str, plan: list[str], *, want: int = 2,
          max_relaunches: int = 3, dead: tuple[str, ...] = (),
          sick: tuple[str, ...] = (), known_bad: str = "",
          probe: str = "", slurm_env: dict[str, str] | None = None,
          files: dict[str, str] | None = None, variables: dict[str, str] | None = None,
          bash4: bool = False, timeout: float = 120) -> tuple[str, str, Path]:
    """Run the guard over ``nodes`` with launches doing ``plan``; returns (its last
    stdout line, the stand-ins' log, the run directory); its stderr is left in
    tmp_path/fake/stderr. ``slurm_env``: Slurm's job variables (default: job 7, not an
    array task); ``files``: what the stand-ins read (FAKES says), by name; ``variables``: more
    of the guard's variables; ``bash4``: without bash 5's clocks (DRIVER)."""
    fake, bin_dir = install_fakes(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "job").mkdir()
    (run / "code").mkdir()
    # The batch shell's steps, and a dataset's mount step, before the guard starts.
    (fake / "steps").write_text("7.batch\n7.extern\n7.0\n")
    for name, text in (files or {}).items():
        (fake / name).write_text(text)
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
           "HPCDL_PROBE_SLOW": str(run / PROBE_SLOW_NAME), "BASH4": "1" if bash4 else "",
           **(variables or {})}
    res = subprocess.run(["bash", "-c", DRIVER], capture_output=True, text=True, env=env,
                         timeout=timeout, check=False)
    (fake / "stderr").write_text(res.stderr)
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


def test_a_node_slurm_took_out_of_the_job_is_excluded_before_the_gate(
        tmp_path: Path) -> None:
    """Slurm declared b down and took it out of the --no-kill job, and the step b took
    down ended before sinfo said so (seen on 26.05, tests/integration/
    test_no_kill_relaunch.py): the gate must not ask for b, whose srun would fail for
    every node (the old guard then excluded a and c too and the job ended)."""
    last, log, run = guard(tmp_path, "a,b,c", ["gone b", "ok"])
    assert last == "rc=0 cause="
    assert launches(log) == ["a,b", "a,c"]
    assert (run / "bad-nodes.tsv").read_text() == \
        "b\tSlurm: no longer in the job (declared down)\n"
    assert "hpcdl: gate: 2 of 2 nodes healthy" in stderr_of(tmp_path)


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
set -euo pipefail
source "$NODES_FILE"
declare -A hpcdl_bad=([b]="gate: no answer in 11 s" [c]="Slurm: node state down*")
set +e
hpcdl_exclude_and_requeue
echo "rc=$?"
"""


def requeue(tmp_path: Path, files: tuple[str, ...] = (), comment: str | None = None,
            slurm_env: dict[str, str] | None = None) -> tuple[list[list[str]], str]:
    """hpcdl_exclude_and_requeue with b and c bad: (the scontrol calls, split as
    [verb, rest], its stderr). ``files``: the stand-ins' switches to create (FAKES)."""
    fake, bin_dir = install_fakes(tmp_path)
    for name in files:
        (fake / name).touch()
    if comment is not None:
        (fake / "comment").write_text(comment + "\n")
    env = {**os.environ, "FAKE": str(fake), **(slurm_env or {"SLURM_JOB_ID": "7"}),
           "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "NODES_FILE": str(templates_dir() / "hpcdl-nodes.sh")}
    # (a session of its own: term_on_hold's TERM reaches its processes alone)
    res = subprocess.run(["bash", "-c", REQUEUE], capture_output=True, text=True, timeout=60,
                         check=False, env=env, start_new_session=True)
    calls = [line.split(" ", 2)[1:] for line in (fake / "log").read_text().splitlines()]
    return calls, res.stdout + res.stderr


@pytest.mark.parametrize("updatable", [True, False])
def test_out_of_spares_requeues_with_the_bad_nodes_excluded_or_plainly(
        tmp_path: Path, updatable: bool) -> None:
    calls, out = requeue(tmp_path, () if updatable else ("no_update",))
    if updatable:
        assert [c[0] for c in calls] == ["update", "requeuehold", "update", "release"]
        assert calls[2][1] in ("JobId=7 ExcNodeList=b,c", "JobId=7 ExcNodeList=c,b")
        assert "hpcdl: requeued with ExcNodeList=" in out and "rc=0" in out
    else:
        assert calls[-1] == ["requeue", "7"] and "requeuehold" not in str(calls)
        assert "requeued without ExcNodeList" in out
        # Slurm's own words are in the job's log.
        assert "hpcdl: scontrol update JobId=7 Comment= failed (exit 1: slurm_update error: " \
            "Job is being resized)" in out


@pytest.mark.parametrize("comment, written", [("(null)", "JobId=7 Comment="),
                                              ("user note: run 3", "JobId=7 Comment=user note: run 3")])
def test_the_update_probe_leaves_the_jobs_comment_as_it_was(
        tmp_path: Path, comment: str, written: str) -> None:
    """The probe that tells whether the job takes updates writes back the comment it read
    (squeue %k; "(null)": none): a user's or a site's note is not replaced by hpcdl's."""
    calls, out = requeue(tmp_path, comment=comment)
    assert calls[0] == ["update", written], calls
    assert "hpcdl: bad nodes" not in str(calls)


def test_the_requeues_term_does_not_end_the_update_of_the_exclusions(tmp_path: Path) -> None:
    """Slurm TERMs every process of the batch step as it requeues the job; the shell ignores
    it, and so must the scontrol calls after the requeuehold: under timeout (which catches a
    TERM and passes it on) the update of ExcNodeList was ended half-way, exit 143, and the
    job requeued without its exclusions (seen on Slurm 22.05, test_spares'
    test_out_of_spares_the_job_requeues_without_its_bad_nodes)."""
    calls, out = requeue(tmp_path, ("term_on_hold",))
    assert [c[0] for c in calls] == ["update", "requeuehold", "update", "release"], calls
    assert "hpcdl: requeued with ExcNodeList=" in out and "rc=0" in out, out
    assert "failed" not in out, out


def test_a_release_that_fails_is_named_and_the_job_said_held(tmp_path: Path) -> None:
    calls, out = requeue(tmp_path, ("no_release",))
    assert [c[0] for c in calls] == ["update", "requeuehold", "update", "release", "release"]
    assert "hpcdl: scontrol release 7 failed (exit 1: Job is no longer pending execution " \
        "for job 7)" in out
    assert "hpcdl: the job is requeued but held: scontrol release 7 failed twice" in out
    assert "rc=1" in out


def test_an_array_task_out_of_spares_requeues_itself_alone(tmp_path: Path) -> None:
    """Every scontrol call names the task (7_1): the bare 7 (its SLURM_JOB_ID here) would
    hold, change and requeue every task of the array."""
    calls, _ = requeue(tmp_path, slurm_env={"SLURM_JOB_ID": "7", "SLURM_ARRAY_JOB_ID": "7",
                                            "SLURM_ARRAY_TASK_ID": "1"})
    assert [c[0] for c in calls] == ["update", "requeuehold", "update", "release"]
    assert [c[1].split(" ")[0] for c in calls] == ["JobId=7_1", "7_1", "JobId=7_1", "7_1"]
    squeue = (tmp_path / "fake" / "squeue.log").read_text()
    assert "-j 7_1 -o %k" in squeue


def stderr_of(tmp_path: Path) -> str:
    return (tmp_path / "fake" / "stderr").read_text()


def test_the_guard_runs_on_a_bash_without_epochrealtime(tmp_path: Path) -> None:
    """Bash 4.4 (RHEL/Rocky 8) has no EPOCHREALTIME: under the job script's `set -u` a
    mention of it ended the batch shell at the first gate. DRIVER unsets bash 5's clocks
    (which then are plain unset variables, as on bash 4.4) and the guard still gates,
    times the gate, relaunches."""
    last, log, _ = guard(tmp_path, "a,b,c", ["dies b", "ok"], bash4=True)
    assert last == "rc=0 cause=", stderr_of(tmp_path)
    assert launches(log) == ["a,b", "a,c"]
    assert re.search(r"hpcdl: gate: 2 of 3 nodes healthy in \d+\.\d{3} s", stderr_of(tmp_path))


@pytest.mark.parametrize("left", ["UNLIMITED", "NOT_SET", "1-00:00:00"])
def test_a_job_without_a_time_limit_relaunches(tmp_path: Path, left: str) -> None:
    """--time=infinite (what hpcdl renders without --time or a profile default): squeue
    says UNLIMITED, which is no limit, not "0 s left"; a day left is 86400 s, not 216000."""
    last, log, _ = guard(tmp_path, "a,b,c", ["dies b", "ok"], files={"left": left + "\n"})
    assert last == "rc=0 cause=", stderr_of(tmp_path)
    assert launches(log) == ["a,b", "a,c"]


def test_a_relaunch_with_too_little_time_left_is_refused(tmp_path: Path) -> None:
    last, log, _ = guard(tmp_path, "a,b,c", ["dies b", "ok"], files={"left": "00:59\n"})
    assert last == "rc=1 cause="
    assert "hpcdl: node failure with 59 s left (under 60): no relaunch" in stderr_of(tmp_path)


@pytest.mark.parametrize("state", ["drng", "drain", "down*", "failg", "mix*"])
def test_a_node_drained_under_the_job_is_excluded(tmp_path: Path, state: str) -> None:
    """An admin or a health checker drains b while the job holds it (sinfo: drng); the
    step then fails: b is excluded and the training goes on on a and c."""
    last, log, run = guard(tmp_path, "a,b,c", ["fail", "ok"],
                           files={"sinfo": f"a alloc\nb {state}\nc idle\n"})
    assert last == "rc=0 cause=", stderr_of(tmp_path)
    assert launches(log) == ["a,b", "a,c"]
    assert (run / "bad-nodes.tsv").read_text() == f"b\tSlurm: node state {state}\n"


def test_a_gate_stuck_on_a_node_is_bounded_and_its_nodes_excluded(tmp_path: Path) -> None:
    """A check blocked in the kernel (a dead NFS or FUSE mount) can keep srun from ending
    on TERM: timeout's -k KILLs it, the nodes that did not answer are excluded, and the
    gate's step is cancelled."""
    t0 = time.monotonic()
    last, log, _ = guard(tmp_path, "a,b,c", ["ok"], files={"gate_hangs": ""},
                         variables={"HPCDL_GATE_TIMEOUT": "1", "HPCDL_KILL_S": "1"}, timeout=30)
    took = time.monotonic() - t0
    assert last == "rc=1 cause=NODES"
    assert took < 15, took
    err = stderr_of(tmp_path)
    assert "hpcdl: gate: the step ran past its 1 s and was ended" in err
    assert "hpcdl: gate: 0 of 3 nodes healthy" in err


@pytest.mark.parametrize("plan, stall", [(["hangs b", "ok"], "3"), (["asks", "ok"], "60")])
def test_the_old_step_is_cancelled_after_the_guard_ended_it(
        tmp_path: Path, plan: list[str], stall: str) -> None:
    """After a hang (a node that stopped answering, found by the gate; the hang watchdog's
    request) the guard KILLs srun here and cancels the step (scancel 7.1), so its ranks on
    the surviving nodes do not run beside the relaunch; the steps the job had before the
    guard started (7.0, a dataset's mount) and the batch shell's are left alone."""
    last, log, _ = guard(tmp_path, "a,b,c", plan, variables={"HPCDL_STALL_S": stall})
    assert last == "rc=0 cause=", stderr_of(tmp_path)
    assert [line for line in log.splitlines() if line.startswith("scancel")] == ["scancel 7.1"]
    assert "hpcdl: cancelled step 7.1 on every node it ran on" in stderr_of(tmp_path)
    assert len(launches(log)) == 2


def test_a_quiet_run_is_seen_while_the_ranks_write_into_the_code_copy(tmp_path: Path) -> None:
    """code/ (the --code copy) is not the training's progress: ranks writing there (a
    .pyc, a log beside the code) do not hide a dead node, and find does not walk it. (The
    run directory is looked at every 5 s: a stall of 7 s is seen only if the look at 5 s
    did not count the code/ write as progress.)"""
    last, log, _ = guard(tmp_path, "a,b,c", ["churns b", "ok"],
                         variables={"HPCDL_STALL_S": "7"}, timeout=40)
    assert last == "rc=0 cause=", stderr_of(tmp_path)
    assert launches(log) == ["a,b", "a,c"]
    assert "nothing in the run directory changed for 7 s" in stderr_of(tmp_path)


def test_the_steps_stderr_is_not_copied_whole(tmp_path: Path) -> None:
    """Only what the guard reads of the step's stderr is kept in the batch host's /tmp
    (3000 lines of a chatty step: none), and it still finds a rank's hardware error."""
    last, log, run = guard(tmp_path, "a,b,c", ["chatty", "ok"])
    assert last == "rc=0 cause=", stderr_of(tmp_path)
    assert int((tmp_path / "fake" / "errsize").read_text()) == 0
    assert (run / "bad-nodes.tsv").read_text().startswith("b\trank 1: RuntimeError: CUDA error")
    assert stderr_of(tmp_path).count("a line the guard has no use for") == 3000


def test_a_failed_release_and_a_silent_squeue_are_not_read_as_slurm_taking_the_node(
        tmp_path: Path) -> None:
    last, log, _ = guard(tmp_path, "a,b,c", ["dies b", "ok"],
                         files={"no_update": "", "squeue_fails": ""})
    assert last == "rc=0 cause="
    err = stderr_of(tmp_path)
    assert "took the node back" not in err
    assert "hpcdl: could not release b, and Slurm did not say which nodes the job holds" in err
    assert "hpcdl: squeue -h -j 7 -o %N failed (exit 1: squeue: error: slurm_load_jobs " \
        "error: Socket timed out on send/recv operation)" in err


# ---- the heartbeat (HPCDL_HB_DEAD_S): a dead node found without a step sent to it ----

HEARTBEAT = {"HPCDL_HB_DEAD_S": "2"}


def gates(log: str) -> list[str]:
    """The node lists the gate's steps were sent to, in order."""
    return [re.search(r"--nodelist=(\S+)", line).group(1)  # type: ignore[union-attr]
            for line in log.splitlines()
            if line.startswith("srun ") and "hpcdl_node_check" in line]


def test_a_node_that_dies_under_a_silent_step_is_found_by_its_heartbeat(
        tmp_path: Path) -> None:
    """b stops answering and the step says nothing (MPI ranks waiting for a dead peer):
    its beats stop, a's and c's go on, and 2 s later (HPCDL_HB_DEAD_S) b is excluded and
    the step ended, where the guard waited for the run directory to be quiet for
    HPCDL_STALL_S (30 s) and then for the gate's step to b (MessageTimeout, 10 s)."""
    t0 = time.monotonic()
    last, log, run = guard(tmp_path, "a,b,c", ["hangs b", "ok"],
                           variables={**HEARTBEAT, "HPCDL_STALL_S": "60", "HPCDL_STUCK_S": "60"},
                           timeout=60)
    took = time.monotonic() - t0
    assert last == "rc=0 cause=", stderr_of(tmp_path)
    assert launches(log) == ["a,b", "a,c"]
    assert took < 20, took
    assert (run / "bad-nodes.tsv").read_text().startswith("b\theartbeat: none for 2 s")
    assert gates(log) == ["a,b,c", "a,c"]  # no step sent to b once it died
    # The heartbeat ran on every usable node, spares included, and each one was cancelled.
    beats = [line for line in log.splitlines() if "--job-name=hpcdl-heartbeat" in line]
    assert [re.search(r"--nodelist=(\S+)", b).group(1) for b in beats] == ["a,b,c", "a,c"]  # type: ignore[union-attr]
    # (the stand-in lists a cancelled step on: so does Slurm while a node of it is dead)
    assert len({line for line in log.splitlines() if re.match(r"scancel 7\.hb", line)}) == 2
    # The training step the guard ended is cancelled, once; the heartbeat's not named.
    assert "hpcdl: cancelled step 7.1 on every node it ran on" in stderr_of(tmp_path)
    assert "cancelled step 7.hb" not in stderr_of(tmp_path)


def test_at_the_steps_exit_the_heartbeat_names_the_dead_node_and_the_gate_skips_it(
        tmp_path: Path) -> None:
    """The step failed (DDP: the survivor's rank ended) and b died: the heartbeat says so
    within HPCDL_HB_DEAD_S of the exit, and the gate before the relaunch is not sent to b
    (on a cluster it would wait Slurm's MessageTimeout for it)."""
    last, log, run = guard(tmp_path, "a,b,c", ["dies b", "ok"], variables=HEARTBEAT)
    assert last == "rc=0 cause=", stderr_of(tmp_path)
    assert launches(log) == ["a,b", "a,c"]
    assert (run / "bad-nodes.tsv").read_text().startswith("b\theartbeat: ")
    assert gates(log) == ["a,b,c", "a,c"]
    (line,) = (run / "recoveries.tsv").read_text().splitlines()
    assert line.split("\t")[5].startswith("b: heartbeat: ")


def test_a_code_failure_with_every_node_beating_is_not_relaunched(tmp_path: Path) -> None:
    """Every node beats after the failure: no node is blamed, in about a second."""
    t0 = time.monotonic()
    last, log, run = guard(tmp_path, "a,b,c", ["fail", "ok"], variables=HEARTBEAT)
    assert last == "rc=1 cause=", stderr_of(tmp_path)
    assert launches(log) == ["a,b"]
    assert not (run / "bad-nodes.tsv").exists()
    assert time.monotonic() - t0 < 15


def test_without_a_heartbeat_the_quiet_run_directory_and_the_gate_still_find_the_node(
        tmp_path: Path) -> None:
    """The heartbeat's step did not start (srun refused it): no beat from any node is no
    verdict on any; the quiet run directory and the gate find the dead node as before."""
    last, log, run = guard(tmp_path, "a,b,c", ["hangs b", "ok"],
                           variables={**HEARTBEAT, "HPCDL_STALL_S": "3"},
                           files={"hb_fails": ""})
    assert last == "rc=0 cause=", stderr_of(tmp_path)
    assert launches(log) == ["a,b", "a,c"]
    assert (run / "bad-nodes.tsv").read_text().startswith("b\tgate: no answer in ")


def test_a_spare_slurm_knows_down_is_left_out_of_the_next_gate(tmp_path: Path) -> None:
    """After a failed step Slurm is asked about every node the job may use, not only the
    step's: the spare d, down for Slurm, is excluded without the gate's step waiting
    MessageTimeout for it."""
    last, log, run = guard(tmp_path, "a,b,c,d", ["fail", "ok"],
                           files={"sinfo": "a alloc\nb drng\nc idle\nd down*\n"})
    assert last == "rc=0 cause=", stderr_of(tmp_path)
    assert gates(log) == ["a,b,c,d", "a,c"]
    assert launches(log) == ["a,b", "a,c"]
    bad = dict(line.split("\t") for line in (run / "bad-nodes.tsv").read_text().splitlines())
    assert bad == {"b": "Slurm: node state drng", "d": "Slurm: node state down*"}


def test_a_node_whose_heartbeat_task_was_killed_is_alive_and_kept(tmp_path: Path) -> None:
    """b's heartbeat task is killed (the OOM killer, a stray kill) and srun says so: b's
    slurmstepd answered, b is alive. Its silence is not read as its death: the training
    step runs to its end on a and b."""
    last, log, run = guard(tmp_path, "a,b,c", ["runs 6"], variables=HEARTBEAT,
                           files={"hb_task_dies": "b\n"})
    assert last == "rc=0 cause=", stderr_of(tmp_path)
    assert launches(log) == ["a,b"]
    assert not (run / "bad-nodes.tsv").exists(), (run / "bad-nodes.tsv").read_text()
    assert "srun: error: b: task 1: Killed" in stderr_of(tmp_path)  # (the job's log has it)
