"""Finding the container runtime (apptainer or singularity) and running it.

Root on some VMs lacks capabilities Apptainer asks for by default (CAP_SYS_RESOURCE
on ours): every exec/build then fails with "Requesting capability set ... while
permitted capability set is ...". ``runtime_env`` computes the missing bits and
passes them in APPTAINER_DROP_CAPS, so hpcdl works whether or not the wrapper that
scripts/install-apptainer.sh writes is first on PATH.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from hpcdl.core import proc
from hpcdl.errors import ToolError

RUNTIMES = ("apptainer", "singularity")
INSTALL_HINT = (
    "install Apptainer (on Debian: scripts/install-apptainer.sh) or load the site's module "
    "(e.g. `module load apptainer`), or set container.binary in the profile"
)

# Linux capability numbers -> names, in kernel order (include/uapi/linux/capability.h).
CAPABILITIES = (
    "CAP_CHOWN CAP_DAC_OVERRIDE CAP_DAC_READ_SEARCH CAP_FOWNER CAP_FSETID CAP_KILL CAP_SETGID "
    "CAP_SETUID CAP_SETPCAP CAP_LINUX_IMMUTABLE CAP_NET_BIND_SERVICE CAP_NET_BROADCAST "
    "CAP_NET_ADMIN CAP_NET_RAW CAP_IPC_LOCK CAP_IPC_OWNER CAP_SYS_MODULE CAP_SYS_RAWIO "
    "CAP_SYS_CHROOT CAP_SYS_PTRACE CAP_SYS_PACCT CAP_SYS_ADMIN CAP_SYS_BOOT CAP_SYS_NICE "
    "CAP_SYS_RESOURCE CAP_SYS_TIME CAP_SYS_TTY_CONFIG CAP_MKNOD CAP_LEASE CAP_AUDIT_WRITE "
    "CAP_AUDIT_CONTROL CAP_SETFCAP CAP_MAC_OVERRIDE CAP_MAC_ADMIN CAP_SYSLOG CAP_WAKE_ALARM "
    "CAP_BLOCK_SUSPEND CAP_AUDIT_READ CAP_PERFMON CAP_BPF CAP_CHECKPOINT_RESTORE"
).split()


@dataclass(frozen=True)
class Runtime:
    path: str
    name: str  # apptainer | singularity
    version: str  # e.g. "1.4.5"

    def __str__(self) -> str:
        return f"{self.name} {self.version} ({self.path})"


def missing_capabilities(status_text: str, cap_last_cap: int) -> list[str]:
    """Capabilities the kernel knows (0..cap_last_cap) that ``CapPrm`` lacks. Pure."""
    m = re.search(r"^CapPrm:\s*([0-9a-fA-F]+)", status_text, re.M)
    if not m:
        return []
    permitted = int(m.group(1), 16)
    last = min(cap_last_cap, len(CAPABILITIES) - 1)
    return [CAPABILITIES[i] for i in range(last + 1) if not (permitted >> i) & 1]


def runtime_env() -> dict[str, str]:
    """Extra environment for apptainer: APPTAINER_DROP_CAPS for root when needed."""
    if os.geteuid() != 0 or os.environ.get("APPTAINER_DROP_CAPS"):
        return {}
    try:
        status = Path("/proc/self/status").read_text()
        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    except (OSError, ValueError):
        return {}
    missing = missing_capabilities(status, last)
    return {"APPTAINER_DROP_CAPS": ",".join(missing)} if missing else {}


def parse_version(text: str) -> str:
    """'apptainer version 1.4.5' -> '1.4.5'; 'singularity-ce version 4.1.0' -> '4.1.0'."""
    m = re.search(r"version\s+(\S+)", text)
    return m.group(1) if m else text.strip()


def find_runtime(binary: str | None = None) -> Runtime:
    """The runtime to use: ``binary`` (a profile's container.binary) or apptainer, then
    singularity, on PATH.

    Raises ToolError, saying clearly that neither exists, with the fix as hint.
    """
    candidates = [binary] if binary else list(RUNTIMES)
    for candidate in candidates:
        path = candidate if "/" in candidate else proc.which(candidate)
        if path and os.access(path, os.X_OK):
            result = proc.run([path, "--version"], timeout=30, env=runtime_env(), check=False)
            if not result.ok:
                raise ToolError(
                    f"{path} --version failed (exit {result.returncode}): "
                    f"{(result.stderr or result.stdout).strip()}",
                    argv=[path, "--version"],
                    returncode=result.returncode,
                    hint=INSTALL_HINT,
                )
            out = result.stdout.strip()
            name = "singularity" if out.startswith("singularity") else "apptainer"
            return Runtime(path=path, name=name, version=parse_version(out))
    if binary:
        raise ToolError(f"container runtime '{binary}' not found or not executable", hint=INSTALL_HINT)
    raise ToolError("neither apptainer nor singularity is on PATH", hint=INSTALL_HINT)


# --- how this host lets this user run containers --------------------------------------------

Mode = Literal["setuid", "unprivileged", "root", "unusable"]

# Where the kernel says whether unprivileged users may create user namespaces.
MAX_USER_NAMESPACES = "/proc/sys/user/max_user_namespaces"
USERNS_CLONE = "/proc/sys/kernel/unprivileged_userns_clone"  # Debian/Ubuntu kernels only
FUSE_DEVICE = "/dev/fuse"


@dataclass(frozen=True)
class RuntimeFacts:
    """What decides how (and whether) this user can run a SIF image here.

    Gathered by ``gather_runtime_facts``; judged by ``runtime_mode`` (pure). ``None``
    means "could not be read", which the rules treat as "not available".
    """

    euid: int
    runtime: str | None = None  # apptainer | singularity (None: not found)
    runtime_path: str | None = None
    runtime_version: str | None = None
    conf_path: str | None = None  # apptainer.conf the runtime reads
    allow_setuid: bool | None = None  # its "allow setuid" (None: not readable)
    suid_starter: str | None = None  # path of starter-suid where it exists
    suid_starter_owner: int | None = None  # its uid
    suid_starter_setuid: bool = False  # has the setuid bit
    max_user_namespaces: int | None = None
    unprivileged_userns_clone: int | None = None  # None where the file does not exist
    userns_error: str | None = None  # why `unshare --user` failed (None: it worked / untried)
    squashfuse: str | None = None  # squashfuse_ll or squashfuse on PATH
    fuse2fs: str | None = None  # writable ext3 overlays need it; a SIF does not
    unsquashfs: str | None = None  # what --unsquash needs
    fuse_mode: str | None = None  # /dev/fuse permissions, e.g. "0600" (None: absent)
    fuse_owner: str | None = None  # "root:root"
    fuse_error: str | None = None  # why this user cannot open /dev/fuse (None: they can)
    # What an unprivileged build (--fakeroot) can use
    subuid: bool = False  # this user has a range in /etc/subuid and /etc/subgid
    newuidmap_setuid: bool = False  # /usr/bin/newuidmap is setuid root (maps that range)
    fakeroot_command: str | None = None  # `fakeroot` on PATH (root-mapped namespace builds)

    @property
    def setuid_ready(self) -> bool:
        """The setuid starter is installed (root-owned, setuid bit) and allowed."""
        return bool(self.suid_starter and self.suid_starter_owner == 0
                    and self.suid_starter_setuid and self.allow_setuid)

    @property
    def userns(self) -> bool:
        """Unprivileged user namespaces are enabled (and, where tried, work)."""
        return bool(self.max_user_namespaces and self.max_user_namespaces > 0
                    and self.unprivileged_userns_clone != 0 and not self.userns_error)

    @property
    def fuse(self) -> bool:
        """This user can open /dev/fuse."""
        return self.fuse_mode is not None and self.fuse_error is None


def _decide(f: RuntimeFacts) -> tuple[Mode, str]:
    if not f.runtime:
        return "unusable", "neither apptainer nor singularity is installed"
    if f.euid == 0:
        return "root", "running as root: the runtime mounts images itself"
    if f.setuid_ready:
        return "setuid", f"setuid starter {f.suid_starter} (allow setuid = yes)"
    missing = unprivileged_missing(f)
    if missing:
        return "unusable", f"{setuid_problem(f)}, and " + "; ".join(missing)
    return "unprivileged", "user namespaces + FUSE (squashfuse) as this user"


def unprivileged_missing(f: RuntimeFacts) -> list[str]:
    """What the unprivileged mode lacks here, one phrase each (empty: nothing). Pure."""
    missing = []
    if not f.userns:
        missing.append(userns_problem(f))
    if not f.squashfuse:
        missing.append("squashfuse is not installed")
    if not f.fuse:
        missing.append(fuse_problem(f))
    return missing


def runtime_mode(facts: RuntimeFacts) -> Mode:
    """How this user can run SIF images here. Pure.

    root: running as root. setuid: the root-owned setuid starter exists and
    apptainer.conf allows it. unprivileged: user namespaces, squashfuse and a /dev/fuse
    this user can open (fuse2fs only matters for ext3 overlay images, so it is a fact
    the doctor reports, not a condition of the mode). unusable: none of these
    (``runtime_mode_reason`` says what is missing).
    """
    return _decide(facts)[0]


def runtime_mode_reason(facts: RuntimeFacts) -> str:
    """One line: why ``runtime_mode`` decided what it did (for "unusable": everything
    missing). Pure."""
    return _decide(facts)[1]


def setuid_problem(f: RuntimeFacts) -> str:
    """Why the setuid flow is not available, in one phrase. Pure."""
    if not f.suid_starter:
        return "no setuid starter (starter-suid) is installed"
    if f.suid_starter_owner != 0 or not f.suid_starter_setuid:
        return f"{f.suid_starter} is not a root-owned setuid program"
    if not f.allow_setuid:
        return f"{f.conf_path or 'apptainer.conf'} says allow setuid = no"
    return "the setuid starter is ready"


def userns_problem(f: RuntimeFacts) -> str:
    """What stops unprivileged user namespaces, in one phrase. Pure."""
    if f.unprivileged_userns_clone == 0:
        return "unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone = 0)"
    if not f.max_user_namespaces:
        value = "unreadable" if f.max_user_namespaces is None else "0"
        return f"user namespaces are disabled (user.max_user_namespaces = {value})"
    if f.userns_error:
        return f"user namespaces are blocked: {f.userns_error}"
    return "user namespaces work"


def fuse_problem(f: RuntimeFacts) -> str:
    """What stops this user from using FUSE, in one phrase. Pure."""
    if f.fuse_mode is None:
        return f"{FUSE_DEVICE} does not exist (the fuse kernel module is not loaded)"
    if f.fuse_error:
        owner = f" {f.fuse_owner}" if f.fuse_owner else ""
        return f"{FUSE_DEVICE} is {f.fuse_mode}{owner}: this user cannot open it ({f.fuse_error})"
    return f"{FUSE_DEVICE} is usable"


def can_unsquash(facts: RuntimeFacts) -> bool:
    """``apptainer exec --unsquash`` (extract the SIF to a temporary sandbox directory,
    no FUSE mount) can work for this user: user namespaces and unsquashfs. Pure."""
    return bool(facts.runtime and facts.userns and facts.unsquashfs)


BuildMode = Literal["root", "fakeroot", "unusable"]


def build_mode(f: RuntimeFacts) -> tuple[BuildMode, str]:
    """How this user can run ``apptainer build`` here, and one line saying how (for
    "unusable": what is missing). Pure.

    Apptainer >= 1.1 builds as an ordinary user with --fakeroot: in a user namespace
    mapped to the user's /etc/subuid range (newuidmap), else in a root-mapped namespace
    helped by the `fakeroot` command; without user namespaces only the setuid starter
    with a subuid range can do it.
    """
    if not f.runtime:
        return "unusable", "neither apptainer nor singularity is installed"
    if f.euid == 0:
        return "root", "running as root"
    if f.userns:
        if f.subuid and f.newuidmap_setuid:
            return "fakeroot", "--fakeroot: user namespace mapped to this user's /etc/subuid range"
        if f.fakeroot_command:
            return "fakeroot", ("--fakeroot: root-mapped user namespace with the fakeroot "
                                "command (no /etc/subuid range)")
        return "fakeroot", ("--fakeroot: root-mapped user namespace only (no /etc/subuid range, "
                            "no fakeroot command: package installs that chown files may fail)")
    if f.setuid_ready and f.subuid:
        return "fakeroot", "--fakeroot through the setuid starter and this user's /etc/subuid range"
    missing = userns_problem(f)
    if f.setuid_ready:
        missing += ", and this user has no /etc/subuid range for the setuid starter"
    return "unusable", f"cannot build as this user: {missing}"


def has_subid_range(text: str, user: str, uid: int) -> bool:
    """Whether /etc/subuid (or /etc/subgid) text gives ``user`` (by name or uid) a
    range of at least 65536 ids, what a build's package installs need. Pure."""
    for line in text.splitlines():
        parts = line.strip().split(":")
        if len(parts) == 3 and parts[0] in (user, str(uid)) and parts[2].isdigit() \
                and int(parts[2]) >= 65536:
            return True
    return False


def parse_conf_bool(conf: str, key: str, default: bool) -> bool:
    """An apptainer.conf / singularity.conf boolean (the last setting wins). Pure."""
    value = default
    for line in conf.splitlines():
        name, sep, rest = line.partition("=")
        if sep and not name.lstrip().startswith("#") and name.strip().lower() == key:
            value = rest.strip().lower() == "yes"
    return value


def parse_buildcfg(text: str) -> dict[str, str]:
    """``apptainer buildcfg`` output as a dict (SYSCONFDIR, LIBEXECDIR, ...). Pure."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = re.fullmatch(r"([A-Z_]+)=(.*)", line.strip())
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


def _read_int(path: str) -> int | None:
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None


def _fuse_facts() -> tuple[str | None, str | None, str | None]:
    """(mode, owner, error) of /dev/fuse for this user; opening it is the only true test
    (device cgroups, ACLs), and an open without a mount is harmless."""
    try:
        st = os.stat(FUSE_DEVICE)
    except OSError:
        return None, None, None
    import grp
    import pwd

    def name(lookup, ident: int) -> str:  # type: ignore[no-untyped-def]
        try:
            return str(lookup(ident)[0])
        except KeyError:
            return str(ident)

    mode = f"{stat.S_IMODE(st.st_mode):04o}"
    owner = f"{name(pwd.getpwuid, st.st_uid)}:{name(grp.getgrgid, st.st_gid)}"
    try:
        fd = os.open(FUSE_DEVICE, os.O_RDWR)
    except OSError as err:
        return mode, owner, os.strerror(err.errno or errno.EACCES)
    os.close(fd)
    return mode, owner, None


def _userns_error() -> str | None:
    """Why this user cannot create a user namespace (None: it can). Seccomp or
    AppArmor can refuse what the sysctls allow, so try it."""
    unshare = proc.which("unshare")
    if not unshare:
        return None  # cannot tell; the sysctls decide
    try:
        r = proc.run([unshare, "--user", "true"], timeout=10, check=False)
    except ToolError as err:
        return err.message
    if r.ok:
        return None
    tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or [f"exit {r.returncode}"]
    return f"unshare --user failed: {tail[0]}"


def _subid(uid: int) -> bool:
    import pwd

    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    try:
        return all(has_subid_range(Path(f).read_text(), name, uid)
                   for f in ("/etc/subuid", "/etc/subgid"))
    except OSError:
        return False


def gather_runtime_facts(binary: str | None = None) -> RuntimeFacts:
    """The facts ``runtime_mode`` judges, for this process's user. ``binary``: a
    profile's container.binary, else apptainer/singularity on PATH. Never raises."""
    euid = os.geteuid()
    fuse_mode, fuse_owner, fuse_error = _fuse_facts()
    newuidmap = proc.which("newuidmap")
    try:
        newuidmap_setuid = bool(newuidmap and os.stat(newuidmap).st_uid == 0
                                and os.stat(newuidmap).st_mode & stat.S_ISUID)
    except OSError:
        newuidmap_setuid = False
    facts = RuntimeFacts(
        euid=euid,
        max_user_namespaces=_read_int(MAX_USER_NAMESPACES),
        unprivileged_userns_clone=_read_int(USERNS_CLONE),
        userns_error=None if euid == 0 else _userns_error(),
        squashfuse=proc.which("squashfuse_ll") or proc.which("squashfuse"),
        fuse2fs=proc.which("fuse2fs"),
        unsquashfs=proc.which("unsquashfs"),
        fuse_mode=fuse_mode, fuse_owner=fuse_owner, fuse_error=fuse_error,
        subuid=_subid(euid), newuidmap_setuid=newuidmap_setuid,
        fakeroot_command=proc.which("fakeroot"),
    )
    try:
        rt = find_runtime(binary)
    except ToolError:
        return facts
    cfg: dict[str, str] = {}
    try:
        r = proc.run([rt.path, "buildcfg"], timeout=30, env=runtime_env(), check=False)
        cfg = parse_buildcfg(r.stdout) if r.ok else {}
    except ToolError:
        pass
    conf = Path(cfg.get("SYSCONFDIR", "/etc")) / rt.name / f"{rt.name}.conf"
    allow: bool | None
    try:
        allow = parse_conf_bool(conf.read_text(encoding="utf-8"), "allow setuid", True)
    except OSError:
        allow = None
    starter = Path(cfg.get("LIBEXECDIR", "/usr/libexec")) / rt.name / "bin" / "starter-suid"
    try:
        st = starter.stat()
    except OSError:
        st = None
    return replace(
        facts, runtime=rt.name, runtime_path=rt.path, runtime_version=rt.version,
        conf_path=str(conf), allow_setuid=allow,
        suid_starter=str(starter) if st else None,
        suid_starter_owner=st.st_uid if st else None,
        suid_starter_setuid=bool(st and st.st_mode & stat.S_ISUID),
    )
