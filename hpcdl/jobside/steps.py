"""Per-step metrics: one JSON line per optimizer step per rank, writer and reader.

    RUN_DIR/metrics/rank-00003.jsonl

One file per rank, so ranks never share a file (no locking, no interleaved lines
across nodes on a shared file system). Each attempt of a run (a requeue, a chain's
next job, a resume) appends to the same file and first writes a ``start`` line:

    {"kind": "start", "rank": 3, "world_size": 4, "host": "n2", "local_rank": 1,
     "attempt": 0, "job_id": "42", "pid": 1234, "t": 1764000000.12, "cpus": [0, 1]}
    {"step": 17, "epoch": 1, "t": 1764000003.4, "step_s": 0.212, "data_s": 0.004,
     "compute_s": 0.15, "sync_s": 0.058, "images_per_sec": 75.5, "loss": 2.31,
     "lr": 0.0125, "attempt": 0}

``step_s`` is the step's wall time on this rank from the batch in hand to the
optimizer step done: ``compute_s`` (forward and backward, this rank's own work) +
``sync_s`` (waiting for the gradient allreduce to finish: the part that did not
overlap with backward). ``data_s`` is the wait for the batch before the step (the
data loader), not part of ``step_s``. ``images_per_sec`` is this rank's
(its batch / (data_s + step_s)). ``attempt`` is SLURM_RESTART_COUNT (a requeue) or
the number of the chain's job.

Cheap by construction: a step appends one dict to a list; the lines are written
(``json.dumps``, one ``write``) at most every ``flush_steps`` steps or ``flush_s``
seconds, and at close and interpreter exit. A reader tolerates a last line cut off
mid-write (a killed rank) and lines it does not know.

The heartbeat (``beat``): a job with ``--hang-timeout`` exports ``$HPCDL_HEARTBEAT_DIR``
(RUN_DIR/heartbeat), and each rank calls ``beat()`` after every optimizer step (the
bundled examples do; ``StepWriter.step`` does it too), which rewrites ``rank-R`` there
at most once every BEAT_EVERY_S: one small write a second per rank on the shared
filesystem, whatever the step rate, and nothing without the variable. This is the
progress the job's hang watchdog reads (hpcdl.jobside.hangwatch), from the ranks
themselves: it compares the files' sizes and mtimes between its polls (a change is
progress), never an mtime with its own clock. A user's own script may call it too; one
that does not is watched through its run directory's files.

Standard library only: the examples and any training script import this module
inside the job (from the checkout, the image's /opt/hpcdl or the wheel), without
hpcdl's dependencies.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

# Where the job script says the run directory is (hpcdl.plan exports it when the job
# has one); the metrics go to $HPCDL_RUN_DIR/metrics.
RUN_DIR_ENV = "HPCDL_RUN_DIR"
METRICS_DIR = "metrics"
FLUSH_STEPS = 50
FLUSH_S = 10.0
# The fields of a step line, in the order they are written (a reader keeps others too).
STEP_FIELDS = ("step", "epoch", "t", "step_s", "data_s", "compute_s", "sync_s",
               "images_per_sec", "loss", "lr", "attempt")


# The heartbeat (see the module doc).
HEARTBEAT_ENV = "HPCDL_HEARTBEAT_DIR"
HEARTBEAT_DIR = "heartbeat"
# A rank writes its heartbeat at most this often: enough for any --hang-timeout (the
# watchdog looks every tenth of it, at most every 10 s, at least every 0.5 s).
BEAT_EVERY_S = 1.0
_beat_last = float("-inf")
_beat_path: str | None = None


def beat(step: int | None = None, *, now: float | None = None) -> bool:
    """This rank completed a step: rewrite its heartbeat file $HPCDL_HEARTBEAT_DIR/rank-R
    (R: $RANK, else $SLURM_PROCID), at most every BEAT_EVERY_S (``now``:
    time.monotonic(), for tests). True when it wrote. Never raises: a heartbeat that
    cannot be written must not stop the training (the watchdog then reads the run
    directory's files, or sees no progress)."""
    global _beat_last, _beat_path
    now = time.monotonic() if now is None else now
    if now - _beat_last < BEAT_EVERY_S:
        return False
    _beat_last = now
    if _beat_path is None:
        directory = os.environ.get(HEARTBEAT_ENV, "")
        if not directory:
            _beat_last = float("inf")  # no watchdog: never look again
            return False
        rank = os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or f"pid{os.getpid()}"
        _beat_path = os.path.join(directory, f"rank-{rank}")
    try:
        with open(_beat_path, "w", encoding="ascii") as fh:
            # The step, for a person reading it; the watchdog looks at size and mtime.
            fh.write(f"{'' if step is None else step}\n")
    except OSError:
        return False
    return True


def beat_reset() -> None:
    """Forget what beat() looked up (tests; a process that changed its environment)."""
    global _beat_last, _beat_path
    _beat_last, _beat_path = float("-inf"), None


def rank_file(directory: str | os.PathLike[str], rank: int) -> Path:
    """``directory/rank-00003.jsonl``: rank ``rank``'s metrics file."""
    return Path(directory) / f"rank-{rank:05d}.jsonl"


def metrics_dir(run_dir: str | os.PathLike[str]) -> Path:
    """A run directory's metrics folder."""
    return Path(run_dir) / METRICS_DIR


def default_dir(env: dict[str, str] | os._Environ[str] | None = None) -> str:
    """``$HPCDL_RUN_DIR/metrics`` when the job has a run directory, else ''."""
    run_dir = (os.environ if env is None else env).get(RUN_DIR_ENV, "")
    return str(metrics_dir(run_dir)) if run_dir else ""


def attempt_number(env: dict[str, str] | os._Environ[str] | None = None) -> int:
    """Which attempt of the run this process belongs to: Slurm's restart count."""
    text = (os.environ if env is None else env).get("SLURM_RESTART_COUNT", "0")
    return int(text) if text.isdigit() else 0


def _round(value: float | None, digits: int = 6) -> float | None:
    if value is None:
        return None
    value = float(value)
    return round(value, digits) if value == value else None  # NaN -> null (valid JSON)


class StepWriter:
    """Appends one rank's step lines to ``directory/rank-RRRRR.jsonl``, buffered.

    ``directory`` '' makes a writer that records nothing (``enabled`` False), so a
    script can call ``step`` unconditionally. The file is opened (and the ``start``
    line buffered) at construction; ``close`` (also registered with atexit) writes
    what is left.
    """

    def __init__(self, directory: str | os.PathLike[str], rank: int, *, world_size: int = 1,
                 local_rank: int = 0, host: str | None = None, attempt: int | None = None,
                 job_id: str | None = None, flush_steps: int = FLUSH_STEPS,
                 flush_s: float = FLUSH_S, cpus: list[int] | None = None) -> None:
        self.enabled = bool(str(directory))
        self.rank = rank
        self.attempt = attempt_number() if attempt is None else attempt
        self.flush_steps = max(1, flush_steps)
        self.flush_s = flush_s
        self.path: Path | None = None
        self._pending: list[dict[str, Any]] = []
        self._steps_pending = 0
        self._last_flush = time.monotonic()
        self._file: Any = None
        if not self.enabled:
            return
        self.path = rank_file(directory, rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())
        self._pending.append({
            "kind": "start", "rank": rank, "world_size": world_size,
            "host": host or socket.gethostname(), "local_rank": local_rank,
            "attempt": self.attempt,
            "job_id": job_id if job_id is not None else os.environ.get("SLURM_JOB_ID"),
            "pid": os.getpid(), "t": round(time.time(), 3),
            "cpus": usable_cpus() if cpus is None else sorted(cpus)})
        atexit.register(self.close)

    def step(self, step: int, *, epoch: int, step_s: float, data_s: float, sync_s: float,
             images: int, loss: float | None, lr: float | None) -> None:
        """Record one optimizer step (see the module doc for the fields), and beat."""
        beat(step)
        if not self.enabled:
            return
        busy = data_s + step_s
        self._pending.append({
            "step": step, "epoch": epoch, "t": round(time.time(), 3),
            "step_s": _round(step_s), "data_s": _round(data_s),
            "compute_s": _round(max(0.0, step_s - sync_s)), "sync_s": _round(sync_s),
            "images_per_sec": _round(images / busy, 3) if busy > 0 else None,
            "loss": _round(loss), "lr": _round(lr, 8), "attempt": self.attempt})
        self._steps_pending += 1
        if (self._steps_pending >= self.flush_steps
                or time.monotonic() - self._last_flush >= self.flush_s):
            self.flush()

    def flush(self) -> None:
        """Write the buffered lines in one write (a line is never split across writes)."""
        if self._file is None or not self._pending:
            return
        text = "".join(json.dumps(rec, separators=(",", ":")) + "\n" for rec in self._pending)
        self._pending.clear()
        self._steps_pending = 0
        self._file.write(text)
        self._file.flush()
        self._last_flush = time.monotonic()

    def close(self) -> None:
        if self._file is None:
            return
        try:
            self.flush()
        finally:
            self._file.close()
            self._file = None


def parse_lines(text: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """(start records, step records, lines skipped) of one rank's file. A line that is
    not a JSON object (cut off by a kill, or garbage) is skipped and counted."""
    starts, steps, skipped = [], [], 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            skipped += 1
            continue
        if not isinstance(rec, dict):
            skipped += 1
        elif rec.get("kind") == "start":
            starts.append(rec)
        elif isinstance(rec.get("step"), int) and not isinstance(rec.get("step"), bool):
            steps.append(rec)
        else:
            skipped += 1
    return starts, steps, skipped


def usable_cpus() -> list[int] | None:
    """The CPUs this process may run on (its affinity: Slurm's binding, a cgroup's
    cpuset), which the straggler verdict unites per node to see whether the node's ranks
    outnumber its cores; None where the platform cannot tell."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def read_metrics(directory: str | os.PathLike[str]) -> dict[int, dict[str, Any]]:
    """Every rank's file in ``directory``: rank -> {"host", "cpus" (its last start's, or
    None), "starts", "steps", "all_steps", "skipped", "path"}. Empty when there is no such directory. In ``steps`` a step
    recorded twice (an attempt that resumed from a checkpoint before it) keeps its last
    record; ``all_steps`` keeps every line in file order."""
    folder = Path(directory)
    out: dict[int, dict[str, Any]] = {}
    if not folder.is_dir():
        return out
    for path in sorted(folder.glob("rank-*.jsonl")):
        digits = path.stem.removeprefix("rank-")
        if not digits.isdigit():
            continue
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        starts, steps, skipped = parse_lines(text)
        by_step: dict[int, dict[str, Any]] = {}
        for rec in steps:
            by_step[rec["step"]] = rec
        hosts = [s.get("host") for s in starts if isinstance(s.get("host"), str)]
        cpus = [s["cpus"] for s in starts if isinstance(s.get("cpus"), list)
                and all(isinstance(c, int) and not isinstance(c, bool) for c in s["cpus"])]
        out[int(digits)] = {"host": hosts[-1] if hosts else None,
                            "cpus": cpus[-1] if cpus else None, "starts": starts,
                            "steps": [by_step[k] for k in sorted(by_step)],
                            "all_steps": steps, "skipped": skipped, "path": str(path)}
    return out
