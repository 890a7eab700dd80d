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
import re
import socket
from typing import Any

RESULT_KEY = "hpcdl_result"
RANK_TAG = "hpcdl_rank_checksum"

_LABEL = re.compile(r"^\s*(\d+): ")
_RESULT_START = '{"' + RESULT_KEY + '"'
# host= is optional when reading: lines written before this module had none.
_RANK_LINE = re.compile(RANK_TAG + r" rank=(\d+)(?: host=(\S+))? checksum=(\S+)")
_TOKEN = re.compile(r"\S+")


def result_line(result: dict[str, Any]) -> str:
    """The final result line (one JSON object on one line)."""
    return json.dumps({RESULT_KEY: result})


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
    found = None
    for raw in log.splitlines():
        at = raw.find(_RESULT_START)
        if at < 0:
            continue
        try:
            found = json.loads(raw[at:].strip())[RESULT_KEY]
        except (ValueError, KeyError, TypeError):
            continue
    return found


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
