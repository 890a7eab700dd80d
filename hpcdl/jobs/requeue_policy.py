"""What an attempt of a requeued job (hpcdl submit --requeue / --chain) ends as, and whether
the batch script sends it back to the queue: the specification of the job script's
``hpcdl_requeue_verdict`` (templates/sbatch.sh.j2). That bash function runs on the batch
host, which may have no python3 (RHEL 8 nodes), so the decision is written twice, here
and there, and tests/unit/jobs/test_requeue_policy.py runs the rendered bash over a table
and over generated inputs against ``verdict``: one changed alone fails there.

The words are hpcdl.jobside.requeue's (CAUSES: the batch script records them in
attempts.tsv, hpcdl.jobs.attempts reads them back). Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hpcdl.jobside.requeue import (
    COMPLETED,
    EXIT_REQUEUE,
    FAILED,
    LEAD_SLACK_S,
    NO_STEP,
    PREEMPTED,
    SPEND_NO_RESTART,
    STALLED,
    STARTUP,
    TIMEOUT,
)

# What the batch script says about the verdict (its messages, by key):
SIGNAL = "signal"  # the job's signal came: ask the ranks to checkpoint and stop
DONE = "done"  # the step exited 0: nothing to say
CHAIN = "chain"  # one job of a --chain ended non-zero: the chain's next job resumes
NO_STEP_KEYS = {STARTUP: "startup", STALLED: "stalled"}  # failed / stalled before a step
REQUEUE = "requeue"  # requeued
LIMIT = "limit"  # not requeued: --max-restarts used up
KEYS = (SIGNAL, DONE, CHAIN, *NO_STEP_KEYS.values(), REQUEUE, LIMIT)

_SECONDS = re.compile(r"[0-9]+")
_NO_STEP_CAUSE = {FAILED: STARTUP, TIMEOUT: STALLED}


@dataclass(frozen=True)
class Verdict:
    """The attempt's cause (one of CAUSES), whether the script requeues the job, and
    the key (KEYS) of what it says."""

    cause: str
    requeue: bool
    key: str


def verdict(rc: int | None, cause: str, *, left: str, lead: int, progress: bool,
            used: int, max_restarts: int, chain: int) -> Verdict:
    """The batch script's decision.

    ``rc``: the step's exit code, or None when the job's signal came and the step still
    runs; ``cause``: the cause so far ("" none; the signal's TIMEOUT or PREEMPTED; the
    node guard's NODES); ``left``: the job's time left when the signal came, as
    hpcdl_time_left says it (seconds, "none" without a limit, "" when squeue did not
    answer; read only when ``rc`` is None); ``lead``: the signal's lead (s);
    ``progress``: the attempt completed a training step (the progress file is there);
    ``used``: restarts earlier attempts of the job spent (attempts.tsv rows whose cause
    is not in SPEND_NO_RESTART); ``chain``: 1 for a job that requeues itself, N > 1 for
    one of a chain of N jobs."""
    if rc is None:
        # The first word stands (a second signal, or the guard's NODES before it). Time
        # left decides what the signal means: near the limit, a time limit; a job without
        # a limit ("none") can only be preempted; squeue silent (""): preemption, which
        # spends no restart.
        if not cause:
            near = _SECONDS.fullmatch(left) is not None and int(left) <= lead + LEAD_SLACK_S
            cause = TIMEOUT if near else PREEMPTED
        return Verdict(cause, False, SIGNAL)
    if rc == 0:
        cause = COMPLETED
    elif not cause:
        cause = FAILED
    if chain > 1:
        # A chain's next job (--dependency=afterany) resumes from the checkpoint.
        return Verdict(cause, False, CHAIN if rc != 0 else DONE)
    if rc not in (0, EXIT_REQUEUE) and not progress:
        # No step and no checkpoint promised: failed before its first step, or reached its
        # time limit without one (it looks hung). Another attempt would do the same.
        cause = _NO_STEP_CAUSE.get(cause, cause)
    if cause in NO_STEP:
        return Verdict(cause, False, NO_STEP_KEYS[cause])
    if rc == 0:
        return Verdict(cause, False, DONE)
    # Preemption is not the job's fault: always requeued, and it spends no restart; time
    # limits and failures count against --max-restarts (this attempt included).
    spent = used + (cause not in SPEND_NO_RESTART)
    if cause == PREEMPTED or spent <= max_restarts:
        return Verdict(cause, True, REQUEUE)
    return Verdict(cause, False, LIMIT)
