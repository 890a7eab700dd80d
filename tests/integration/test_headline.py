"""The README's headline command, exactly as a new user types it after `make demo`, on
the real sandbox with the real CPU image, as an ordinary user (hpcdl from a wheel in a
venv the nodes do not see, Apptainer unprivileged: tests/integration/conftest_user.py):
the sandbox profile's example defaults make it end with the result table (without them
it ran into the 10-minute default time). And a
job that really hits its time limit: `submit --wait` says so in one line with the fix
and exits 124, `hpcdl status` shows the limit it hit (on the sandbox's twin,
``sandbox_twin``: it needs only the sandbox's shape, and runs beside the host sandbox's
tests, tests/parallel.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hpcdl.core.duration import parse_time
from tests.integration.conftest_slurm import hpcdl
from tests.integration.conftest_user import ClusterUser

# s: 8 ranks of ResNet-50 start torch + Horovod in the image on 2 shared cores, then
# 10 steps (~1 min alone); room for a queue, inside pytest's 900 s with an image build.
HEADLINE_TIMEOUT = 600
# s: the 1-minute limit, Slurm's ~30 s time-limit sweep, KillWait, and a queue.
TIMEOUT_JOB_TIMEOUT = 600


def _run_dir(stdout: str) -> Path:
    m = re.search(r"^run directory: (.+)$", stdout, re.M)
    assert m, stdout
    return Path(m.group(1))


@pytest.mark.slurm
@pytest.mark.apptainer
@pytest.mark.horovod
def test_the_headline_command_with_no_other_flags_ends_with_the_table(
        sandbox_user: ClusterUser, cpu_image: Path) -> None:
    res = sandbox_user.cli("submit", "-p", "sandbox", "--nodes", "2", "--gpus", "4",
                           "--image", str(cpu_image), "--wait", timeout=HEADLINE_TIMEOUT)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    out = res.stdout
    assert re.search(r"^job \d+: COMPLETED \(Slurm COMPLETED\), exit code 0", out, re.M), out
    assert re.search(r"^world size\s+8$", out, re.M), out
    assert re.search(r"^nodes\s+2$", out, re.M), out
    assert re.search(r"^backend\s+horovod$", out, re.M), out
    assert re.search(r"^arch\s+resnet50$", out, re.M), out
    assert re.search(r"^images/sec\s+\d", out, re.M), out
    assert "parameters identical on every rank" in out
    assert "time limit" not in out
    # The example ran with the sandbox's sizes (its log's first line, in the tail shown).
    assert "resnet50 32px, global batch 32, " in out and ", 10 steps, " in out

    run_dir = _run_dir(out)
    record = json.loads((run_dir / "result.json").read_text())
    assert record["state"] == "COMPLETED" and record["exit_code"] == 0
    assert record["hpcdl_result"]["world_size"] == 8
    assert len({r["host"] for r in record["ranks"]}) == 2
    plan = json.loads((run_dir / "plan.json").read_text())
    # Unprivileged Apptainer: what MPI needs across per-rank user namespaces is set, and
    # neither Open MPI nor PMIx complains (they did: CMA and gds_ds12 errors, then a hang).
    assert plan["container_mode"] == "unprivileged"
    assert plan["env"]["OMPI_MCA_btl_vader_single_copy_mechanism"] == "none"
    err = "".join(p.read_text() for p in run_dir.glob("slurm-*.err"))
    assert "single_copy_mechanism" not in err and "PMIX ERROR" not in err, err[-3000:]
    # The example and its hpcdl modules came from the run directory, not the user's venv.
    assert (run_dir / "job" / "examples" / "resnet50_imagenet.py").is_file()
    assert str(sandbox_user.venv) not in (run_dir / "job.sbatch").read_text()
    assert run_dir.is_relative_to(sandbox_user.home) and run_dir.stat().st_uid == sandbox_user.uid
    assert plan["time"] == "00:10:00"  # the profile's default time was enough
    assert "--max-steps=10" in plan["example_defaults"]
    assert plan["command"][-len(plan["example_defaults"]):] == plan["example_defaults"]


SLEEPER = "import time; print('sleeping', flush=True); time.sleep(600)"


@pytest.mark.slurm
@pytest.mark.usefixtures("sandbox_twin")
def test_a_job_past_its_time_limit_is_named_with_the_limit_and_the_fix(runs_dir: Path) -> None:
    res = hpcdl("submit", "-p", "sandbox", "--nodes", "1", "--gpus", "1", "--time", "00:01:00",
                "--job-name", "i19-timeout", "--wait", "--", "python3", "-c", SLEEPER,
                timeout=TIMEOUT_JOB_TIMEOUT)
    out = res.stdout
    assert res.returncode == 124, f"{res.returncode}\n{out}\n{res.stderr}"
    job_id = re.search(r"^Submitted job (\d+) ", out, re.M)
    assert job_id, out
    jid = job_id.group(1)
    assert re.search(rf"^job {jid}: TIMEOUT \(Slurm TIMEOUT\)", out, re.M), out
    lines = [ln for ln in out.splitlines() if ln.startswith(f"job {jid} hit its time limit")]
    assert len(lines) == 1, out
    m = re.fullmatch(rf"job {jid} hit its time limit of 00:01:00 after (\S+) \(Slurm TIMEOUT\): "
                     r"give it more with --time \(partition debug allows up to 00:30:00\), or "
                     r"make it shorter \(fewer steps: -X --max-steps=N, -X --epochs=N\), or "
                     r"let it continue: --requeue \(checkpoint, requeue, resume\) or --chain N "
                     r"where requeue is off",
                     lines[0])
    assert m, lines[0]
    assert (parse_time(m.group(1)) or 0) >= 60  # Slurm really let it run to its limit
    assert out.splitlines()[-1].startswith("run directory: ")
    assert "the job failed" not in out  # Slurm ended the ranks; no crash to trace
    assert "DUE TO TIME LIMIT" in out  # the stderr tail says it too
    record = json.loads((_run_dir(out) / "result.json").read_text())
    assert record["state"] == "TIMEOUT" and parse_time(record["time_limit"]) == 60

    status = hpcdl("status", jid)
    assert status.returncode == 0, status.stderr
    header, row, hint = status.stdout.splitlines()
    columns = header.split()
    assert columns[:9] == ["JOBID", "STATE", "SLURM", "EXIT", "PARTITION", "NODES", "ELAPSED",
                           "TIMELIMIT", "NAME"]
    values = row.split()
    assert values[0] == jid and values[1] == "TIMEOUT"
    assert values[7] == "00:01:00" and values[-1] == "i19-timeout"
    assert hint.startswith(f"job {jid} hit its time limit of 00:01:00 after ")
    as_json = json.loads(hpcdl("status", jid, "--json").stdout)
    assert as_json["state"] == "TIMEOUT" and parse_time(as_json["time_limit"]) == 60
