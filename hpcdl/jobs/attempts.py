"""The attempts of a requeued job: what the scheduler's accounting says (Slurm's sacct
-D, one row per attempt: Scheduler.history) joined with what the batch script recorded
itself (the run directory's attempts.tsv: why it stopped, as the script saw it); the
scheduler words each attempt's reason (Scheduler.attempt_reason). Pure: no I/O here;
hpcdl.cli prints them, RunDir stores them.

Slurm alone cannot tell a self-requeued time limit from a crash (both are REQUEUED),
and the script alone does not see a NODE_FAIL; together they name each attempt's
reason: COMPLETED, TIMEOUT, PREEMPTED, NODE_FAIL, FAILED, CANCELLED or RUNNING, NODES
(a job with spares ran out of healthy nodes), or one of NO_STEP's: STARTUP (failed
before its first step: the container or the start-up failed) and STALLED (its time
limit came before its first step: it looks hung). The batch script requeues neither:
another attempt would do the same. The script's words are hpcdl.jobside.requeue's, and
what it decided (hpcdl.jobs.requeue_policy specifies it) is read back from attempts.tsv,
not worked out again here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from hpcdl.core.atomic import write_json_atomic
from hpcdl.jobs.rundir import RunDir
from hpcdl.jobs.timelimit import hang_advice
from hpcdl.jobside import requeue
from hpcdl.jobside.protocol import unlabel
from hpcdl.schedulers.base import NATIVE_STATE_KEY, JobStatus, Scheduler

# Causes the batch script gives an attempt that completed no training step (the run
# directory's progress file was not there when it ended; hpcdl/jobside/requeue.py): the
# words the job script is rendered with (hpcdl.jobside.requeue), not spelt again here.
STARTUP = requeue.STARTUP
STALLED = requeue.STALLED
NO_STEP = requeue.NO_STEP
# Lines in a job's stderr that report a failure rather than say what it was: the
# scheduler's tools' (Scheduler.stderr_noise), and the batch shell's own (unlabelled; a
# rank's "hpcdl: command not found" carries the launcher's rank label and is a cause).
_SHELL = "hpcdl:"


@dataclass(frozen=True)
class ScriptAttempt:
    """One line of attempts.tsv, written by the batch script when its step ended."""

    job_id: str
    restart: int
    started: int
    ended: int
    exit_code: int
    cause: str  # one of hpcdl.jobside.requeue.CAUSES (the batch script's $hpcdl_cause)

    @classmethod
    def parse(cls, line: str) -> ScriptAttempt | None:
        """A line of attempts.tsv, or None for a malformed (half-written) one."""
        parts = line.rstrip("\n").split("\t")
        if len(parts) != 6 or not all(p.lstrip("-").isdigit() for p in parts[1:5]):
            return None
        return cls(parts[0], int(parts[1]), int(parts[2]), int(parts[3]), int(parts[4]),
                   parts[5])


@dataclass(frozen=True)
class Attempt:
    """One run of a job: ``number`` 0 is the first (SLURM_RESTART_COUNT)."""

    number: int
    job_id: str
    native_state: str  # the scheduler's word for how it ended
    reason: str
    start: str
    end: str
    exit_code: int | None

    def to_dict(self) -> dict[str, Any]:
        """attempts.json's keys (``native_state`` under NATIVE_STATE_KEY, as written so far)."""
        return {(NATIVE_STATE_KEY if k == "native_state" else k): v
                for k, v in asdict(self).items()}


def read_script_attempts(run: RunDir) -> list[ScriptAttempt]:
    """The run's attempts.tsv lines (malformed ones left out); empty when there is none."""
    try:
        text = run.attempts_log.read_text(encoding="utf-8")
    except OSError:
        return []
    return [a for line in text.splitlines() if (a := ScriptAttempt.parse(line))]


def write_attempts(run: RunDir, attempts: list[Attempt]) -> None:
    """The run's attempts.json: every attempt, atomically."""
    write_json_atomic(run.attempts_file, {"attempts": [a.to_dict() for a in attempts]})


def join(history: list[JobStatus], script: list[ScriptAttempt], *,
         scheduler: Scheduler) -> list[Attempt]:
    """The scheduler's rows of one job (oldest first) joined with the script's lines for
    it, by order: the k-th row is restart k. A row the script has no line for (a node
    failure, a kill before the script could write) keeps the scheduler's reason."""
    out = []
    for number, row in enumerate(history):
        mine = [s for s in script if s.job_id == row.job_id and s.restart == number]
        # The native state's word, without its decorations ("CANCELLED by 0").
        state = row.native_state.split(" ", 1)[0]
        reason = scheduler.attempt_reason(row.native_state, last=number == len(history) - 1,
                                          script_cause=mine[-1].cause if mine else None)
        code = mine[-1].exit_code if mine else row.exit_code
        out.append(Attempt(number, row.job_id, state, reason, row.start, row.end, code))
    return out


def from_script(script: list[ScriptAttempt]) -> list[Attempt]:
    """Attempts from the script's lines alone (no accounting database)."""
    import time

    def stamp(t: int) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))

    return [Attempt(n, s.job_id, "", s.cause, stamp(s.started), stamp(s.ended), s.exit_code)
            for n, s in enumerate(script)]


def stderr_cause(stderr: str, *, scheduler: Scheduler) -> str | None:
    """The last line of a job's stderr that says what went wrong: not the batch
    script's or the scheduler's tools' reports of it (Slurm's srun and slurmstepd),
    without the launcher's rank label."""
    for line in reversed(stderr.splitlines()):
        rank, text = unlabel(line)
        text = text.strip()
        if text and not text.startswith(scheduler.stderr_noise) and not (rank is None
                                                          and text.startswith(_SHELL)):
            return text
    return None


def no_step_message(attempts: list[Attempt], stderr: str = "", *, scheduler: Scheduler,
                    nodes: int = 1) -> str | None:
    """One line when the job's last attempt completed no training step and so was not
    requeued (STARTUP: the cause from the job's stderr; STALLED: it looks hung, and what
    to run next); None for any other job."""
    if not attempts or attempts[-1].reason not in NO_STEP:
        return None
    last = attempts[-1]
    code = "?" if last.exit_code is None else str(last.exit_code)
    if last.reason == STALLED:
        return (f"attempt {last.number} completed no training step before its time limit "
                f"(exit {code}): not requeued; it looks hung: {hang_advice(nodes)}")
    cause = stderr_cause(stderr, scheduler=scheduler)
    where = (f"the cause is in the job's stderr: {cause}" if cause
             else f"the job's stderr names no cause (hpcdl logs {last.job_id} shows it all)")
    return (f"attempt {last.number} failed before its first step (exit {code}): "
            f"not requeued; {where}")
