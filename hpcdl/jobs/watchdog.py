"""The hang watchdog on the submitting machine: the fallback of ``hpcdl submit --wait
--hang-timeout`` for a job that cannot watch itself (no python3 on its batch host: the
job says so in RUN_DIR/hang-unwatched), an ``on_poll`` callback of hpcdl.jobs.follow's
Watcher. A job normally watches itself (hpcdl.jobside.hangwatch, started by its batch
script); the follow loop then only reports what it wrote (hpcdl.jobs.flow).

The watch itself (progress, collecting, diagnosing, writing hang/, acting) is
hpcdl.jobside.hangwatch's Watch, the one the job runs; here the stacks are collected
through the scheduler adapter (``srun --overlap`` from the login node) and the job is
cancelled through it. It never prints; it reports through ``on_hang``.
"""

from __future__ import annotations

import json
import os
import re
import sys
import sysconfig
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from hpcdl.errors import ToolError
from hpcdl.hang.actions import UNWATCHED_NAME
from hpcdl.hang.diagnosis import Diagnosis, Fingerprint, RankPid
from hpcdl.jobs.rundir import RunDir
from hpcdl.jobside import hangwatch
from hpcdl.jobside.hangwatch import COLLECT_TIMEOUT_S, PY_SPY_ENV, Collected, Watch
from hpcdl.schedulers.base import JobState, JobStatus, Scheduler

__all__ = ["COLLECT_TIMEOUT_S", "PY_SPY_ENV", "HangReport", "HangWatchdog", "collect", "find_py_spy",
           "fingerprint"]


def fingerprint(run: RunDir) -> Fingerprint:
    """The run directory's files as progress (hpcdl.jobside.hangwatch.fingerprint)."""
    return hangwatch.fingerprint(run.path)


def find_py_spy() -> str:
    """The py-spy executable the watchdog uses: $HPCDL_PY_SPY, else the one installed with
    hpcdl (the py-spy package's own binary, not a shim that wraps it: it is bound into
    the job's image, so it must be the static executable itself).

    Raises ToolError when there is none.
    """
    candidates: list[Path] = []
    if os.environ.get(PY_SPY_ENV):
        candidates.append(Path(os.environ[PY_SPY_ENV]))
    else:
        try:
            for f in metadata.files("py-spy") or ():
                if f.name == "py-spy" and "bin" in f.parts:
                    candidates.append(Path(str(f.locate())))
        except metadata.PackageNotFoundError:
            pass
        candidates += [Path(sysconfig.get_path("scripts")) / "py-spy",
                       Path(sys.executable).parent / "py-spy"]
    for path in candidates:
        try:
            with path.resolve().open("rb") as fh:
                if fh.read(4) != b"\x7fELF" or not os.access(path, os.X_OK):
                    continue
        except OSError:
            continue
        found = str(path.resolve())
        if re.search(r"[:,\s]", found):  # it becomes apptainer's -B SRC:DST:ro
            raise ToolError(f"hang-timeout: py-spy's path {found!r} holds a ':', ',' or blank, "
                            "which a container bind cannot carry",
                            hint=f"set {PY_SPY_ENV} to a copy at a plain path")
        return found
    where = os.environ.get(PY_SPY_ENV) or "the Python environment of hpcdl"
    raise ToolError(f"hang-timeout: no py-spy executable in {where}",
                    hint=f"pip install py-spy (a dependency of hpcdl), or set {PY_SPY_ENV} to "
                    "its binary")


Collector = Callable[[str, list[RankPid]], Collected]


def collect(scheduler: Scheduler, job_id: str, pids: list[RankPid], *, py_spy: str,
            runtime: str | None, image: str | None,
            timeout: float = COLLECT_TIMEOUT_S) -> Collected:
    """Dump every recorded rank through the scheduler adapter (one ``srun --overlap``
    per node from here, all nodes at once): hpcdl.jobside.hangwatch.collect."""
    def on_node(node: str, argv: list[str], limit: float) -> tuple[int, str, str]:
        res = scheduler.run_in_job(job_id, node, argv, timeout=limit)
        return res.returncode, res.stdout, res.stderr

    return hangwatch.collect(on_node, pids, py_spy=py_spy, runtime=runtime, image=image,
                             timeout=timeout)


def _progress(path: Path, stale: Fingerprint = frozenset()) -> tuple[str, Fingerprint]:
    """hpcdl.jobside.hangwatch.progress, through this module's fingerprint (which tests
    replace)."""
    beats = hangwatch.heartbeats(path)
    return (("heartbeat", beats) if beats and beats != stale
            else ("run directory", fingerprint(RunDir(path))))


class HangWatchdog:
    """An ``on_poll`` callback for hpcdl.jobs.follow: the job's watch
    (hpcdl.jobside.hangwatch.Watch) run from the follow loop, each poll while the job
    runs; acts once it has been silent for ``timeout`` seconds.

    ``on_hang(diagnosis)`` is called once per hang (after the files are written and,
    with action ``cancel``, the job is cancelled). ``collector(job_id, pids)`` and
    ``clock`` are injectable for tests.
    """

    def __init__(self, run: RunDir, job_id: str, *, timeout: float, action: str,
                 scheduler: Scheduler, collector: Collector,
                 on_hang: Callable[[Diagnosis], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.run = run
        self.job_id = job_id
        self.scheduler = scheduler

        def cancel() -> bool:
            try:
                scheduler.cancel([job_id])
            except ToolError:
                return False  # it may have ended meanwhile; the follow loop tells
            return True

        self.watch = Watch(run.path, job_id, timeout=timeout, action=action,
                           collector=lambda pids: collector(job_id, pids), cancel=cancel,
                           on_hang=on_hang, clock=clock,
                           progress=_progress)

    @property
    def diagnosis(self) -> Diagnosis | None:
        return self.watch.diagnosis

    def __call__(self, pending: dict[str, JobStatus], elapsed: float) -> None:
        status = pending.get(self.job_id)
        self.watch.poll(running=status is not None and status.state == JobState.RUNNING)


class HangReport:
    """An ``on_poll`` callback for hpcdl.jobs.follow that reports what the job's own
    watchdog (hpcdl.jobside.hangwatch) wrote: each new RUN_DIR/hang/diagnosis.json goes
    to ``on_hang`` once. A job that says it cannot watch itself (RUN_DIR/hang-unwatched:
    no python3 on its batch host) is watched from here instead, by ``fallback()`` (a
    HangWatchdog; None where this machine cannot: a run directory that is a copy of the
    cluster's). ``finish()`` reads the run directory once more after the job ended (a
    copy pulled back from the cluster holds the diagnosis only then).
    """

    def __init__(self, run: RunDir, *, on_hang: Callable[[Diagnosis], None] | None = None,
                 fallback: Callable[[], HangWatchdog | None] | None = None) -> None:
        self.run = run
        self.on_hang = on_hang
        self.fallback = fallback
        self.dog: HangWatchdog | None = None
        self.diagnosis: Diagnosis | None = None
        self._seen: tuple[int, int] | None = None  # diagnosis.json's (mtime, size) read last

    def __call__(self, pending: dict[str, JobStatus], elapsed: float) -> None:
        if self.dog is not None:
            self.dog(pending, elapsed)
            self.diagnosis = self.dog.diagnosis or self.diagnosis
            return
        if self.fallback is not None and (self.run.path / UNWATCHED_NAME).exists():
            self.dog, self.fallback = self.fallback(), None
            if self.dog is not None:
                self.dog(pending, elapsed)
                return
        self.read()

    def read(self) -> Diagnosis | None:
        """The job's diagnosis when it is new since the last read (reported to
        ``on_hang``), else None."""
        try:
            st = self.run.hang_json.stat()
        except OSError:
            return None
        if (st.st_mtime_ns, st.st_size) == self._seen:
            return None
        self._seen = (st.st_mtime_ns, st.st_size)
        try:
            diag = Diagnosis.from_dict(json.loads(self.run.hang_json.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError):
            self._seen = None  # (being replaced this instant: it is atomic; read it again)
            return None
        if self.diagnosis is not None and diag.detected_at == self.diagnosis.detected_at:
            self.diagnosis = diag  # the same hang, rewritten (a cancel that failed)
            return None
        self.diagnosis = diag
        if self.on_hang is not None:
            self.on_hang(diag)
        return diag

    def finish(self) -> Diagnosis | None:
        """After the job's end: the last diagnosis (read once more)."""
        if self.dog is None:
            self.read()
        return self.diagnosis
