"""A hyperparameter sweep as one job array: every point planned (and so checked)
before anything is written, one run directory per point inside the sweep directory,
one array script, one submission; and the failed points alone submitted again.

    runs/sweep-<YYYYmmdd-HHMMSS>-<xxxx>/
        sweep.json          the points (their values, task ids, run directories), the arrays
        array.sbatch        the array's script: $SLURM_ARRAY_TASK_ID picks a point
        point-000/          an ordinary run directory: job.sbatch, plan.json (with the
                            point's values), job.json (task id 123_0), slurm-123_0.out, metrics/

The sweep directory is the one `hpcdl scale` writes (sweep.json with a "points" list of
run directories), so `results`, `report`, `track` and the follow loop read both; a
parameter sweep adds ``kind: "params"`` and each point's ``params``. No terminal output.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcdl.core.atomic import write_atomic
from hpcdl.core.gpuarch import ImageArchFacts
from hpcdl.errors import ToolError, ValidationError
from hpcdl.jobs.place import HERE, RunPlace
from hpcdl.jobs.rundir import JobRecord, RunDir
from hpcdl.jobs.submit import code_of, live_check_wanted, ship_or_undo, write_run
from hpcdl.plan import JobPlan, JobRequest, RuntimeMode, build_plan
from hpcdl.profiles.schema import Profile
from hpcdl.schedulers.base import Scheduler, SubmitOptions
from hpcdl.schedulers.slurm.array import array_script, array_spec, task_id
from hpcdl.sweep.compare import param_row
from hpcdl.sweep.grid import PointEntry, SweepRecord, read_sweep, sweep_record, write_sweep
from hpcdl.sweep.params import Point, command_args, example_args
from hpcdl.sweep.run import PointState, load_points, refresh

ARRAY_SCRIPT = "array.sbatch"
KIND = "params"


class ParamPointEntry(PointEntry, total=False):
    """A parameter sweep's point in sweep.json: the scale entry plus its values."""

    index: int
    params: dict[str, str]


def point_width(count: int) -> int:
    """Digits of the points' directory names (point-007): at least 3, so Slurm's %3a
    and the names agree up to 1,000 points, more above."""
    return max(3, len(str(max(count - 1, 0))))


def point_name(index: int, width: int) -> str:
    return f"point-{index:0{width}d}"


@dataclass(frozen=True)
class ArrayPlan:
    """A sweep decided, nothing written: the directory, each point with its plan (its run
    directory inside the sweep directory), the array script and its --array spec. What
    --dry-run prints is what gets submitted."""

    sweep_dir: Path
    base: JobRequest
    points: list[Point]
    plans: list[JobPlan]
    script: str
    array: str
    max_concurrent: int | None
    limit_reason: str
    size_limit: str = ""  # the most points the array may have, and whose limit that is

    @property
    def job_name(self) -> str:
        return self.plans[0].spec.job_name


def point_request(base: JobRequest, point: Point) -> JobRequest:
    """The request of one point: the example's -X with ``--NAME=v``, or COMMAND with its
    placeholders filled in."""
    if base.launch.command:
        return dataclasses.replace(base, launch=dataclasses.replace(
            base.launch, command=command_args(base.launch.command, point)))
    return dataclasses.replace(base, launch=dataclasses.replace(
        base.launch, example_args=example_args(base.launch.example_args, point)))


def cluster_array_size(scheduler: Scheduler, live_check: bool | None = None) -> int | None:
    """The scheduler's own limit on an array's tasks (Slurm's MaxArraySize), asked once
    when the live check runs and the scheduler can be asked from here; None otherwise
    (a dry run on a laptop, $HPCDL_SKIP_LIVE_CHECK): the profile's max_array_size is
    then the only limit checked before the submission."""
    if not live_check_wanted(live_check) or not scheduler.available():
        return None
    try:
        return scheduler.max_array_size()
    except ToolError:
        return None  # a submission's live check says so; a dry run goes on without it


def check_array_size(profile: Profile, partition: str, count: int,
                     cluster_max: int | None = None) -> str:
    """Raise ValidationError (one line: the field, the number of points, the limit)
    when ``count`` points exceed the cluster's MaxArraySize (``cluster_max``, from
    cluster_array_size) or the partition's max_array_size or max_submit_jobs in the
    profile; both are checked when both are known (the profile may be stricter).
    Returns the limit that applies, in words ("" when none is known)."""
    part = profile.partition(partition)
    where = f"partition {partition} allows"
    # (limit, who allows it, the field and what it is, the limit's name in the plan)
    checks: list[tuple[int | None, str, str, str]] = [
        (cluster_max, "the cluster allows",
         f"MaxArraySize = {cluster_max} in scontrol show config", "the cluster's MaxArraySize"),
        (part.max_array_size if part else None, where,
         f"max_array_size in profile {profile.name}: Slurm's MaxArraySize",
         "the profile's max_array_size"),
        (part.max_submit_jobs if part else None, where,
         f"max_submit_jobs in profile {profile.name}: the QOS's MaxSubmitJobs; each task "
         f"counts", "the profile's max_submit_jobs")]
    for limit, allows, field, _ in checks:
        if limit is not None and count > limit:
            raise ValidationError(f"points: {count} points, but {allows} {limit} ({field}); "
                                  f"split the sweep")
    known = [(limit, name) for limit, _, _, name in checks if limit is not None]
    if not known:
        return ""
    limit, name = min(known, key=lambda k: k[0])
    return f"at most {limit} points: {name}"


def array_limits(profile: Profile, partition: str, count: int,
                 max_concurrent: int | None) -> tuple[int | None, str]:
    """The throttle for ``count`` points on ``partition``, and where it comes from.
    Raises ValidationError (nothing is written yet) when the throttle is below 1."""
    part = profile.partition(partition)
    if max_concurrent is not None:
        if max_concurrent < 1:
            raise ValidationError(f"max-concurrent: {max_concurrent} must be 1 or more")
        return max_concurrent, "--max-concurrent"
    cap = part.max_jobs_per_user if part else None
    if cap is not None and cap < count:
        return cap, f"partition {partition}'s max_jobs_per_user"
    return None, "no limit: every point may run at once (--max-concurrent M sets one)"


def plan_array(profile: Profile, base: JobRequest, points: list[Point], *, sweep_dir: Path,
               max_concurrent: int | None = None, image_facts: ImageArchFacts | None = None,
               runtime_mode: RuntimeMode | None = None, place: RunPlace = HERE,
               cluster_max_array_size: int | None = None) -> ArrayPlan:
    """Every point planned with its run directory in ``sweep_dir`` (nothing written).
    Raises ValidationError naming the first point that cannot run, or the limit the
    number of points exceeds (``cluster_max_array_size``: the cluster's MaxArraySize,
    cluster_array_size; checked once the first point has its partition, before the
    others are planned)."""
    if not points:
        raise ValidationError("param: no point to run (give --param NAME=v1,v2, --points "
                              "FILE or --random N)")
    width = point_width(len(points))
    plans: list[JobPlan] = []
    size_limit = ""
    for point in points:
        request = point_request(base, point)
        run_dir = place.cluster_path(sweep_dir / point_name(point.index, width))
        request = dataclasses.replace(
            request, files=dataclasses.replace(request.files, run_dir=run_dir))
        try:
            plans.append(build_plan(profile, request, image_facts, runtime_mode))
        except ValidationError as err:
            raise ValidationError(f"point {point.index} ({point.describe()}): {err.message}",
                                  hint=err.hint) from err
        if len(plans) == 1:
            size_limit = check_array_size(profile, plans[0].spec.partition.name, len(points),
                                          cluster_max_array_size)
    throttle, why = array_limits(profile, plans[0].spec.partition.name, len(points), max_concurrent)
    script = array_script(
        [p.script for p in plans], [f"{p.spec.run_dir}/job.sbatch" for p in plans],
        [p.describe() for p in points],
        log_dir_pattern=f"{place.cluster_path(sweep_dir)}/point-%{width}a")
    return ArrayPlan(sweep_dir, base, points, plans, script,
                     array_spec([p.index for p in points], throttle), throttle, why, size_limit)


def submit_array(profile: Profile, sweep: ArrayPlan, *, scheduler: Scheduler,
                 live_check: bool | None = None, place: RunPlace = HERE) -> SweepRecord:
    """Write the sweep directory (every point's run directory, array.sbatch,
    sweep.json) and submit the array with one sbatch; returns sweep.json as written.
    The live check of every point runs first (one read of the cluster), with the
    number of points against the cluster's MaxArraySize (cluster_array_size). For a
    cluster elsewhere (``place``, the one plan_array mapped the paths with) the sweep
    directory is written here, then copied there whole (as submit copies a run
    directory: ship_or_undo) before sbatch sees it. Raises ValidationError,
    SubmitError, ToolError; when the scheduler refuses, sweep.json says so
    (``aborted``) and no point has a job id."""
    scheduler.require()
    if live_check_wanted(live_check):
        scheduler.check(profile, {f"point {p.index}": plan.demand()
                                  for p, plan in zip(sweep.points, sweep.plans, strict=True)})
        check_array_size(profile, sweep.plans[0].spec.partition.name, len(sweep.points),
                         scheduler.max_array_size())
    sweep_dir = sweep.sweep_dir
    locals_ = [place.local_path(str(plan.spec.run_dir)) for plan in sweep.plans]
    # Every point runs the same code: scanned once (a COMMAND's directory, see for_cluster).
    code = code_of(profile, sweep.plans[0], locals_[0])
    place.prepare()
    sweep_dir.mkdir(parents=True)
    runs = [write_run(profile, plan, local, code=code,
                      extra={"sweep_point": {"index": p.index, "params": p.params}})
            for p, plan, local in zip(sweep.points, sweep.plans, locals_, strict=True)]
    script = sweep_dir / ARRAY_SCRIPT
    write_atomic(script, sweep.script)
    entries: list[PointEntry] = [_entry(p, plan, run) for p, plan, run
                                 in zip(sweep.points, sweep.plans, runs, strict=True)]
    record = sweep_record(sweep_dir.name, profile.name, sweep.base, True, entries)
    record.update({"kind": KIND, "params": [k for k, _ in sweep.points[0].values],
                   "max_concurrent": sweep.max_concurrent, "job_name": sweep.job_name,
                   "arrays": [], "partition": sweep.plans[0].spec.partition.name})
    write_sweep(sweep_dir, record)
    ship_or_undo(place, RunDir(sweep_dir))  # the whole sweep directory, in one copy
    argv = scheduler.submit_argv(place.cluster_path(script), sweep.job_name,
                                 SubmitOptions(array=sweep.array))
    try:
        array_id = scheduler.submit(argv)
    except ToolError as err:
        record["aborted"] = f"sbatch: {err.message}"
        write_sweep(sweep_dir, record)
        raise
    _submitted(sweep_dir, record, array_id, [p.index for p in sweep.points], argv, runs)
    return record


def _entry(point: Point, plan: JobPlan, run: RunDir) -> PointEntry:
    return ParamPointEntry(  # type: ignore[typeddict-item]
        backend=plan.launch.backend, nodes=plan.spec.nodes, gpus=plan.spec.gpus_per_node,
        batch_size=None, ranks=plan.spec.ntasks, label=point.describe() or run.name, job_id=None, run_dir=run.name,
        index=point.index, params=point.params)


def _submitted(sweep_dir: Path, record: SweepRecord, array_id: str, indices: list[int],
               argv: list[str], runs: list[RunDir]) -> None:
    """Each submitted point's job.json and sweep.json entry with its task id."""
    by_index = {int(e.get("index", i)): e  # type: ignore[call-overload]
                for i, e in enumerate(record["points"])}
    for index, run in zip(indices, runs, strict=True):
        job = task_id(array_id, index)
        run.write_job(JobRecord.now(job, argv))
        by_index[index]["job_id"] = job
    record["arrays"].append({"job_id": array_id, "indices": indices, "argv": argv})
    write_sweep(sweep_dir, record)


def read_array_sweep(sweep_dir: Path) -> SweepRecord:
    """sweep.json of an `hpcdl sweep` directory. Raises ValidationError otherwise."""
    record = read_sweep(sweep_dir)
    if record is None or record.get("kind") != KIND:
        raise ValidationError(f"retry-failed: {sweep_dir} is not an `hpcdl sweep` directory "
                              f"(no sweep.json of kind {KIND!r})")
    return record


def failed_points(sweep_dir: Path, *, scheduler: Scheduler,
                  place: RunPlace = HERE) -> list[PointState]:
    """The points that ended without completing (their result.json written now if the
    scheduler has their end, their files pulled back first from ``place``); points
    still queued or running are not among them."""
    read_array_sweep(sweep_dir)
    _, points = load_points(sweep_dir)
    points = refresh(sweep_dir, points, scheduler=scheduler, place=place)
    return [p for p in points if p.final and not _completed(p)]


def _completed(point: PointState) -> bool:
    record = point.record or {}
    return record.get("state") == "COMPLETED" and record.get("exit_code") in (0, None)


def check_retry_size(indices: list[int], cluster_max: int | None) -> None:
    """Raise ValidationError (one line) when a point's index is not a task id the
    cluster takes: a retried point keeps its index, and Slurm numbers an array's tasks
    0 to MaxArraySize - 1 (``cluster_max``; None: not known, nothing checked)."""
    if cluster_max is None or not indices or max(indices) < cluster_max:
        return
    top = max(indices)
    allows = f"tasks 0-{cluster_max - 1}" if cluster_max > 0 else "no job array"
    raise ValidationError(
        f"retry-failed: point {top} is array task {top}, but the cluster allows {allows} "
        f"(MaxArraySize = {cluster_max} in scontrol show config); nothing resubmitted",
        hint="sweep those points again as a new sweep (--points FILE.yaml): its tasks are "
             "numbered from 0")


def retry_failed(sweep_dir: Path, *, scheduler: Scheduler, max_concurrent: int | None = None,
                 place: RunPlace = HERE, live_check: bool | None = None,
                 ) -> tuple[list[int], str | None]:
    """Submit the failed points again as one new array over their indices (``--array=3,5``)
    with the same array script (its copy on the cluster, ``place``); each keeps its run
    directory (the earlier result.json kept as result-<task id>.json, the earlier logs
    stay; with --requeue, its checkpoints: it resumes from the newest). The indices are
    checked against the cluster's MaxArraySize first (check_retry_size; asked once,
    unless ``live_check`` is off). Returns (indices, array job id);
    ([], None) when no point failed. Raises ValidationError, SubmitError, ToolError."""
    record = read_array_sweep(sweep_dir)
    failed = failed_points(sweep_dir, scheduler=scheduler, place=place)
    if not failed:
        return [], None
    indices = sorted(int(p.entry.get("index", -1)) for p in failed)  # type: ignore[call-overload]
    # The cluster's MaxArraySize again: it may have been lowered since the sweep was
    # submitted (or that submission could not ask); nothing is moved before this.
    check_retry_size(indices, cluster_array_size(scheduler, live_check))
    throttle = max_concurrent if max_concurrent is not None else record.get("max_concurrent")
    spec = array_spec(indices, throttle)  # type: ignore[arg-type]
    runs = {int(p.entry.get("index", -1)): p.run_dir(sweep_dir)  # type: ignore[call-overload]
            for p in failed}
    for point in failed:
        run = point.run_dir(sweep_dir)
        if run.result_file.is_file():  # a new result.json comes with the new task
            run.result_file.replace(run.path / f"result-{point.job_id}.json")
    argv = scheduler.submit_argv(place.cluster_path(sweep_dir / ARRAY_SCRIPT),
                                 record["job_name"], SubmitOptions(array=spec))
    array_id = scheduler.submit(argv)
    _submitted(sweep_dir, record, array_id, indices, argv, [runs[i] for i in indices])
    return indices, array_id


def table(sweep_dir: Path, *, scheduler: Scheduler, query: bool = True,
          place: RunPlace = HERE) -> tuple[list[dict[str, Any]], list[str]]:
    """The comparison rows of a parameter sweep (hpcdl.sweep.compare) and its
    parameters' names; unfinished points asked about in ``scheduler`` (one batched
    query) unless ``query`` is False."""
    record, points = load_points(sweep_dir)
    points = refresh(sweep_dir, points, query=query, scheduler=scheduler, place=place)
    return ([param_row(p.entry, p.record, p.state, p.note) for p in points],
            list(record.get("params") or []))
