"""What the cluster benchmarks share: running a command against a cluster of their own,
reading the ranks' clocks, printing a spread of repeats, and counting the Slurm commands
hpcdl runs (against the fake Slurm of tests/fakeslurm or a real one)."""

from __future__ import annotations

import os
import shutil
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
SANDBOX = REPO / "scripts" / "sandbox.sh"

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


@contextmanager
def own_cluster(nodes: int, tag: str, slurmd_timeout: int | None = None, *,
                default_time: str | None = None, up_timeout: float = 600,
                down_timeout: float = 180, keep_runs: bool = False) -> Iterator[dict[str, Any]]:
    """A scripts/sandbox.sh cluster of ``nodes`` of its own beside the sandbox (own
    directory under /tmp, ports, subnet, node names; a network namespace per node; no
    slurmdbd), stopped and removed at the end whatever happens. Its profile reaches rank
    0 by its node's name (no MASTER_ADDR: each node has its own loopback); run
    directories go under /scratch/hpcdl-bench-TAG-* (HPCDL_RUNS), where the nodes see
    them (kept at the end with ``keep_runs``). ``default_time``: the partition's
    DefaultTime. Yields {"env", "profile", "nodes", "dir", "runs"}; ``env`` points
    hpcdl, Slurm's commands and sandbox.sh (``shape``) at the cluster."""
    import yaml

    from tests.own_cluster import (
        cluster_env,
        cluster_profile,
        free_port,
        free_subnet,
        node_names,
        unique_prefix,
    )

    folder = Path(tempfile.mkdtemp(prefix=f"hpcdl-{tag}-", dir="/tmp"))  # short: socket paths
    prefix, subnet = unique_prefix(), free_subnet()
    names = node_names(prefix, nodes)
    lines = [f"node {n} {subnet}.{10 + i} {free_port()} 8 4096 gpu:fake:4 up"
             for i, n in enumerate(names, 1)]
    lines.append(f"partition debug {','.join(names)} Default=YES MaxNodes={nodes} "
                 "MaxTime=00:30:00" + (f" DefaultTime={default_time}" if default_time else ""))
    runs = Path(f"/scratch/hpcdl-bench-{tag}-{prefix}")
    env = {**cluster_env(folder, "\n".join(lines) + "\n", f"{tag}{prefix}"),
           "HPCDL_RUNS": str(runs)}
    profile = folder / "profile.yaml"
    cluster_profile(folder, f"{tag}{prefix}", profile)
    data = yaml.safe_load(profile.read_text())
    data["env"]["vars"].pop("MASTER_ADDR", None)
    profile.write_text(yaml.safe_dump(data, sort_keys=False))
    try:
        run(["bash", str(SANDBOX), "up"], env, timeout=up_timeout)
        if slurmd_timeout is not None:
            conf = folder / "etc" / "slurm.conf"
            conf.write_text(conf.read_text() + f"SlurmdTimeout={slurmd_timeout}\n")
            run(["scontrol", "reconfigure"], env)
        yield {"env": env, "profile": profile, "nodes": names, "dir": folder, "runs": runs}
    finally:
        run(["bash", str(SANDBOX), "down"], env, timeout=down_timeout, check=False)
        shutil.rmtree(folder, ignore_errors=True)
        if not keep_runs:
            shutil.rmtree(runs, ignore_errors=True)


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
