"""The release matrix as the ordinary user and from the laptop (issue 41): on the 24.11
and 26.05 release sandboxes (conftest_releases), a native 2-node run

- as ``hpcuser`` (conftest_user: hpcdl from a wheel in a venv outside /home, a clean
  environment, no root), with the release's profile copied into the user's own config:
  the release's commands (the sandbox's bin/ wrappers, scheduler.commands) run as that
  user, and the job's ranks run as that user on the release's nodes;
- from the laptop (conftest_remote's mount namespace: no Slurm command, no Slurm
  configuration), through an SSH login node of that release's cluster
  (scripts/sandbox-login.sh with HPCDL_SANDBOX_DIR, on its bridge at .250) with a
  profile of ``login:`` plus the release's ``scheduler.commands``: every Slurm command
  runs from that directory on the login node, which is how a site's ``module load
  slurm/24.11`` path is served.

22.05 has both in test_cluster_user.py and test_remote.py (the host sandbox).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.integration.conftest_releases import HOST_RELEASE, matrix_releases
from tests.integration.conftest_remote import LOGIN_SCRIPT, Laptop, _laptop_bin, trust_login_node
from tests.integration.conftest_user import ClusterUser

pytestmark = [pytest.mark.slurm, pytest.mark.slurm_matrix, pytest.mark.timeout(600)]

RELEASES = [r for r in matrix_releases() if r != HOST_RELEASE]
# The ranks say who and where they are.
WHO = ("sh", "-c", 'echo "who=$(id -un) on=$(hostname)"')


def _json_line(stdout: str) -> dict:
    return dict(json.loads(stdout.strip().splitlines()[-1]))


def _user_profile(user: ClusterUser, boxes, release: str,  # type: ignore[no-untyped-def]
                  name: str, **extra: object) -> Path:
    """The release's profile (root's, written by `sandbox up`) in a config home of the
    user's, as ``name`` with ``extra`` top-level fields; returns the config home."""
    rel = boxes.get(release)
    source = Path(rel.env["XDG_CONFIG_HOME"]) / "hpcdl" / "profiles" / f"{rel.profile}.yaml"
    data = yaml.safe_load(source.read_text())
    data.update(name=name, **extra)
    config = user.own(user.home / f".config-hpcdl-matrix-{release}")
    target = config / "hpcdl" / "profiles" / f"{name}.yaml"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(yaml.safe_dump(data, sort_keys=False))
    subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(config)], check=True,
                   timeout=60)
    return config


def _ranks(text: str) -> list[tuple[str, str]]:
    return sorted((m.group(1), m.group(2)) for m in re.finditer(r"who=(\S+) on=(\S+)", text))


@pytest.mark.parametrize("release", RELEASES)
def test_a_native_run_as_the_ordinary_user(release: str, release_sandboxes,  # type: ignore[no-untyped-def]
                                           cluster_user: ClusterUser) -> None:
    user = cluster_user
    rel = release_sandboxes.get(release)
    config = _user_profile(user, release_sandboxes, release, rel.profile)
    # Each release's own runs folder (in the user's ./runs): every cluster numbers its
    # jobs from 1, and `hpcdl logs 1` finds a job by its id among the runs there.
    runs = user.own(user.home / "runs" / f"matrix-{release}-{os.getpid()}")
    env = {"XDG_CONFIG_HOME": str(config), "HPCDL_RUNS": str(runs)}
    started = time.monotonic()
    res = user.cli("submit", "-p", rel.profile, "-N", "2", "-G", "1", "--no-image", "--wait",
                   "--json", "--", *WHO, env=env, timeout=300)
    took = time.monotonic() - started
    assert res.returncode == 0, res.stdout + res.stderr
    info = _json_line(res.stdout)
    assert info["state"] == "COMPLETED", info
    assert Path(info["run_dir"]).is_relative_to(user.home), info
    assert _ranks(Path(info["stdout"]).read_text()) == [(user.name, n) for n in sorted(rel.nodes)]
    # The job is the user's for this release's Slurm (its own scontrol, as the user).
    shown = user.run([rel.command("scontrol"), "show", "job", str(info["job_id"])])
    assert re.search(rf"UserId={user.name}\(", shown.stdout), shown.stdout + shown.stderr
    logs = user.cli("logs", str(info["job_id"]), env=env)
    assert logs.returncode == 0 and _ranks(logs.stdout) == _ranks(
        Path(info["stdout"]).read_text()), logs.stdout + logs.stderr
    print(f"\n{release}: as {user.name}, submit --wait of a 2-node native job: {took:.1f} s")


@pytest.fixture
def release_login(release: str, release_sandboxes,  # type: ignore[no-untyped-def]
                  cluster_user: ClusterUser) -> Iterator[tuple[str, Path]]:
    """A login node (sshd) for ``release``'s cluster: its address and the cluster's
    folder; stopped after the test (before the cluster goes down with the session)."""
    require_sshd = Path("/usr/sbin/sshd")
    if not require_sshd.exists():
        pytest.skip("openssh-server is not installed (scripts/setup.sh installs it)")
    release_sandboxes.get(release)
    folder = release_sandboxes.folders[release]
    env = {**os.environ, "HPCDL_SANDBOX_DIR": str(folder)}
    res = subprocess.run(["bash", str(LOGIN_SCRIPT), "up"], capture_output=True, text=True,
                         timeout=120, check=False, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    try:
        found = re.search(r"up at (\d+\.\d+\.\d+\.\d+)", res.stdout)
        assert found, res.stdout
        trust_login_node(cluster_user, found.group(1), folder)
        yield found.group(1), folder
    finally:
        # The test's SSH sessions first (hpcdl's master connection persists on the
        # laptop side): each process in the login node's namespace (sshd's own too,
        # which `down` would kill), by its id; the laptop's master sees its connection
        # close and ends.
        netns = f"hpcdl-{hashlib.sha1(str(folder).encode()).hexdigest()[:6]}-login"
        pids = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True,
                              timeout=30, check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGTERM)
        time.sleep(0.5)  # the sessions' close reaches the laptop while the bridge is up
        subprocess.run(["bash", str(LOGIN_SCRIPT), "down"], capture_output=True, text=True,
                       timeout=120, check=False, env=env)


@pytest.mark.parametrize("release", RELEASES)
def test_a_native_run_from_the_laptop(release: str, release_sandboxes,  # type: ignore[no-untyped-def]
                                      cluster_user: ClusterUser, release_login,
                                      tmp_path: Path) -> None:
    user = cluster_user
    host, folder = release_login
    rel = release_sandboxes.get(release)
    name = f"{rel.profile}-remote"
    config = _user_profile(user, release_sandboxes, release, name, login={"host": host})
    _laptop_bin()
    runs = user.own(user.home / "hpcdl-runs")
    hidden = [str(folder / "etc"), str(runs)]
    if Path("/etc/slurm").is_dir():
        hidden.append("/etc/slurm")
    laptop = Laptop(user, runs, user.home / "hpcdl-images", tuple(hidden))
    project = user.own(user.home / f"matrix-laptop-{release}-{os.getpid()}")
    env = {"XDG_CONFIG_HOME": str(config), "HPCDL_RUNS": str(project / "runs")}
    # The laptop has no Slurm: what reaches the cluster goes over SSH.
    gone = laptop.run(["sh", "-c", f"command -v sbatch || ls {folder / 'etc'}"], env=env)
    assert gone.stdout.strip() == "", gone.stdout
    started = time.monotonic()
    res = laptop.cli("submit", "-p", name, "-N", "2", "-G", "1", "--no-image", "--wait",
                     "--json", "--", *WHO, cwd=project, env=env, timeout=300)
    took = time.monotonic() - started
    assert res.returncode == 0, res.stdout + res.stderr
    info = _json_line(res.stdout)
    assert info["state"] == "COMPLETED", info
    cluster = Path(info["cluster_run_dir"])
    assert cluster.parent == runs, info
    logs = laptop.cli("logs", str(info["job_id"]), cwd=project, env=env)
    assert logs.returncode == 0, logs.stdout + logs.stderr
    assert _ranks(logs.stdout) == [(user.name, n) for n in sorted(rel.nodes)], logs.stdout
    # Submitted by this release's sbatch (the profile's scheduler.commands, on the login
    # node): the job is in this release's cluster, the user's.
    shown = user.run([rel.command("scontrol"), "show", "job", str(info["job_id"])])
    assert re.search(rf"UserId={user.name}\(", shown.stdout), shown.stdout + shown.stderr
    assert f"WorkDir={cluster}" in shown.stdout or str(cluster) in shown.stdout, shown.stdout
    print(f"\n{release}: from the laptop, submit --wait of a 2-node native job: {took:.1f} s")
