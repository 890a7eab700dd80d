"""TensorBoard: one event-file directory per run (DIR/<run id>/), written with the
tensorboard package's own writer (tensorboard.summary.Writer: numpy, no TensorFlow or
torch) and read back with its own reader, so a step already in the directory is not
written again: tracking twice adds nothing, and ``--follow`` adds only new steps.

Tags: ``train/<key>`` per step (hpcdl.track.source's series) and ``result/<key>`` once,
at the last step, when the job's result is known.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcdl.core.errors import ToolError, UserInputError
from hpcdl.track.source import RunSource

EXTRA_HINT = "pip install 'hpcdl[tensorboard]'"
STEP_PREFIX = "train/"
RESULT_PREFIX = "result/"


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

    def pending(self, source: RunSource) -> tuple[list[tuple[str, float, int, float | None]],
                                                  int]:
        """(tag, value, step, wall time) not in the run's directory yet, and the number
        of steps they touch."""
        if source.run_id not in self._logged:
            self._logged[source.run_id] = logged_steps(self.run_dir(source))
        have = self._logged[source.run_id]
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
        out = {"dir": str(self.run_dir(source)), "steps_written": steps,
               "points_written": len(todo)}
        if dry_run or not todo:
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
        except OSError as exc:
            raise ToolError(f"tensorboard {self.run_dir(source)}: cannot write "
                            f"({exc.strerror or exc})") from exc
        have = self._logged[source.run_id]
        for tag, _, step, _ in todo:
            have.setdefault(tag, set()).add(step)
        return out

    def close(self) -> None:
        writers, self._writers = self._writers, {}
        for writer in writers.values():
            writer.close()
