"""The scaling table: one row per sweep point, with throughput, speedup and parallel
efficiency against the 1-rank baseline of the same backend and batch size, and the
share of step time spent waiting for gradient synchronisation. Pure functions over
the points' result records; the CSV and JSON forms read back into the same rows.

Speedup is ``img/s / baseline img/s``; efficiency is ``speedup / (ranks / baseline
ranks)``. The baseline is the 1-rank point; when that one is missing or failed, the
completed point with the fewest ranks stands in and ``baseline_ranks`` says so.
Points that failed, are still queued or left no result stay in the table with their
state and why; they never vanish from it.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hpcdl.errors import ValidationError

COMPLETED = "COMPLETED"
NO_RESULT = "NO_RESULT"


@dataclass(frozen=True)
class Row:
    label: str
    backend: str
    batch_size: int | None
    nodes: int
    gpus: int
    ranks: int
    state: str
    job_id: str | None = None
    images_per_sec: float | None = None
    images_per_sec_per_rank: float | None = None
    speedup: float | None = None
    efficiency: float | None = None
    baseline_ranks: int | None = None
    step_seconds: float | None = None
    sync_seconds: float | None = None
    sync_share: float | None = None
    epoch_seconds: float | None = None
    note: str = ""
    run_dir: str | None = None

    @property
    def ok(self) -> bool:
        return self.state == COMPLETED and self.images_per_sec is not None


FIELDS = tuple(f.name for f in dataclasses.fields(Row))
_INTS = {"batch_size", "nodes", "gpus", "ranks", "baseline_ranks"}
_FLOATS = {"images_per_sec", "images_per_sec_per_rank", "speedup", "efficiency",
           "step_seconds", "sync_seconds", "sync_share", "epoch_seconds"}


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def row_from(point: Mapping[str, Any], record: Mapping[str, Any] | None, state: str,
             note: str = "") -> Row:
    """One table row from a point (sweep.json entry) and its result.json record.

    ``state`` is the job's state when there is no record (PENDING, RUNNING, UNKNOWN,
    NOT_SUBMITTED...), with ``note`` saying why.
    """
    base = {"label": point["label"], "backend": point["backend"],
            "batch_size": point.get("batch_size"), "nodes": point["nodes"],
            "gpus": point["gpus"], "ranks": point["ranks"], "job_id": point.get("job_id"),
            "run_dir": point.get("run_dir")}
    if record is None:
        return Row(**base, state=state, note=note)
    state = record.get("state") or state
    result = record.get("hpcdl_result")
    if state != COMPLETED:
        return Row(**base, state=state, note=_failure_note(record))
    if not isinstance(result, dict) or _num(result.get("images_per_sec")) is None:
        return Row(**base, state=NO_RESULT,
                   note="the job completed but printed no hpcdl_result line with images/sec")
    epochs = [t for t in result.get("epoch_times") or [] if _num(t) is not None]
    notes = []
    if result.get("world_size") not in (None, point["ranks"]):
        notes.append(f"ran {result['world_size']} ranks, not {point['ranks']}")
    return Row(
        **base, state=COMPLETED,
        images_per_sec=_num(result.get("images_per_sec")),
        images_per_sec_per_rank=_num(result.get("images_per_sec_per_rank")),
        step_seconds=_num(result.get("step_seconds")),
        sync_seconds=_num(result.get("sync_seconds")),
        sync_share=_num(result.get("sync_share")),
        epoch_seconds=round(statistics.fmean(epochs), 4) if epochs else None,
        note="; ".join(notes),
    )


def _failure_note(record: Mapping[str, Any]) -> str:
    parts = []
    if record.get("exit_code") not in (None, 0):
        parts.append(f"exit code {record['exit_code']}")
    if record.get("signal"):
        parts.append(f"signal {record['signal']}")
    if record.get("failed_ranks"):
        parts.append("failed ranks " + ",".join(map(str, record["failed_ranks"])))
    if record.get("message"):
        parts.append(str(record["message"]))
    return ", ".join(parts)


def with_scaling(rows: list[Row]) -> list[Row]:
    """``rows`` with speedup, efficiency and baseline_ranks filled in per (backend,
    batch size) group; rows without a throughput keep them empty."""
    baselines: dict[tuple[str, int | None], Row] = {}
    for row in rows:
        if not row.ok:
            continue
        key = (row.backend, row.batch_size)
        if key not in baselines or row.ranks < baselines[key].ranks:
            baselines[key] = row
    out = []
    for row in rows:
        base = baselines.get((row.backend, row.batch_size))
        if not row.ok or base is None or not base.images_per_sec:
            out.append(row)
            continue
        assert row.images_per_sec is not None
        speedup = row.images_per_sec / base.images_per_sec
        out.append(dataclasses.replace(
            row, speedup=round(speedup, 4),
            efficiency=round(speedup / (row.ranks / base.ranks), 4),
            baseline_ranks=base.ranks))
    return out


# ----- output forms ---------------------------------------------------------------

def count(n: int, noun: str) -> str:
    """``1 rank``, ``4 ranks``."""
    return f"{n} {noun}{'s' if n != 1 else ''}"


def _cell(value: Any, kind: str = "") -> str:
    if value is None:
        return "-"
    if kind == "%":
        return f"{100 * value:.1f}%"
    if isinstance(value, float):
        return f"{value:.2f}" if kind != "s" else f"{value:.4f}"
    return str(value)


_COLUMNS = (  # (header, field, kind)
    ("backend", "backend", ""), ("batch", "batch_size", ""), ("nodes", "nodes", ""),
    ("gpus/node", "gpus", ""), ("ranks", "ranks", ""), ("state", "state", ""),
    ("img/s", "images_per_sec", ""), ("img/s/rank", "images_per_sec_per_rank", ""),
    ("speedup", "speedup", ""), ("efficiency", "efficiency", "%"),
    ("step s", "step_seconds", "s"), ("sync", "sync_share", "%"),
    ("epoch s", "epoch_seconds", ""),
)


def format_table(rows: list[Row]) -> str:
    """A fixed-width table for people, then one line per point that needs explaining."""
    table = [[h for h, _, _ in _COLUMNS]]
    table += [[_cell(getattr(r, f), kind) for _, f, kind in _COLUMNS] for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(_COLUMNS))]
    lines = ["  ".join(c.rjust(w) if i >= 6 else c.ljust(w)
                       for i, (c, w) in enumerate(zip(line, widths, strict=True))).rstrip()
             for line in table]
    bases = sorted({(r.backend, r.batch_size, r.baseline_ranks) for r in rows
                    if r.baseline_ranks is not None}, key=str)
    for backend, batch, ranks in bases:
        batch_text = f", batch {batch}" if batch is not None else ""
        lines.append(f"baseline ({backend}{batch_text}): {count(ranks, 'rank')}"
                     + ("" if ranks == 1 else " (no completed 1-rank point)"))
    for r in rows:
        if not r.ok:
            lines.append(f"{r.label}: {r.state}" + (f" ({r.note})" if r.note else "")
                         + (f", job {r.job_id}" if r.job_id else ""))
        elif r.note:
            lines.append(f"{r.label}: {r.note}")
    return "\n".join(lines)


def to_json(rows: list[Row], meta: dict[str, Any] | None = None) -> str:
    return json.dumps({**(meta or {}), "rows": [dataclasses.asdict(r) for r in rows]}, indent=2)


def to_csv(rows: list[Row]) -> str:
    """The rows as CSV, one record a line ending in \\n. The writer's terminator is
    \\r\\n so that csv quotes a field holding a \\r (with \\n alone it wrote a note's
    bare \\r unquoted, and no reader could read the table back); each record's \\r\\n
    is then cut to \\n."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=FIELDS, lineterminator="\r\n")
    lines = []
    for record in [None, *rows]:
        buf.seek(0)
        buf.truncate()
        if record is None:
            writer.writeheader()
        else:
            writer.writerow({k: ("" if v is None else v)
                             for k, v in dataclasses.asdict(record).items()})
        lines.append(buf.getvalue().removesuffix("\r\n") + "\n")
    return "".join(lines)


def _typed(name: str, text: str) -> Any:
    if name in _INTS:
        return int(text) if text != "" else None
    if name in _FLOATS:
        return float(text) if text != "" else None
    if name in ("job_id", "run_dir"):
        return text or None
    return text


def rows_from_csv(text: str, source: str = "CSV") -> list[Row]:
    """Rows back from ``to_csv``'s output. Raises ValidationError for another CSV."""
    reader = csv.DictReader(io.StringIO(text))
    missing = [f for f in FIELDS if f not in (reader.fieldnames or [])]
    if missing:
        raise ValidationError(f"{source}: not an hpcdl results table (no column "
                              f"{', '.join(missing[:3])})")
    try:
        return [Row(**{k: _typed(k, rec[k]) for k in FIELDS}) for rec in reader]
    except (ValueError, csv.Error) as exc:  # csv.Error: no ValueError (a bare \\r, say)
        raise ValidationError(f"{source}: line {reader.line_num}: {exc}") from exc


def rows_from_json(text: str, source: str = "JSON") -> list[Row]:
    """Rows back from ``to_json``'s output. Raises ValidationError for other JSON."""
    try:
        data = json.loads(text)
        return [Row(**{k: rec.get(k) for k in FIELDS}) for rec in data["rows"]]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValidationError(f"{source}: not an hpcdl results table ({exc})") from exc
