"""The Slurm release matrix (issue 41): the ``slurm_release`` fixture runs a test once
per release, each release's cluster brought up once per session and shared by every
test that asks for it.

- 22.05: the host's own sandbox (``slurm_cluster``, Debian 12's packages), profile
  ``sandbox``, Slurm's commands on PATH.
- 24.11, 26.05: ``hpcdl sandbox up --slurm RELEASE --nodes 3`` in a directory of the
  session's own (the matrix's jobs take 2 nodes; the third is the spare of
  test_no_kill_relaunch.py, which kills a node and brings it back: ``restore``) (never the shared sandbox's), profile ``sandbox-RELEASE`` under a
  private config home, commands from the profile's scheduler.commands; taken down when
  the session ends. The first use of a release builds its root filesystem
  (scripts/slurm-rootfs.sh, ~60-90 s, cached by content afterwards).

Tests that talk to Slurm's behaviour carry ``pytest.mark.slurm_matrix`` and take
``slurm_release``. HPCDL_TEST_RELEASES (e.g. ``24.11,26.05``) narrows the matrix, for a
run that must leave one cluster alone. Every release's jobs get their own runs
directory: each cluster numbers its jobs from 1, and `hpcdl status JOBID` finds a job by
its id among the runs there."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hpcdl import sandbox as shape
from tests.conftest import require
from tests.integration.conftest_slurm import hpcdl

HOST_RELEASE = "22.05"
RELEASES = (HOST_RELEASE, *shape.RELEASES)
# Nodes of a release sandbox: 2 for the matrix's jobs, and a spare (an idle slurmd costs
# nothing), so the --no-kill relaunch test shares the session's cluster.
NODES = 3


def matrix_releases() -> tuple[str, ...]:
    """The releases the matrix runs: HPCDL_TEST_RELEASES's, else every one."""
    chosen = os.environ.get("HPCDL_TEST_RELEASES")
    if not chosen:
        return RELEASES
    picked = tuple(r.strip() for r in chosen.split(",") if r.strip())
    unknown = [r for r in picked if r not in RELEASES]
    if unknown:
        raise pytest.UsageError(f"HPCDL_TEST_RELEASES: {', '.join(unknown)} not one of "
                                f"{', '.join(RELEASES)}")
    return picked


def release_command(command: str, *args: str, env: dict[str, str]) -> str:
    """Run one of a release's Slurm commands (a path from its commands directory) with
    a test's environment on top of this one: its stdout and stderr, whatever the exit."""
    res = subprocess.run([command, *args], capture_output=True, text=True, timeout=60,
                         check=False, env={**os.environ, **env})
    return res.stdout + res.stderr


@dataclass(frozen=True)
class SlurmRelease:
    """One release's cluster as a test uses it."""

    release: str
    profile: str
    env: dict[str, str]          # for every hpcdl call: config home, runs directory
    commands: Path | None        # its Slurm commands' directory; None: PATH's
    nodes: tuple[str, ...]

    def command(self, name: str) -> str:
        """The path (or name, on PATH) of the Slurm command ``name`` on this release."""
        return str(self.commands / name) if self.commands else name

    def hpcdl(self, *args: str, timeout: float = 180):  # type: ignore[no-untyped-def]
        return hpcdl(*args, env=self.env, timeout=timeout)


@dataclass
class _Sandboxes:
    base: Path
    runs: Path
    up: dict[str, SlurmRelease] = field(default_factory=dict)
    folders: dict[str, Path] = field(default_factory=dict)

    def get(self, release: str) -> SlurmRelease:
        if release in self.up:
            return self.up[release]
        require(os.geteuid() == 0, "a release sandbox starts Slurm daemons and namespaces")
        folder = Path("/var/lib") / f"hpcdl-test-slurm-{release}-{os.getpid()}"
        env = {"XDG_CONFIG_HOME": str(self.base / "cfg"), "HPCDL_RUNS": str(self.runs / release)}
        self.folders[release] = folder
        self._up(release, folder, env)
        self.up[release] = SlurmRelease(release, shape.profile_name(NODES, release), env,
                                        shape.commands_dir(folder),
                                        tuple(shape.node_names(2, release)))
        return self.up[release]

    def _up(self, release: str, folder: Path, env: dict[str, str]) -> None:
        res = hpcdl("sandbox", "up", "--slurm", release, "--nodes", str(NODES), "--dir",
                    str(folder), env=env, timeout=900)
        assert res.returncode == 0, res.stdout + res.stderr

    def restore(self, release: str, killed: str) -> None:
        """Bring ``release``'s cluster back to every node idle after a test killed the
        node ``killed`` (every process in its namespace). Slurm is told it is down first:
        a node Slurm still counts idle passes ``up``'s wait as soon as its slurmd is
        started, before it listens, and the next job's step failed to launch there
        (seen on 26.05); a down node passes only once its slurmd registered (``up``
        resumes it)."""
        rel = self.up[release]
        env = {**os.environ, "SLURM_CONF": str(self.folders[release] / "etc" / "slurm.conf")}
        subprocess.run([rel.command("scontrol"), "update", f"NodeName={killed}",
                        "State=DOWN", "Reason=hpcdl-test-restore"], capture_output=True,
                       timeout=60, check=False, env=env)
        self._up(release, self.folders[release], rel.env)
        # Back means a job's step runs there, launched from another node as a job's
        # srun is: the restarted slurmd was seen taking a step from the host's srun and
        # yet, in the next second, refusing the next job's from its batch host
        # ("Communication connection failure", 26.05).
        other = next(n for n in rel.nodes if n != killed)
        deadline = time.monotonic() + 120
        while True:
            try:
                res = subprocess.run([rel.command("sbatch"), "--wait", "-N2", "-w",
                                      f"{other},{killed}", "-t", "1", "-o", "/dev/null",
                                      "--wrap", "srun -N2 true"], capture_output=True,
                                     text=True, timeout=60, check=False, env=env)
                if res.returncode == 0:
                    return
                why = res.stderr.strip()
            except subprocess.TimeoutExpired:
                why = "srun: no answer in 30 s"
            assert time.monotonic() < deadline, f"{killed} of {release} not back: {why}"
            time.sleep(1)

    def down(self) -> None:
        for release, folder in self.folders.items():
            if folder.exists():
                res = hpcdl("sandbox", "down", "--slurm", release, "--nodes", str(NODES), "--dir",
                            str(folder), env=self.up.get(release, SlurmRelease(
                                release, "", {}, None, ())).env or None, timeout=300)
                assert res.returncode == 0, res.stdout + res.stderr
                shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(self.runs, ignore_errors=True)


@pytest.fixture(scope="session")
def release_sandboxes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Sandboxes]:
    """The release sandboxes, each brought up on first use and all taken down at the
    end of the session."""
    boxes = _Sandboxes(tmp_path_factory.mktemp("releases"),
                       Path("/scratch") / f"hpcdl-test-matrix-{os.getpid()}")
    try:
        yield boxes
    finally:
        boxes.down()


@pytest.fixture(params=matrix_releases())
def slurm_release(request: pytest.FixtureRequest,
                  release_sandboxes: _Sandboxes) -> SlurmRelease:
    """This test's release: the host's 22.05 sandbox or a release sandbox, up."""
    release = request.param
    if release == HOST_RELEASE:
        request.getfixturevalue("slurm_cluster")
        return SlurmRelease(HOST_RELEASE, "sandbox",
                            {"HPCDL_RUNS": str(release_sandboxes.runs / HOST_RELEASE)}, None,
                            ("n1", "n2"))
    return release_sandboxes.get(release)
