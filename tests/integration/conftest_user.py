"""An ordinary cluster user for the tests, the way a scientist meets hpcdl.

``cluster_user`` (session) creates the Linux account ``hpcuser`` when it is missing
(idempotent; home /home/hpcuser, which the sandbox's nodes share) and installs hpcdl
into a venv **outside /home** (/opt/hpcdl-user/venv, which the nodes do not see) from a
wheel of this checkout, with Debian's /usr/bin/python3: root's Python lives under
/root, which an ordinary account cannot read. ``cluster_user.run(...)`` runs a command
as that user, from their home, with a clean environment (no root variables, no
PYTHONPATH, the venv's bin first on PATH), the way a login shell would.
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import require
from tests.integration.conftest_slurm import DEFAULT_DIR, redirected_sandbox_profile, sandbox_dir

REPO = Path(__file__).resolve().parents[2]
USER = "hpcuser"
# $HPCDL_TEST_USER_VENV: another venv for a second checkout's tests on the same machine.
VENV = Path(os.environ.get("HPCDL_TEST_USER_VENV") or "/opt/hpcdl-user/venv")
SYSTEM_PYTHON = "/usr/bin/python3"
# The user's folders that tests submit runs into: ./runs (HPCDL_RUNS's default, from
# the home) and ~/hpcdl-runs (a `login:` profile's default remote runs folder).
RUN_FOLDERS = ("hpcdl-runs", "runs")


def ensure_user(name: str = USER) -> pwd.struct_passwd:
    """The account ``name``, created (with its home under /home) if it does not exist."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name],
                       check=True, timeout=60, capture_output=True)
        return pwd.getpwnam(name)


def _install_venv(venv: Path) -> None:
    """A fresh venv at ``venv`` with hpcdl installed from a wheel of the checkout."""
    if venv.exists():
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", str(venv)], check=True, timeout=300)
    with tempfile.TemporaryDirectory() as wheels:
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "wheel", "-q", "--no-deps",
                        "-w", wheels, str(REPO)], check=True, timeout=600, cwd=wheels)
        wheel = next(Path(wheels).glob("hpcdl-*.whl"))
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
                       check=True, timeout=900, cwd=wheels)
    # Readable and runnable by everyone, writable by root only: like a site install.
    subprocess.run(["chmod", "-R", "a+rX,go-w", str(venv.parent)], check=True, timeout=120)


@dataclass(frozen=True)
class ClusterUser:
    name: str
    uid: int
    gid: int
    home: Path
    venv: Path
    extra_env: tuple[tuple[str, str], ...] = ()

    @property
    def hpcdl(self) -> str:
        return str(self.venv / "bin" / "hpcdl")

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        base = {
            "HOME": str(self.home), "USER": self.name, "LOGNAME": self.name,
            "PATH": f"{self.venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8", "SHELL": "/bin/bash",
        }
        if os.environ.get("SLURM_CONF"):  # a developer's own sandbox directory
            base["SLURM_CONF"] = os.environ["SLURM_CONF"]
        return {**base, **dict(self.extra_env), **(extra or {})}

    def run(self, argv: Sequence[str], *, cwd: Path | None = None, timeout: float = 300,
            env: Mapping[str, str] | None = None, input: str | None = None,
            ) -> subprocess.CompletedProcess[str]:
        """``argv`` as this user (runuser: no password, no login shell), from ``cwd``
        (default: the user's home), with the user's clean environment plus ``env``."""
        environment = self.env(env)
        command = ["runuser", "-u", self.name, "--", "env", "-i",
                   *(f"{k}={v}" for k, v in environment.items()), *argv]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              cwd=str(cwd or self.home), input=input, check=False)

    def cli(self, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
        """The installed ``hpcdl`` command as this user."""
        return self.run([self.hpcdl, *args], **kw)  # type: ignore[arg-type]

    def own(self, path: Path) -> Path:
        """``path`` (a directory, created) owned by this user."""
        path.mkdir(parents=True, exist_ok=True)
        os.chown(path, self.uid, self.gid)
        return path


@pytest.fixture(scope="session")
def cluster_user(request: pytest.FixtureRequest) -> Iterator[ClusterUser]:
    """An ordinary user with hpcdl installed from a wheel into a venv outside /home.

    The account and its home outlive the session (the next run reuses them), so the run
    directories this session's jobs left in the user's run folders are removed at its
    end when every test passed: a ResNet run keeps ~100 MB of checkpoints and a sweep
    ~700 MB, and a machine that runs the suite many times fills its disk otherwise."""
    require(os.geteuid() == 0, "creating the test user needs root")
    require(shutil.which("runuser") is not None, "runuser (util-linux) is missing")
    require(Path(SYSTEM_PYTHON).exists(), f"{SYSTEM_PYTHON} (Debian's python3) is missing")
    entry = ensure_user()
    _install_venv(VENV)
    home = Path(entry.pw_dir)
    before = {folder: _entries(home / folder) for folder in RUN_FOLDERS}
    yield ClusterUser(entry.pw_name, entry.pw_uid, entry.pw_gid, home, VENV)
    if request.session.testsfailed:
        return  # kept for whoever reads the failure
    for folder, old in before.items():
        for name in _entries(home / folder) - old:
            shutil.rmtree(home / folder / name, ignore_errors=True)


def _entries(folder: Path) -> set[str]:
    return set(os.listdir(folder)) if folder.is_dir() else set()


@pytest.fixture(scope="session")
def sandbox_user(cluster_user: ClusterUser, slurm_cluster: Path) -> ClusterUser:
    """``cluster_user`` on the sandbox: for a developer's own sandbox directory, the
    user's ``sandbox`` profile binds that cluster's TmpFS (a private XDG_CONFIG_HOME of
    the user's, as slurm_cluster does for root)."""
    folder = sandbox_dir()
    if str(folder) == DEFAULT_DIR:
        return cluster_user
    config = cluster_user.own(cluster_user.home / ".config-hpcdl-test")
    target = config / "hpcdl" / "profiles" / "sandbox.yaml"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(redirected_sandbox_profile(folder))
    subprocess.run(["chown", "-R", f"{cluster_user.uid}:{cluster_user.gid}", str(config)],
                   check=True, timeout=60)
    return dataclasses.replace(cluster_user, extra_env=(("XDG_CONFIG_HOME", str(config)),))
