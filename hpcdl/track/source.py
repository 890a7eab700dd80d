"""What a tracker is given of one run directory: its identity, parameters, per-step
series and result, read through RunDir and hpcdl.jobside.steps (the owners of the
files). Pure apart from reading the directory.

The per-step series is one point per optimizer step, aggregated over the ranks that
recorded it: ``loss``, ``lr`` and ``epoch`` of the lowest rank (rank 0 normally;
every rank logs its own loss, rank 0's is what the example prints); ``images_per_sec``
summed over the ranks (the job's throughput); ``step_s``, ``data_s`` and ``sync_s``
the largest over the ranks (the slowest rank sets the pace of a synchronous step).

The hyperparameters (``hparams``: what TensorBoard's HPARAMS tab compares) are a
parameter sweep's values of the point (sweep.json's ``params``, under their own names),
else the run's parameters; a value that reads as a number is one, so the tab sorts
and plots it as a number.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcdl.errors import ValidationError
from hpcdl.jobs.rundir import RunDir
from hpcdl.jobside import steps as step_metrics
from hpcdl.sweep.grid import read_sweep

# Per-step keys and how ranks are combined (see the module doc).
FROM_LOWEST_RANK = ("loss", "lr")
SUMMED = ("images_per_sec",)
SLOWEST = ("step_s", "data_s", "sync_s")
# plan.json keys that say what the run was (the rest is how it was run).
PLAN_PARAMS = ("nodes", "gpus_per_node", "ntasks", "tasks_per_node", "cpus_per_task",
               "backend", "launcher", "profile", "partition", "time", "job_name", "image",
               "container_mode", "requeue", "chain", "spares")
# MLflow keeps parameter values up to 6,000 characters (500 on servers before 2.9): a
# long command is cut so any server takes it.
PARAM_VALUE_MAX = 500
_UNSAFE_ID = re.compile(r"[^A-Za-z0-9_.+-]+")
_UNSAFE_KEY = re.compile(r"[^A-Za-z0-9_.\- /]+")


@dataclass(frozen=True)
class StepPoint:
    step: int
    wall_time: float | None
    values: dict[str, float]


@dataclass(frozen=True)
class RunSource:
    """One run directory as the trackers see it."""

    path: Path
    run_id: str  # the directory's name, made safe: the tracker's key for this run
    params: dict[str, str]
    tags: dict[str, str]
    points: list[StepPoint]
    ranks: int
    result: dict[str, float] = field(default_factory=dict)
    state: str | None = None  # result.json's state, once the job was followed to its end
    hparams: dict[str, float | str] = field(default_factory=dict)

    @property
    def ended(self) -> bool:
        return self.state is not None

    @property
    def last_step(self) -> int | None:
        return self.points[-1].step if self.points else None


def is_run_dir(path: Path) -> bool:
    """What `hpcdl report` takes as a run directory: plan.json or metrics/ in it."""
    run = RunDir(path)
    return run.plan_file.is_file() or run.metrics.is_dir()


def find_runs(paths: list[Path]) -> list[Path]:
    """The run directories named by ``paths``: a run directory itself, a sweep directory's
    points (sweep.json, those submitted), or a directory whose subdirectories are run
    directories. Raises ValidationError naming a path that is none of these."""
    found: list[Path] = []
    for path in paths:
        if not path.is_dir():
            raise ValidationError(f"{path}: not a directory (expected a run or sweep directory)")
        sweep = read_sweep(path)
        if sweep is not None:
            found += [path / str(p["run_dir"]) for p in sweep["points"]
                      if p.get("run_dir") and (path / str(p["run_dir"])).is_dir()]
        elif is_run_dir(path):
            found.append(path)
        else:
            inner = sorted(p for p in path.iterdir() if p.is_dir() and is_run_dir(p))
            if not inner:
                raise ValidationError(
                    f"{path}: neither a run directory (plan.json or metrics/) nor a sweep "
                    f"directory (sweep.json, or subdirectories that are run directories)")
            found += inner
    unique: dict[Path, None] = {}
    for p in found:
        unique.setdefault(p.resolve(), None)
    return list(unique)


def run_id_of(path: Path) -> str:
    """The tracker's key of a run: its directory's name (unique: name, time, random
    suffix), with anything outside [A-Za-z0-9_.+-] replaced."""
    return _UNSAFE_ID.sub("-", path.resolve().name).strip("-") or "run"


def param_key(name: str) -> str:
    """A key MLflow and TensorBoard take (letters, digits, _ - . space /)."""
    return _UNSAFE_KEY.sub("_", name)[:250]


def hparam_value(text: str) -> float | str:
    """A parameter's value as TensorBoard's HPARAMS tab compares it: a (finite) number
    when the text reads as one, else the text."""
    try:
        number = float(text)
    except ValueError:
        return text
    return number if math.isfinite(number) else text


def _value(value: Any) -> str:
    text = value if isinstance(value, str) else shlex.join(value) if isinstance(
        value, list) else str(value)
    return text if len(text) <= PARAM_VALUE_MAX else text[:PARAM_VALUE_MAX - 3] + "..."


def command_args(command: list[str]) -> dict[str, str]:
    """``--key value``, ``--key=value`` and bare ``--flag`` of a training command, as
    {"key": "value"} ("true" for a flag); a later value of a key wins, as argparse does."""
    out: dict[str, str] = {}
    i = 0
    while i < len(command):
        word = command[i]
        if word.startswith("--") and len(word) > 2:
            key, eq, value = word[2:].partition("=")
            if not eq:
                following = command[i + 1] if i + 1 < len(command) else None
                if following is not None and not following.startswith("--"):
                    value, i = following, i + 1
                else:
                    value = "true"
            out[key] = value
        i += 1
    return out


def plan_params(plan: dict[str, Any]) -> dict[str, str]:
    """The run's parameters from plan.json: its shape and the command's arguments
    (``arg.KEY``), the command itself too (cut to PARAM_VALUE_MAX characters)."""
    params = {key: _value(plan[key]) for key in PLAN_PARAMS
              if plan.get(key) not in (None, "")}
    command = [str(w) for w in plan.get("command") or []]
    if command:
        params["command"] = _value(command)
        params.update({param_key(f"arg.{k}"): _value(v)
                       for k, v in command_args(command).items()})
    return params


def aggregate(metrics: dict[int, dict[str, Any]], *, complete_only: bool) -> list[StepPoint]:
    """One point per step over every rank's steps (hpcdl.jobside.steps.read_metrics);
    with ``complete_only``, only the steps every rank has written so far (a rank flushes
    its lines in batches: a step of a running job may not be on every rank's file yet,
    and a sum over some ranks would be logged once and never corrected)."""
    if not metrics:
        return []
    by_step: dict[int, list[tuple[int, dict[str, Any]]]] = {}
    for rank in sorted(metrics):
        for rec in metrics[rank]["steps"]:
            by_step.setdefault(rec["step"], []).append((rank, rec))
    limit = None
    if complete_only:
        lasts = [info["steps"][-1]["step"] if info["steps"] else None
                 for info in metrics.values()]
        if any(last is None for last in lasts):
            return []
        limit = min(x for x in lasts if x is not None)
    points = []
    for step in sorted(by_step):
        if limit is not None and step > limit:
            break
        recs = [rec for _, rec in by_step[step]]
        values: dict[str, float] = {}
        for key in FROM_LOWEST_RANK:
            if _number(recs[0].get(key)):
                values[key] = float(recs[0][key])
        for key in SUMMED:
            got = [float(r[key]) for r in recs if _number(r.get(key))]
            if got:
                values[key] = sum(got)
        for key in SLOWEST:
            got = [float(r[key]) for r in recs if _number(r.get(key))]
            if got:
                values[key] = max(got)
        t = recs[0].get("t")
        points.append(StepPoint(step, float(t) if isinstance(t, (int, float)) else None,
                                values))
    return points


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def result_metrics(record: dict[str, Any] | None) -> dict[str, float]:
    """The numbers of the job's result line (result.json's hpcdl_result)."""
    result = (record or {}).get("hpcdl_result")
    if not isinstance(result, dict):
        return {}
    return {param_key(k): float(v) for k, v in result.items() if _number(v)}


def read_run(path: Path) -> RunSource:
    """Run directory ``path`` as trackers see it. Raises ValidationError when plan.json
    or result.json is there but unreadable."""
    run = RunDir(path)
    params: dict[str, str] = {}
    tags = {"hpcdl.run_id": run_id_of(path), "hpcdl.run_dir": str(path.resolve())}
    if run.plan_file.is_file():
        try:
            plan = run.read_plan().data
        except (OSError, ValueError) as exc:
            raise ValidationError(f"{run.plan_file}: unreadable ({exc})") from exc
        params = plan_params(plan)
    swept: Any = None
    sweep = read_sweep(path.resolve().parent)
    if sweep is not None:
        tags["hpcdl.sweep_id"] = str(sweep.get("sweep_id", ""))
        for point in sweep["points"]:
            if point.get("run_dir") == path.resolve().name:
                params.update({f"point.{k}": _value(point[k]) for k in  # type: ignore[literal-required]
                               ("label", "batch_size") if point.get(k) is not None})
                swept = point.get("params")  # a parameter sweep's point: its values
                if isinstance(swept, dict):
                    # Under their own names, as trackers compare runs: a `-- COMMAND`
                    # sweep's values need not appear as an `--name value` argument.
                    params.update({param_key(f"point.{k}"): _value(v) for k, v in swept.items()})
    hparams = ({param_key(str(k)): hparam_value(_value(v)) for k, v in swept.items()}
               if isinstance(swept, dict) and swept else
               {key: hparam_value(value) for key, value in params.items()})
    job = run.read_job()
    if job is not None:
        tags["hpcdl.job_id"] = job.job_id
    try:
        record = run.read_result()
    except (OSError, ValueError) as exc:
        raise ValidationError(f"{run.result_file}: unreadable ({exc})") from exc
    state = str(record.get("state")) if record and record.get("state") else None
    if state:
        tags["hpcdl.state"] = state
    metrics = step_metrics.read_metrics(run.metrics)
    return RunSource(path=path, run_id=tags["hpcdl.run_id"], params=params, tags=tags,
                     points=aggregate(metrics, complete_only=state is None),
                     ranks=len(metrics), result=result_metrics(record), state=state,
                     hparams=hparams)
