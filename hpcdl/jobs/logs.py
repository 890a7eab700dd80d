"""Reading a failed job's logs: which rank failed, why, and what it printed last;
and the small result table of one run. Pure functions over log text.

srun runs with ``--label``, so each line may carry a ``R: `` prefix naming the
task. The result and rank lines themselves belong to hpcdl.jobside.protocol.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpcdl.jobside.protocol import unlabel

# srun's own report of a failed task, e.g. "srun: error: n2: task 3: Exited with exit code 1"
_SRUN_FAIL = re.compile(
    r"srun: error: (?P<host>\S+): tasks? (?P<tasks>[\d,\-]+): (?P<why>.+)\Z"
)


@dataclass(frozen=True)
class RankFailure:
    host: str
    ranks: tuple[int, ...]
    reason: str


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
    lines = [text for r, text in map(unlabel, log.splitlines()) if r == rank]
    return lines[-last:]


def _causes(failures: list[RankFailure]) -> list[RankFailure]:
    # Tasks that "Exited with exit code" failed on their own; those srun "Killed"
    # afterwards (--kill-on-bad-exit) are the consequence.
    return [f for f in failures if f.reason.startswith("Exited")] or failures


def _ranks_text(ranks: tuple[int, ...]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ",".join(map(str, ranks))


def describe_failures(stdout: str, stderr: str, *, max_ranks: int = 2,
                      last: int = 10) -> list[str]:
    """Lines that tell which rank(s) crashed and what they printed last.

    srun reports every task that ended badly; the cause gets its last lines, the
    tasks stopped afterwards one line. Returns [] when srun reported no failed task.
    """
    failures = parse_failures(stderr)
    if not failures:
        return []
    causes = _causes(failures)
    lines: list[str] = []
    shown = 0
    for failure in causes:
        lines.append(f"{_ranks_text(failure.ranks)} on {failure.host}: {failure.reason}")
        for rank in failure.ranks:
            if shown == max_ranks:
                break
            shown += 1
            tail = rank_lines(stderr, rank, last) or rank_lines(stdout, rank, last)
            if tail:
                lines.append(f"--- last {len(tail)} lines of rank {rank} ---")
                lines += [f"  {text}" for text in tail]
    stopped = sorted({r for f in failures if f not in causes for r in f.ranks})
    if stopped:
        lines.append(f"{_ranks_text(tuple(stopped))} stopped after that (srun --kill-on-bad-exit)")
    return lines


def failed_ranks(stderr: str) -> list[int]:
    """The ranks that exited non-zero on their own (not killed by srun afterwards)."""
    return sorted({r for f in _causes(parse_failures(stderr)) for r in f.ranks})


def _fmt(value: Any, digits: int = 4) -> str:
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return "-" if value is None else str(value)


def _percent(fraction: Any) -> str | None:
    return f"{100 * fraction:.1f}%" if isinstance(fraction, (int, float)) else None


def format_result_table(result: Mapping[str, Any],
                        ranks: Sequence[Mapping[str, Any]] | None = None) -> str:
    """A small human table of the run's result (and the rank table when known)."""
    rows = [
        ("world size", result.get("world_size")),
        ("nodes", result.get("nodes")),
        ("backend", result.get("backend")),
        ("arch", result.get("arch")),
        ("launcher", result.get("launcher")),
        ("images/sec", result.get("images_per_sec")),
        ("images/sec per rank", result.get("images_per_sec_per_rank")),
        ("gradient sync share", _percent(result.get("sync_share"))),
        ("final loss", result.get("final_loss")),
        ("top-1 (val)", _percent(result.get("top1"))),
        ("top-5 (val)", _percent(result.get("top5"))),
        ("wall time (s)", result.get("wall_time")),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {_fmt(v)}" for k, v in rows]
    if ranks:
        lines.append("")
        lines.append(f"{'rank':>4}  {'host':<10}  checksum")
        lines += [f"{r['rank']:>4}  {r['host'] or '-':<10}  {r['checksum']}" for r in ranks]
        distinct = {r["checksum"] for r in ranks}
        lines.append("parameters identical on every rank" if len(distinct) == 1
                     else f"WARNING: {len(distinct)} different parameter checksums across ranks")
    return "\n".join(lines)
