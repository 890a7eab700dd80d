"""What every benchmark prints about the machine it measured on (one place for all of them)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def describe(*, packages: tuple[str, ...] = (), tools: tuple[str, ...] = ()) -> dict[str, Any]:
    """Host, OS, CPU, cores, Python; plus the versions of ``packages`` (pip names) and
    ``tools`` (each asked with ``--version``) the benchmark depends on.
    """
    info: dict[str, Any] = {
        "host": platform.node(),
        "os": f"{platform.system()} {platform.release()}",
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
    }
    for dist in packages:
        info[dist] = _version(dist)
    for tool in tools:
        path = shutil.which(tool)
        # The first line: some tools (mpirun) add a bug-report address after it.
        out = (subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30,
                              check=False).stdout.strip() if path else "")
        info[tool] = out.splitlines()[0] if out else None
    return info


def facts_line(info: dict[str, Any]) -> str:
    """The machine's facts (``describe``) as ``key=value; ...`` for a benchmark's header."""
    return "; ".join(f"{k}={v}" for k, v in info.items())
