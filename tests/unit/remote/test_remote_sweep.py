"""`hpcdl sweep` from a laptop (a profile with login:), without a network: the login
node's commands run here against the fake Slurm (tests/fakeslurm) and its rsync is a
copy into a "cluster" directory, so the sweep goes the way submit's remote path goes:
the array planned with the cluster's paths, the sweep directory written here and copied
there whole, sbatch given the cluster's array.sbatch; status, results and cancel from
the laptop's records."""

from __future__ import annotations

import json
import posixpath
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from hpcdl.cli import cli
from hpcdl.core import proc
from hpcdl.profiles import load_profile
from hpcdl.remote.ssh import SshExecutor
from tests.fakeslurm.fixture import FakeSlurm


def run_cli(*args: str) -> Any:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert "Traceback (most recent call last)" not in result.output
    return result


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    """The cluster's runs directory (login.runs): where the "login node" copies to."""
    return tmp_path / "cluster" / "runs"


@pytest.fixture
def remote(tmp_path: Path, cluster: Path) -> str:
    """sandbox-remote with login.runs naming ``cluster`` (no $HOME to ask for)."""
    profile = load_profile("sandbox-remote").model_dump(mode="json")
    profile["name"] = "laptop-remote"
    profile["login"]["runs"] = str(cluster)
    path = tmp_path / "laptop-remote.yaml"
    path.write_text(yaml.safe_dump(profile))
    return str(path)


@pytest.fixture
def moved(fake_slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch,
          tmp_path: Path) -> list[tuple[str, str, str]]:
    """The login node's commands run here (the fake Slurm's), its rsync copies; the list
    records every copy as (push|pull, from, to)."""
    monkeypatch.setenv("HPCDL_SKIP_LIVE_CHECK", "1")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("hpcdl.jobs.follow.MIN_INTERVAL_S", 0.01)
    monkeypatch.setattr("hpcdl.jobs.follow.LOG_READ_S", 0.0)
    fake_slurm.scenario(default={"states": [["PENDING", 1], ["COMPLETED", 0]],
                                 "stdout": "0: train: 5 steps\n0: hpcdl: loss 1.5\n"})
    copies: list[tuple[str, str, str]] = []

    def run(self: SshExecutor, argv: Sequence[str], *, timeout: float = 60,
            check: bool = True, input: str | None = None) -> proc.Result:
        return proc.run(list(argv), timeout=timeout, check=check, input=input)

    def push(self: SshExecutor, local: Any, remote_dir: str, **kw: Any) -> int:
        copies.append(("push", str(local), remote_dir))
        shutil.copytree(local, remote_dir, dirs_exist_ok=True)
        return 1

    def pull(self: SshExecutor, remote_dir: str, local: Any, **kw: Any) -> int:
        copies.append(("pull", remote_dir, str(local)))
        if Path(remote_dir).is_dir():
            shutil.copytree(remote_dir, local, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("job", "code", "checkpoints"))
        return 1

    monkeypatch.setattr(SshExecutor, "run", run)
    monkeypatch.setattr(SshExecutor, "push", push)
    monkeypatch.setattr(SshExecutor, "pull", pull)
    return copies


def sweep(profile: str, *extra: str) -> Any:
    return run_cli("sweep", "-p", profile, "-N", "1", "-G", "1", "-c", "1", "--synthetic",
                   "--no-image", "--param", "lr=0.1,0.05", *extra)


def test_a_remote_sweep_dry_run_shows_the_clusters_paths_and_touches_nothing(
        remote: str, cluster: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SshExecutor, "run", lambda *a, **k: pytest.fail("ssh was run"))
    res = sweep(remote, "--dry-run")
    assert res.exit_code == 0, res.output
    runs = tmp_path / "runs"
    assert f"# sweep directory on the cluster {cluster}/sweep-" in res.stderr
    assert "(nothing is created)" in res.stderr
    assert "# not checked: the number of points against the cluster's MaxArraySize" \
        in res.stderr
    assert f"#SBATCH --output={cluster}/sweep-" in res.stdout
    assert f"{cluster}/sweep-" in res.stdout and "/point-000/job.sbatch" in res.stdout
    assert str(runs) not in res.stdout  # the laptop's paths are not the nodes'
    assert not cluster.exists() and not runs.exists()
    as_json = json.loads(sweep(remote, "--dry-run", "--json").stdout)
    assert as_json["cluster_sweep_dir"].startswith(f"{cluster}/sweep-")
    assert [p["run_dir"].removeprefix(as_json["cluster_sweep_dir"]) for p in as_json["points"]
            ] == ["/point-000", "/point-001"]


def test_a_remote_sweep_copies_its_directory_once_and_sbatch_runs_the_clusters_script(
        fake_slurm: FakeSlurm, moved: list[tuple[str, str, str]], remote: str,
        cluster: Path, tmp_path: Path) -> None:
    res = sweep(remote, "--json")
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout)
    local, there = Path(info["sweep_dir"]), info["cluster_sweep_dir"]
    assert local.parent == tmp_path / "runs" and there == f"{cluster}/{local.name}"
    assert moved == [("push", str(local), there)]  # the whole sweep directory, one copy
    (call,) = [c for c in fake_slurm.calls() if c["tool"] == "sbatch"]
    assert call["argv"][-1] == f"{there}/array.sbatch" and "--array=0-1" in call["argv"]
    for point in ("point-000", "point-001"):
        plan = json.loads((Path(there) / point / "plan.json").read_text())
        assert plan["run_dir"] == f"{there}/{point}"
        assert (local / point / "job.json").is_file()  # the laptop keeps the record
    task = json.loads((local / "point-001" / "job.json").read_text())["job_id"]
    array = task.split("_")[0]

    # From the laptop's records: the array and its tasks reached through the login node.
    moved.clear()
    table = run_cli("results", str(local), "--json")
    assert table.exit_code == 0, table.output
    rows = json.loads(table.stdout)["rows"]
    assert [(r["lr"], r["state"]) for r in rows] == [
        ("0.1", "COMPLETED"), ("0.05", "COMPLETED")], rows
    assert sorted(m[1] for m in moved) == [f"{there}/point-000", f"{there}/point-001"]
    assert (local / "point-000" / "result.json").is_file()
    status = run_cli("status", task, "--json")
    assert status.exit_code == 0 and json.loads(status.stdout)["state"] == "COMPLETED"
    whole = run_cli("status", array, "--json")
    assert whole.exit_code == 0, whole.output


def test_a_remote_sweep_waits_and_pulls_each_point_back(
        moved: list[tuple[str, str, str]], remote: str, cluster: Path) -> None:
    res = sweep(remote, "--wait", "--json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["rows"]
    assert [r["state"] for r in rows] == ["COMPLETED", "COMPLETED"], rows
    assert [m[0] for m in moved] == ["push", "pull", "pull"]


def test_retry_failed_of_a_remote_sweep_submits_the_clusters_script(
        fake_slurm: FakeSlurm, moved: list[tuple[str, str, str]], remote: str,
        cluster: Path) -> None:
    fake_slurm.scenario(default={"states": [["COMPLETED", 0]], "stdout": "0: hpcdl: loss 1\n"},
                        task_specs={"100_1": {"states": [["FAILED", 0]], "exit": "1:0"}})
    info = json.loads(sweep(remote, "--json").stdout)
    fake_slurm.reset_calls()
    res = run_cli("sweep", "--retry-failed", info["sweep_dir"], "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["retried"] == [1]
    (call,) = [c for c in fake_slurm.calls() if c["tool"] == "sbatch"]
    assert call["argv"][-1] == f"{info['cluster_sweep_dir']}/array.sbatch"


def scale(profile: str, *extra: str) -> Any:
    return run_cli("scale", "-p", profile, "-N", "1", "-G", "1", "-c", "1", "--synthetic",
                   "--no-image", *extra)


def test_a_remote_scale_dry_run_shows_what_it_submits_and_touches_nothing(
        fake_slurm: FakeSlurm, moved: list[tuple[str, str, str]], remote: str,
        cluster: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ssh_run = SshExecutor.run
    monkeypatch.setattr(SshExecutor, "run", lambda *a, **k: pytest.fail("ssh was run"))
    text = scale(remote, "--dry-run")
    assert text.exit_code == 0, text.output
    assert f"# sweep directory on the cluster {cluster}/sweep-" in text.stderr
    assert "# not checked: that Slurm answers on 10.77.0.250 (the live check)" in text.stderr
    assert f"each runs: srun --label --kill-on-bad-exit=1 --mpi=pmix /bin/sh {cluster}/sweep-" \
        in text.stdout
    dry = json.loads(scale(remote, "--dry-run", "--json").stdout)
    runs = tmp_path / "runs"
    assert not cluster.exists() and not runs.exists() and moved == []
    (point,) = dry["points"]
    assert point["plan"]["run_dir"].startswith(dry["cluster_sweep_dir"] + "/horovod-n1-g1-")
    assert dry["sweep_dir"].startswith(f"{runs}/sweep-")

    # The submission sends the same script, but for the names a later run gets anew.
    monkeypatch.setattr(SshExecutor, "run", ssh_run)
    res = scale(remote, "--json")
    assert res.exit_code == 0, res.output
    local = Path(json.loads(res.stdout.strip().splitlines()[-1])["sweep_dir"])
    (sent,) = (cluster / local.name).glob("horovod-n1-g1-*/job.sbatch")
    (call,) = [c for c in fake_slurm.calls() if c["tool"] == "sbatch"]
    assert call["argv"][-1] == str(sent)
    renamed = point["job_script"]
    for was, now in ((posixpath.basename(point["plan"]["run_dir"]), sent.parent.name),
                     (posixpath.basename(dry["cluster_sweep_dir"]), local.name),
                     (dry["points"][0]["plan"]["job_name"],
                      json.loads((sent.parent / "plan.json").read_text())["job_name"])):
        renamed = renamed.replace(was, now)
    assert sent.read_text() == renamed
