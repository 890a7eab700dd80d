"""Following jobs to their end: one Watcher polls the scheduler for *all* the jobs
being followed with one batched query per cycle (Scheduler.statuses: for Slurm one
squeue, plus sacct only for jobs that ended), backing off while nothing changes, as submitit's InfoWatcher does.
No terminal output: progress goes to callbacks, results are returned.

Polling cost is constant in the number of jobs: a 200-point sweep costs the
controller what one job does (bench/bench_polling.py measures it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from hpcdl.errors import ToolError
from hpcdl.schedulers.base import JobState, JobStatus, Scheduler, is_final
from hpcdl.schedulers.executor import ConnectionLost

T = TypeVar("T")

# Back-off: the first polls are quick (short jobs end within seconds), then the
# interval grows by FACTOR per quiet cycle up to MAX_INTERVAL_S, and drops back to
# MIN_INTERVAL_S whenever a job changes state.
MIN_INTERVAL_S = 0.25
MAX_INTERVAL_S = 15.0
FACTOR = 1.5
# A job that ended but whose exit code the scheduler does not have yet (its accounting
# lags behind its controller for a few seconds) is asked about again for this long.
SETTLE_S = 15.0
# Cycles in which the scheduler did not know a job before it counts as unknown.
MISSING_CYCLES = 3
# A job that ended in a state after which the scheduler may requeue it (PENDING again,
# same id; Scheduler.may_come_back) is taken as ended only after this long away.
REQUEUE_SETTLE_S = 20.0
# How often `logs -f` reads the log files (cheap, local) between scheduler polls.
LOG_READ_S = 0.5
# A login node that cannot be reached (a dropped SSH connection, a laptop's network
# going away) is tried again every RETRY_S for up to RECONNECT_S before following
# stops; the job itself goes on on the cluster either way.
RETRY_S = 5.0
RECONNECT_S = 600.0


class Backoff:
    """The wait before the next poll: grows while nothing changes, resets on change.
    Defaults are the module's constants as they are when it is made."""

    def __init__(self, minimum: float | None = None, maximum: float | None = None,
                 factor: float | None = None) -> None:
        self.minimum = MIN_INTERVAL_S if minimum is None else minimum
        self.maximum = MAX_INTERVAL_S if maximum is None else maximum
        self.factor = FACTOR if factor is None else factor
        self.current = self.minimum

    def next(self, changed: bool) -> float:
        """The interval to sleep now; ``changed``: a job changed state this cycle."""
        self.current = self.minimum if changed else min(self.current * self.factor,
                                                         self.maximum)
        return self.current


class FollowTimeout(ToolError):
    """The deadline passed with jobs still unfinished; ``pending`` holds their last status."""

    def __init__(self, message: str, pending: dict[str, JobStatus], hint: str | None = None):
        super().__init__(message, hint=hint)
        self.pending = pending


OnChange = Callable[[JobStatus], None]
OnPoll = Callable[[dict[str, JobStatus], float], None]
# The login node could not be reached: the error and the seconds it has been away.
OnLost = Callable[[ConnectionLost, float], None]


class Reconnecting:
    """Calls that go through a login node, tried again while it is out of reach:
    ``call(fn)`` returns fn's value, retrying ConnectionLost every RETRY_S for up to
    ``limit_s`` (then raises it with how long it tried and how to reattach)."""

    def __init__(self, *, on_lost: OnLost | None = None, limit_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, hint: str | None = None) -> None:
        self.on_lost = on_lost
        self.limit_s = RECONNECT_S if limit_s is None else limit_s
        self.clock = clock
        self.sleep = sleep
        self.hint = hint
        self.lost = 0  # connections lost and found again

    def call(self, fn: Callable[[], T]) -> T:
        since: float | None = None
        while True:
            try:
                value = fn()
            except ConnectionLost as err:
                now = self.clock()
                since = now if since is None else since
                if now - since >= self.limit_s:
                    raise ConnectionLost(f"{err.message}; gave up after {now - since:.0f} s",
                                         hint=self.hint) from err
                if self.on_lost is not None:
                    self.on_lost(err, now - since)
                self.sleep(RETRY_S)
                continue
            if since is not None:
                self.lost += 1
            return value


class Watcher:
    """Polls a scheduler for a set of jobs until every one has ended.

    ``clock`` and ``sleep`` are injectable so tests and the benchmark can run
    without waiting.
    """

    def __init__(self, scheduler: Scheduler, *, backoff: Backoff | None = None,
                 settle_s: float = SETTLE_S, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 link: Reconnecting | None = None) -> None:
        self.scheduler = scheduler
        self.backoff = backoff or Backoff()
        self.settle_s = settle_s
        self.clock = clock
        self.sleep = sleep
        self.cycles = 0
        # Each poll goes through it: a login node out of reach is tried again.
        self.link = link or Reconnecting(clock=clock, sleep=sleep)

    def watch(self, job_ids: Sequence[str], *, on_change: OnChange | None = None,
              on_done: OnChange | None = None, on_poll: OnPoll | None = None,
              timeout: float | None = None) -> dict[str, JobStatus]:
        """Poll until every job has ended (with its exit code, or SETTLE_S after it
        ended without one); return the final statuses. A job the scheduler does not
        know for MISSING_CYCLES polls ends as UNKNOWN with source ``"missing"``.

        ``on_change(status)`` runs when a job's state (or its exit code) changes,
        ``on_done(status)`` once a job is finished with (its final status),
        ``on_poll(pending, elapsed)`` after every cycle with the jobs still going.
        Raises FollowTimeout when ``timeout`` seconds pass first.
        """
        start = self.clock()
        deadline = None if timeout is None else start + timeout
        pending = {job_id: JobStatus(job_id, "", JobState.UNKNOWN, "") for job_id in dict.fromkeys(job_ids)}
        done: dict[str, JobStatus] = {}
        ended_at: dict[str, float] = {}
        missing: dict[str, int] = {}
        while pending:
            now_status = self.link.call(lambda: self.scheduler.statuses(list(pending)))
            self.cycles += 1
            now = self.clock()
            changed = False
            for job_id, old in list(pending.items()):
                new = now_status.get(job_id)
                if new is None:
                    missing[job_id] = missing.get(job_id, 0) + 1
                    if missing[job_id] >= MISSING_CYCLES:
                        gone = replace(old, state=JobState.UNKNOWN, source="missing")
                        done[job_id] = gone
                        del pending[job_id]
                        changed = True
                        if on_done:
                            on_done(gone)
                    continue
                missing.pop(job_id, None)
                if (new.state, new.native_state, new.exit_code) != (
                        old.state, old.native_state, old.exit_code):
                    changed = True
                    if on_change:
                        on_change(new)
                pending[job_id] = new
                if not is_final(new.state):
                    ended_at.pop(job_id, None)  # requeued: it runs again
                if is_final(new.state):
                    ended_at.setdefault(job_id, now)
                    # A preempted job that is requeued looks ended for a moment.
                    if (self.scheduler.may_come_back(new)
                            and now - ended_at[job_id] < REQUEUE_SETTLE_S):
                        continue
                    if new.exit_code is not None or now - ended_at[job_id] >= self.settle_s:
                        done[job_id] = new
                        del pending[job_id]
                        if on_done:
                            on_done(new)
            if not pending:
                break
            if on_poll:
                on_poll(dict(pending), now - start)
            if deadline is not None and now >= deadline:
                raise FollowTimeout(f"{len(pending)} jobs still unfinished after {timeout:g} s",
                                    dict(pending))
            # An ended job waiting for its exit code is asked again soon.
            settling = any(is_final(s.state) for s in pending.values())
            wait = self.backoff.next(changed or settling)
            if deadline is not None:
                wait = max(0.0, min(wait, deadline - now))
            self.sleep(wait)
        return done


def follow(job_id: str, *, scheduler: Scheduler, on_poll: OnPoll | None = None,
           on_change: OnChange | None = None, timeout: float | None = None,
           watcher: Watcher | None = None) -> JobStatus:
    """Poll one job until it ends; returns its final status with the exit code.

    Raises ToolError when the scheduler does not know the job, FollowTimeout when
    ``timeout`` seconds pass first.
    """
    watcher = watcher or Watcher(scheduler)
    try:
        final = watcher.watch([job_id], on_change=on_change, on_poll=on_poll,
                              timeout=timeout)[job_id]
    except FollowTimeout as err:
        state = err.pending[job_id].state
        raise FollowTimeout(f"job {job_id}: still {state} after {timeout:g} s", err.pending,
                            hint=f"hpcdl status {job_id}; hpcdl cancel {job_id}") from None
    if final.source == "missing":
        raise ToolError(f"job {job_id}: unknown to the scheduler",
                        hint="check the id (hpcdl status lists your jobs)")
    return final


@dataclass(frozen=True)
class LogChunk:
    """New output of a job: ``text`` appended to ``path`` (stderr when ``stderr``)."""

    path: Path
    text: str
    stderr: bool


def log_chunks(job_id: str, out: Path, err: Path, *, scheduler: Scheduler, follow_job: bool,
               timeout: float | None = None,
               sleep: Callable[[float], None] = time.sleep,
               sync: Callable[[], object] | None = None,
               on_lost: OnLost | None = None) -> Iterator[LogChunk]:
    """The job's stdout and stderr as they grow: what is there now, and with
    ``follow_job`` new output until the job has ended and its files stop growing.
    The files are read every LOG_READ_S; the scheduler is asked with back-off, and
    ``sync`` (bringing the files from a cluster elsewhere) runs after each ask. A login
    node out of reach is tried again (``on_lost`` hears of it; see Reconnecting).
    Raises ToolError when ``timeout`` seconds pass first.
    """
    offsets = {out: 0, err: 0}
    link = Reconnecting(on_lost=on_lost, sleep=sleep)
    if sync is not None:
        link.call(sync)

    def pump() -> list[LogChunk]:
        chunks = []
        for path in (out, err) if err != out else (out,):
            try:
                with path.open("rb") as fh:
                    fh.seek(offsets[path])
                    data = fh.read()
            except OSError:
                continue
            if data:
                offsets[path] += len(data)
                chunks.append(LogChunk(path, data.decode("utf-8", errors="replace"),
                                       path == err and err != out))
        return chunks

    yield from pump()
    if not follow_job:
        return
    deadline = None if timeout is None else time.monotonic() + timeout
    backoff = Backoff()
    next_poll = 0.0
    state = JobState.UNKNOWN
    missing = 0
    while True:
        now = time.monotonic()
        if now >= next_poll:
            status = link.call(lambda: scheduler.statuses([job_id])).get(job_id)
            if sync is not None:
                link.call(sync)
            missing = 0 if status else missing + 1
            if missing >= MISSING_CYCLES:
                raise ToolError(f"job {job_id}: unknown to the scheduler",
                                hint="check the id (hpcdl status lists your jobs)")
            old, state = state, status.state if status else state
            next_poll = now + backoff.next(state != old)
        yield from pump()
        if is_final(state):
            sleep(LOG_READ_S)
            if sync is not None:
                link.call(sync)
            while chunks := pump():
                yield from chunks
                sleep(LOG_READ_S)
            return
        if deadline is not None and time.monotonic() > deadline:
            raise ToolError(f"job {job_id}: still {state} after {timeout:g} s")
        sleep(LOG_READ_S)
