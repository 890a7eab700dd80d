"""hpcdl against the real sandbox Slurm cluster: ranks and GPUs, PMIx MPI, exit
codes, cancel, limits, the live check, quoting, and 100 concurrent submissions.

Every job and CLI call has a hard timeout (see conftest_slurm).
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from hpcdl.profiles import load_profile
from tests.conftest import require
from tests.integration.conftest_slurm import hpcdl, submit_json, wait_final

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

RANK_PRINT = ("import os, socket; e = os.environ; print('RANK', e['SLURM_PROCID'], "
              "e['SLURM_LOCALID'], socket.gethostname(), e.get('CUDA_VISIBLE_DEVICES', '-'), "
              "flush=True)")


def test_two_nodes_four_gpus_eight_ranks(runs_dir: Path) -> None:
    out = submit_json("-p", "sandbox", "-N", "2", "-G", "4", "--wait", "--",
                      "python3", "-c", RANK_PRINT)
    assert out["state"] == "COMPLETED" and out["exit_code"] == 0, out
    log = Path(out["stdout"]).read_text()
    rows = [ln.split("RANK ", 1)[1].split() for ln in log.splitlines() if "RANK " in ln]
    assert sorted(int(r[0]) for r in rows) == list(range(8))
    by_host: dict[str, dict[int, list[str]]] = defaultdict(dict)
    for _rank, local, host, cvd in rows:
        by_host[host][int(local)] = cvd.split(",")
    assert set(by_host) == {"n1", "n2"}
    for host, locals_ in by_host.items():
        assert sorted(locals_) == [0, 1, 2, 3], host
        for devices in locals_.values():
            assert len(devices) == 4, f"{host}: every rank sees the node's 4 GPUs: {devices}"
        # One rank per GPU: local rank k drives the k-th visible GPU.
        picked = {locals_[k][k] for k in locals_}
        assert len(picked) == 4, f"{host}: GPU ids per local rank not distinct: {picked}"
    # The run directory holds what was submitted and what came back.
    run_dir = Path(out["run_dir"])
    assert {"job.sbatch", "plan.json", "job.json", "result.json"} <= {
        p.name for p in run_dir.iterdir()}
    assert json.loads((run_dir / "job.json").read_text())["job_id"] == out["job_id"]
    assert json.loads((run_dir / "result.json").read_text())["state"] == "COMPLETED"


def test_srun_gpu_bind_gives_each_rank_its_own_gpu() -> None:
    res = subprocess.run(
        ["srun", "-N2", "--ntasks-per-node=4", "--gres=gpu:4", "--gpu-bind=single:1",
         "python3", "-c", RANK_PRINT],
        capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    rows = [ln.split()[1:] for ln in res.stdout.splitlines() if ln.startswith("RANK ")]
    assert len(rows) == 8
    for _rank, local, host, cvd in rows:
        assert host in ("n1", "n2")
        assert cvd == local, f"rank with local id {local} on {host} sees GPUs {cvd}"


def test_pmix_mpi4py_allreduce_across_two_nodes(runs_dir: Path, tmp_path: Path) -> None:
    probe = subprocess.run(["python3", "-c", "import mpi4py"], capture_output=True, timeout=60,
                           check=False)
    require(probe.returncode == 0, "mpi4py is not installed for python3 (pip install mpi4py)")
    prog = tmp_path / "allreduce.py"
    prog.write_text(textwrap.dedent("""
        import socket
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        total = comm.allreduce(comm.Get_rank() + 1, op=MPI.SUM)
        print("ALLREDUCE", comm.Get_rank(), comm.Get_size(), socket.gethostname(), total,
              flush=True)
    """))
    out = submit_json("-p", "sandbox", "-N", "2", "-G", "2", "--wait", "--",
                      "python3", str(prog))
    assert out["state"] == "COMPLETED", Path(out["stderr"]).read_text()
    plan = json.loads((Path(out["run_dir"]) / "plan.json").read_text())
    assert "--mpi=pmix" in plan["launch_line"]
    rows = [ln.split("ALLREDUCE ", 1)[1].split()
            for ln in Path(out["stdout"]).read_text().splitlines() if "ALLREDUCE " in ln]
    assert sorted(int(r[0]) for r in rows) == [0, 1, 2, 3]
    assert {r[1] for r in rows} == {"4"}
    assert {r[2] for r in rows} == {"n1", "n2"}
    assert {r[3] for r in rows} == {"10"}  # 1 + 2 + 3 + 4


def test_exit_code_3_is_failed_with_code_3(runs_dir: Path) -> None:
    out = submit_json("-p", "sandbox", "-N", "1", "-G", "0", "--", "bash", "-c", "exit 3")
    row = wait_final(out["job_id"])
    assert row["state"] == "FAILED" and row["exit_code"] == 3, row
    text = hpcdl("status", out["job_id"])
    assert text.returncode == 0
    assert f"{out['job_id']} " in text.stdout and "FAILED" in text.stdout
    # --wait hands the job's exit code to the caller.
    res = hpcdl("submit", "-p", "sandbox", "-N", "1", "-G", "0", "--wait", "--",
                "bash", "-c", "echo bye; exit 3")
    assert res.returncode == 3, res.stderr
    assert "FAILED" in res.stdout and "exit code 3" in res.stdout and "bye" in res.stdout


def test_cancelled_job_is_cancelled(runs_dir: Path) -> None:
    out = submit_json("-p", "sandbox", "-N", "1", "-G", "1", "--", "sleep", "300")
    job = out["job_id"]
    res = hpcdl("cancel", job)
    assert res.returncode == 0, res.stderr
    assert "CANCELLED" in res.stdout
    assert wait_final(job)["state"] == "CANCELLED"
    again = hpcdl("cancel", job)
    assert again.returncode == 1 and "already ended" in again.stderr


def test_logs_follow_prints_output_until_the_end(runs_dir: Path) -> None:
    out = submit_json("-p", "sandbox", "-N", "1", "-G", "0", "--", "bash", "-c",
                      "for i in 1 2 3; do echo tick $i; sleep 1; done; echo oops >&2")
    res = hpcdl("logs", out["job_id"], "-f", timeout=120)
    assert res.returncode == 0, res.stderr
    assert [ln for ln in res.stdout.splitlines() if ln.startswith("0: tick")] == [
        "0: tick 1", "0: tick 2", "0: tick 3"]
    assert "oops" in res.stderr


@pytest.mark.parametrize("args, needle", [
    (["-N", "3", "-G", "4"], "nodes: 3"),
    (["-N", "1", "-G", "5"], "gpus: 5"),
    (["--partition", "short", "-N", "2", "-G", "1"], "nodes: 2"),
    (["--partition", "short", "-N", "1", "-G", "1", "-t", "01:00:00"], "time: 01:00:00"),
    (["--partition", "nope", "-N", "1", "-G", "1"], "partition: 'nope'"),
    (["-N", "1", "-G", "4", "--cpus-per-task", "4"], "cpus-per-task"),
])
def test_over_limit_is_refused_before_sbatch(tmp_path: Path, runs_dir: Path, args: list[str],
                                             needle: str) -> None:
    # An sbatch that leaves a mark: it must never run.
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    mark = tmp_path / "sbatch-was-called"
    (fake_bin / "sbatch").write_text(f"#!/bin/sh\ntouch {mark}\nexit 1\n")
    (fake_bin / "sbatch").chmod(0o755)
    res = hpcdl("submit", "-p", "sandbox", *args, "--", "true",
                env={"PATH": f"{fake_bin}:{os.environ['PATH']}"})
    assert res.returncode == 2, res.stderr
    assert needle in res.stderr and "Traceback" not in res.stderr
    assert not mark.exists()
    assert not runs_dir.exists(), "nothing may be written for a refused request"


def _lying_profile(tmp_path: Path) -> Path:
    data = load_profile("sandbox").model_dump(mode="json", exclude_none=True)
    data["name"] = "sandbox-liar"
    debug = next(p for p in data["partitions"] if p["name"] == "debug")
    debug["gpus_per_node"] = 8
    debug["max_time"] = "04:00:00"
    data["partitions"].append({**debug, "name": "huge", "default": False})
    path = tmp_path / "sandbox-liar.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_live_check_catches_a_lying_profile(tmp_path: Path, runs_dir: Path) -> None:
    liar = str(_lying_profile(tmp_path))
    cases = [
        (["--partition", "debug", "-N", "1", "-G", "8"],
         "GPUs per node: profile sandbox-liar partition debug claims 8, the cluster has 4"),
        (["--partition", "debug", "-N", "1", "-G", "1", "-t", "03:00:00"],
         "max time: profile sandbox-liar partition debug claims 04:00:00, the cluster's limit "
         "is 00:30:00"),
        (["--partition", "huge", "-N", "1", "-G", "1"],
         "partition: profile sandbox-liar partition huge does not exist on the cluster"),
    ]
    for args, needle in cases:
        res = hpcdl("submit", "-p", liar, *args, "--", "true")
        assert res.returncode == 2, (args, res.stderr)
        assert "live check" in res.stderr and needle in res.stderr, res.stderr
        assert "hint:" in res.stderr and "Traceback" not in res.stderr
    assert not runs_dir.exists()


@pytest.mark.parametrize("args, slurm_says", [
    (["--partition", "debug", "-N", "1", "-G", "8"], "Requested node configuration is not available"),
    (["--partition", "debug", "-N", "1", "-G", "1", "-t", "03:00:00"], "Requested time limit is invalid"),
    (["--partition", "huge", "-N", "1", "-G", "1"], "invalid partition specified: huge"),
])
def test_slurm_refusal_is_reported_verbatim(tmp_path: Path, runs_dir: Path, args: list[str],
                                            slurm_says: str) -> None:
    res = hpcdl("submit", "-p", str(_lying_profile(tmp_path)), *args, "--", "true",
                env={"HPCDL_SKIP_LIVE_CHECK": "1"})
    assert res.returncode == 1, res.stderr
    first = res.stderr.splitlines()[0]
    assert first.startswith("error: sbatch refused the job: sbatch: error: ") and slurm_says in first
    assert "hint:" in res.stderr and "Traceback" not in res.stderr


def _evil(marker: Path) -> list[str]:
    # The foundation's quoting cases (tests/unit/project/test_quoting.py), now run by Slurm.
    return [
        f"$(touch {marker})",
        f"`touch {marker}`",
        f"x; touch {marker}",
        f"it's \"quoted\" && touch {marker}",
        f"line1\nline2 $(touch {marker})",
        f"$HOME ${{PATH}} \\ {marker}",
    ]


PRINT_ENV = ("import json, os; e = os.environ; print('ENV ' + json.dumps({k: e.get(k) for k in "
             "('HPCDL_JOB_NAME', 'SLURM_JOB_NAME', 'EVIL')}), flush=True)")


@pytest.mark.parametrize("index", range(6))
def test_quoting_cases_run_by_slurm_arrive_verbatim(tmp_path: Path, runs_dir: Path,
                                                    index: int) -> None:
    marker = tmp_path / "pwned"
    value = _evil(marker)[index]
    name = value.replace("\n", " ")  # a Slurm job name cannot hold a newline
    out = submit_json("-p", "sandbox", "-N", "1", "-G", "0", "--job-name", name,
                      "--env", f"EVIL={value}", "--wait", "--", "python3", "-c", PRINT_ENV,
                      cwd=tmp_path)
    assert out["state"] == "COMPLETED", Path(out["stderr"]).read_text()
    seen = [json.loads(ln.split("ENV ", 1)[1]) for ln in Path(out["stdout"]).read_text()
            .splitlines() if "ENV " in ln]
    assert seen == [{"HPCDL_JOB_NAME": name, "SLURM_JOB_NAME": name, "EVIL": value}]
    assert out["job_name"] == name
    assert not marker.exists(), "a user value was executed"


def test_one_hundred_concurrent_submissions_all_complete(runs_dir: Path) -> None:
    from hpcdl.jobs.submit import plan_run, submit
    from hpcdl.plan import JobRequest
    from hpcdl.schedulers.slurm.adapter import SlurmScheduler
    from hpcdl.schedulers.slurm.parse import SACCT_FIELDS, parse_sacct

    profile = load_profile("sandbox")

    def one(i: int) -> tuple[str, Path]:
        req = JobRequest.of(nodes=1, gpus=0, cpus_per_task=1, job_name=f"load-{i}",
                         command=("true",))
        sub = submit(profile, plan_run(profile, req), scheduler=SlurmScheduler(profile.name))
        return sub.job_id, sub.run_dir

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(one, range(100), timeout=300))
    ids = [job for job, _ in results]
    assert len(set(ids)) == 100, "duplicate job ids"
    assert len({run for _, run in results}) == 100, "two jobs shared a run directory"

    expected_names = sorted(f"load-{i}" for i in range(100))
    deadline = time.monotonic() + 300
    while True:
        res = subprocess.run(["sacct", "-n", "-P", "-X", "-j", ",".join(ids), "-o", SACCT_FIELDS],
                             capture_output=True, text=True, timeout=60, check=True)
        rows = parse_sacct(res.stdout)
        states = {r.job_id: r.state for r in rows}
        names = sorted(r.name for r in rows)
        # sacct's rows are eventually consistent: for a few seconds a finished job's row
        # can be the "allocation" placeholder; wait for the real records.
        if set(states.values()) == {"COMPLETED"} and names == expected_names:
            break
        assert time.monotonic() < deadline, f"after 300 s: {sorted(states.items())[:10]}"
        time.sleep(2)
    assert sorted(states) == sorted(ids), "sacct lost or invented jobs"
    assert len(rows) == 100


def test_alloc_runs_a_command_in_the_allocation() -> None:
    res = hpcdl("alloc", "-p", "sandbox", "-N", "2", "-G", "4", "--", "srun", "hostname")
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.split()) == ["n1"] * 4 + ["n2"] * 4
    failed = hpcdl("alloc", "-p", "sandbox", "-N", "1", "-G", "1", "--", "bash", "-c", "exit 4")
    assert failed.returncode == 4


def test_sandbox_cli_up_is_idempotent_and_status_reports_nodes() -> None:
    up = hpcdl("sandbox", "up", timeout=900)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "already up (nothing started)" in up.stdout
    status = hpcdl("sandbox", "status")
    assert status.returncode == 0, status.stdout
    assert "n1 idle" in status.stdout or "n1 mix" in status.stdout or "n1 alloc" in status.stdout
    assert "sandbox: up" in status.stdout
    for daemon in ("munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd-n1", "slurmd-n2"):
        assert f"{daemon}" in status.stdout and "stopped" not in status.stdout
