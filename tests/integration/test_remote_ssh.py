"""hpcdl.remote.ssh against a real OpenSSH server, as the ordinary test user.

The server: Debian's sshd, started by the test as root on 127.0.0.1 at a free port,
key-only (no passwords, no PAM), accepting only the test user, whose key this test makes.
The client: hpcdl's SshExecutor run as that user (the user's venv python with this
checkout first on its path), the way a laptop reaches a login node: the host key is in
the user's known_hosts, as after a first ``ssh`` by hand.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import require
from tests.integration.conftest_user import REPO, ClusterUser
from tests.own_cluster import free_port

pytestmark = pytest.mark.timeout(300)

SSHD = "/usr/sbin/sshd"


@dataclass(frozen=True)
class Login:
    port: int
    key: Path  # the user's private key
    log: Path  # sshd's log (-E)
    work: Path  # a directory of the user's for the test's files


def _as_root(argv: list[str]) -> None:
    subprocess.run(argv, check=True, timeout=60, capture_output=True)


@contextlib.contextmanager
def sshd(user: ClusterUser, extra_config: str = "") -> Iterator[Login]:
    """A key-only sshd on 127.0.0.1 at a free port, accepting only ``user`` with a key
    made here; ``extra_config``: more sshd_config lines (e.g. SetEnv)."""
    require(Path(SSHD).exists(), "openssh-server is not installed (scripts/setup.sh installs it)")
    require(shutil.which("rsync") is not None, "rsync is missing")
    # sshd reads the key list as the user and (StrictModes) wants every directory above
    # it root-owned and not world-writable: /run is, the test's tmp dirs are not.
    etc = Path(tempfile.mkdtemp(prefix="hpcdl-test-sshd-", dir="/run"))
    os.chmod(etc, 0o755)
    _as_root(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(etc / "host_key")])
    work = user.own(Path("/scratch") / "tmp" / f"hpcdl-ssh-{os.getpid()}-{etc.name}")
    os.chmod(work, 0o700)
    key = work / "id_ed25519"
    done = user.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)])
    assert done.returncode == 0, done.stderr
    keys = etc / "authorized"
    keys.mkdir(mode=0o755)
    shutil.copy(f"{key}.pub", keys / user.name)
    os.chmod(keys / user.name, 0o644)
    # useradd leaves the account locked ('!'), which sshd refuses even for a key: a
    # cluster account has no usable password, not a locked one.
    _as_root(["usermod", "-p", "*", user.name])
    port = free_port()
    (etc / "sshd_config").write_text(textwrap.dedent(f"""\
        ListenAddress 127.0.0.1
        Port {port}
        HostKey {etc}/host_key
        PidFile {etc}/sshd.pid
        AuthorizedKeysFile {keys}/%u
        AuthenticationMethods publickey
        PasswordAuthentication no
        KbdInteractiveAuthentication no
        UsePAM no
        AllowUsers {user.name}
        LogLevel VERBOSE
        """) + extra_config)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
    log = etc / "sshd.log"
    server = subprocess.Popen([SSHD, "-D", "-f", str(etc / "sshd_config"), "-E", str(log)])
    try:
        known = user.home / ".ssh"
        user.own(known)
        os.chmod(known, 0o700)
        host_key = (etc / "host_key.pub").read_text().split()
        entry = f"[127.0.0.1]:{port} {host_key[0]} {host_key[1]}\n"
        with open(known / "known_hosts", "a", encoding="utf-8") as fh:
            fh.write(entry)
        os.chown(known / "known_hosts", user.uid, user.gid)
        for _ in range(100):  # sshd listens within a second or so
            if log.exists() and "Server listening" in log.read_text():
                break
            time.sleep(0.1)
        yield Login(port, key, log, work)
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(etc, ignore_errors=True)


@pytest.fixture(scope="module")
def login(cluster_user: ClusterUser) -> Iterator[Login]:
    with sshd(cluster_user) as server:
        yield server


def client(user: ClusterUser, login: Login, code: str, **login_kw: object) -> dict:
    """Run ``code`` as the user with ``ex`` (an SshExecutor for the test's login node)
    defined; it sets ``out`` (a dict), printed back as JSON. An hpcdl error becomes
    ``{"error": message, "exit_code": n, "type": class name}``."""
    kw = {"host": "127.0.0.1", "user": user.name, "port": login.port,
          "identity": str(login.key), **login_kw}
    program = textwrap.dedent("""\
        import json, sys
        from hpcdl.errors import HpcdlError
        from hpcdl.remote.ssh import LoginNode, SshExecutor
        ex = SshExecutor.for_login(LoginNode(**json.loads(sys.argv[1])))
        out = {}
        try:
        """) + textwrap.indent(textwrap.dedent(code).strip() + "\n", "    ") + textwrap.dedent("""\
        except HpcdlError as err:
            out = {"error": err.message, "exit_code": err.exit_code, "type": type(err).__name__}
        print(json.dumps(out))
        """)
    res = user.run([str(user.venv / "bin" / "python"), "-c", program, json.dumps(kw)],
                   env={"PYTHONPATH": str(REPO)}, timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_commands_reach_the_login_node_quoted_over_one_connection(
        cluster_user: ClusterUser, login: Login) -> None:
    tricky = "a b; echo $(id -u) `x` 'q' \"d\""
    out = client(cluster_user, login, f"""
        ex.connect()
        out["echo"] = ex.run(["printf", "%s|", {tricky!r}, "two"]).stdout
        out["who"] = ex.run(["id", "-un"]).stdout.strip()
        for _ in range(5):
            ex.run(["true"])
        missing = ex.run(["hpcdl-no-such-tool", "--version"], check=False)
        out["missing"] = [missing.returncode, missing.stderr.strip(), list(missing.argv)]
        out["which"] = [ex.which("sh"), ex.which("hpcdl-no-such-tool")]
        out["master"] = ex.master_running()
        ex.close()
        out["after_close"] = ex.master_running()
        """)
    assert "error" not in out, out
    assert out["echo"] == f"{tricky}|two|"  # each word arrived as one, unexpanded
    assert out["who"] == cluster_user.name
    assert out["missing"][0] == 127 and "hpcdl-no-such-tool" in out["missing"][1]
    assert out["missing"][2] == ["hpcdl-no-such-tool", "--version"]  # the remote argv, not ssh's
    assert out["which"] == ["/usr/bin/sh", None] or out["which"] == ["/bin/sh", None]
    assert out["master"] is True and out["after_close"] is False
    # Eight commands, one connection: sshd accepted the key once.
    assert login.log.read_text().count("Accepted publickey") == 1, login.log.read_text()


def test_push_moves_only_what_changed_and_pull_brings_it_back(
        cluster_user: ClusterUser, login: Login) -> None:
    src = cluster_user.own(login.work / "src")
    (src / "big.bin").write_bytes(os.urandom(512 * 1024))
    (src / "train.py").write_text("print('hello')\n")
    for p in src.iterdir():
        os.chown(p, cluster_user.uid, cluster_user.gid)
    remote, back = login.work / "remote", login.work / "back"
    out = client(cluster_user, login, f"""
        out["first"] = ex.push({str(src)!r}, {str(remote)!r})
        out["again"] = ex.push({str(src)!r}, {str(remote)!r})
        out["pulled"] = ex.pull({str(remote)!r}, {str(back)!r})
        """)
    assert "error" not in out, out
    assert out["first"] > 512 * 1024 * 0.9  # random bytes do not compress
    assert out["again"] < 4096, out  # unchanged: file lists and checksums only
    assert out["pulled"] > 512 * 1024 * 0.9
    assert (back / "big.bin").read_bytes() == (src / "big.bin").read_bytes()
    assert (back / "train.py").read_text() == "print('hello')\n"


def test_connection_failures_are_one_line_each(
        cluster_user: ClusterUser, login: Login, tmp_path: Path) -> None:
    unknown = client(cluster_user, login, "ex.run(['true'])", host="no-such-host.invalid")
    assert unknown["type"] == "RemoteInputError" and unknown["exit_code"] == 2
    assert unknown["error"].startswith(f"login node {cluster_user.name}@no-such-host.invalid "
                                       f"port {login.port}: unknown host"), unknown
    stranger = login.work / "stranger"
    made = cluster_user.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)])
    assert made.returncode == 0, made.stderr
    # The master the other tests left running was authenticated with the good key: a
    # command with another key gets its own master, which the server refuses.
    refused = client(cluster_user, login, "ex.run(['true'])", identity=str(stranger))
    assert refused["exit_code"] == 2 and ": authentication refused (" in refused["error"], refused
    closed = client(cluster_user, login, "ex.run(['true'])", port=free_port())
    assert closed["type"] == "ConnectionLost" and closed["exit_code"] == 1
    assert ": unreachable (" in closed["error"] and "Connection refused" in closed["error"]
    # The same server by another name: known_hosts holds its key for [127.0.0.1]:PORT
    # only, so ssh knows no key for [localhost]:PORT and, with no terminal to ask on,
    # stops before authenticating. That is a host key to accept, not a refused key.
    new_key = client(cluster_user, login, "ex.run(['true'])", host="localhost")
    assert new_key["type"] == "RemoteInputError" and new_key["exit_code"] == 2, new_key
    assert new_key["error"].startswith(f"login node {cluster_user.name}@localhost port "
                                       f"{login.port}: its host key is not in "
                                       f"~/.ssh/known_hosts yet ("), new_key
    assert f"ssh -p {login.port} {cluster_user.name}@localhost" in new_key["error"], new_key
    assert "authorized_keys" not in new_key["error"], new_key
    for err in (unknown, refused, closed, new_key):
        assert "\n" not in err["error"]
