"""Finding the container runtime (apptainer or singularity) and running it.

Root on some VMs lacks capabilities Apptainer asks for by default (CAP_SYS_RESOURCE
on ours): every exec/build then fails with "Requesting capability set ... while
permitted capability set is ...". ``runtime_env`` computes the missing bits and
passes them in APPTAINER_DROP_CAPS, so hpcdl works whether or not the wrapper that
scripts/install-apptainer.sh writes is first on PATH.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from hpcdl import proc
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
