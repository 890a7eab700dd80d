"""The lines a training job prints for hpcdl: one owner for writer and parser.

Rank 0 prints, last, one result line ``{"hpcdl_result": {...}}`` (a JSON object);
every rank prints ``hpcdl_rank_checksum rank=R host=H checksum=C`` (its final
parameters' hash), so a run shows whether all ranks ended with the same model.
Launchers may prefix lines: srun --label writes ``R: ``, horovodrun ``[R]<stdout>:``;
the parsers take either.

Standard library only: the examples import this module inside the job, from the
checkout or from the image (/opt/hpcdl), without hpcdl's dependencies.
"""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path
from typing import Any

RESULT_KEY = "hpcdl_result"
# `hpcdl probe`'s report (hpcdl/jobside/probe_worker.py): rank 0 prints the measurements; a rank
# that cannot run prints ``{"error": ...}`` (with its node) before it exits 2.
PROBE_KEY = "hpcdl_probe"
# ... and writes the same line to RUN_DIR/probe-error.RANK: srun --kill-on-bad-exit can end
# the step before that rank's stdout reaches the log (its stderr, written first, did).
PROBE_ERROR_PREFIX = "probe-error."
RANK_TAG = "hpcdl_rank_checksum"

_LABEL = re.compile(r"^\s*(\d+): ")
# host= is optional when reading: lines written before this module had none.
_RANK_LINE = re.compile(RANK_TAG + r" rank=(\d+)(?: host=(\S+))? checksum=(\S+)")
_TOKEN = re.compile(r"\S+")


def result_line(result: dict[str, Any]) -> str:
    """The final result line (one JSON object on one line)."""
    return json.dumps({RESULT_KEY: result})


def probe_line(report: dict[str, Any]) -> str:
    """The probe's report line (one JSON object on one line)."""
    return json.dumps({PROBE_KEY: report})


def write_probe_error(run_dir: str, rank: int, line: str) -> None:
    """Write a rank's error report ``line`` (probe_line's) to ``run_dir``, atomically."""
    path = os.path.join(run_dir, f"{PROBE_ERROR_PREFIX}{rank}")
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(line + "\n")
    os.replace(tmp, path)


def read_probe_errors(run_dir: Path) -> str:
    """The report lines of probe ranks that refused their input (write_probe_error's
    files in ``run_dir``), joined; '' when none wrote one."""
    lines = []
    for path in sorted(run_dir.glob(f"{PROBE_ERROR_PREFIX}*")):
        if not path.name.endswith(".tmp"):
            try:
                lines.append("\n" + path.read_text(encoding="utf-8", errors="replace"))
            except OSError:
                pass
    return "".join(lines)


def rank_line(rank: int, checksum: str, host: str | None = None) -> str:
    """One rank's checksum line; ``host`` defaults to this machine's name.

    Raises ValueError for a host or checksum with white space (the line would not
    parse back).
    """
    host = host or socket.gethostname()
    for name, value in (("host", host), ("checksum", checksum)):
        if not _TOKEN.fullmatch(value):
            raise ValueError(f"{name} {value!r}: must be one token without white space")
    return f"{RANK_TAG} rank={rank} host={host} checksum={checksum}"


def unlabel(line: str) -> tuple[int | None, str]:
    """(task id, text) of a line srun --label prefixed with ``R: ``; (None, line) else."""
    m = _LABEL.match(line)
    return (int(m.group(1)), line[m.end():]) if m else (None, line)


def parse_result(log: str) -> dict[str, Any] | None:
    """The last result object in ``log``, or None."""
    found = _objects(log, RESULT_KEY)
    return found[-1] if found else None


def parse_probe(log: str) -> dict[str, Any] | None:
    """The probe's report in ``log``: rank 0's measurements, or else the error of the
    lowest rank that reported one (every rank checks its own node and they print in any
    order; srun may stop the others before they print); None when the log has neither."""
    reports = _objects(log, PROBE_KEY)
    measured = [r for r in reports if "error" not in r]
    if measured:
        return measured[-1]
    errors = sorted(reports, key=lambda r: r["rank"] if isinstance(r.get("rank"), int) else 1 << 30)
    return errors[0] if errors else None


# srun --label cuts a long line into chunks and labels each (``0: {"hpcdl_probe": ...``
# then ``0: ...rest``): an object that does not parse is continued from the next lines
# with the same label, up to this many.
_MAX_JOINED = 256


def _objects(log: str, key: str) -> list[dict[str, Any]]:
    """Every ``{"key": {...}}`` object printed in ``log`` (after a launcher's label),
    rejoined where srun --label cut its line."""
    return [value for value, _ in _spans(log.splitlines(), key)]


def _spans(lines: list[str], key: str) -> list[tuple[dict[str, Any], list[int]]]:
    """(object, the indices of the lines it was printed on) for every ``key`` object."""
    start = '{"' + key + '"'
    found = []
    for i, raw in enumerate(lines):
        at = raw.find(start)
        if at < 0:
            continue
        label = unlabel(raw)[0]
        text, used = raw[at:], [i]
        value = _loads(text, key)
        for j in range(i + 1, min(len(lines), i + 1 + _MAX_JOINED)):
            if value is not None:
                break
            more_label, rest = unlabel(lines[j])
            if more_label != label:
                continue  # another rank's line in between
            text += rest
            used.append(j)
            value = _loads(text, key)
        if isinstance(value, dict):
            found.append((value, used))
    return found


def without_probe(log: str) -> str:
    """``log`` without the lines that carry the probe's report (for a log's tail: the
    report is shown as tables instead)."""
    lines = log.splitlines()
    drop = {i for _, used in _spans(lines, PROBE_KEY) for i in used}
    return "\n".join(line for i, line in enumerate(lines) if i not in drop)


def _loads(text: str, key: str) -> Any:
    try:
        return json.loads(text.strip())[key]
    except (ValueError, KeyError, TypeError):
        return None


def parse_rank_table(log: str) -> list[dict[str, Any]]:
    """One row per rank (rank, host or None, checksum), sorted by rank; a rank that
    printed twice keeps its last line."""
    rows = {}
    for raw in log.splitlines():
        m = _RANK_LINE.search(raw)
        if m:
            rank = int(m.group(1))
            rows[rank] = {"rank": rank, "host": m.group(2), "checksum": m.group(3)}
    return [rows[r] for r in sorted(rows)]


# ---- `hpcdl probe`'s worker: its command line and exit status ---------------------
# hpcdl.probe.request writes the worker's arguments and hpcdl.jobs.flow reads its exit
# status; the worker (hpcdl/jobside/probe_worker.py) parses and returns them: one owner
# for both ends, as for the lines above.
EXIT_OK = 0
EXIT_SLOW = 1
EXIT_BAD_INPUT = 2
# Smallest and largest message: one float32, and 1 GiB (a probe, not a burn-in).
MIN_SIZE = 4
MAX_SIZE = 1 << 30
MAX_ITERS = 1000
# A node is named below this share of the median node's best link. Chosen from the
# spread of healthy nodes against a rate-limited one (bench/bench_probe.py, docs/
# benchmarks.md "Network probe"): on the 2-core sandbox healthy nodes fell to 0.38 of
# the median (26 probes; 0.39 once in CI, where 0.5 named a healthy node) and a node
# limited to 200 Mbit/s reached at most 0.065 (8 probes). 0.15, about their geometric
# mean, leaves a factor of 2.6 to the lowest healthy ratio and 2.3 to the highest slow one.
DEFAULT_SLOW_RATIO = 0.15
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20,
          "MB": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}
_SIZE = re.compile(r"(\d+)\s*([A-Za-z]*)")
# --ifname, in NCCL_SOCKET_IFNAME's syntax: a comma list of prefixes of Linux interface
# names (IFNAMSIZ 16: 15 characters), exact names after '=', excluded prefixes after '^'.
IFNAME_SPEC = re.compile(r"[\^=]?[A-Za-z0-9_.:\-]{1,15}(,[A-Za-z0-9_.:\-]{1,15})*")


class ProbeInputError(ValueError):
    """A value the probe cannot run with (exit 2)."""


def parse_size(text: str) -> int:
    """Bytes of ``4096``, ``4K``, ``1M``, ``1GiB``; a multiple of 4 (float32) from
    MIN_SIZE to MAX_SIZE. Raises ProbeInputError naming the value and the limit."""
    m = _SIZE.fullmatch(text.strip())
    unit = m.group(2).upper() if m else ""
    if m is None or unit not in _UNITS:
        raise ProbeInputError(f"{text!r} is not a size (bytes, or with K, M, G: 4K,1M,64M)")
    size = int(m.group(1)) * _UNITS[unit]
    if size < MIN_SIZE or size > MAX_SIZE:
        raise ProbeInputError(f"{text!r} is {size} bytes: a probe message is "
                              f"{MIN_SIZE} bytes to {format_size(MAX_SIZE)}")
    if size % 4:
        raise ProbeInputError(f"{text!r} is {size} bytes, not a whole number of float32 (4 bytes)")
    return size


def parse_sizes(text: str) -> tuple[int, ...]:
    """A comma list of sizes, sorted, duplicates dropped. Raises ProbeInputError."""
    items = [item for item in text.split(",")]
    if not text.strip() or any(not item.strip() for item in items):
        raise ProbeInputError(f"{text!r} is not a comma list of sizes (e.g. 4K,1M,16M)")
    return tuple(sorted({parse_size(item) for item in items}))


def format_size(size: int) -> str:
    """``4K``, ``1M``, ``1536K``, ``100``: the largest binary unit that divides ``size``
    (so parse_size reads it back exactly)."""
    for unit, factor in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= factor and size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)
