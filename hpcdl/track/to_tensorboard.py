"""TensorBoard: one event-file directory per run (DIR/<run id>/), written with the
tensorboard package's own writer (tensorboard.summary.Writer: numpy, no TensorFlow or
torch) and read back with its own reader, so a step already in the directory is not
written again: tracking twice adds nothing, and ``--follow`` adds only new steps.

Tags: ``train/<key>`` per step (hpcdl.track.source's series) and ``result/<key>`` once,
at the last step, when the job's result is known.

The HPARAMS tab: each run directory is one session of tensorboard's hparams plugin, its
start (the run's hparams: a parameter sweep's values, tensorboard.plugins.hparams'
summary_v2.hparams_pb) written once, its end (success or failure, from the job's state)
once the job has ended. The plugin finds the sessions under DIR and takes the last value
of each scalar tag of a session's directory as its metrics (``result/final_loss`` and
the rest): no experiment summary is written, so runs of several sweeps tracked into one
DIR are compared side by side. Both are written once, like the steps.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hpcdl.errors import ToolError, UserInputError
from hpcdl.track.source import RunSource

EXTRA_HINT = "pip install 'hpcdl[tensorboard]'"
STEP_PREFIX = "train/"
RESULT_PREFIX = "result/"
# tensorboard.plugins.hparams.metadata's SESSION_START_INFO_TAG / SESSION_END_INFO_TAG,
# spelt here so a look at what a directory holds imports no plugin (tests/unit/track/test_track.py
# holds them to the plugin's).
SESSION_START_TAG = "_hparams_/session_start_info"
SESSION_END_TAG = "_hparams_/session_end_info"


def require() -> Any:
    """The tensorboard package's Writer class. Raises UserInputError naming the extra."""
    try:
        from tensorboard.summary import Writer
    except ImportError:
        raise UserInputError(f"--tensorboard needs the tensorboard package, which is not "
                             f"installed: {EXTRA_HINT}") from None
    return Writer


def logged_steps(run_dir: Path) -> dict[str, set[int]]:
    """{tag: steps} already in ``run_dir``'s event files, read by tensorboard's reader."""
    if not run_dir.is_dir() or not any(run_dir.glob("events.out.tfevents.*")):
        return {}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    tags = acc.Tags()
    out: dict[str, set[int]] = {}
    for tag in tags.get("tensors", []):
        out[tag] = {e.step for e in acc.Tensors(tag)}
    for tag in tags.get("scalars", []):
        out.setdefault(tag, set()).update(e.step for e in acc.Scalars(tag))
    return out


class TensorBoardSink:
    """Writes runs into ``root``/<run id>/; ``close`` ends every writer it opened."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._writer_cls = require()
        self._writers: dict[str, Any] = {}
        self._logged: dict[str, dict[str, set[int]]] = {}

    def run_dir(self, source: RunSource) -> Path:
        return self.root / source.run_id

    def _have(self, source: RunSource) -> dict[str, set[int]]:
        if source.run_id not in self._logged:
            self._logged[source.run_id] = logged_steps(self.run_dir(source))
        return self._logged[source.run_id]

    def pending_session(self, source: RunSource) -> list[str]:
        """The hparams session tags (start, end) the run's directory lacks."""
        have = self._have(source)
        todo = []
        if source.hparams and not have.get(SESSION_START_TAG):
            todo.append(SESSION_START_TAG)
        if source.hparams and source.ended and not have.get(SESSION_END_TAG):
            todo.append(SESSION_END_TAG)
        return todo

    def pending(self, source: RunSource) -> tuple[list[tuple[str, float, int, float | None]],
                                                  int]:
        """(tag, value, step, wall time) not in the run's directory yet, and the number
        of steps they touch."""
        have = self._have(source)
        todo: list[tuple[str, float, int, float | None]] = []
        steps: set[int] = set()
        for point in source.points:
            for key, value in point.values.items():
                tag = STEP_PREFIX + key
                if point.step not in have.get(tag, ()):
                    todo.append((tag, value, point.step, point.wall_time))
                    steps.add(point.step)
        if source.ended and source.last_step is not None:
            for key, value in source.result.items():
                tag = RESULT_PREFIX + key
                if not have.get(tag):
                    todo.append((tag, value, source.last_step, source.points[-1].wall_time))
        return todo, len(steps)

    def track(self, source: RunSource, *, dry_run: bool = False) -> dict[str, Any]:
        """Write what ``source`` has that the directory has not. Raises ToolError when
        the directory cannot be written."""
        todo, steps = self.pending(source)
        session = self.pending_session(source)
        out = {"dir": str(self.run_dir(source)), "steps_written": steps,
               "points_written": len(todo), "hparams_written": bool(session)}
        if dry_run or not (todo or session):
            return out
        try:
            writer = self._writers.get(source.run_id)
            if writer is None:
                self.run_dir(source).mkdir(parents=True, exist_ok=True)
                writer = self._writers[source.run_id] = self._writer_cls(
                    str(self.run_dir(source)))
            for tag, value, step, wall_time in todo:
                writer.add_scalar(tag, value, step, wall_time=wall_time)
            writer.flush()
            if session:
                write_session(self.run_dir(source), source, session)
        except OSError as exc:
            raise ToolError(f"tensorboard {self.run_dir(source)}: cannot write "
                            f"({exc.strerror or exc})") from exc
        have = self._logged[source.run_id]
        for tag, _, step, _ in todo:
            have.setdefault(tag, set()).add(step)
        for tag in session:
            have.setdefault(tag, set()).add(0)
        return out

    def close(self) -> None:
        writers, self._writers = self._writers, {}
        for writer in writers.values():
            writer.close()


def _wall_time(source: RunSource, index: int) -> float | None:
    return source.points[index].wall_time if source.points else None


def write_session(run_dir: Path, source: RunSource, tags: list[str]) -> None:
    """The run's hparams session start and/or end (``tags``) into ``run_dir``, at step 0,
    with tensorboard's own hparams summaries, through its event file writer (a file of
    its own beside the scalars'). Raises OSError."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2, summary_v2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    events = []
    if SESSION_START_TAG in tags:
        start = _wall_time(source, 0)
        events.append((start, summary_v2.hparams_pb(dict(source.hparams),
                                                    trial_id=source.run_id,
                                                    start_time_secs=start)))
    if SESSION_END_TAG in tags:
        end = _wall_time(source, -1)
        status = api_pb2.STATUS_SUCCESS if source.state == "COMPLETED" else api_pb2.STATUS_FAILURE
        info = plugin_data_pb2.SessionEndInfo(status=status, end_time_secs=end or 0.0)
        summary = summary_pb2.Summary()
        summary.value.add(tag=SESSION_END_TAG, tensor=metadata.NULL_TENSOR,
                          metadata=metadata.create_summary_metadata(
                              plugin_data_pb2.HParamsPluginData(session_end_info=info)))
        events.append((end, summary))
    writer = EventFileWriter(str(run_dir))
    try:
        for wall_time, summary in events:
            writer.add_event(event_pb2.Event(wall_time=wall_time or time.time(), step=0,
                                             summary=summary))
    finally:
        writer.close()
