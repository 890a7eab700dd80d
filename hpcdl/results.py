"""Reading what a training job left in its logs: the result line, the rank table,
and which rank failed. Pure functions over log text.

The examples print, on rank 0, one final line ``{"hpcdl_result": {...}}`` and on
every rank ``hpcdl_rank_checksum rank=R host=H checksum=C``. srun runs with
``--label``, so each line may carry a ``R: `` prefix naming the task.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_LABEL = re.compile(r"^\s*(\d+): ")
_RANK_LINE = re.compile(r"hpcdl_rank_checksum rank=(\d+) host=(\S+) checksum=(\S+)")
# srun's own report of a failed task, e.g. "srun: error: n2: task 3: Exited with exit code 1"
_SRUN_FAIL = re.compile(
    r"srun: error: (?P<host>\S+): tasks? (?P<tasks>[\d,\-]+): (?P<why>.+)$"
)


@dataclass(frozen=True)
class RankFailure:
    host: str
    ranks: tuple[int, ...]
    reason: str


def _unlabel(line: str) -> tuple[int | None, str]:
    m = _LABEL.match(line)
    return (int(m.group(1)), line[m.end():]) if m else (None, line)


def parse_result(log: str) -> dict[str, Any] | None:
    """The last ``{"hpcdl_result": ...}`` object in ``log``, or None."""
    found = None
    for raw in log.splitlines():
        _, line = _unlabel(raw)
        line = line.strip()
        if line.startswith('{"hpcdl_result"'):
            try:
                found = json.loads(line)["hpcdl_result"]
            except (ValueError, KeyError):
                continue
    return found


def parse_rank_table(log: str) -> list[dict[str, Any]]:
    """One row per rank (rank, host, checksum), sorted by rank."""
    rows = {}
    for raw in log.splitlines():
        m = _RANK_LINE.search(raw)
        if m:
            rank = int(m.group(1))
            rows[rank] = {"rank": rank, "host": m.group(2), "checksum": m.group(3)}
    return [rows[r] for r in sorted(rows)]


def _expand_tasks(spec: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(out)


def parse_failures(stderr: str) -> list[RankFailure]:
    """srun's 'task N: Exited with exit code X' reports, in log order."""
    out = []
    for line in stderr.splitlines():
        m = _SRUN_FAIL.search(line.strip())
        if m:
            out.append(RankFailure(m["host"], _expand_tasks(m["tasks"]), m["why"].strip()))
    return out


def rank_lines(log: str, rank: int, last: int = 10) -> list[str]:
    """The last ``last`` lines that task ``rank`` printed (needs srun --label)."""
    lines = [text for r, text in map(_unlabel, log.splitlines()) if r == rank]
    return lines[-last:]


def _fmt(value: Any, digits: int = 4) -> str:
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return "-" if value is None else str(value)


def format_result_table(result: dict[str, Any], ranks: list[dict[str, Any]] | None = None) -> str:
    """A small human table of the run's result (and the rank table when known)."""
    rows = [
        ("world size", result.get("world_size")),
        ("nodes", result.get("nodes")),
        ("backend", result.get("backend")),
        ("arch", result.get("arch")),
        ("images/sec", result.get("images_per_sec")),
        ("images/sec per rank", result.get("images_per_sec_per_rank")),
        ("final loss", result.get("final_loss")),
        ("top-1", result.get("top1")),
        ("top-5", result.get("top5")),
        ("wall time (s)", result.get("wall_time")),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {_fmt(v)}" for k, v in rows]
    if ranks:
        lines.append("")
        lines.append(f"{'rank':>4}  {'host':<10}  checksum")
        lines += [f"{r['rank']:>4}  {r['host']:<10}  {r['checksum']}" for r in ranks]
        distinct = {r["checksum"] for r in ranks}
        lines.append("parameters identical on every rank" if len(distinct) == 1
                     else f"WARNING: {len(distinct)} different parameter checksums across ranks")
    return "\n".join(lines)
