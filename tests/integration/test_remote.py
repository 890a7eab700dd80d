"""hpcdl from a laptop: the ordinary test user off the cluster (no Slurm command on PATH,
no Slurm configuration, the remote runs directory out of sight: conftest_remote.py)
reaches the sandbox only through its SSH login node, with the bundled sandbox-remote
profile. The user's project and local runs live under /opt, which the compute nodes do
not see: a job that read them instead of the copies on the cluster would fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.integration.conftest_remote import LOGIN_HOST, LOGIN_NETNS, LOGIN_SCRIPT, Laptop
from tests.integration.conftest_slurm import sandbox_dir
from tests.integration.conftest_user import REPO
from tests.integration.test_remote_ssh import sshd

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]

JOB_TIMEOUT = 420


@pytest.fixture
def project(laptop: Laptop) -> Iterator[Path]:
    """A directory of the user's on the laptop (the nodes cannot see /opt), with runs/."""
    path = laptop.user.own(Path("/opt/hpcdl-laptop") / f"proj-{os.getpid()}-{time.time_ns()}")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _json_line(stdout: str) -> dict:
    return dict(json.loads(stdout.strip().splitlines()[-1]))


def _write(laptop: Laptop, path: Path, text: str) -> Path:
    laptop.user.own(path.parent)
    path.write_text(text)
    shutil.chown(path, laptop.user.uid, laptop.user.gid)
    return path


def test_alloc_from_the_laptop_runs_salloc_on_the_login_node(laptop: Laptop,
                                                             project: Path) -> None:
    # The laptop has no salloc: the allocation can only have come through ssh -t (no
    # terminal here: ssh says so and runs it without one), its srun step on a node.
    res = laptop.cli("alloc", "-p", "sandbox-remote", "-N", "1", "-G", "0", "-J",
                     "laptop alloc", "--", "srun", "sh", "-c", "echo on-$(hostname)",
                     cwd=project, timeout=JOB_TIMEOUT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert re.search(r"^on-n\d+$", res.stdout, re.M), res.stdout + res.stderr


def test_status_logs_and_cancel_from_the_laptop(laptop: Laptop, project: Path) -> None:
    env = {"HPCDL_RUNS": str(project / "runs")}
    res = laptop.cli("submit", "-p", "sandbox-remote", "-N", "1", "-G", "0", "--no-image",
                     "--json", "--job-name", "laptop-sleeper", "--",
                     "sh", "-c", "echo started-$SLURM_JOB_ID; exec sleep 300",
                     cwd=project, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    info = _json_line(res.stdout)
    job, local = info["job_id"], Path(info["run_dir"])
    assert local.is_relative_to(project / "runs")
    cluster = Path(info["cluster_run_dir"])
    assert cluster.parent == laptop.remote_runs and cluster.name == local.name
    assert (cluster / "job.sbatch").read_bytes() == (local / "job.sbatch").read_bytes()
    assert info["bytes_moved"] > 0
    deadline = time.monotonic() + 120
    while True:  # each call a new process: found again from the local run directory
        status = laptop.cli("status", job, "--json", cwd=project, env=env)
        assert status.returncode == 0, status.stderr
        if _json_line(status.stdout)["state"] == "RUNNING":
            break
        assert time.monotonic() < deadline, status.stdout
        time.sleep(1)
    deadline = time.monotonic() + 60
    while f"started-{job}" not in (log := laptop.cli("logs", job, cwd=project, env=env)).stdout:
        assert time.monotonic() < deadline, log.stdout + log.stderr
        time.sleep(1)
    cancel = laptop.cli("cancel", job, cwd=project, env=env)
    assert cancel.returncode == 0, cancel.stderr
    assert "CANCELLED" in cancel.stdout
    follow = laptop.cli("logs", "-f", job, cwd=project, env=env, timeout=120)
    assert follow.returncode == 0 and f"started-{job}" in follow.stdout, follow.stderr
    listed = laptop.cli("status", "-p", "sandbox-remote", "--json", cwd=project, env=env)
    assert listed.returncode == 0, listed.stderr
    assert job in {row["job_id"] for row in json.loads(listed.stdout)}


def _variant(laptop: Laptop, project: Path, **login: object) -> Path:
    """The bundled sandbox-remote profile with ``login`` changed, in the project."""
    doc = yaml.safe_load((REPO / "hpcdl" / "profiles" / "bundled" /
                          "sandbox-remote.yaml").read_text())
    doc["name"] = "laptop-variant"
    doc["login"].update(login)
    return _write(laptop, project / "variant.yaml", yaml.safe_dump(doc))


def _refused(laptop: Laptop, project: Path, profile: Path) -> tuple[int, list[str]]:
    """Submit with ``profile``; the exit code and the stderr lines. Nothing may be
    written locally (no runs/) or on the cluster (no new directory in its runs)."""
    before = set(os.listdir(laptop.remote_runs))
    res = laptop.cli("submit", "-p", str(profile), "-N", "1", "-G", "0", "--no-image", "--",
                     "sh", "-c", "echo never", cwd=project,
                     env={"HPCDL_RUNS": str(project / "runs")}, timeout=120)
    said = res.stdout + res.stderr
    assert not (project / "runs").exists() or not os.listdir(project / "runs"), said
    assert set(os.listdir(laptop.remote_runs)) == before, said
    return res.returncode, res.stderr.splitlines()


def test_an_unknown_login_host_is_one_line(laptop: Laptop, project: Path) -> None:
    code, err = _refused(laptop, project, _variant(laptop, project, host="nosuchhost.invalid"))
    assert code == 2, err
    assert err[0].startswith("error: login node nosuchhost.invalid: unknown host"), err
    assert len(err) <= 2, err


def test_a_refused_key_is_one_line(laptop: Laptop, project: Path) -> None:
    key = project / "not-authorized"
    made = laptop.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)])
    assert made.returncode == 0, made.stderr
    code, err = _refused(laptop, project, _variant(laptop, project, identity=str(key)))
    assert code == 2, err
    assert err[0].startswith(f"error: login node {LOGIN_HOST}: authentication refused"), err
    assert len(err) <= 2, err


def test_a_runs_directory_the_user_cannot_write_is_one_line(laptop: Laptop,
                                                           project: Path) -> None:
    code, err = _refused(laptop, project, _variant(laptop, project, runs="/home/hpcdl-not-yours/runs"))
    assert code == 2, err
    assert err[0].startswith("error: login.runs: /home/hpcdl-not-yours/runs is not writable on "), err
    assert len(err) <= 2, err


def test_a_login_node_without_slurm_is_one_line(laptop: Laptop, project: Path) -> None:
    # An SSH server whose sessions find no Slurm on PATH: not the cluster's login node.
    with sshd(laptop.user, "SetEnv PATH=/nonexistent\n") as other:
        profile = _variant(laptop, project, host="127.0.0.1", port=other.port,
                           identity=str(other.key))
        code, err = _refused(laptop, project, profile)
    assert code == 2, err
    assert err[0].startswith("error: login node 127.0.0.1: Slurm's commands (sbatch"), err
    assert "not on its PATH" in err[0] and len(err) <= 2, err


def _running(name: str, timeout: float = 120) -> str:
    """The id of the user's job ``name`` once Slurm runs it (asked here, as root)."""
    deadline = time.monotonic() + timeout
    env = {**os.environ, "SLURM_CONF": str(sandbox_dir() / "etc" / "slurm.conf")}
    while time.monotonic() < deadline:
        res = subprocess.run(["squeue", "-h", "-n", name, "-t", "RUNNING", "-o", "%i"],
                             capture_output=True, text=True, timeout=30, env=env, check=False)
        if res.stdout.strip():
            return res.stdout.split()[0]
        time.sleep(1)
    raise AssertionError(f"job {name} did not start within {timeout} s")


def test_a_login_node_that_goes_away_mid_wait_is_reconnected(laptop: Laptop,
                                                             project: Path) -> None:
    """The login node dies while `submit --wait` follows the job (every process in its
    namespace killed: the master connection drops, new ones are refused) and comes back
    15 s later: the user sees one warning line, the job goes on on the cluster, and the
    wait ends with its result as if nothing happened."""
    env = {"HPCDL_RUNS": str(project / "runs")}
    wait = laptop.start("submit", "-p", "sandbox-remote", "-N", "1", "-G", "0", "--no-image",
                        "--wait", "--job-name", "laptop-outage", "--", "sh", "-c",
                        "echo before; sleep 40; echo after", cwd=project, env=env)
    try:
        job = _running("laptop-outage")
        pids = subprocess.run(["ip", "netns", "pids", LOGIN_NETNS], capture_output=True,
                              text=True, timeout=30, check=True).stdout.split()
        subprocess.run(["kill", *pids], check=True, timeout=30)
        time.sleep(15)
        up = subprocess.run(["bash", str(LOGIN_SCRIPT), "up"], capture_output=True, text=True,
                            timeout=120, check=False)
        assert up.returncode == 0, up.stdout + up.stderr
        out, err = wait.communicate(timeout=JOB_TIMEOUT)
    finally:
        if wait.poll() is None:
            wait.kill()
    assert wait.returncode == 0, out + err
    assert re.search(rf"^job {job}: COMPLETED", out, re.M), out
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert warnings and "unreachable" in warnings[0], err
    assert "the job goes on on the cluster" in warnings[0], err
    run = next((project / "runs").iterdir())
    record = json.loads((run / "result.json").read_text())
    assert record["state"] == "COMPLETED", record
    assert "after" in (run / f"slurm-{job}.out").read_text()
    print(err)  # what the user saw (pytest -s shows it)


TRAIN = """\
import os, socket
with open("data/labels.txt") as fh:  # relative: the job starts in its copy of the project
    labels = fh.read().split()
print(f"LAPTOP rank={os.environ['RANK']} world={os.environ['WORLD_SIZE']} "
      f"host={socket.gethostname()} cwd={os.getcwd()} labels={len(labels)}", flush=True)
"""


def test_a_script_from_a_laptop_directory_runs_in_its_copy_and_unchanged_code_moves_once(
        laptop: Laptop, project: Path) -> None:
    env = {"HPCDL_RUNS": str(project / "runs")}
    _write(laptop, project / "train.py", TRAIN)
    _write(laptop, project / "data" / "labels.txt", "cat dog\n" * 20_000)  # 160 kB
    _write(laptop, project / "notes" / "draft.txt", "not for the cluster\n")
    _write(laptop, project / ".hpcdlignore", "notes/\n")
    first = laptop.cli("submit", "-p", "sandbox-remote", "-N", "2", "-G", "1", "--no-image",
                       "--json", "--wait", "--job-name", "laptop-script", "--",
                       "python3", "train.py", cwd=project, env=env, timeout=JOB_TIMEOUT)
    assert first.returncode == 0, first.stdout + first.stderr
    info = _json_line(first.stdout)
    cluster = Path(info["cluster_run_dir"])
    assert info["state"] == "COMPLETED", info
    local = Path(info["run_dir"])
    out = (local / f"slurm-{info['job_id']}.out").read_text()  # pulled back
    lines = re.findall(r"LAPTOP rank=(\d) world=2 host=(\S+) cwd=(\S+) labels=40000", out)
    assert sorted(r for r, _, _ in lines) == ["0", "1"], out
    assert {h for _, h, _ in lines} == {"n1", "n2"}, out
    assert {c for _, _, c in lines} == {f"{cluster}/code"}, out
    assert (cluster / "code" / "train.py").is_file() and not (cluster / "code" / "notes").exists()
    assert not (cluster / "code" / "runs").exists()  # the local runs stay out of the code
    # The same code again: only the new run's own files cross (the code is linked there).
    second = laptop.cli("submit", "-p", "sandbox-remote", "-N", "1", "-G", "1", "--no-image",
                        "--json", "--job-name", "laptop-script", "--", "python3", "train.py",
                        cwd=project, env=env)
    assert second.returncode == 0, second.stderr
    again = _json_line(second.stdout)
    assert again["bytes_moved"] < info["bytes_moved"] / 2, (info["bytes_moved"], again)
    code_again = Path(again["cluster_run_dir"]) / "code" / "data" / "labels.txt"
    assert code_again.stat().st_ino == (cluster / "code" / "data" / "labels.txt").stat().st_ino
    laptop.cli("cancel", again["job_id"], cwd=project, env=env)


HANG = """\
import os, time
def slow_step():
    time.sleep(3600)  # the hang: the job's watchdog must name this frame
def wait_for_peer():
    while True:
        time.sleep(0.2)
rank = int(os.environ["RANK"])
for step in range(3):
    print(f"step {step} rank {rank}", flush=True)
    time.sleep(0.5)
if rank == 1:
    print(f"HANG_START {time.time():.3f}", flush=True)
    slow_step()
wait_for_peer()
"""


def test_a_hang_submitted_from_the_laptop_is_healed_by_the_job_itself(
        laptop: Laptop, project: Path) -> None:
    """issue 42: --hang-timeout from a laptop (refused before), without --wait: the laptop
    submits and is gone; the job's own watchdog, on its batch host, dumps both ranks'
    stacks with the py-spy the laptop staged, names rank 1 in slow_step and cancels the
    job. Status from the laptop says CANCELLED; the diagnosis is in the run directory on
    the cluster (read there: no --wait pulled it back)."""
    env = {"HPCDL_RUNS": str(project / "runs")}
    _write(laptop, project / "hang.py", HANG)
    res = laptop.cli("submit", "-p", "sandbox-remote", "-N", "2", "-G", "0", "--no-image",
                     "--json", "--job-name", "laptop-hang", "--hang-timeout", "15", "--",
                     "python3", "hang.py", cwd=project, env=env, timeout=JOB_TIMEOUT)
    assert res.returncode == 0, res.stdout + res.stderr
    info = _json_line(res.stdout)
    job, cluster = info["job_id"], Path(info["cluster_run_dir"])
    assert (cluster / "job" / "bin" / "py-spy").is_file()  # staged from the laptop's venv
    deadline = time.monotonic() + JOB_TIMEOUT
    while True:  # each call a new process: nothing follows the job in between
        status = laptop.cli("status", job, "--json", cwd=project, env=env)
        assert status.returncode == 0, status.stderr
        state = _json_line(status.stdout)["state"]
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            break
        assert time.monotonic() < deadline, status.stdout
        time.sleep(2)
    err = (cluster / f"slurm-{job}.err").read_text()
    assert state == "CANCELLED", err[-3000:]
    hang = json.loads((cluster / "hang" / "diagnosis.json").read_text())
    assert hang["cancelled"] is True and hang["progress"] == "run directory", hang
    (s,) = hang["stragglers"]
    assert (s["label"], s["function"]) == ("rank 1", "slow_step"), hang
    assert f"hpcdl: hang watchdog: watching job {job} on " in err, err[-3000:]
    found = re.search(r"HANG_START (\S+)", (cluster / f"slurm-{job}.out").read_text())
    assert found, "no HANG_START in the job's output"
    started = float(found.group(1))
    print(f"\nhang from the laptop, no --wait: diagnosis {hang['detected_at'] - started:.1f} s "
          f"after the hang (--hang-timeout 15)")


SWEEP_SCRIPT = """\
import os, sys
print(f"SWEPT lr={sys.argv[sys.argv.index('--lr') + 1]} cwd={os.getcwd()} "
      f"task={os.environ['SLURM_ARRAY_TASK_ID']}", flush=True)
"""


def test_a_parameter_sweep_from_the_laptop_runs_each_point_in_its_copy_on_the_cluster(
        laptop: Laptop, project: Path) -> None:
    env = {"HPCDL_RUNS": str(project / "runs")}
    _write(laptop, project / "sweep_me.py", SWEEP_SCRIPT)
    res = laptop.cli("sweep", "-p", "sandbox-remote", "-N", "1", "-G", "1", "-c", "1",
                     "--no-image", "--param", "lr=0.1,0.05", "--wait", "--json", "--",
                     "python3", "sweep_me.py", "--lr", "{lr}", cwd=project, env=env,
                     timeout=JOB_TIMEOUT)
    assert res.returncode == 0, res.stdout + res.stderr
    table = json.loads(res.stdout)
    sweep = Path(table["sweep_dir"])
    assert sweep.is_relative_to(project / "runs")
    rows = table["rows"]
    assert [(r["lr"], r["state"]) for r in rows] == [("0.1", "COMPLETED"),
                                                     ("0.05", "COMPLETED")], rows
    cluster = laptop.remote_runs / sweep.name  # as the cluster sees it
    assert (cluster / "array.sbatch").read_bytes() == (sweep / "array.sbatch").read_bytes()
    for index, lr in enumerate(("0.1", "0.05")):
        point = f"point-{index:03d}"
        (out,) = (cluster / point).glob("slurm-*.out")
        assert f"SWEPT lr={lr} cwd={cluster / point}/code task={index}" in out.read_text()
        assert (sweep / point / out.name).read_text() == out.read_text()  # pulled back
        assert (sweep / point / "result.json").is_file()
    # One task's log by its task id (JOBID_TASK), from the laptop's pulled-back copy.
    task = json.loads((sweep / "point-001" / "job.json").read_text())["job_id"]
    logs = laptop.cli("logs", task, cwd=project, env=env)
    assert logs.returncode == 0 and "SWEPT lr=0.05 " in logs.stdout, logs.stdout + logs.stderr
    # From the laptop again (a new process): the table from the laptop's records.
    again = laptop.cli("results", str(sweep), "--json", cwd=project, env=env)
    assert again.returncode == 0, again.stderr
    assert [r["state"] for r in json.loads(again.stdout)["rows"]] == ["COMPLETED"] * 2


def test_logs_follow_a_running_job_from_the_laptop(laptop: Laptop, project: Path) -> None:
    env = {"HPCDL_RUNS": str(project / "runs")}
    res = laptop.cli("submit", "-p", "sandbox-remote", "-N", "1", "-G", "0", "--no-image",
                     "--json", "--job-name", "laptop-follow", "--", "sh", "-c",
                     "echo first; sleep 10; echo last", cwd=project, env=env)
    assert res.returncode == 0, res.stderr
    job = _json_line(res.stdout)["job_id"]
    follow = laptop.cli("logs", "-f", job, cwd=project, env=env, timeout=JOB_TIMEOUT)
    assert follow.returncode == 0, follow.stderr
    lines = follow.stdout.splitlines()
    assert lines[0].startswith(f"hpcdl: job {job} on n1") and lines[1:3] == ["0: first", "0: last"]


# s: 8 ranks of ResNet-50 in the image on 2 shared cores (test_headline.py's figure).
HEADLINE_TIMEOUT = 600


@pytest.fixture(scope="module")
def pushed(laptop: Laptop, cpu_image: Path) -> Path:
    """The CPU image, pushed to the cluster from the laptop (by content: once)."""
    res = laptop.cli("push", str(cpu_image), "-p", "sandbox-remote", timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    return cpu_image


@pytest.mark.apptainer
@pytest.mark.horovod
def test_the_headline_command_from_the_laptop_ends_with_the_table(
        laptop: Laptop, project: Path, pushed: Path) -> None:
    env = {"HPCDL_RUNS": str(project / "runs")}
    res = laptop.cli("submit", "-p", "sandbox-remote", "--nodes", "2", "--gpus", "4",
                     "--image", str(pushed), "--wait", cwd=project, env=env,
                     timeout=HEADLINE_TIMEOUT)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    out = res.stdout
    assert re.search(r"^job \d+: COMPLETED \(Slurm COMPLETED\), exit code 0", out, re.M), out
    assert re.search(r"^world size\s+8$", out, re.M), out
    assert re.search(r"^images/sec\s+\d", out, re.M), out
    assert "parameters identical on every rank" in out
    run = next((project / "runs").iterdir())
    record = json.loads((run / "result.json").read_text())  # written here, from pulled logs
    assert record["hpcdl_result"]["world_size"] == 8
    assert len({r["host"] for r in record["ranks"]}) == 2
    assert (run / "report.html").is_file() and list((run / "metrics").glob("rank-*.jsonl"))
    plan = json.loads((run / "plan.json").read_text())
    # The image the nodes ran is the pushed copy, named by its content.
    assert plan["image"].startswith(f"{laptop.remote_images}/pytorch-horovod-cpu-")
    assert plan["run_dir"] == f"{laptop.remote_runs}/{run.name}"
    assert plan["container_mode"] == "unprivileged"
    assert not (run / "checkpoints").exists()  # they stay on the cluster


@pytest.mark.apptainer
@pytest.mark.horovod
def test_a_sweep_from_the_laptop_and_its_table_and_plot_pulled_back(
        laptop: Laptop, project: Path, pushed: Path) -> None:
    env = {"HPCDL_RUNS": str(project / "runs")}
    res = laptop.cli("scale", "-p", "sandbox-remote", "-N", "1", "-G", "1,2",
                     "--backend", "horovod,ddp", "--synthetic", "--image", str(pushed),
                     "--json", cwd=project, env=env, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    sweep = Path(_json_line(res.stdout)["sweep_dir"])
    assert sweep.is_relative_to(project / "runs")
    deadline = time.monotonic() + 4 * JOB_TIMEOUT
    while True:  # each call a new process, as after closing the laptop
        table = laptop.cli("results", str(sweep), "--json", cwd=project, env=env)
        assert table.returncode in (0, 1), table.stderr
        rows = json.loads(table.stdout)["rows"]
        if all(r["state"] not in ("PENDING", "RUNNING") for r in rows):
            break
        assert time.monotonic() < deadline, table.stdout
        time.sleep(10)
    states = [(r["label"], r["state"], r["note"]) for r in rows]
    assert len(rows) == 4 and all(r["state"] == "COMPLETED" for r in rows), states
    assert all(r["images_per_sec"] for r in rows), rows
    plot = laptop.cli("results", str(sweep), "--plot", str(project / "scaling.png"),
                      cwd=project, env=env)
    assert plot.returncode == 0, plot.stderr
    assert (project / "scaling.png").stat().st_size > 1000
    for point in (p for p in sweep.iterdir() if p.is_dir()):
        assert (point / "result.json").is_file() and len(list(point.glob("slurm-*.out"))) == 1
        # Each point ran its own script (sent in the same second as its siblings').
        cluster = laptop.remote_runs / sweep.name / point.name
        assert (cluster / "job.sbatch").read_bytes() == (point / "job.sbatch").read_bytes()


def test_spares_from_the_laptop_gate_the_nodes_and_the_record_comes_back(
        laptop: Laptop, project: Path) -> None:
    """--spares through the login node: the node guard is shipped with the run (job/bin),
    its health gate runs on both sandbox nodes, the training on one, and its lines come
    back with the run directory."""
    env = {"HPCDL_RUNS": str(project / "runs")}
    res = laptop.cli("submit", "-p", "sandbox-remote", "-N", "1", "-G", "0", "--spares", "1",
                     "--no-image", "--wait", "--json", "--", "sh", "-c",
                     "echo trained-on-$SLURMD_NODENAME", cwd=project, env=env, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    info = _json_line(res.stdout)
    local = Path(info["run_dir"])
    assert (local / "job" / "bin" / "hpcdl-nodes").is_file()
    err = (local / f"slurm-{info['job_id']}.err").read_text()
    assert "hpcdl: gate: 2 of 2 nodes healthy in " in err, err
    assert "hpcdl: training on n1" in err, err
    out = (local / f"slurm-{info['job_id']}.out").read_text()
    assert "trained-on-n1" in out and "trained-on-n2" not in out, out
    assert "recoveries" not in info and not (local / "bad-nodes.tsv").exists()
