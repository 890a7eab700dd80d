"""The comparison table of a parameter sweep: one row per point with its values, how it
ended and what it reached (final loss, top-1, img/s, run time), sortable by any column,
as text, CSV or JSON. Pure functions over the points' sweep.json entries and result.json
records.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping
from typing import Any

from hpcdl.errors import ValidationError

# The columns after the parameters' own, in the table's order.
FIXED = ("state", "final_loss", "top1", "images_per_sec", "run_time_s", "job_id")


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def elapsed_seconds(text: str) -> float | None:
    """Slurm's Elapsed ("1-02:03:04", "02:03:04", "3:04", "0:00") in seconds; None
    when it is not one."""
    days, _, clock = text.strip().rpartition("-")
    parts = clock.split(":")
    if not (days.isdigit() or not days) or not all(p.isdigit() for p in parts) \
            or not 1 <= len(parts) <= 3:
        return None
    seconds = 0
    for part in parts:
        seconds = seconds * 60 + int(part)
    return float(seconds + int(days or 0) * 86400)


def param_row(entry: Mapping[str, Any], record: Mapping[str, Any] | None, state: str,
              note: str = "") -> dict[str, Any]:
    """One point's row: ``point`` (its index), its parameters, then FIXED and ``note``.
    ``state`` is the scheduler's word while there is no result.json (``record``)."""
    result = (record or {}).get("hpcdl_result") or {}
    elapsed = (record or {}).get("elapsed")
    seconds = elapsed_seconds(elapsed) if isinstance(elapsed, str) else None
    if seconds is None:
        seconds = _number(result.get("wall_time"))
    return {"point": entry.get("index"), **dict(entry.get("params") or {}),
            "state": (record or {}).get("state") or state,
            "final_loss": _number(result.get("final_loss")), "top1": _number(result.get("top1")),
            "images_per_sec": _number(result.get("images_per_sec")),
            "run_time_s": seconds, "job_id": entry.get("job_id"), "run_dir": entry.get("run_dir"),
            "note": note if record is None else ""}


def columns(params: list[str]) -> list[str]:
    return ["point", *params, *FIXED]


def sort_key(value: Any) -> tuple[int, float, str]:
    # Numbers (and numeric parameter values) by value, words after them, empty last.
    if value is None or value == "":
        return (2, 0.0, "")
    try:
        return (0, float(value), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(value))


def sort_rows(rows: list[dict[str, Any]], column: str, params: list[str]) -> list[dict[str, Any]]:
    """``rows`` ordered by ``column`` (ascending, a leading '-' descending; empty cells
    last either way). Raises ValidationError naming the columns there are."""
    name = column.removeprefix("-")
    if name not in columns(params):
        raise ValidationError(f"sort: no column {name!r}; columns: {', '.join(columns(params))}")
    present = [r for r in rows if r.get(name) not in (None, "")]
    absent = [r for r in rows if r.get(name) in (None, "")]
    return sorted(present, key=lambda r: sort_key(r.get(name)), reverse=column.startswith("-")) + absent


def cell_text(name: str, value: Any) -> str:
    if value is None:
        return "-"
    if name == "top1" and isinstance(value, float):
        return f"{100 * value:.1f}%"
    if isinstance(value, float):
        return f"{value:.4g}" if name == "final_loss" else f"{value:.1f}"
    return str(value)


def format_table(rows: list[dict[str, Any]], params: list[str]) -> str:
    """The rows as an aligned text table, a note under a point that has one."""
    names = columns(params)
    cells = [[cell_text(n, r.get(n)) for n in names] for r in rows]
    widths = [max([len(n), *(len(c[i]) for c in cells)]) for i, n in enumerate(names)]
    lines = ["  ".join(n.upper().ljust(w) for n, w in zip(names, widths, strict=True)).rstrip()]
    for row, line in zip(rows, cells, strict=True):
        lines.append("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
        if row.get("note"):
            lines.append(f"    {row['note']}")
    done = sum(1 for r in rows if r["state"] == "COMPLETED")
    lines.append(f"{len(rows)} points, {done} completed")
    return "\n".join(lines)


def to_csv(rows: list[dict[str, Any]], params: list[str]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=[*columns(params), "run_dir", "note"],
                            extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def to_json(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    return json.dumps({**meta, "rows": rows}, indent=2)
