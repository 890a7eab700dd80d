"""An ordinary cluster user for the tests, the way a scientist meets hpcdl.

``cluster_user`` (session) creates the Linux account ``hpcuser`` when it is missing
(idempotent; home /home/hpcuser, which the sandbox's nodes share) and installs hpcdl
into a venv **outside /home** (/opt/hpcdl-user/venv-KEY, which the nodes do not see)
from a wheel of this checkout, with Debian's /usr/bin/python3: root's Python lives under
/root, which an ordinary account cannot read. The venv is kept between sessions, keyed by
the wheel's content (tests/integration/user_cache.py): a session whose wheel matches
reuses it instead of building it again. ``cluster_user.run(...)`` runs a command
as that user, from their home, with a clean environment (no root variables, no
PYTHONPATH, the venv's bin first on PATH), the way a login shell would.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import require
from tests.integration.conftest_slurm import DEFAULT_DIR, redirected_sandbox_profile, sandbox_dir
from tests.integration.user_cache import (
    RunRecord,
    Sessions,
    cached_venv,
    point_latest,
    remove,
    wheel_content_hash,
)

REPO = Path(__file__).resolve().parents[2]
USER = "hpcuser"
# The user's venvs (venv-KEY, one per wheel content), the sessions' lock files, and
# venv: a link to the newest, for the benches. $HPCDL_TEST_USER_VENVS: another folder.
VENV_ROOT = Path(os.environ.get("HPCDL_TEST_USER_VENVS") or "/opt/hpcdl-user")
VENV = VENV_ROOT / "venv"  # the link to the newest (bench/bench_cluster_user.py)
SYSTEM_PYTHON = "/usr/bin/python3"
# The user's folders that tests submit runs into: ./runs (HPCDL_RUNS's default, from
# the home) and ~/hpcdl-runs (a `login:` profile's default remote runs folder).
RUN_FOLDERS = ("hpcdl-runs", "runs")
# Where this session's own bytecode cache is named (Makefile: KEEP_BYTECODE); pip must
# not see it, or it compiles the user's venv into root's cache instead of the venv.
BYTECODE_VARS = ("PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE")


def ensure_user(name: str = USER) -> pwd.struct_passwd:
    """The account ``name``, created (with its home under /home) if it does not exist."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name],
                       check=True, timeout=60, capture_output=True)
        return pwd.getpwnam(name)


def install_env() -> dict[str, str]:
    """Root's environment without the bytecode variables: the venv's modules are compiled
    into its own __pycache__, readable by the user, whose commands run with env -i."""
    return {k: v for k, v in os.environ.items() if k not in BYTECODE_VARS}


def build_wheel(folder: Path) -> Path:
    """A wheel of this checkout in ``folder``."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(folder),
                    str(REPO)], check=True, timeout=600, cwd=folder, env=install_env())
    return next(folder.glob("hpcdl-*.whl"))


def venv_key(wheel: Path) -> str:
    """The wheel's content and the interpreter the venv is made from."""
    version = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print(sys.version)"],
                             capture_output=True, text=True, check=True, timeout=60).stdout
    return hashlib.sha256(f"{wheel_content_hash(wheel)}\n{SYSTEM_PYTHON}\n{version}".encode()
                          ).hexdigest()


def _install_venv(venv: Path, wheel: Path) -> None:
    """A fresh venv at ``venv`` with hpcdl installed from ``wheel``."""
    env = install_env()
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", str(venv)], check=True, timeout=300, env=env)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
                   check=True, timeout=900, cwd=venv, env=env)
    # Readable and runnable by everyone, writable by root only: like a site install.
    subprocess.run(["chmod", "-R", "a+rX,go-w", str(venv)], check=True, timeout=120)


@dataclass(frozen=True)
class ClusterUser:
    name: str
    uid: int
    gid: int
    home: Path
    venv: Path
    extra_env: tuple[tuple[str, str], ...] = ()
    # What this session's commands made in the run folders (None: nothing recorded).
    record: RunRecord | None = dataclasses.field(default=None, compare=False, repr=False)

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
        return self.recorded(lambda: subprocess.run(
            command, capture_output=True, text=True, timeout=timeout,
            cwd=str(cwd or self.home), input=input, check=False))

    def recorded(self, run: Callable[[], subprocess.CompletedProcess[str]]
                 ) -> subprocess.CompletedProcess[str]:
        """``run()``, with what it made in the user's run folders recorded as this
        session's (named in its output where another session ran meanwhile)."""
        if self.record is None:
            return run()

        def command() -> tuple[str, subprocess.CompletedProcess[str]]:
            done = run()
            return f"{done.stdout}\n{done.stderr}", done
        return self.record.around(command)

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
    directories this session's commands made in the user's run folders are removed at its
    end when every test passed: a ResNet run keeps ~100 MB of checkpoints and a sweep
    ~700 MB, and a machine that runs the suite many times fills its disk otherwise. Only
    this session's (user_cache.RunRecord): another session's live runs stay."""
    require(os.geteuid() == 0, "creating the test user needs root")
    require(shutil.which("runuser") is not None, "runuser (util-linux) is missing")
    require(Path(SYSTEM_PYTHON).exists(), f"{SYSTEM_PYTHON} (Debian's python3) is missing")
    entry = ensure_user()
    VENV_ROOT.mkdir(parents=True, exist_ok=True)
    VENV_ROOT.chmod(0o755)
    with tempfile.TemporaryDirectory() as wheels:
        wheel = build_wheel(Path(wheels))
        venv = cached_venv(VENV_ROOT, venv_key(wheel),
                           lambda path: _install_venv(path, wheel))
    point_latest(VENV, venv.path)
    home = Path(entry.pw_dir)
    sessions = Sessions(VENV_ROOT / "sessions")
    record = RunRecord(tuple(home / folder for folder in RUN_FOLDERS), sessions)
    try:
        yield ClusterUser(entry.pw_name, entry.pw_uid, entry.pw_gid, home, venv.path,
                          record=record)
        if not request.session.testsfailed:  # else kept for whoever reads the failure
            remove(record.to_remove())
    finally:
        sessions.close()
        venv.release()


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
