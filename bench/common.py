"""What the cluster benchmarks share: running a command against a cluster of their own,
reading the ranks' clocks, printing a spread of repeats, and counting the Slurm commands
hpcdl runs (against the fake Slurm of tests/fakeslurm or a real one)."""

from __future__ import annotations

import os
import statistics
import subprocess
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SLURM_TOOLS = ("squeue", "sacct", "scontrol", "sbatch", "scancel", "sinfo")
FAKE_BIN = REPO / "tests" / "fakeslurm" / "bin"

# The sandbox's nodes see only the host's /home and /scratch (scripts/sandbox.sh): a
# bench's run directories, scripts and image must live there, not under /tmp or the
# build cache (/var/cache/hpcdl), or the job fails on the nodes.
SHARED = Path(os.environ.get("HPCDL_SANDBOX_SHARED") or "/scratch")
SHARED_IMAGE = SHARED / "images" / "pytorch-horovod-cpu.sif"


def shared_tmp(prefix: str) -> Path:
    """A fresh directory under SHARED/tmp (made world-writable and sticky, like /tmp, when
    this is root) that the sandbox's nodes can read; under the usual temporary directory
    when there is no SHARED (a machine without the sandbox). The caller removes it."""
    base = SHARED / "tmp"
    if SHARED.is_dir() or os.geteuid() == 0:
        base.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0 and base.stat().st_uid == 0:
            base.chmod(0o1777)
        return Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    return Path(tempfile.mkdtemp(prefix=prefix))


def shared_copy(path: Path, work: Path) -> Path:
    """``path`` (a file of the checkout a job runs) copied into ``work`` (a shared_tmp
    directory), readable by every user: the nodes do not see the checkout."""
    target = work / path.name
    target.write_bytes(path.read_bytes())
    target.chmod(0o644)
    return target


@contextmanager
def counting() -> Iterator[Counter[str]]:
    """Count every Slurm command hpcdl runs (all go through hpcdl.core.proc.run)."""
    from hpcdl.core import proc

    counts: Counter[str] = Counter()
    real = proc.run

    def counted(argv: list[str], *args: Any, **kwargs: Any) -> Any:
        if argv and Path(argv[0]).name in SLURM_TOOLS:
            counts[Path(argv[0]).name] += 1
        return real(argv, *args, **kwargs)

    proc.run = counted  # type: ignore[assignment]
    try:
        yield counts
    finally:
        proc.run = real  # type: ignore[assignment]


def run(argv: list[str], env: dict[str, str], timeout: float = 600,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    """``argv`` from the checkout with ``env`` over this environment; with ``check`` a
    failure raises with the tail of its output."""
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                         env={**os.environ, **env}, cwd=REPO)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({res.returncode}):\n"
                           f"{res.stdout[-3000:]}{res.stderr[-3000:]}")
    return res


def stamps(text: str) -> list[float]:
    """The ranks' clocks from their output (``3: 1795498920.606`` with srun --label)."""
    out = []
    for line in text.splitlines():
        word = line.split(":", 1)[-1].strip()
        try:
            out.append(float(word))
        except ValueError:
            continue
    return out


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    """The median, and the range when the repeats differ; '-' for none."""
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1 or min(values) == max(values):
        return fmt.format(med)
    return f"{fmt.format(med)} ({fmt.format(min(values))}-{fmt.format(max(values))})"
