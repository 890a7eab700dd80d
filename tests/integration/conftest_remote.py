"""A laptop for the tests: the ordinary test user, off the cluster, reaching it through
the sandbox's SSH login node (scripts/sandbox-login.sh) with the bundled
``sandbox-remote`` profile.

``laptop`` (session) starts the login node, gives the user a key the login node accepts
and its host key in the user's known_hosts (as after a first ``ssh`` by hand), and runs
commands as that user in a mount namespace of their own where the cluster is out of
reach: PATH holds hpcdl's venv and a directory of links to ssh, rsync and a shell's
basics (no Slurm command), and tmpfs mounts hide Slurm's configuration (the sandbox's
etc/, /etc/slurm) and the remote runs and images directories (the login node, in the
host's mount namespace, sees them). Whatever reaches the cluster goes over SSH.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import require
from tests.integration.conftest_slurm import DEFAULT_DIR, sandbox_dir
from tests.integration.conftest_user import REPO, ClusterUser

LOGIN_HOST = "10.77.0.250"
# scripts/sandbox-login.sh's network namespace of the default sandbox's login node.
LOGIN_NETNS = f"hpcdl-{hashlib.sha1(DEFAULT_DIR.encode()).hexdigest()[:6]}-login"
LOGIN_SCRIPT = REPO / "scripts" / "sandbox-login.sh"
# What a laptop has on PATH besides hpcdl: no sbatch, squeue, scontrol, srun.
LAPTOP_TOOLS = ("ssh", "ssh-keygen", "rsync", "sh", "bash", "env", "cat", "ls", "mkdir", "rm", "cp", "mv",
                "python3", "id", "true", "false", "sleep", "kill", "ps", "pkill")
LAPTOP_BIN = Path("/opt/hpcdl-laptop/bin")
# The shell script that runs as root in the laptop's mount namespace: hide each path
# up to "--" under an empty tmpfs, then run the rest (runuser ... as the user).
_HIDE = ('while [ "$1" != -- ]; do mount -t tmpfs -o size=1m,mode=0755 hpcdl-laptop "$1"; '
         'shift; done; shift; exec "$@"')


@dataclass(frozen=True)
class Laptop:
    user: ClusterUser
    remote_runs: Path  # the sandbox-remote profile's runs directory, as the cluster sees it
    remote_images: Path
    hidden: tuple[str, ...]

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = self.user.env(extra)
        env["PATH"] = f"{self.user.venv / 'bin'}:{LAPTOP_BIN}"
        env.pop("SLURM_CONF", None)
        return env

    def run(self, argv: Sequence[str], *, cwd: Path | None = None, timeout: float = 300,
            env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """``argv`` as the user on the laptop, from ``cwd`` (default: their home)."""
        # Recorded as the user's own commands are: what it made in the run folders (the
        # cluster side's ~/hpcdl-runs) is this session's to remove at the end.
        return self.user.recorded(lambda: subprocess.run(
            self._argv(argv, env), capture_output=True, text=True, timeout=timeout,
            cwd=str(cwd or self.user.home), check=False))

    def cli(self, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
        """The installed ``hpcdl`` as the user on the laptop."""
        return self.run([self.user.hpcdl, *args], **kw)  # type: ignore[arg-type]

    def start(self, *args: str, cwd: Path, env: Mapping[str, str] | None = None,
              ) -> subprocess.Popen[str]:
        """``hpcdl ARGS`` as run() runs it, without waiting (pipes for its output)."""
        return subprocess.Popen(self._argv([self.user.hpcdl, *args], env), cwd=str(cwd),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def _argv(self, argv: Sequence[str], env: Mapping[str, str] | None) -> list[str]:
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", _HIDE,
                "sh", *self.hidden, "--", "runuser", "-u", self.user.name, "--", "env",
                "-i", *(f"{k}={v}" for k, v in self.env(env).items()), *argv]


def _as_user(user: ClusterUser, argv: list[str]) -> str:
    res = user.run(argv)
    assert res.returncode == 0, f"{argv}: {res.stdout}{res.stderr}"
    return res.stdout


def trust_login_node(user: ClusterUser, host: str, folder: Path) -> None:
    """The user's key in their authorized_keys (homes are shared with the login node) and
    the login node's host key in their known_hosts, replacing an older one for ``host``."""
    ssh = user.own(user.home / ".ssh")
    os.chmod(ssh, 0o700)
    key = ssh / "id_ed25519"
    if not key.exists():
        _as_user(user, ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)])
    public = (ssh / "id_ed25519.pub").read_text().strip()
    authorized = ssh / "authorized_keys"
    lines = authorized.read_text().splitlines() if authorized.exists() else []
    if public not in lines:
        authorized.write_text("\n".join([*lines, public]) + "\n")
    known = ssh / "known_hosts"
    host_key = (folder / "login" / "host_ed25519.pub").read_text().split()
    kept = [line for line in (known.read_text().splitlines() if known.exists() else [])
            if line.split(" ", 1)[0] != host]
    known.write_text("\n".join([*kept, f"{host} {host_key[0]} {host_key[1]}"]) + "\n")
    for path in (authorized, known):
        os.chown(path, user.uid, user.gid)
        os.chmod(path, 0o600)
    # useradd leaves the account locked ('!'), which sshd refuses even for a key.
    subprocess.run(["usermod", "-p", "*", user.name], check=True, timeout=60,
                   capture_output=True)


def _laptop_bin() -> None:
    LAPTOP_BIN.mkdir(parents=True, exist_ok=True)
    for tool in LAPTOP_TOOLS:
        found = shutil.which(tool, path="/usr/bin:/bin")
        link = LAPTOP_BIN / tool
        if found and not link.exists():
            link.symlink_to(found)


@pytest.fixture(scope="session")
def laptop(cluster_user: ClusterUser, slurm_cluster: Path) -> Laptop:
    """The test user on a "laptop" that reaches the sandbox only through its login node."""
    folder = sandbox_dir()
    require(str(folder) == DEFAULT_DIR,
            "the sandbox-remote profile names the default sandbox's login node")
    require(Path("/usr/sbin/sshd").exists(),
            "openssh-server is not installed (scripts/setup.sh installs it)")
    res = subprocess.run(["bash", str(LOGIN_SCRIPT), "up"], capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    trust_login_node(cluster_user, LOGIN_HOST, folder)
    _laptop_bin()
    runs = cluster_user.own(cluster_user.home / "hpcdl-runs")
    images = cluster_user.own(cluster_user.home / "hpcdl-images")
    hidden = [str(folder / "etc"), str(runs), str(images)]
    if Path("/etc/slurm").is_dir():
        hidden.append("/etc/slurm")
    return Laptop(cluster_user, runs, images, tuple(hidden))
