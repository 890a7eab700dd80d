"""The hang watchdog inside the job (``hpcdl submit --hang-timeout S``, with or without
``--wait``). The batch script starts it in the background on the batch host:

    PYTHONPATH=RUN_DIR/job python3 -m hpcdl.jobside.hangwatch --run-dir RUN_DIR \\
        --job-id ID --timeout S --action cancel|relaunch|leave [--runtime R --image I]

and it ends with the script (it polls its parent). When the job has shown no progress
for S seconds it collects a Python stack of every rank with py-spy (one
``srun --overlap`` per node, in the job's image when it has one), writes the dumps and
the diagnosis to RUN_DIR/hang/ (hpcdl.jobside.hangdiag decides), then cancels the job
(scancel), asks the node guard to relaunch the training (RUN_DIR/relaunch.request, read
by templates/hpcdl-nodes.sh; the relaunched step's silence is then measured from the
request, so one that hangs again, even before its first heartbeat, is diagnosed again,
as often as the guard's --max-restarts allows) or leaves it running and watches again
once progress resumes. A follower (``--wait``, from the login node or a laptop) only reports what
it wrote.

Progress (``progress``): the ranks' heartbeats (hpcdl.jobside.steps.beat) once any rank
of the current step wrote one; before that, and for a script that writes none, any file of the run
directory (the logs, checkpoints), as the follow-side watchdog always read it. Changes
are compared between polls, never mtimes with this host's clock.

It runs under the batch host's own python3 (3.9 or later), not the image's: srun and
scancel are the host's. The script checks for one first; without one it says so in the
job's stderr and in RUN_DIR/hang-unwatched (hpcdl.hang.actions.UNWATCHED_NAME), and a
follower on the login node watches instead (hpcdl.jobs.watchdog).

Standard library only (the job side: hpcdl's dependencies are not on the nodes).
Subprocesses are run here rather than through hpcdl.core.proc for that reason, each
with an argv list and a timeout.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from hpcdl.jobside.errors import ToolError
from hpcdl.jobside.hangdiag import (
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
from hpcdl.jobside.steps import HEARTBEAT_DIR

# Names in the run directory (hpcdl.jobs.rundir.RunDir names the same).
HANG_DIR = "hang"
PIDS_DIR = "pids"
DIAGNOSIS_JSON = "diagnosis.json"
DIAGNOSIS_TEXT = "diagnosis.txt"
# The node guard's request (hpcdl.launch.nodes, templates/hpcdl-nodes.sh): end the step,
# relaunch, without the node it names.
RELAUNCH_REQUEST_NAME = "relaunch.request"
# Where the staged py-spy is (hpcdl.launch.staging.stage_tool), relative to the run.
PY_SPY_IN_RUN = "job/bin/py-spy"
PY_SPY_ENV = "HPCDL_PY_SPY"

# Files looked at per poll at most (a run directory with a huge checkpoint tree still
# costs a bounded walk).
MAX_FILES = 5000
COLLECT_TIMEOUT_S = 120.0
SCANCEL_TIMEOUT_S = 30.0
# Names in the run directory that are not the job's progress: the watchdog's own output,
# what hpcdl writes after the end, the staged job-side files and --code copy (static,
# and not to be walked every poll), the heartbeats (read on their own).
_NOT_PROGRESS = frozenset({HANG_DIR, "result.json", "attempts.json", "job", "code",
                           HEARTBEAT_DIR, RELAUNCH_REQUEST_NAME})

# ---- what is read and written ------------------------------------------------------------


def fingerprint(run_dir: Path) -> Fingerprint:
    """(relative path, size, mtime in ns) of every file the job may write in its run
    directory: a change is progress. The watchdog's own output is left out."""
    seen = set()
    root = str(run_dir)
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


def heartbeats(run_dir: Path) -> Fingerprint:
    """(name, size, mtime in ns) of every rank's heartbeat file (empty: none yet)."""
    seen = set()
    try:
        entries = list(os.scandir(run_dir / HEARTBEAT_DIR))
    except OSError:
        return frozenset()
    for entry in entries:
        if not entry.name.startswith("rank-"):
            continue
        try:
            st = entry.stat()
        except OSError:
            continue
        seen.add((entry.name, st.st_size, st.st_mtime_ns))
    return frozenset(seen)


def progress(run_dir: Path, stale: Fingerprint = frozenset()) -> tuple[str, Fingerprint]:
    """(what was read, its fingerprint): the heartbeats once any rank wrote one, else
    the run directory's files. ``stale``: the heartbeats of a step the watchdog had
    relaunched; while they are all there is (the new step has not beaten yet), the run
    directory's files are read, as before a first step's first beat."""
    beats = heartbeats(run_dir)
    if beats and beats != stale:
        return "heartbeat", beats
    return "run directory", fingerprint(run_dir)


def read_pids(run_dir: Path) -> list[RankPid]:
    """The processes the rank wrapper recorded in the run's pids/ (files being written
    are skipped)."""
    out = []
    for path in sorted((run_dir / PIDS_DIR).glob("*")):
        try:
            found = parse_pid_file(path.name, path.read_text(encoding="utf-8"))
        except OSError:
            continue
        if found is not None:
            out.append(found)
    return out


def safe_node(node: str) -> str:
    """A node name as a file name part (the names are checked tokens already; this is
    belt and braces: nothing but [A-Za-z0-9_.-])."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", node) or "_"


def hang_dump(run_dir: Path, node: str) -> Path:
    """py-spy's dumps of the ranks on ``node``, in the run's hang/."""
    return run_dir / HANG_DIR / f"stacks-{safe_node(node)}.txt"


def write_atomic(path: Path, text: str) -> None:
    """``text`` to ``path`` whole or not at all (a temporary file beside it, renamed): a
    follower reading the run directory never sees half a diagnosis."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_hang(run_dir: Path, diagnosis: dict[str, Any], text: str,
               dumps: dict[str, str]) -> list[Path]:
    """The run's hang/: every node's dumps, then diagnosis.txt and diagnosis.json (last:
    a follower takes its appearance as "the diagnosis is complete"); returns the dump
    files written."""
    import json

    (run_dir / HANG_DIR).mkdir(exist_ok=True)
    written = []
    for node, dump in dumps.items():
        write_atomic(hang_dump(run_dir, node), dump)
        written.append(hang_dump(run_dir, node))
    write_atomic(run_dir / HANG_DIR / DIAGNOSIS_TEXT, text)
    write_atomic(run_dir / HANG_DIR / DIAGNOSIS_JSON, json.dumps(diagnosis, indent=2) + "\n")
    return written


def request_relaunch(run_dir: Path, node: str, why: str) -> bool:
    """Ask the job's node guard to end the training step and relaunch it, without
    ``node`` ("" for none): RELAUNCH_REQUEST_NAME in ``run_dir``, one line
    "NODE<TAB>WHY", written atomically. False when it cannot be written."""
    line = f"{node or '-'}\t{' '.join(why.split())[:300]}\n"
    try:
        write_atomic(run_dir / RELAUNCH_REQUEST_NAME, line)
    except OSError:
        return False
    return True


# ---- Slurm, from inside the job ----------------------------------------------------------


def overlap_argv(job_id: str, node: str, command: Sequence[str]) -> list[str]:
    """``srun --overlap`` running ``command`` once on ``node`` inside the running job
    ``job_id``: a step beside the job's own that shares its CPUs and memory, so it
    starts even when the training step holds all of them. Pure.

    Raises ToolError for a job id or node name that is not a plain token.
    """
    if not re.fullmatch(r"[0-9]+(_[0-9]+)?", job_id):
        raise ToolError(f"srun --overlap: {job_id!r} is not a Slurm job id")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", node):
        raise ToolError(f"srun --overlap: {node!r} is not a Slurm node name")
    return ["srun", "--overlap", f"--jobid={job_id}", f"--nodelist={node}", "--nodes=1",
            "--ntasks=1", "--cpus-per-task=1", "--mem=0", "--quiet", *command]


# The batch shell's own step geometry, which srun would read as options of the stack
# collection's one-task step (SLURM_NTASKS_PER_NODE=2 beside --ntasks=1: a warning on
# every dump): the watchdog's sruns run without them.
_STEP_ENV = ("SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS", "SLURM_NPROCS",
             "SLURM_DISTRIBUTION", "SLURM_CPU_BIND", "SRUN_CPUS_PER_TASK", "SLURM_MEM_PER_CPU")


def _run(argv: list[str], timeout: float) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``argv``; 124 and a note when it ran past
    ``timeout``, 127 when it is missing."""
    env = {k: v for k, v in os.environ.items() if k not in _STEP_ENV}
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env,
                             stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
        return 124, out, f"{argv[0]}: no end in {timeout:g} s"
    except OSError as exc:
        return 127, "", f"{argv[0]}: {exc.strerror or exc}"
    return res.returncode, res.stdout, res.stderr


Collected = tuple[dict[str, list[NodeDump]], dict[str, str], dict[str, str]]
# (node, argv, timeout) -> (exit code, stdout, stderr): runs one node's collection.
RunOnNode = Callable[[str, list[str], float], tuple[int, str, str]]


def collect(run_on_node: RunOnNode, pids: list[RankPid], *, py_spy: str,
            runtime: str | None, image: str | None,
            timeout: float = COLLECT_TIMEOUT_S) -> Collected:
    """Dump every recorded rank: one step per node (``run_on_node``), all nodes at once.

    Returns (node -> its ranks' dumps, node -> the step's raw output, node -> why the
    node gave nothing). Never raises: a node that fails is an entry of the third map.
    """
    groups = by_node(pids)

    def one(node: str) -> tuple[str, list[NodeDump], str, str]:
        argv = node_command(groups[node], py_spy, runtime=runtime, image=image)
        try:
            code, out, err = run_on_node(node, argv, timeout)
        except ToolError as exc:
            return node, [], "", exc.message.splitlines()[0]
        dumps = split_node_output(out)
        # The file a person reads: one headed section per rank, then what srun said.
        text = "".join(f"=== {_spec_label(d.spec)} on {node}, pid {d.pid} (py-spy exit "
                       f"{d.returncode}) ===\n{d.text}\n" for d in dumps) or out
        if err.strip():
            text += f"=== srun's stderr (exit {code}) ===\n{err}"
        why = "" if dumps else ((err.strip().splitlines() or [f"exit {code}"])[-1][:300])
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


def srun_in_job(job_id: str) -> RunOnNode:
    """run_on_node for collect(): ``srun --overlap`` into ``job_id`` from inside it."""
    def run(node: str, argv: list[str], timeout: float) -> tuple[int, str, str]:
        return _run(overlap_argv(job_id, node, argv), timeout)
    return run


def scancel(job_id: str) -> bool:
    """Cancel the job from inside it; True when scancel said yes."""
    code, _, err = _run(["scancel", job_id], SCANCEL_TIMEOUT_S)
    if code != 0:
        say(f"scancel {job_id} failed (exit {code}: {err.strip()[-200:]})")
    return code == 0


def find_py_spy(run_dir: Path) -> str | None:
    """The py-spy staged with the run (RUN_DIR/job/bin/py-spy), else $HPCDL_PY_SPY, else
    one on this host's PATH; None when there is none."""
    for candidate in (str(run_dir / PY_SPY_IN_RUN), os.environ.get(PY_SPY_ENV, ""),
                      shutil.which("py-spy") or ""):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


# ---- the watch ---------------------------------------------------------------------------


class Watch:
    """Watches one job's progress and acts once it has been silent for ``timeout``
    seconds: ``poll(running)`` once per interval. The collecting and cancelling are
    injected (``collector(pids)``, ``cancel()``), so the same watch runs inside the job
    (srun and scancel from the batch host) and, as a fallback, in the follow loop
    (hpcdl.jobs.watchdog: through the scheduler adapter); ``clock`` for tests.
    ``on_hang(diagnosis)`` hears of each hang once its files are written and acted on.
    """

    def __init__(self, run_dir: Path, job_id: str, *, timeout: float, action: str,
                 collector: Callable[[list[RankPid]], Collected],
                 cancel: Callable[[], bool],
                 on_hang: Callable[[Diagnosis], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 progress: Callable[[Path, Fingerprint], tuple[str, Fingerprint]] = progress
                 ) -> None:
        self.run_dir = Path(run_dir)
        self.job_id = job_id
        self.timeout = timeout
        self.action = action
        self.collector = collector
        self.cancel = cancel
        self.on_hang = on_hang
        self.clock = clock
        self.progress = progress
        self.silence = Silence()
        self.source = ""
        self.fired_at: Fingerprint | None = None  # the silence already diagnosed
        # The heartbeats as the step relaunched last had left them: not the new step's.
        self.stale: Fingerprint = frozenset()
        self.diagnosis: Diagnosis | None = None

    def poll(self, running: bool = True) -> Diagnosis | None:
        """Observe the job once; the diagnosis when this poll found (and acted on) a hang."""
        source, fp = self.progress(self.run_dir, self.stale) if running else ("", frozenset())
        if source and source != self.source:
            self.source = source
            self.silence = Silence()  # the heartbeats began: their own clock from now
        silent = self.silence.observe(self.clock(), running, fp)
        if silent < self.timeout or (self.fired_at is not None and fp == self.fired_at):
            return None
        self.fired_at = fp
        diag = self.fire(silent)
        if diag.relaunched:
            self.relaunched(fp if source == "heartbeat" else self.stale)
        return diag

    def relaunched(self, beats: Fingerprint) -> None:
        """After asking for a relaunch: the next silence is the new step's, measured from
        now. Its heartbeats count once they differ from ``beats`` (the old step's, which
        a new step that hangs before its first beat leaves as they were: without this
        it was never diagnosed again); until then the run directory's files do, as for
        a first step (the guard's and the new ranks' lines and pid files are progress).
        The guard's relaunch budget (--max-restarts) bounds how often this repeats: out
        of it, the job ends, and this watch with it."""
        self.stale = beats
        self.fired_at = None
        self.source, fp = self.progress(self.run_dir, self.stale)
        self.silence = Silence()
        self.silence.observe(self.clock(), True, fp)

    def fire(self, silent: float) -> Diagnosis:
        """Collect, diagnose, write hang/, act; return the diagnosis."""
        started = time.monotonic()
        since = time.time() - silent
        pids = read_pids(self.run_dir)
        dumps, raw, errors = self.collector(pids)
        stacks = rank_stacks(pids, dumps, errors)
        diag = diagnose(stacks, job_id=self.job_id, silent_s=silent, timeout_s=self.timeout,
                        action=self.action)
        if not pids:
            diag = replace(diag, summary="no rank recorded its pid in "
                           f"{self.run_dir / PIDS_DIR} (did the job start through hpcdl's "
                           "rank wrapper?)")
        node = suspect_node(diag) if self.action == "relaunch" else ""
        diag = replace(diag, relaunch_without=node,
                       collect_s=round(time.monotonic() - started, 2), detected_at=time.time(),
                       silent_since=since, progress=self.source,
                       dumps=tuple(str(hang_dump(self.run_dir, n)) for n in raw))
        text = "\n".join(diag.lines()) + "\n"
        if self.action == "cancel":
            # Written before the cancel, which ends this process too when it runs in the
            # job: the files say what was asked, and are written again if it failed.
            diag = replace(diag, cancelled=True)
            write_hang(self.run_dir, diag.to_dict(), text, raw)
            if not self.cancel():
                diag = replace(diag, cancelled=False)
                write_hang(self.run_dir, diag.to_dict(), text, {})
        else:
            if self.action == "relaunch":
                # The guard reads it, ends the step, relaunches (without ``node``).
                diag = replace(diag, relaunched=request_relaunch(self.run_dir, node,
                                                                 diag.summary))
            write_hang(self.run_dir, diag.to_dict(), text, raw)
        self.diagnosis = diag
        if self.on_hang:
            self.on_hang(diag)
        return diag


# ---- the process the batch script starts -------------------------------------------------


def say(text: str) -> None:
    """One line on the job's stderr, as the batch script's own lines read."""
    print(f"hpcdl: hang watchdog: {text}", file=sys.stderr, flush=True)


def interval_for(timeout: float) -> float:
    """How often the watchdog looks: a tenth of the timeout, between 0.5 and 10 s (a
    hang is seen within 10 % of its timeout; a quiet job costs a few stats a second)."""
    return max(0.5, min(10.0, timeout / 10))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="hpcdl-hangwatch", description=__doc__.split("\n")[0])
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--timeout", required=True, type=float)
    parser.add_argument("--action", required=True, choices=("cancel", "leave", "relaunch"))
    parser.add_argument("--runtime", default=None)
    parser.add_argument("--image", default=None)
    parser.add_argument("--interval", type=float, default=None)
    args = parser.parse_args(argv)
    if not args.timeout > 0:
        parser.error(f"--timeout: must be more than 0 seconds (got {args.timeout:g})")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run_dir: Path = args.run_dir
    parent = os.getppid()
    py_spy = find_py_spy(run_dir)
    if py_spy is None:
        say(f"no py-spy in {run_dir / PY_SPY_IN_RUN}, ${PY_SPY_ENV} or PATH: a hang is "
            "diagnosed without stacks")
        py_spy = "py-spy"

    def on_hang(diag: Diagnosis) -> None:
        for line in diag.lines():
            say(line)
        done = ("cancelling the job" if diag.cancelled else
                "asked the node guard to relaunch" if diag.relaunched else
                "left running" if diag.action == "leave" else f"{diag.action} failed")
        say(f"{done}; stacks and diagnosis in {run_dir / HANG_DIR}")

    watch = Watch(run_dir, args.job_id, timeout=args.timeout, action=args.action,
                  collector=lambda pids: collect(srun_in_job(args.job_id), pids,
                                                 py_spy=py_spy, runtime=args.runtime,
                                                 image=args.image),
                  cancel=lambda: scancel(args.job_id), on_hang=on_hang)
    every = args.interval or interval_for(args.timeout)
    say(f"watching job {args.job_id} on {os.uname().nodename} (pid {os.getpid()}): no "
        f"progress for {args.timeout:g} s -> stacks in {run_dir / HANG_DIR}, then "
        f"{args.action}")
    # The batch script's end (this process is handed to another parent) ends the watch.
    while os.getppid() == parent:
        watch.poll(running=True)
        time.sleep(every)
    return 0


if __name__ == "__main__":
    sys.exit(main())
