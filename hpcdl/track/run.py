"""One tracking pass over many runs, or following them until their jobs end.

Following asks the scheduler nothing new: hpcdl.sweep.run.refresh (what `hpcdl results`
uses) brings every unfinished run up to date with one batched query per polling cycle,
and writes result.json for a job that ended, as `submit --wait` would; a run whose
result.json is there is done. Each cycle logs the steps written since the last one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from hpcdl.jobs.place import HERE, RunPlace
from hpcdl.schedulers.base import Scheduler
from hpcdl.sweep.run import PointState, refresh, run_dir_entry
from hpcdl.track.source import RunSource, read_run

DEFAULT_INTERVAL_S = 10.0


class Sink(Protocol):
    def track(self, source: RunSource) -> dict[str, Any]: ...


@dataclass
class Sinks:
    """Where runs go: TensorBoard, MLflow or both (hpcdl.track.to_tensorboard/to_mlflow)."""

    tensorboard: Any = None
    mlflow: Any = None
    dry_run: bool = False

    def track(self, source: RunSource, *, report: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"run": source.run_id, "path": str(source.path),
                               "ranks": source.ranks, "steps": len(source.points),
                               "state": source.state}
        if self.tensorboard is not None:
            out["tensorboard"] = self.tensorboard.track(source, dry_run=self.dry_run)
        if self.mlflow is not None:
            out["mlflow"] = self.mlflow.track(source, report=report)
        return out

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()


def track_once(runs: list[Path], sinks: Sinks) -> list[dict[str, Any]]:
    """Every run in ``runs`` tracked once: what each sink wrote, per run."""
    return [sinks.track(read_run(path)) for path in runs]


@dataclass
class Totals:
    """What following wrote so far, per run (summed over the cycles)."""

    runs: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, entry: dict[str, Any]) -> None:
        seen = self.runs.get(entry["run"])
        if seen is None:
            self.runs[entry["run"]] = {k: dict(v) if isinstance(v, dict) else v
                                       for k, v in entry.items()}
            return
        for sink in ("tensorboard", "mlflow"):
            for key, value in entry.get(sink, {}).items():
                if isinstance(value, bool):  # created, result_logged, report: ever
                    seen[sink][key] = bool(seen[sink].get(key)) or value
                elif isinstance(value, int):  # steps and points written: summed
                    seen[sink][key] = seen[sink].get(key, 0) + value
                elif value is not None:
                    seen[sink][key] = value
        seen.update({k: entry[k] for k in ("steps", "state", "ranks")})


def follow(runs: list[Path], sinks: Sinks, *, scheduler: Scheduler, place: RunPlace = HERE,
           interval: float = DEFAULT_INTERVAL_S, timeout: float | None = None,
           on_cycle: Callable[[list[dict[str, Any]], int], None] | None = None,
           sleep: Callable[[float], None] = time.sleep) -> list[dict[str, Any]]:
    """Track ``runs`` every ``interval`` seconds until each one's job has ended (then a
    last pass with its result and report), or ``timeout`` seconds passed. ``on_cycle(
    entries, still_running)`` after each cycle. Returns the totals per run."""
    totals = Totals()
    waiting = list(runs)
    start = time.monotonic()
    while waiting:
        entries = []
        for path in waiting:
            if place.remote:
                from hpcdl.jobs.rundir import RunDir

                place.fetch(RunDir(path))
            entries.append(sinks.track(read_run(path), report=False))
        ended = _ended(waiting, scheduler, place)
        for path in ended:  # the last pass: the result (refresh wrote result.json), the report
            entries.append(sinks.track(read_run(path), report=True))
        for entry in entries:
            totals.add(entry)
        waiting = [p for p in waiting if p not in ended]
        if on_cycle is not None:
            on_cycle(entries, len(waiting))
        if not waiting or (timeout is not None and time.monotonic() - start >= timeout):
            break
        sleep(interval)
    return list(totals.runs.values())


def _ended(runs: list[Path], scheduler: Scheduler, place: RunPlace) -> list[Path]:
    """The runs whose job has ended (result.json there or written now): one scheduler
    query per cycle per parent directory (a sweep's points share theirs)."""
    groups: dict[Path, list[Path]] = {}
    for path in runs:
        groups.setdefault(path.parent, []).append(path)
    done = []
    for base, paths in groups.items():
        points = [PointState(run_dir_entry(p)) if (p / "plan.json").is_file() else None
                  for p in paths]
        known = [pt for pt in points if pt is not None]
        fresh = iter(refresh(base, known, scheduler=scheduler, place=place)) if known else iter(())
        for path, point in zip(paths, points, strict=True):
            state = next(fresh) if point is not None else None
            # A directory without plan.json was never submitted by hpcdl: nothing to wait for.
            if state is None or state.final:
                done.append(path)
    return done
