"""result.json: an ended job's record, made from its final status and its logs.

Written by ``submit --wait``, ``scale --wait`` and ``results`` alike (one writer);
read by the scaling table and the CLI through ResultRecord's keys.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, TypedDict

from hpcdl.jobs.logs import failed_ranks
from hpcdl.jobs.rundir import RunDir
from hpcdl.jobside.protocol import parse_probe, parse_rank_table, parse_result, read_probe_errors
from hpcdl.schedulers.base import JobStatus


class RankRow(TypedDict):
    rank: int
    host: str | None
    checksum: str


class ResultRecord(TypedDict, total=False):
    """result.json: JobStatus.to_dict()'s keys (the scheduler's own state word under
    ``slurm_state``, hpcdl.schedulers.base.NATIVE_STATE_KEY), the log paths and what
    the logs said. A job the scheduler refused has only ``state`` ("REFUSED"),
    ``message`` and ``argv``."""

    job_id: str
    name: str
    state: str
    slurm_state: str
    exit_code: int | None
    signal: int | None
    nodes: str
    elapsed: str
    time_limit: str
    partition: str
    reason: str
    source: str
    stdout: str
    stderr: str
    hpcdl_result: dict[str, Any] | None
    probe: dict[str, Any] | None  # `hpcdl probe`'s report (or a --probe-first step's)
    ranks: list[RankRow]
    failed_ranks: list[int]
    message: str
    argv: list[str]


@dataclasses.dataclass(frozen=True)
class JobLogs:
    """A finished job's stdout and stderr, read once for result.json and the report."""

    out_path: Path
    err_path: Path
    out: str
    err: str

    @classmethod
    def read(cls, run_dir: RunDir, job_id: str) -> JobLogs:
        out, err = run_dir.logs(job_id)
        return cls(out, err, _read(out), _read(err))


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def result_record(status: JobStatus, logs: JobLogs, probe_errors: str = "") -> ResultRecord:
    """result.json: the final status, the example's result line and rank table
    (if any), the probe's report (if any; ``probe_errors`` holds the lines ranks that
    refused its input wrote to the run directory), and the ranks srun saw fail.
    """
    record: dict[str, Any] = {
        **status.to_dict(), "stdout": str(logs.out_path), "stderr": str(logs.err_path),
        "hpcdl_result": parse_result(logs.out), "probe": parse_probe(logs.out + probe_errors),
        "ranks": parse_rank_table(logs.out), "failed_ranks": failed_ranks(logs.err)}
    return ResultRecord(**record)  # type: ignore[typeddict-item]


def record_result(run_dir: RunDir, status: JobStatus) -> tuple[ResultRecord, JobLogs]:
    """An ended job's result.json, written from its status and logs; returns it and
    the logs (read once)."""
    logs = JobLogs.read(run_dir, status.job_id)
    record = result_record(status, logs, read_probe_errors(run_dir.path))
    run_dir.write_result(dict(record))
    return record, logs


def refused_record(message: str, argv: list[str]) -> ResultRecord:
    """result.json of a job the scheduler refused (or could not be asked to take)."""
    return ResultRecord(state="REFUSED", message=message, argv=list(argv))
