"""Commands and files through a cluster's login node, over one multiplexed OpenSSH
connection.

OpenSSH, not a Python SSH library: it reads the user's ``~/.ssh/config`` (aliases,
ProxyJump, keys, agents, ControlPersist) exactly as their own ``ssh`` does, and a
2FA prompt is answered once, by the master connection, for every command after it.
The master lives at a ControlPath under a directory only the user can read; every
command and every rsync rides on it (``-o ControlMaster=auto``), so a polling cycle
costs one round trip, not one TCP and key exchange.

Remote commands are argv lists: :func:`remote_command` quotes each word for the
remote POSIX shell, so a value never becomes shell syntax there. The remote side
needs only sh, Slurm's commands and rsync: no hpcdl.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from hpcdl.core import proc
from hpcdl.core.tokens import SSH_HOST, SSH_JUMP, SSH_USER, check_token
from hpcdl.errors import ToolError, UserInputError

# The names reach the script as "$@", never as shell text.
_WHICH_ALL = ["sh", "-c", 'for c do printf "%s\\n" "$(command -v "$c")"; done', "sh"]

# A name ``env NAME=VALUE`` sets on the remote side (a value is quoted, a name must be one).
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# ssh's own exit status for "could not connect or authenticate" (a remote command's
# status otherwise comes back unchanged).
SSH_FAILED = 255
CONNECT_TIMEOUT_S = 15
# How long the master connection outlives the last command: long enough to cover the
# gaps between polls, short enough not to linger after hpcdl exits.
PERSIST_S = 300


class RemoteError(ToolError):
    """The login node could not be reached or a command on it failed (exit 1)."""


class ConnectionLost(RemoteError):
    """The login node could not be reached (refused, timed out, connection dropped): it
    may well be back in a moment, so a follow loop tries again."""


class RemoteInputError(UserInputError):
    """The login node named in the profile cannot be used as given (exit 2): unknown
    host, host key not accepted yet or changed, refused key."""


class Shell(Hashable, Protocol):
    """What the cluster-side helpers of hpcdl.remote (its directories, pushed images)
    need of a transport: a command run there, and a name for messages. SshExecutor is
    one; so is any hpcdl.schedulers.executor.Executor, which is how the layers above
    hand theirs over without naming SSH. Hashable: the remote home is asked once per
    transport (remote_home's cache)."""

    @property
    def target(self) -> str: ...

    def run(self, argv: Sequence[str], *, timeout: float,
            check: bool = True) -> proc.Result: ...


@dataclass(frozen=True)
class LoginNode:
    """Where to reach the cluster: an ``~/.ssh/config`` alias or a host name, with what
    ``ssh`` would otherwise take from that config. Every value is checked as a token of
    its kind (none can start with '-', so none is read as an ssh option)."""

    host: str
    user: str | None = None
    port: int | None = None
    identity: str | None = None
    jump: str | None = None

    def __post_init__(self) -> None:
        check_token(self.host, SSH_HOST)
        if self.user is not None:
            check_token(self.user, SSH_USER)
        if self.jump is not None:
            check_token(self.jump, SSH_JUMP)
        if self.port is not None and not 1 <= self.port <= 65535:
            raise ValueError(f"port {self.port}: must be 1 to 65535")
        if self.identity is not None and not os.path.isabs(self.identity):
            raise ValueError(f"identity {self.identity!r}: must be an absolute path")

    @property
    def target(self) -> str:
        """``user@host`` or ``host``: what names the login node in messages and rsync."""
        return f"{self.user}@{self.host}" if self.user else self.host


def control_dir() -> Path:
    """Where the master connections' sockets live: a directory only this user can enter
    (a socket there is a logged-in session)."""
    base = Path(os.environ.get("XDG_RUNTIME_DIR") or Path.home() / ".cache")
    path = base / "hpcdl" / "ssh"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path


def ssh_options(login: LoginNode, sockets: Path, *, batch: bool = True) -> list[str]:
    """The options of every ssh call to ``login`` (without the host): the shared master
    connection, timeouts, and the profile's user, port, key and jump host. ``batch``
    refuses password and 2FA prompts (a command run from a poll loop must fail, not
    wait on a terminal); the first connection may allow them."""
    opts = ["-o", "ControlMaster=auto", "-o", f"ControlPath={sockets}/{_master_tag(login)}",
            "-o", f"ControlPersist={PERSIST_S}", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
            "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=3",
            "-o", f"BatchMode={'yes' if batch else 'no'}"]
    if login.user:
        opts += ["-l", login.user]
    if login.port:
        opts += ["-p", str(login.port)]
    if login.identity:
        opts += ["-i", login.identity, "-o", "IdentitiesOnly=yes"]
    if login.jump:
        opts += ["-J", login.jump]
    return opts


def _master_tag(login: LoginNode) -> str:
    """The master connection's name: one per host, user, port, key and jump host, so a
    profile with another key never rides on a connection authenticated with a different
    one. Short, since a Unix socket path (with ssh's 17-character temporary suffix) must
    fit 107 bytes under the user's home."""
    key = "|".join(str(v) for v in (login.host, login.user, login.port, login.identity,
                                    login.jump))
    return hashlib.sha1(key.encode()).hexdigest()[:16]


def remote_command(argv: Sequence[str]) -> str:
    """``argv`` as one command line for the remote POSIX shell, each word quoted."""
    if not argv:
        raise ValueError("an empty remote command")
    return shlex.join(str(a) for a in argv)


# What ssh says on stderr when it cannot get to a shell, and what hpcdl tells the user.
_UNKNOWN_HOST = re.compile(r"Could not resolve hostname|Name or service not known")
_AUTH = re.compile(r"Permission denied \(|Too many authentication failures")
# OpenSSH (9.2) prints the banner "WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!" and
# "Host key for H has changed and you have requested strict checking." for a key that
# differs from the one recorded; for a host not recorded at all it says only "Host key
# verification failed." (after "No ED25519 host key is known for H and you have
# requested strict checking." under StrictHostKeyChecking=yes), in batch mode or without
# a terminal to ask on. Changed is tested first: its text ends with the same line.
_HOST_KEY_CHANGED = re.compile(r"REMOTE HOST IDENTIFICATION HAS CHANGED|"
                               r"Host key for \S+ has changed")
_HOST_KEY_UNKNOWN = re.compile(r"Host key verification failed|No \S+ host key is known for")
_FINGERPRINT = re.compile(r"\bSHA256:[A-Za-z0-9+/=]+")
_OFFENDING = re.compile(r"Offending \S+ key in (\S+):(\d+)")
_UNREACHABLE = re.compile(r"Connection refused|Connection timed out|No route to host|"
                          r"Network is unreachable|Connection closed|Connection reset|"
                          r"kex_exchange_identification|timed out")


def _where(login: LoginNode) -> str:
    return f"login node {login.target}" + (f" port {login.port}" if login.port else "")


def connection_error(login: LoginNode, stderr: str) -> UserInputError | RemoteError:
    """The one-line error for an ssh call that exited 255: an unknown host, a host key
    not yet accepted or changed, or a refused key is the profile's (or the user's) to fix
    (exit 2); an unreachable host may be passing (exit 1)."""
    said = " ".join(stderr.split())[:300] or "no message"
    where = _where(login)
    if _UNKNOWN_HOST.search(stderr):
        return RemoteInputError(f"{where}: unknown host ({said})")
    if _HOST_KEY_CHANGED.search(stderr):
        return RemoteInputError(_host_key_changed(login, where, stderr))
    if _HOST_KEY_UNKNOWN.search(stderr):
        return RemoteInputError(_host_key_unknown(login, where, said))
    if _AUTH.search(stderr):
        return RemoteInputError(f"{where}: authentication refused ({said}); check the "
                                f"key (login.identity) and that it is in the remote "
                                f"~/.ssh/authorized_keys")
    if _UNREACHABLE.search(stderr):
        return ConnectionLost(f"{where}: unreachable ({said})")
    return RemoteError(f"{where}: ssh failed ({said})")


def _interactive_ssh(login: LoginNode) -> str:
    """The plain ``ssh`` command that reaches ``login`` as hpcdl does (port, jump host),
    for the user to run once in a terminal, where ssh can ask about a host key."""
    argv = ["ssh"]
    if login.port:
        argv += ["-p", str(login.port)]
    if login.jump:
        argv += ["-J", login.jump]
    return shlex.join([*argv, login.target])


def _known_hosts_name(login: LoginNode) -> str:
    """How known_hosts names the login node: ``[host]:port`` off port 22."""
    return f"[{login.host}]:{login.port}" if login.port and login.port != 22 else login.host


def _host_key_unknown(login: LoginNode, where: str, said: str) -> str:
    # Not the key's fault (the text hpcdl used to give): ssh stopped before
    # authenticating, since it had no terminal to ask whether to trust a new host.
    scan = shlex.join(["ssh-keyscan", *(["-p", str(login.port)] if login.port else []),
                       login.host])
    how = (f"check its fingerprint with the site, then accept it once by connecting in a "
           f"terminal: {_interactive_ssh(login)}")
    if not login.jump:  # ssh-keyscan cannot go through a jump host
        how += f" (or add it with: {scan} >> ~/.ssh/known_hosts)"
    return f"{where}: its host key is not in ~/.ssh/known_hosts yet ({said}); {how}"


def _host_key_changed(login: LoginNode, where: str, stderr: str) -> str:
    found = _FINGERPRINT.search(stderr)
    offending = _OFFENDING.search(stderr)
    record = f"{offending[1]} line {offending[2]}" if offending else "~/.ssh/known_hosts"
    sent = f"; it now sends {found[0]}" if found else ""
    remove = shlex.join(["ssh-keygen", "-R", _known_hosts_name(login)]
                        + (["-f", offending[1]] if offending else []))
    return (f"{where}: its host key has CHANGED from the one recorded in {record} "
            f"(ssh: REMOTE HOST IDENTIFICATION HAS CHANGED{sent}); this can be an attack: "
            f"ask the site whether the key changed and what its fingerprint is, and only "
            f"then remove the old one ({remove}) and accept the new one once in a "
            f"terminal: {_interactive_ssh(login)}")


@dataclass(frozen=True)
class SshExecutor:
    """Runs argv lists on the login node (through hpcdl.core.proc, the one place hpcdl runs
    programs) and moves directories there and back with rsync, all over one master
    connection."""

    login: LoginNode
    sockets: Path

    # The Executor protocol's facts of a transport: the commands run elsewhere.
    remote = True

    @classmethod
    def for_login(cls, login: LoginNode) -> SshExecutor:
        return cls(login, control_dir())

    @property
    def target(self) -> str:
        return self.login.target

    @property
    def where(self) -> str:
        """How the one-line errors name the login node (its port when not ssh's)."""
        return _where(self.login)

    def ssh_argv(self, argv: Sequence[str]) -> list[str]:
        """The local argv that runs ``argv`` on the login node."""
        return ["ssh", *ssh_options(self.login, self.sockets), self.login.host, "--",
                remote_command(argv)]

    def terminal_argv(self, argv: Sequence[str]) -> list[str]:
        """The local argv that runs ``argv`` on the login node attached to this terminal:
        ``ssh -t`` (a terminal there, for a program that asks, such as an allocation's
        shell), prompts allowed, on the same master connection and options as ``run``."""
        return ["ssh", "-t", *ssh_options(self.login, self.sockets, batch=False),
                self.login.host, "--", remote_command(argv)]

    def terminal(self, argv: Sequence[str], env: dict[str, str]
                 ) -> tuple[list[str], dict[str, str]]:
        """The Executor protocol's terminal: ``ssh -t LOGIN -- env NAME=VALUE ... ARGV``
        (terminal_argv), every word quoted for the remote shell: ssh does not carry the
        environment, ``env`` sets it there; nothing is added here."""
        for name in env:
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(f"environment variable name {name!r}")
        words = ["env", *(f"{k}={v}" for k, v in env.items()), *argv] if env else list(argv)
        return self.terminal_argv(words), {}

    def run(self, argv: Sequence[str], *, timeout: float = 60, check: bool = True,
            input: str | None = None) -> proc.Result:
        """Run ``argv`` on the login node. A connection failure raises the one-line
        error of :func:`connection_error` whatever ``check`` says; the remote
        command's own failure raises RemoteError only with ``check``. The result
        carries the remote argv, so messages name what ran there."""
        res = proc.run(self.ssh_argv(argv), timeout=timeout, check=False, input=input,
                       error_cls=RemoteError)
        if res.returncode == SSH_FAILED and _ssh_said(res.stderr):
            raise connection_error(self.login, res.stderr)
        remote = proc.Result(tuple(str(a) for a in argv), res.returncode, res.stdout,
                             res.stderr)
        if check and not remote.ok:
            message = (res.stderr or res.stdout).strip() or f"exit code {res.returncode}"
            raise RemoteError(f"{argv[0]} on {self.login.target} failed (exit "
                              f"{res.returncode}): {' '.join(message.split())[:500]}",
                              argv=list(remote.argv), returncode=res.returncode,
                              output=res.stdout + res.stderr)
        return remote

    def which(self, name: str) -> str | None:
        """Where the login node finds the command ``name`` (its shell's ``command -v``),
        or None: the Executor protocol's question, asked remotely."""
        return self.which_all([name])[name]

    def which_all(self, names: Sequence[str]) -> dict[str, str | None]:
        """``which`` of each name in one remote command: a line per name, empty when
        the login node's shell does not find it."""
        res = self.run([*_WHICH_ALL, *names], check=False)
        lines = res.stdout.split("\n") if res.ok else []
        return {name: (lines[i].strip() or None) if i < len(lines) else None
                for i, name in enumerate(names)}

    def connect(self, *, timeout: float = 120) -> None:
        """Open the master connection now, prompts allowed (a key's passphrase, 2FA):
        later commands run in batch mode on it. Raises the one-line errors."""
        argv = ["ssh", *ssh_options(self.login, self.sockets, batch=False),
                self.login.host, "--", "true"]
        res = proc.run(argv, timeout=timeout, check=False, error_cls=RemoteError)
        if not res.ok:
            raise connection_error(self.login, res.stderr)

    def master_running(self) -> bool:
        """Whether this login node's master connection is up (``ssh -O check``)."""
        return self._control("check").ok

    def close(self) -> None:
        """Stop the master connection (``ssh -O exit``); nothing to stop is fine."""
        self._control("exit")

    def _control(self, command: str) -> proc.Result:
        """``ssh -O COMMAND``: a request to this login node's master connection."""
        return proc.run(["ssh", *ssh_options(self.login, self.sockets), "-O", command,
                         self.login.host], timeout=30, check=False, error_cls=RemoteError)

    def rsync_argv(self, source: str, dest: str, *, delete: bool = False,
                   link_dest: Sequence[str] = (), exclude: Sequence[str] = ()) -> list[str]:
        """rsync over this connection; a remote side is written ``:PATH``. Paths are
        passed with --protect-args, so the remote shell never splits or expands them.
        ``link_dest``: directories (relative to the destination) whose identical files
        are hard-linked instead of sent; ``exclude``: rsync patterns left out."""
        shell = shlex.join(["ssh", *ssh_options(self.login, self.sockets)])
        argv = ["rsync", "--archive", "--compress", "--stats", "--protect-args",
                "--rsh", shell]
        if delete:
            argv.append("--delete")
        if link_dest:
            # rsync's quick check (size and mtime to the second) would link a sibling's
            # job.sbatch of the same length written in the same second: compare contents.
            argv.append("--checksum")
        argv += [f"--link-dest={d}" for d in link_dest]
        argv += [f"--exclude={p}" for p in exclude]
        return [*argv, *(self._side(p) for p in (source, dest))]

    def _side(self, path: str) -> str:
        return f"{self.login.host}{path}" if path.startswith(":") else path

    def push(self, local_dir: str | os.PathLike[str], remote_dir: str, *,
             timeout: float = 600, link_dest: Sequence[str] = (),
             parents: bool = True) -> int:
        """Copy ``local_dir``'s content into ``remote_dir`` on the login node (made with
        its parents unless ``parents`` says they exist: rsync makes the last one; only
        what differs moves); returns the bytes sent."""
        return self._rsync(f"{os.fspath(local_dir).rstrip('/')}/", f":{remote_dir}/",
                           timeout, link_dest=link_dest, mkpath=parents)

    def pull(self, remote_dir: str, local_dir: str | os.PathLike[str], *,
             timeout: float = 600, exclude: Sequence[str] = ()) -> int:
        """Copy ``remote_dir``'s content into ``local_dir``; returns the bytes received."""
        return self._rsync(f":{remote_dir.rstrip('/')}/", f"{os.fspath(local_dir)}/", timeout,
                           received=True, exclude=exclude)

    def send_file(self, local_file: str | os.PathLike[str], remote_path: str, *,
                  timeout: float = 600, progress: Callable[[str], None] | None = None) -> int:
        """Copy one file to ``remote_path`` on the login node (its directory must
        exist); returns the bytes sent. ``progress`` is handed each line of rsync's
        ``--progress`` as it comes (a multi-GB image takes minutes over a laptop's
        link); ``timeout`` then bounds the wait once rsync's output ends, and a
        connection that dies mid-copy is ended by ssh's keepalives."""
        source, dest = os.fspath(local_file), f":{remote_path}"
        if progress is None:
            return self._rsync(source, dest, timeout)
        argv = self.rsync_argv(source, dest)
        argv.insert(1, "--progress")
        try:
            res = proc.stream(argv, on_line=progress, timeout=timeout, error_cls=RemoteError)
        except subprocess.TimeoutExpired:
            raise RemoteError(f"rsync to {self.login.target} did not finish within "
                              f"{timeout:g} s of its last output", argv=argv,
                              returncode=124) from None
        except RemoteError as err:
            if err.returncode == 127:
                raise  # rsync is missing: proc's own line says so
            if _ssh_said(err.output):
                raise connection_error(self.login, err.output) from None
            said = [line for line in err.output.splitlines()
                    if line.strip() and not _PROGRESS.match(line)
                    and line != "sending incremental file list"]
            raise self._rsync_failed(argv, err.returncode, " ".join(said[-10:]),
                                     err.output) from None
        return rsync_bytes(res.stdout)

    def _rsync(self, source: str, dest: str, timeout: float, *, received: bool = False,
               link_dest: Sequence[str] = (), exclude: Sequence[str] = (),
               mkpath: bool = False) -> int:
        if mkpath:  # rsync's own --mkpath needs 3.2.3 on the cluster's side too
            self.run(["mkdir", "-p", "--", dest[1:]], timeout=60)
        res = proc.run(self.rsync_argv(source, dest, link_dest=link_dest, exclude=exclude),
                       timeout=timeout, check=False, error_cls=RemoteError)
        if res.returncode and _ssh_said(res.stderr):
            raise connection_error(self.login, res.stderr)
        if not res.ok:
            raise self._rsync_failed(list(res.argv), res.returncode, res.stderr,
                                     res.stdout + res.stderr)
        return rsync_bytes(res.stdout, received=received)

    def _rsync_failed(self, argv: list[str], returncode: int | None, said: str,
                      output: str) -> RemoteError:
        """The one line for an rsync that failed on its own (not ssh's connection)."""
        return RemoteError(f"rsync to {self.login.target} failed (exit {returncode}): "
                           f"{' '.join(said.split())[:500]}", argv=argv,
                           returncode=returncode, output=output)


_SSH_SAID = re.compile(r"^ssh: |^kex_exchange_identification|^Connection closed by", re.M)


def _ssh_said(stderr: str) -> bool:
    """Whether a failure was ssh's own (it could not connect or authenticate) rather than
    the remote command's: a command may exit 255 too, but ssh then said nothing."""
    return any(p.search(stderr) for p in (_SSH_SAID, _UNKNOWN_HOST, _HOST_KEY_CHANGED,
                                           _HOST_KEY_UNKNOWN, _AUTH, _UNREACHABLE))


_STAT = re.compile(r"^Total bytes (sent|received): ([\d,.]+)", re.M)
# One line of ``rsync --progress``: bytes so far, percent, rate, time left.
_PROGRESS = re.compile(r"\s*([\d,.]+)\s+(\d{1,3})%\s+(\S+/s)\s+(\d+:\d\d:\d\d)")


def rsync_progress(line: str) -> tuple[int, int, str, str] | None:
    """``(bytes, percent, rate, time left)`` from a line of ``rsync --progress``, or
    None for any other line. Pure."""
    m = _PROGRESS.match(line)
    if not m:
        return None
    return int(re.sub(r"[,.]", "", m.group(1))), int(m.group(2)), m.group(3), m.group(4)


def rsync_bytes(stats: str, *, received: bool = False) -> int:
    """The bytes that crossed the wire, from ``rsync --stats``: sent for a push,
    received for a pull (0 when rsync printed no figure)."""
    want = "received" if received else "sent"
    for kind, figure in _STAT.findall(stats):
        if kind == want:
            return int(figure.replace(",", "").replace(".", ""))
    return 0
