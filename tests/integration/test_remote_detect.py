"""`hpcdl profiles detect --login` from a laptop (the ``laptop`` fixture: the test user
with no Slurm command or configuration in reach) through the sandbox's SSH login node:
the profile it writes describes the sandbox exactly as detection on the cluster does,
names the login node, and works from the laptop straight away (validate, diff); every
command rode one SSH connection (the login node's sshd log says so). A host that does
not resolve, a key the login node refuses and a login node without Slurm (an sshd of
the test's own on loopback whose sessions' PATH has none) are one line each, exit 2.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcdl.profiles import load_profile, load_profile_file
from hpcdl.profiles.schema import Login
from hpcdl.schedulers.slurm.describe import MODE_NOTE
from hpcdl.schedulers.slurm.detect import COMMANDS
from tests.integration.conftest_remote import LAPTOP_BIN, LOGIN_HOST, Laptop
from tests.integration.conftest_slurm import sandbox_dir
from tests.integration.test_profiles_detect import compared_fields
from tests.integration.test_remote_ssh import Login as Sshd
from tests.integration.test_remote_ssh import sshd

SSHD = "/usr/sbin/sshd"


def sockets_dir(laptop: Laptop) -> Path:
    """A directory of the user's for hpcdl's master sockets (XDG_RUNTIME_DIR): none of
    another test's masters there, and a short path (a socket's path has at most 107
    bytes, and ssh's names take 75 of them)."""
    return laptop.user.own(Path(tempfile.mkdtemp(prefix="hd-", dir="/tmp")))


def stop_masters(laptop: Laptop, sockets: Path, *ssh_args: str) -> None:
    """Stop the master connections hpcdl left under ``sockets`` (ControlPersist would
    keep each up for minutes after the test)."""
    for socket in (sockets / "hpcdl" / "ssh").glob("*"):
        laptop.user.run(["ssh", "-o", f"ControlPath={socket}", "-O", "exit", *ssh_args],
                        timeout=30)
    shutil.rmtree(sockets, ignore_errors=True)


pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]


@pytest.fixture
def folder(laptop: Laptop) -> Iterator[Path]:
    """A directory of the user's for the detected profile (their home is shared with
    the login node, as on a cluster, but nothing here reads it from there)."""
    path = laptop.user.home / "hpcdl-detect-test"
    shutil.rmtree(path, ignore_errors=True)
    laptop.user.own(path)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def own_key(laptop: Laptop, folder: Path) -> Iterator[tuple[Path, str, Path]]:
    """A key of this test's own in the user's authorized_keys (its fingerprint picks this
    test's connections out of the login node's log, which other sessions write too), its
    fingerprint, and a directory for ssh's master sockets (none left by another test);
    the master stopped and the key removed afterwards."""
    key = folder / "id_detect"
    made = laptop.user.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C",
                            "hpcdl-detect-test", "-f", str(key)])
    assert made.returncode == 0, made.stderr
    public = Path(f"{key}.pub").read_text().strip()
    printed = laptop.user.run(["ssh-keygen", "-l", "-f", f"{key}.pub"]).stdout.split()
    authorized = laptop.user.home / ".ssh" / "authorized_keys"
    with authorized.open("a") as keys:
        keys.write(public + "\n")
    sockets = sockets_dir(laptop)
    try:
        yield key, printed[1], sockets
    finally:
        stop_masters(laptop, sockets, LOGIN_HOST)
        kept = [line for line in authorized.read_text().splitlines() if line != public]
        authorized.write_text("".join(f"{line}\n" for line in kept))


def test_laptop_detects_the_sandbox_over_ssh(laptop: Laptop, folder: Path,
                                             own_key: tuple[Path, str, Path]) -> None:
    key, fingerprint, sockets = own_key
    # The laptop has no Slurm: whatever detect reads came over SSH.
    assert laptop.run(["sh", "-c", "command -v scontrol || echo none"]).stdout.strip() == "none"
    log = sandbox_dir() / "login" / "sshd.log"
    start = log.stat().st_size
    out = folder / "sandbox.yaml"
    env = {"XDG_RUNTIME_DIR": str(sockets)}
    res = laptop.cli("profiles", "detect", "--login", f"{laptop.user.name}@{LOGIN_HOST}",
                     "--identity", str(key), "--name", "sandbox", "-o", str(out),
                     timeout=120, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    assert f"note: {MODE_NOTE}" in res.stderr
    # One SSH connection (one key exchange and authentication) carried every command:
    # the master's `true`, `command -v scontrol`, Slurm's commands, `command -v
    # apptainer` and its --version.
    with log.open() as text:
        text.seek(start)
        said = text.read()
    ports = re.findall(rf"Accepted publickey for {laptop.user.name} from \S+ port (\d+) "
                       rf"ssh2: \S+ {re.escape(fingerprint)}", said)
    assert len(ports) == 1, said
    sessions = re.findall(rf"Starting session: command for {laptop.user.name} from \S+ "
                          rf"port {ports[0]} ", said)
    assert len(sessions) == len(COMMANDS) + 4, said
    detected = load_profile_file(out)
    assert detected.login == Login(host=LOGIN_HOST, user=laptop.user.name, identity=str(key))
    assert [p.name for p in detected.partitions] == ["debug", "gpu", "short", "lowprio", "urgent"]
    # Field by field what detection on the cluster itself gives (test_profiles_detect).
    rows = compared_fields(detected, load_profile("sandbox"))
    assert [r for r in rows if r[1] != r[2]] == []
    assert "(on the login node hpcuser@10.77.0.250)" in out.read_text()
    valid = laptop.cli("profiles", "validate", str(out), timeout=60)
    assert valid.returncode == 0, valid.stdout + valid.stderr
    assert valid.stdout.strip() == f"{out}: ok (profile sandbox, 5 partitions)"
    # The header says "check it with hpcdl profiles diff FILE": from the laptop, too.
    diff = laptop.cli("profiles", "diff", str(out), timeout=120, env=env)
    assert diff.returncode == 0, diff.stdout + diff.stderr
    assert diff.stdout.strip().startswith("profile sandbox agrees with cluster ")


def test_unknown_host_is_one_line_exit_2(laptop: Laptop, folder: Path) -> None:
    out = folder / "nowhere.yaml"
    res = laptop.cli("profiles", "detect", "--login", "nosuchhost.invalid", "-o", str(out),
                     timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stdout == ""
    lines = res.stderr.splitlines()
    assert lines[0].startswith("error: login node nosuchhost.invalid: unknown host (ssh: "
                               "Could not resolve hostname nosuchhost.invalid"), res.stderr
    assert all(line.startswith("hint: ") for line in lines[1:]), res.stderr
    assert not out.exists()


def test_refused_key_is_one_line_exit_2(laptop: Laptop, folder: Path) -> None:
    key = folder / "id_other"
    made = laptop.user.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)])
    assert made.returncode == 0, made.stderr
    out = folder / "refused.yaml"
    # A master of the user's good key (another test's) does not carry this key's
    # commands: it gets one of its own, which the login node refuses.
    res = laptop.cli("profiles", "detect", "--login", f"{laptop.user.name}@{LOGIN_HOST}",
                     "--identity", str(key), "-o", str(out), timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    first = res.stderr.splitlines()[0]
    assert first.startswith(f"error: login node {laptop.user.name}@{LOGIN_HOST}: "
                            "authentication refused ("), res.stderr
    assert "Permission denied (publickey)" in first
    assert not out.exists()


@pytest.fixture
def slurmless_login(laptop: Laptop) -> Iterator[Sshd]:
    """A login node without Slurm: an sshd of this test's own on 127.0.0.1 (a free port,
    key-only, a key of its own for the test user) whose sessions get the laptop's PATH
    (a shell's basics, no Slurm command)."""
    with sshd(laptop.user, f"SetEnv PATH={LAPTOP_BIN}\n") as server:
        yield server


def test_login_node_without_slurm_is_one_line_exit_2(laptop: Laptop, folder: Path,
                                                     slurmless_login: Sshd) -> None:
    port, key = slurmless_login.port, str(slurmless_login.key)
    target = f"{laptop.user.name}@127.0.0.1"
    # The login node answers (the connection is fine): only Slurm is missing there.
    shell = laptop.run(["ssh", "-o", "BatchMode=yes", "-i", key, "-p", str(port), target,
                        "echo $PATH; command -v scontrol || echo none"], timeout=60)
    assert shell.returncode == 0, shell.stderr
    assert shell.stdout.split() == [str(LAPTOP_BIN), "none"]
    out = folder / "none.yaml"
    sockets = sockets_dir(laptop)
    try:
        res = laptop.cli("profiles", "detect", "--login", target, "--port", str(port),
                         "--identity", key, "-o", str(out), timeout=120,
                         env={"XDG_RUNTIME_DIR": str(sockets)})
    finally:
        stop_masters(laptop, sockets, "-p", str(port), target)
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.splitlines()
    assert lines[0] == (f"error: login node {target} port {port}: Slurm's scontrol is not on "
                        "the remote PATH (of a non-interactive ssh shell there); is it the "
                        "cluster's login node?"), res.stderr
    assert all(line.startswith("hint: ") for line in lines[1:]), res.stderr
    assert res.stdout == "" and not out.exists()
