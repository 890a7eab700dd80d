"""The laptop's side of a cluster reached over SSH, without a network: where run
directories map to on the cluster, which code files go, how a dropped login node is
tried again, and that the job path is planned with the cluster's paths."""

from __future__ import annotations

import os
import posixpath
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from hpcdl.cli import cli
from hpcdl.core.proc import Result
from hpcdl.core.resources import REPO_ROOT
from hpcdl.errors import ValidationError
from hpcdl.jobs.cluster import connect, reconnect
from hpcdl.jobs.follow import Reconnecting
from hpcdl.jobs.place import HERE, Shipped, _siblings
from hpcdl.jobs.rundir import RunDir
from hpcdl.jobs.submit import plan_run
from hpcdl.launch.code import ignored, scan_code
from hpcdl.plan import JobRequest
from hpcdl.profiles import load_profile
from hpcdl.remote.ssh import ConnectionLost, LoginNode, SshExecutor


def _over_ssh(local_root: Path, root: str = "/home/jdoe/hpcdl-runs") -> Shipped:
    ex = SshExecutor(LoginNode("login.example.org", user="jdoe"), Path("/nonexistent"))
    return Shipped(ex, root, local_root)


def test_run_directories_keep_their_names_and_nesting_on_the_cluster(tmp_path: Path) -> None:
    place = _over_ssh(tmp_path / "runs")
    run = tmp_path / "runs" / "sweep-1" / "h-1r-abc"
    assert place.cluster_path(run) == "/home/jdoe/hpcdl-runs/sweep-1/h-1r-abc"
    assert place.local_path("/home/jdoe/hpcdl-runs/sweep-1/h-1r-abc") == run
    # A --run-dir elsewhere keeps its name under the cluster's root.
    assert place.cluster_path(tmp_path / "other" / "x") == "/home/jdoe/hpcdl-runs/x"
    assert HERE.cluster_path(run) == str(run) and HERE.local_path(str(run)) == run


def test_the_plan_names_the_clusters_paths_and_none_of_the_laptops(tmp_path: Path) -> None:
    profile = load_profile("sandbox-remote")
    place = _over_ssh(tmp_path / "runs")
    plan = plan_run(profile, JobRequest.of(nodes=1, gpus=1, command=("python3", "train.py"),
                                        code_dir=str(tmp_path)),
                    runs_under=tmp_path / "runs", place=place)
    assert plan.spec.run_dir is not None and plan.spec.run_dir.startswith("/home/jdoe/hpcdl-runs/")
    assert plan.files.workdir == f"{plan.spec.run_dir}/code"
    assert f"cd {plan.spec.run_dir}/code\n" in plan.script
    assert str(tmp_path) not in plan.script
    assert place.local_path(plan.spec.run_dir).parent == tmp_path / "runs"


def test_the_sandbox_remote_profile_reaches_its_login_node() -> None:
    conn = connect(load_profile("sandbox-remote"))
    assert isinstance(conn.executor, SshExecutor) and conn.executor.login.host == "10.77.0.250"
    assert conn.remote and conn.place.remote and conn.scheduler.name == "slurm"
    local = connect(load_profile("sandbox"))
    assert not local.remote and local.place is HERE


def test_a_run_without_a_login_profile_is_this_machines(tmp_path: Path) -> None:
    assert reconnect(None).place is HERE
    assert reconnect(RunDir(tmp_path)).place is HERE  # no profile.yaml recorded


def test_rsync_links_from_the_newest_submitted_siblings(tmp_path: Path) -> None:
    for i, name in enumerate(["a", "b", "c", "d", "unsubmitted"]):
        (tmp_path / name).mkdir()
        if name != "unsubmitted":
            (tmp_path / name / "job.json").write_text("{}")
        os.utime(tmp_path / name, (1000 + i, 1000 + i))
    assert _siblings(tmp_path / "d") == ["../c", "../b", "../a"]


def test_code_leaves_out_caches_venvs_the_ignore_file_and_the_runs(tmp_path: Path) -> None:
    for rel in ("train.py", "lib/model.py", ".git/HEAD", "lib/__pycache__/m.pyc",
                ".venv/bin/python", "data/big.bin", "runs/r1/job.sbatch", "notes.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x" * 10)
    (tmp_path / ".hpcdlignore").write_text("# data stays on the laptop\ndata/\n*.txt\n")
    code = scan_code(tmp_path, limit_bytes=10_000, skip=(tmp_path / "runs",))
    assert code.files == (".hpcdlignore", "lib/model.py", "train.py")
    assert code.size == sum((tmp_path / f).stat().st_size for f in code.files)


def test_code_over_its_limit_is_refused_naming_the_largest_entry(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "w.pt").write_bytes(b"\0" * 3_000_000)
    with pytest.raises(ValidationError) as err:
        scan_code(tmp_path, limit_bytes=2_000_000)
    assert "holds 3 MB to copy, over the limit of 2 MB" in err.value.message
    assert "largest: weights (3 MB)" in err.value.message
    assert ".hpcdlignore" in (err.value.hint or "")


@pytest.mark.parametrize("rel, is_dir, pattern, hit", [
    ("data", True, "data/", True), ("data", False, "data/", False),
    ("a/b/c.ckpt", False, "*.ckpt", True), ("a/b", True, "a/b/", True),
    ("x/a/b", True, "a/b/", False), ("README.md", False, "/README.md", True),
])
def test_ignore_patterns(rel: str, is_dir: bool, pattern: str, hit: bool) -> None:
    assert ignored(rel, is_dir, (pattern,)) is hit


def test_a_dropped_login_node_is_tried_again_until_it_answers() -> None:
    clock = [0.0]
    calls, lost = [], []

    def flaky() -> str:
        calls.append(clock[0])
        if len(calls) < 4:
            raise ConnectionLost("login node x: unreachable (Connection refused)")
        return "ok"

    def sleep(s: float) -> None:
        clock[0] += s

    link = Reconnecting(on_lost=lambda err, away: lost.append(away), clock=lambda: clock[0],
                        sleep=sleep)
    assert link.call(flaky) == "ok"
    assert lost == [0.0, 5.0, 10.0] and link.lost == 1


def test_a_login_node_away_too_long_stops_following_with_how_to_reattach() -> None:
    clock = [0.0]

    def down() -> None:
        raise ConnectionLost("login node x: unreachable (No route to host)")

    link = Reconnecting(limit_s=30, clock=lambda: clock[0],
                        sleep=lambda s: clock.__setitem__(0, clock[0] + s),
                        hint="hpcdl status 42")
    with pytest.raises(ConnectionLost) as err:
        link.call(down)
    assert "gave up after 30 s" in err.value.message and err.value.hint == "hpcdl status 42"


def test_what_a_laptop_cannot_do_yet_is_refused_before_any_connection(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))  # no ssh: a connection attempt would fail
    # (--hang-timeout from a laptop is no longer refused: the job watches itself; the
    # remote dry run below shows the watchdog in the script.)
    code = CliRunner().invoke(cli, ["submit", "-p", "sandbox", "-N", "1", "-G", "1",
                                    "--code", str(tmp_path), "--", "python3", "t.py"])
    assert code.exit_code == 2
    assert code.stderr.startswith("error: code: --code copies your code to a cluster reached "
                                  "over SSH; profile sandbox has no login:")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("pinned", [False, True])
def test_a_remote_dry_run_names_the_clusters_paths_and_opens_no_connection(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pinned: bool) -> None:
    # A dry run for a login: profile plans with the paths the submission uses (the
    # cluster's run directory, the pushed image's content name) without asking the
    # cluster: no ssh on PATH, and any command through the executor fails the test.
    from hpcdl.container.hashing import file_sha256
    from hpcdl.remote import dirs
    from hpcdl.remote.images import remote_name

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))

    def no_ssh(*args: object, **kwargs: object) -> None:
        raise AssertionError("a dry run ran a command on the login node")

    monkeypatch.setattr(SshExecutor, "run", no_ssh)
    # The remote home a connection found earlier (sandbox-remote sets no login.runs).
    cache = Path(os.environ["XDG_CACHE_HOME"]) / "hpcdl" / dirs.HOMES_FILE
    cache.parent.mkdir(parents=True)
    cache.write_text('{"10.77.0.250": "/home/jdoe"}')
    image = tmp_path / "train.sif"
    image.write_bytes(b"\0" * 32 + b"SIF_MAGIC")
    pushed = f"/home/jdoe/hpcdl-images/{remote_name(image, file_sha256(image))}"
    run_dir = tmp_path / "runs" / "pinned"
    res = CliRunner().invoke(cli, ["submit", "-p", "sandbox-remote", "-N", "1", "-G", "1",
                                   "--image", str(image), "--dry-run", "--hang-timeout", "60",
                                   *(["--run-dir", str(run_dir)] if pinned else [])])
    assert res.exit_code == 0, res.output
    found = re.search(r"^# run directory on the cluster (/home/jdoe/hpcdl-runs/\S+?):? ",
                      res.stderr, flags=re.M)
    assert found is not None, res.stderr
    cluster = found[1]
    if pinned:
        assert cluster == "/home/jdoe/hpcdl-runs/pinned"
    else:
        assert posixpath.basename(cluster).startswith("hpcdl-horovod-")
    assert f"#SBATCH --output={cluster}/slurm-%j.out\n" in res.stdout
    assert f"export HPCDL_RUN_DIR={cluster}\n" in res.stdout
    assert f" {pushed} " in res.stdout and str(image) not in res.stdout
    assert str(REPO_ROOT) not in res.stdout and str(tmp_path) not in res.stdout
    # The job watches itself, on the cluster (not refused from a laptop any more).
    assert (f'PYTHONPATH={cluster}/job "$hpcdl_watch_py" -m hpcdl.jobside.hangwatch --job-id '
            f'"$SLURM_JOB_ID" --run-dir {cluster} --timeout 60 --action cancel') in res.stdout
    assert f"# not checked: that {image} was pushed to {pushed}" in res.stderr
    assert not run_dir.exists() and list(Path(os.environ["HPCDL_RUNS"]).glob("*")) == []
    assert list(cache.parent.iterdir()) == [cache]  # the image's hash was not remembered


def test_a_remote_dry_run_with_login_runs_and_images_needs_no_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SshExecutor, "run", lambda *a, **k: pytest.fail("ssh was run"))
    profile = load_profile("sandbox-remote").model_dump(mode="json")
    profile["login"].update(runs="/scratch/jdoe/runs", images="/scratch/jdoe/images")
    path = tmp_path / "remote.yaml"
    path.write_text(yaml.safe_dump(profile))
    res = CliRunner().invoke(cli, ["submit", "-p", str(path), "-N", "1", "-G", "1",
                                   "--no-image", "--dry-run", "--", "hostname"])
    assert res.exit_code == 0, res.output
    assert "#SBATCH --output=/scratch/jdoe/runs/hpcdl-" in res.stdout
    assert "asked" not in res.stderr


def test_a_remote_dry_run_without_any_record_asks_only_for_the_home(
        monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[list[str]] = []

    def run(self: SshExecutor, argv: list[str], **kwargs: object) -> Result:
        asked.append(list(argv))
        return Result(tuple(argv), 0, "/home/jdoe", "")

    monkeypatch.setattr(SshExecutor, "run", run)
    res = CliRunner().invoke(cli, ["submit", "-p", "sandbox-remote", "-N", "1", "-G", "1",
                                   "--no-image", "--dry-run", "--", "hostname"])
    assert res.exit_code == 0, res.output
    assert asked == [dirs_home_argv()]
    assert "#SBATCH --output=/home/jdoe/hpcdl-runs/hpcdl-" in res.stdout
    assert "# asked 10.77.0.250 for $HOME (reads only)" in res.stderr


def dirs_home_argv() -> list[str]:
    from hpcdl.remote import dirs
    return list(dirs._HOME)
