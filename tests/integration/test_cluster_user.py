"""hpcdl as a cluster user meets it: an ordinary account (``hpcuser``), hpcdl installed
from a wheel into a venv outside /home (/opt, which the sandbox's nodes do not see),
every command run from the user's home, Apptainer without setuid (user namespaces and
squashfuse), and nodes that see only /home and /scratch of the host.

The README's headline command as that user runs in tests/integration/test_headline.py;
here: a torchrun-style script from the user's home, status / logs -f / cancel, the
hang watchdog on the user's own ranks, what the nodes cannot see (refused before
submission), and node-local scratch that is each node's own.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.conftest_slurm import sandbox_dir
from tests.integration.conftest_user import ClusterUser

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]

BYO = Path(__file__).resolve().parent / "byo"
JOB_TIMEOUT = 420  # s: a 2-node job in the image on 2 shared cores, with room for a queue


def _json_line(stdout: str) -> dict:
    return dict(json.loads(stdout.strip().splitlines()[-1]))


def _user_file(user: ClusterUser, rel: str, text: str) -> Path:
    path = user.home / rel
    user.own(path.parent)
    path.write_text(text)
    shutil.chown(path, user.uid, user.gid)
    return path


@pytest.mark.apptainer
@pytest.mark.torch
def test_a_torchrun_script_from_the_users_home_runs_in_the_image(
        sandbox_user: ClusterUser, cpu_image: Path) -> None:
    script = _user_file(sandbox_user, "myproject/train.py", (BYO / "ddp_plain.py").read_text())
    res = sandbox_user.cli("submit", "-p", "sandbox", "-N", "2", "-G", "2", "--image",
                           str(cpu_image), "--launcher", "torchrun", "--job-name", "user-ddp",
                           "--wait", "--", "python3", "train.py",
                           cwd=script.parent, timeout=JOB_TIMEOUT)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    run_dir = Path(re.search(r"^run directory: (.+)$", res.stdout, re.M).group(1))  # type: ignore[union-attr]
    assert run_dir.is_relative_to(sandbox_user.home)  # ./runs under the user's home
    out = "".join(p.read_text() for p in run_dir.glob("slurm-*.out"))
    params = set(re.findall(r"PLAIN host=\S+ rank=\d world=4 .* params=(\S+)", out))
    assert len(re.findall(r"PLAIN host=", out)) == 4, out
    assert len(params) == 1, out  # DDP kept every rank's parameters identical
    assert run_dir.stat().st_uid == sandbox_user.uid
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["container_mode"] == "unprivileged"
    assert plan["env"]["OMPI_MCA_btl_vader_single_copy_mechanism"] == "none"


def test_status_logs_and_cancel_as_the_user(sandbox_user: ClusterUser) -> None:
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 5))
    res = sandbox_user.cli("submit", "-p", "sandbox", "-N", "1", "-G", "0", "--json",
                           "--job-name", "user-sleeper", "--",
                           "sh", "-c", "echo started-$SLURM_JOB_ID; exec sleep 300")
    assert res.returncode == 0, res.stderr
    job = _json_line(res.stdout)["job_id"]
    deadline = time.monotonic() + 120
    while True:
        status = sandbox_user.cli("status", job, "--json")
        assert status.returncode == 0, status.stderr
        if _json_line(status.stdout)["state"] == "RUNNING":
            break
        assert time.monotonic() < deadline, status.stdout
        time.sleep(0.5)
    deadline = time.monotonic() + 60
    while f"started-{job}" not in (log := sandbox_user.cli("logs", job)).stdout:
        assert time.monotonic() < deadline, log.stdout + log.stderr
        time.sleep(0.5)
    cancel = sandbox_user.cli("cancel", job)
    assert cancel.returncode == 0, cancel.stderr
    final = _json_line(sandbox_user.cli("status", job, "--json").stdout)
    assert final["state"] == "CANCELLED", final
    # logs -f on an ended job prints what it wrote and returns.
    follow = sandbox_user.cli("logs", "-f", job, timeout=60)
    assert follow.returncode == 0 and f"started-{job}" in follow.stdout, follow.stderr
    # Slurm accounts it to the user who submitted it. (-S: a restarted sandbox reuses job
    # ids, and the database keeps the older job of the same id; a job that just ended can
    # be a placeholder row for a few seconds.)
    deadline = time.monotonic() + 30
    while (user := sandbox_user.run(["sacct", "-n", "-X", "-S", since, "-j", job,
                                     "-o", "User%20"])).stdout.split() != [sandbox_user.name]:
        assert time.monotonic() < deadline, user.stdout + user.stderr
        time.sleep(1)


@pytest.mark.parametrize("flag, path", [
    ("--run-dir", "/opt/hpcdl-user-runs/x"),
    ("--bind", "/var/cache/hpcdl"),
    ("--image", "/var/cache/hpcdl/images/pytorch-horovod-cpu.sif"),
])
def test_what_the_nodes_cannot_see_is_refused_before_submission(
        sandbox_user: ClusterUser, flag: str, path: str) -> None:
    runs = sandbox_user.home / "runs"
    before = sorted(runs.iterdir()) if runs.exists() else []
    res = sandbox_user.cli("submit", "-p", "sandbox", "-N", "1", "-G", "0", flag, path,
                           "--", "true")
    assert res.returncode == 2, res.stdout + res.stderr
    error = [ln for ln in res.stderr.splitlines() if ln.startswith("error: ")]
    assert error == [f"error: {flag}: {path} is not on a path the compute nodes share (profile "
                     f"sandbox: paths.shared = /home, /scratch): the nodes cannot see it"], res.stderr
    assert "Traceback" not in res.stderr
    assert not Path(path).exists() or flag != "--run-dir"
    assert (sorted(runs.iterdir()) if runs.exists() else []) == before  # nothing written


NODE_SCRATCH = r"""
set -eu
marker="$HPCDL_RUN_DIR_FOR_TEST/wrote"
if [ "$SLURM_PROCID" = 0 ]; then
  echo "$SLURM_JOB_ID" > /local/hpcdl-test-$SLURM_JOB_ID
  echo "$SLURM_JOB_ID" > /tmp/hpcdl-test-$SLURM_JOB_ID
  touch "$marker"
  echo "rank0 on $(hostname): local=$(cat /local/hpcdl-test-$SLURM_JOB_ID)"
else
  i=0; while [ ! -e "$marker" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
  [ -e "$marker" ] || { echo "rank1: rank 0 never wrote"; exit 3; }
  echo "rank1 on $(hostname): local=$( [ -e /local/hpcdl-test-$SLURM_JOB_ID ] && echo seen || echo absent) tmp=$( [ -e /tmp/hpcdl-test-$SLURM_JOB_ID ] && echo seen || echo absent) venv=$( [ -e "$1" ] && echo seen || echo absent)"
fi
"""


def test_node_local_scratch_and_tmp_are_each_nodes_own(sandbox_user: ClusterUser) -> None:
    shared = sandbox_user.own(sandbox_user.home / "scratch-test")
    for old in shared.iterdir():
        old.unlink()
    res = sandbox_user.cli("submit", "-p", "sandbox", "-N", "2", "-G", "0", "--wait",
                           "-e", f"HPCDL_RUN_DIR_FOR_TEST={shared}", "--",
                           "sh", "-c", NODE_SCRATCH, "node-scratch", str(sandbox_user.venv),
                           timeout=180)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    run_dir = Path(re.search(r"^run directory: (.+)$", res.stdout, re.M).group(1))  # type: ignore[union-attr]
    out = "".join(p.read_text() for p in run_dir.glob("slurm-*.out"))
    rank0 = re.search(r"rank0 on (\S+): local=(\d+)", out)
    rank1 = re.search(r"rank1 on (\S+): local=(\w+) tmp=(\w+) venv=(\w+)", out)
    assert rank0 and rank1, out
    assert rank0.group(1) != rank1.group(1)  # two nodes
    # What rank 0 wrote to its node's /local and /tmp is not on the other node, nor on
    # the host; the user's venv (outside /home) is not on the nodes at all.
    assert rank1.groups()[1:] == ("absent", "absent", "absent"), out
    assert not Path(f"/local/hpcdl-test-{rank0.group(2)}").exists()


@pytest.mark.torch
def test_the_hang_watchdog_reads_the_users_own_ranks(sandbox_user: ClusterUser) -> None:
    """py-spy (from the user's venv, which the nodes do not see) is staged into the run
    directory and dumps the user's ranks: ptrace of one's own processes, no privilege."""
    script = _user_file(sandbox_user, "hangproject/hang.py", (
        "import os, time\n"
        "def stuck_in_collective():\n"
        "    time.sleep(3600)\n"
        "print('rank', os.environ.get('RANK'), 'started', flush=True)\n"
        "stuck_in_collective()\n"))
    res = sandbox_user.cli("submit", "-p", "sandbox", "-N", "2", "-G", "0", "--time", "00:05:00",
                           "--hang-timeout", "20", "--wait", "--", "python3", "hang.py",
                           cwd=script.parent, timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    assert "stuck_in_collective" in out, out
    run_dir = Path(re.search(r"^run directory: (.+)$", res.stdout, re.M).group(1))  # type: ignore[union-attr]
    assert (run_dir / "job" / "bin" / "py-spy").is_file()
    assert str(sandbox_user.venv) not in (run_dir / "job.sbatch").read_text()


@pytest.mark.apptainer
@pytest.mark.torch
def test_stage_to_copies_the_dataset_to_each_nodes_own_scratch(
        sandbox_user: ClusterUser, cpu_image: Path) -> None:
    """`-X --stage-to=/local` (the profile's paths.local_scratch, bound into the image):
    the first rank of each node copies the dataset to that node's own disk; on the
    old shared-everything sandbox the second node found the first one's copy."""
    data = sandbox_user.home / "data" / "tiny"
    if not (data / "train").is_dir():
        made = subprocess.run([sys.executable, "-m", "hpcdl", "data", "make-tiny", str(data),
                               "--classes", "4", "--per-class", "4", "--size", "32"],
                              capture_output=True, text=True, timeout=120, check=False)
        assert made.returncode == 0, made.stderr
        subprocess.run(["chown", "-R", f"{sandbox_user.uid}:{sandbox_user.gid}",
                        str(sandbox_user.home / "data")], check=True, timeout=60)
    # Node-local scratch outlives jobs, as on a real node: a directory of this run's own.
    target = f"/local/hpcdl-test-{os.getpid()}-{int(time.time())}"
    res = sandbox_user.cli("submit", "-p", "sandbox", "-N", "2", "-G", "1", "--image",
                           str(cpu_image), "--backend", "ddp", "--data", str(data),
                           "-X", f"--stage-to={target}", "-X", "--max-steps=2",
                           "-X", "--num-classes=4", "--wait", timeout=JOB_TIMEOUT)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    run_dir = Path(re.search(r"^run directory: (.+)$", res.stdout, re.M).group(1))  # type: ignore[union-attr]
    out = "".join(p.read_text() for p in run_dir.glob("slurm-*.out"))
    hosts = re.findall(rf"staged {re.escape(str(data))} -> {target}/tiny in \S+ s \(host (\S+)\)",
                       out)
    assert len(hosts) == 2 and len(set(hosts)) == 2, out
    assert not Path(target).exists()  # on the nodes' disks, not the host's
    for host in hosts:  # each node's own copy, where scripts/sandbox.sh keeps its /local
        copy = sandbox_dir() / "nodes" / host / target.removeprefix("/")
        assert (copy / "tiny" / "train").is_dir(), copy
        shutil.rmtree(copy)


@pytest.mark.apptainer
@pytest.mark.torch
def test_probe_as_the_user(sandbox_user: ClusterUser, cpu_image: Path) -> None:
    """The probe worker comes from the run directory's copy, in the image, unprivileged;
    its MPI row runs over Open MPI with what user namespaces need."""
    res = sandbox_user.cli("probe", "-p", "sandbox", "-N", "2", "--image", str(cpu_image),
                           "--sizes", "4K,64K", "--iters", "2", "--warmup", "1", "--wait",
                           "--json", timeout=JOB_TIMEOUT)
    out = _json_line(res.stdout)
    assert res.returncode == 0 and out["exit_status"] == 0, res.stdout + res.stderr
    probe = out["probe"]
    assert probe["world_size"] == 2 and len(probe["nodes"]) == 2
    assert [r["size"] for r in probe["mpi"]["allreduce"]] == [4096, 65536]
    assert probe["verdict"]["slow_nodes"] == []
    assert Path(out["run_dir"]).is_relative_to(sandbox_user.home)


def test_requeue_as_the_user_stops_an_attempt_that_never_started(sandbox_user: ClusterUser) -> None:
    """--requeue for the user's job: the batch shell's record is written as the user, and
    an attempt that fails before its first step is not requeued."""
    res = sandbox_user.cli("submit", "-p", "sandbox", "-N", "1", "-G", "0", "--requeue",
                           "--max-restarts", "2", "--wait", "--", "python3", "-c",
                           "import no_such_module", timeout=180)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "failed before its first step (exit 1): not requeued" in res.stdout + res.stderr
    run_dir = Path(re.search(r"^run directory: (.+)$", res.stdout, re.M).group(1))  # type: ignore[union-attr]
    attempts = (run_dir / "attempts.tsv").read_text().splitlines()
    assert len(attempts) == 1 and attempts[0].split("\t")[5] == "STARTUP", attempts
    assert (run_dir / "attempts.tsv").stat().st_uid == sandbox_user.uid


@pytest.mark.apptainer
@pytest.mark.horovod
def test_scale_and_results_as_the_user(sandbox_user: ClusterUser, cpu_image: Path) -> None:
    res = sandbox_user.cli("scale", "-p", "sandbox", "-N", "1,2", "-G", "1", "--image",
                           str(cpu_image), "-X", "--arch=resnet18", "-X", "--max-steps=3",
                           "--wait", "--json", timeout=2 * JOB_TIMEOUT)
    assert res.returncode == 0, res.stdout + res.stderr
    sweep_dir = Path(json.loads(res.stdout)["sweep_dir"])
    assert sweep_dir.is_relative_to(sandbox_user.home / "runs")
    results = sandbox_user.cli("results", str(sweep_dir), "--json")
    rows = json.loads(results.stdout)["rows"]
    assert [r["nodes"] for r in rows] == [1, 2] and rows[0]["speedup"] == 1.0, rows
    assert (sweep_dir / "scaling.png").stat().st_uid == sandbox_user.uid
