"""The hang watchdog of ``hpcdl submit --wait --hang-timeout S``: it rides along the
follow loop (an ``on_poll`` callback of hpcdl.jobs.follow's Watcher) and, once the job has
shown no progress for S seconds, collects a Python stack of every rank with py-spy
(``srun --overlap`` into the job, in its image), writes the dumps and a diagnosis to
the run directory's hang/, and cancels the job (``--hang-action leave``: leaves it
running, and watches again once progress resumes).

The decisions are hpcdl.hang.diagnosis's (pure); this module does the I/O around them and
reports through ``on_hang``. It never prints.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from importlib import metadata
from pathlib import Path
from typing import Any

from hpcdl.core.atomic import write_atomic, write_json_atomic
from hpcdl.hang.diagnosis import (
    Diagnosis,
    Fingerprint,
    NodeDump,
    RankPid,
    Silence,
    by_node,
    diagnose,
    node_command,
    parse_pid_file,
    rank_stacks,
    split_node_output,
    suspect_node,
)
from hpcdl.jobs.rundir import RunDir, safe_name
from hpcdl.jobside.errors import ToolError
from hpcdl.launch.nodes import request_relaunch
from hpcdl.schedulers.base import JobState, JobStatus, Scheduler

PY_SPY_ENV = "HPCDL_PY_SPY"
# Files looked at per poll at most (a run directory with a huge checkpoint tree still
# costs a bounded walk).
MAX_FILES = 5000
COLLECT_TIMEOUT_S = 120.0
# Names in the run directory that are not the job's progress: the watchdog's own output
# and what hpcdl writes after the end.
_NOT_PROGRESS = frozenset({"hang", "result.json", "attempts.json"})


def hang_dump(run: RunDir, node: str) -> Path:
    """py-spy's dumps of the ranks on ``node`` (a Slurm node name), in the run's hang/."""
    return run.hang_dir / f"stacks-{safe_name(node)}.txt"


def read_pids(run: RunDir) -> list[RankPid]:
    """The processes the rank wrapper recorded in the run's pids/ (files being written
    are skipped)."""
    out = []
    for path in sorted(run.pids.glob("*")):
        try:
            found = parse_pid_file(path.name, path.read_text(encoding="utf-8"))
        except OSError:
            continue
        if found is not None:
            out.append(found)
    return out


def write_hang(run: RunDir, diagnosis: dict[str, Any], text: str,
               dumps: dict[str, str]) -> list[Path]:
    """The run's hang/: every node's dumps, diagnosis.json and diagnosis.txt (atomically);
    returns the dump files written."""
    run.hang_dir.mkdir(exist_ok=True)
    written = []
    for node, dump in dumps.items():
        write_atomic(hang_dump(run, node), dump)
        written.append(hang_dump(run, node))
    write_json_atomic(run.hang_json, diagnosis)
    write_atomic(run.hang_text, text)
    return written


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


def fingerprint(run: RunDir) -> Fingerprint:
    """(relative path, size, mtime in ns) of every file the job may write in its run
    directory: a change is progress. The watchdog's own output is left out."""
    seen: set[tuple[str, int, int]] = set()
    root = str(run.path)
    for dirpath, dirnames, filenames in os.walk(root):
        if dirpath == root:
            dirnames[:] = [d for d in dirnames if d not in _NOT_PROGRESS]
            filenames = [f for f in filenames if f not in _NOT_PROGRESS]
        for name in filenames:
            full = os.path.join(dirpath, name)
            try:
                st = os.stat(full)
            except OSError:
                continue
            seen.add((os.path.relpath(full, root), st.st_size, st.st_mtime_ns))
            if len(seen) >= MAX_FILES:
                return frozenset(seen)
    return frozenset(seen)


Collector = Callable[[str, list[RankPid]], tuple[dict[str, list[NodeDump]],
                                                 dict[str, str], dict[str, str]]]


def collect(scheduler: Scheduler, job_id: str, pids: list[RankPid], *, py_spy: str,
            runtime: str | None, image: str | None,
            timeout: float = COLLECT_TIMEOUT_S) -> tuple[dict[str, list[NodeDump]],
                                                          dict[str, str], dict[str, str]]:
    """Dump every recorded rank: one ``srun --overlap`` step per node, all nodes at once.

    Returns (node -> its ranks' dumps, node -> the step's raw output, node -> why the
    node gave nothing). Never raises: a node that fails is an entry of the third map.
    """
    groups = by_node(pids)

    def one(node: str) -> tuple[str, list[NodeDump], str, str]:
        argv = node_command(groups[node], py_spy, runtime=runtime, image=image)
        try:
            res = scheduler.run_in_job(job_id, node, argv, timeout=timeout)
        except ToolError as err:
            return node, [], "", err.message.splitlines()[0]
        dumps = split_node_output(res.stdout)
        # The file a person reads: one headed section per rank, then what srun said.
        text = "".join(f"=== {_spec_label(d.spec)} on {node}, pid {d.pid} (py-spy exit "
                       f"{d.returncode}) ===\n{d.text}\n" for d in dumps) or res.stdout
        if res.stderr.strip():
            text += f"=== srun's stderr (exit {res.returncode}) ===\n{res.stderr}"
        why = "" if dumps else (
            (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1][:300])
        return node, dumps, text, why

    dumps: dict[str, list[NodeDump]] = {}
    raw: dict[str, str] = {}
    errors: dict[str, str] = {}
    if not groups:
        return dumps, raw, errors
    with ThreadPoolExecutor(max_workers=min(16, len(groups))) as pool:
        for node, got, text, why in pool.map(one, list(groups)):
            dumps[node], raw[node] = got, text
            if why:
                errors[node] = why
    return dumps, raw, errors


def _spec_label(spec: str) -> str:
    return f"node {spec[1:]} (torchrun agent)" if spec.startswith("n") else f"rank {spec}"


class HangWatchdog:
    """An ``on_poll`` callback for hpcdl.jobs.follow: watches one job's run directory and
    acts once it has been silent for ``timeout`` seconds.

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
        self.timeout = timeout
        self.action = action
        self.scheduler = scheduler
        self.collector = collector
        self.on_hang = on_hang
        self.clock = clock
        self.silence = Silence()
        self.fired_at: Fingerprint | None = None  # the silence already diagnosed
        self.diagnosis: Diagnosis | None = None

    def __call__(self, pending: dict[str, JobStatus], elapsed: float) -> None:
        status = pending.get(self.job_id)
        running = status is not None and status.state == JobState.RUNNING
        fp = fingerprint(self.run) if running else frozenset()
        silent = self.silence.observe(self.clock(), running, fp)
        if silent < self.timeout or (self.fired_at is not None and fp == self.fired_at):
            return
        self.fired_at = fp
        self.fire(silent)

    def fire(self, silent: float) -> Diagnosis:
        """Collect, diagnose, write hang/, act (cancel or leave); return the diagnosis."""
        started = time.monotonic()
        since = time.time() - silent
        pids = read_pids(self.run)
        dumps, raw, errors = self.collector(self.job_id, pids)
        stacks = rank_stacks(pids, dumps, errors)
        diag = diagnose(stacks, job_id=self.job_id, silent_s=silent, timeout_s=self.timeout,
                        action=self.action)
        if not pids:
            diag = replace(diag, summary="no rank recorded its pid in "
                           f"{self.run.pids} (did the job start through hpcdl's rank "
                           "wrapper?)")
        cancelled = relaunched = False
        node = suspect_node(diag) if self.action == "relaunch" else ""
        if self.action == "relaunch":
            # The job's node guard reads it, ends the step, relaunches (without ``node``).
            relaunched = request_relaunch(self.run.path, node, diag.summary)
        if self.action == "cancel":
            try:
                self.scheduler.cancel([self.job_id])
                cancelled = True
            except ToolError:
                cancelled = False  # it may have ended meanwhile; the follow loop tells
        diag = replace(diag, cancelled=cancelled, relaunched=relaunched,
                       relaunch_without=node, collect_s=round(time.monotonic() - started, 2),
                       detected_at=time.time(), silent_since=since,
                       dumps=tuple(str(hang_dump(self.run, node)) for node in raw))
        write_hang(self.run, diag.to_dict(), "\n".join(diag.lines()) + "\n", raw)
        self.diagnosis = diag
        if self.on_hang:
            self.on_hang(diag)
        return diag
