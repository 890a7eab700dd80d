"""Pure parsers for the text Slurm's commands print. No subprocesses here.

Formats are chosen so that the one user-controlled field (the job name) comes
last and is split off with ``maxsplit``: a name with ``|`` in it cannot shift
the other columns.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from hpcdl.errors import SubmitError
from hpcdl.schedulers.base import JobState, JobStatus, TimeRanOut, is_final
from hpcdl.schedulers.slurm.states import to_hpcdl

# squeue -o: job id, state, reason, nodes, elapsed, time limit, partition, name (last).
SQUEUE_FORMAT = "%i|%T|%r|%N|%M|%l|%P|%j"
# squeue -O for the batched status query: the same columns plus exit_code (the raw
# wait status, as slurmctld holds it until MinJobAge); "Field:|" = unpadded + "|".
# An array task's id is ArrayJobID_ArrayTaskID (-O JobID would print its own number, which
# no user sees); a plain job has ArrayTaskID N/A and ArrayJobID its id.
SQUEUE_STATUS_FIELDS = ("ArrayJobID:|,ArrayTaskID:|,State:|,Reason:|,NodeList:|,TimeUsed:|,"
                        "TimeLimit:|,Partition:|,exit_code:|,Name:")
# sacct -o: the same idea; JobName last.
SACCT_FIELDS = "JobID,State,ExitCode,NodeList,Elapsed,Timelimit,Partition,JobName"

PLACEHOLDER_NAME = "allocation"
_JOB_ID = re.compile(r"(\d+)(?:;\S+)?")
_EXIT = re.compile(r"(\d+):(\d+)")
_GPU_GRES = re.compile(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)")
_CONFIG_LINE = re.compile(r"([A-Za-z_][A-Za-z0-9_\[\]]*)\s*=\s?(.*)")


def parse_job_id(stdout: str) -> str:
    """The job id from ``sbatch --parsable`` ("123" or "123;cluster").

    Raises SubmitError when sbatch printed something else.
    """
    lines = [ln.strip() for ln in stdout.strip().splitlines() if ln.strip()]
    m = _JOB_ID.fullmatch(lines[-1]) if lines else None
    if not m:
        raise SubmitError(f"sbatch printed no job id (output: {stdout.strip()!r})")
    return m.group(1)


def parse_exit_code(text: str) -> tuple[int | None, int | None]:
    """Slurm's "EXIT:SIGNAL" (e.g. "3:0", "0:15") as (exit, signal); (None, None) if absent."""
    m = _EXIT.fullmatch(text.strip())
    if not m:
        return None, None
    return int(m.group(1)), int(m.group(2))


def _rows(stdout: str, fields: int = 8) -> Iterator[list[str]]:
    """The '|'-separated rows of squeue/sacct output. The job name comes last and may
    itself contain '|', so the split stops before it; malformed lines are skipped.
    """
    for line in stdout.splitlines():
        parts = line.split("|", fields - 1)
        if line.strip() and len(parts) == fields:
            yield parts


def parse_squeue(stdout: str) -> list[JobStatus]:
    """Rows of ``squeue -h -o SQUEUE_FORMAT``."""
    out = []
    for parts in _rows(stdout):
        job_id, raw, reason, nodes, elapsed, limit, partition, name = parts
        out.append(JobStatus(
            job_id=job_id.strip(), name=name, state=to_hpcdl(raw), native_state=raw.strip(),
            nodes=nodes.strip(), elapsed=elapsed.strip(), time_limit=limit.strip(),
            partition=partition.strip(), reason="" if reason.strip() == "None" else reason.strip(),
            source="squeue",
        ))
    return out


def wait_status(text: str) -> tuple[int | None, int | None]:
    """(exit, signal) from a raw wait status as squeue's exit_code prints it
    ("768" -> (3, 0), "15" -> (0, 15)); (None, None) when it is not a number."""
    text = text.strip()
    if not text.isdigit():
        return None, None
    raw = int(text)
    return (raw >> 8) & 0xFF, raw & 0x7F


def parse_squeue_status(stdout: str) -> list[JobStatus]:
    """Rows of ``squeue -h -O SQUEUE_STATUS_FIELDS``; a finished job carries its exit
    code and signal (slurmctld's, the same that ``scontrol show job`` prints)."""
    out = []
    for parts in _rows(stdout, fields=10):
        base, task, raw, reason, nodes, elapsed, limit, partition, code_text, name = parts
        task = task.strip()
        job_id = base.strip() if task in ("", "N/A") else f"{base.strip()}_{task}"
        state = to_hpcdl(raw)
        code, sig = wait_status(code_text) if is_final(state) else (None, None)
        out.append(JobStatus(
            job_id=job_id.strip(), name=name, state=state, native_state=raw.strip(),
            exit_code=code, signal=sig, nodes=nodes.strip(), elapsed=elapsed.strip(),
            time_limit=limit.strip(), partition=partition.strip(),
            reason="" if reason.strip() == "None" else reason.strip(), source="squeue",
        ))
    return out


# sacct -D (--duplicates) lists every attempt of a requeued job; the name comes last.
HISTORY_FIELDS = ("JobID,State,ExitCode,NodeList,Elapsed,Timelimit,Partition,Start,End,"
                  "Reason,JobName")


def parse_sacct_history(stdout: str) -> list[JobStatus]:
    """Rows of ``sacct -n -P -X -D -o HISTORY_FIELDS``, in sacct's order (oldest first)."""
    out = []
    for parts in _rows(stdout, 11):
        job_id, raw, exit_text, nodes, elapsed, limit, partition, start, end, reason, name = parts
        if "." in job_id:
            continue
        code, sig = parse_exit_code(exit_text)
        out.append(JobStatus(
            job_id=job_id.strip(), name=name, state=to_hpcdl(raw), native_state=raw.strip(),
            exit_code=code, signal=sig, nodes=nodes.strip(), elapsed=elapsed.strip(),
            time_limit=limit.strip(), partition=partition.strip(),
            reason="" if reason.strip() in ("", "None") else reason.strip(),
            source="sacct -D", start=start.strip(), end=end.strip(),
        ))
    return out


def parse_sacct(stdout: str) -> list[JobStatus]:
    """Rows of ``sacct -n -P -X -o SACCT_FIELDS`` (job allocations only, no steps)."""
    out = []
    for parts in _rows(stdout):
        job_id, raw, exit_text, nodes, elapsed, limit, partition, name = parts
        if "." in job_id:  # a step row slipped in (no -X): not a job
            continue
        code, sig = parse_exit_code(exit_text)
        out.append(JobStatus(
            job_id=job_id.strip(), name=name, state=to_hpcdl(raw), native_state=raw.strip(),
            exit_code=code, signal=sig, nodes=nodes.strip(), elapsed=elapsed.strip(),
            time_limit=limit.strip(), partition=partition.strip(), source="sacct",
        ))
    return out


# When an array's tasks disagree, the array's state is the first of these a task has.
_ARRAY_ORDER = (JobState.RUNNING, JobState.SUSPENDED, JobState.PENDING, JobState.FAILED,
                JobState.TIMEOUT, JobState.CANCELLED, JobState.UNKNOWN, JobState.COMPLETED)


def array_of(job_id: str, rows: list[JobStatus], source: str) -> JobStatus | None:
    """One status for the array ``job_id`` from its tasks' rows (``123_0``, ``123_1``,
    ...): running while any task runs or waits, else the worst end (FAILED before
    TIMEOUT before CANCELLED before COMPLETED), the highest exit code, and a reason
    that counts the tasks per state. None when ``rows`` has no task of it."""
    tasks = [r for r in rows if r.job_id.startswith(f"{job_id}_")
             and r.job_id[len(job_id) + 1:].isdigit()]
    if not tasks:
        return None
    counts: dict[str, int] = {}
    for row in tasks:
        counts[str(row.state)] = counts.get(str(row.state), 0) + 1
    state = next(s for s in _ARRAY_ORDER if any(r.state == s for r in tasks))
    lead = next(r for r in tasks if r.state == state)
    final = all(is_final(r.state) for r in tasks)
    codes = [r.exit_code for r in tasks if r.exit_code is not None]
    nodes = sorted({r.nodes for r in tasks if r.nodes})
    return JobStatus(
        job_id=job_id, name=lead.name, state=state, native_state=lead.native_state,
        exit_code=max(codes) if final and codes else None,
        signal=lead.signal if final else None, nodes=",".join(nodes), elapsed=lead.elapsed,
        time_limit=lead.time_limit, partition=lead.partition,
        reason=f"array of {len(tasks)} tasks: " + ", ".join(
            f"{n} {s}" for s, n in sorted(counts.items())), source=source)


def is_sacct_placeholder(row: JobStatus, live: JobStatus | None) -> bool:
    """True for the row sacct shows for a few seconds after a job ends.

    Until slurmctld's job record reaches slurmdbd, sacct can answer with a row
    built from the job's steps: named "allocation", in state PENDING or already
    final. ``live`` is what squeue says about the same job (None: squeue has
    forgotten it, and then the database is all there is).
    """
    if row.state == JobState.UNKNOWN:
        return True
    if live is None:
        return False
    if is_final(live.state) and not is_final(row.state):
        return True
    return row.name == PLACEHOLDER_NAME and live.name != PLACEHOLDER_NAME


def parse_scontrol_exit(text: str, job_state: str) -> tuple[int | None, int | None]:
    """ExitCode from ``scontrol -o show job`` output.

    The job name comes before ExitCode in that line and may contain anything, so
    search only after " JobState=<state> " (the state another source reported).
    """
    anchor = text.rfind(f" JobState={job_state} ")
    if anchor < 0:
        return None, None
    m = re.search(r" ExitCode=(\d+):(\d+)", text[anchor:])
    if not m:
        return None, None
    return int(m.group(1)), int(m.group(2))


def parse_key_values(line: str) -> dict[str, str]:
    """``scontrol -o show partition`` style "Key=Value Key=Value" (values without spaces)."""
    out = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep:
            out[key] = value
    return out


def parse_config(text: str) -> dict[str, str]:
    """``scontrol show config``: ``Key = Value`` lines (the PMIx section included). Pure.

    Here rather than in detect, which the live check of every submission would import
    for it alone (~4 ms)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = _CONFIG_LINE.fullmatch(line.strip())
        if m:
            out.setdefault(m.group(1), m.group(2).strip())
    return out


def gpus_in_gres(gres: str) -> int:
    """GPUs per node in a sinfo %G string ("gpu:fake:4", "gpu:a100:8(S:0-1)", "(null)" -> 0)."""
    return sum(int(m.group(1)) for m in _GPU_GRES.finditer(gres.strip()))


# What Slurm's own tools write into a job's stderr to report a failure, not what it was:
# srun's lines ("srun: error: n1: task 0: Exited ...") and slurmstepd's.
STDERR_NOISE: tuple[str, ...] = ("srun:", "slurmstepd")
# slurmstepd's words in the job's stderr when it ends the job at its time limit.
TIME_LIMIT_MARK = "DUE TO TIME LIMIT"


def time_ran_out(status: JobStatus, stderr: str = "") -> TimeRanOut | None:
    """How the job ran out of time (hpcdl.schedulers.base.Scheduler.time_ran_out):
    "deadline" for Slurm's DEADLINE, "limit" for its time limit (state TIMEOUT, or
    CANCELLED with slurmstepd's "DUE TO TIME LIMIT" in its stderr: a state read while
    the job ended); None otherwise."""
    if not (status.state == JobState.TIMEOUT
            or (status.state == JobState.CANCELLED and TIME_LIMIT_MARK in stderr)):
        return None
    return "deadline" if status.native_state.upper().startswith("DEADLINE") else "limit"
