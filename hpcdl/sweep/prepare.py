"""The sweeps' preparations, as hpcdl.jobs.prepare prepares one job: a scaling sweep's
points (``prepare_points``, hpcdl scale) and a parameter sweep as one job array
(``prepare_array``, hpcdl sweep), dry run or not. Nothing here prints: warnings go to
``on_warning``, refusals go up as hpcdl errors before anything is written."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hpcdl.jobs.cluster import Cluster
from hpcdl.jobs.prepare import OnWarning, for_reading, no_warning, runtime_mode
from hpcdl.plan import JobPlan, JobRequest
from hpcdl.profiles.schema import Profile
from hpcdl.sweep import arrays
from hpcdl.sweep.arrays import ArrayPlan
from hpcdl.sweep.grid import SweepPoint, plan_points
from hpcdl.sweep.params import Point


@dataclass(frozen=True)
class PreparedPoints:
    """A scaling sweep made ready to submit: the base request as the cluster sees it,
    every point's plan, for a dry run the notes of what it left unchecked (None for
    real), and ``cluster_dir``, the sweep directory on the cluster when it is copied
    there (a login: profile), else None."""

    request: JobRequest
    plans: list[tuple[SweepPoint, JobPlan]]
    notes: list[str] | None
    cluster_dir: str | None


def prepare_points(prof: Profile, base: JobRequest, points: list[SweepPoint],
                   cluster: Cluster, *, sweep_dir: Path,
                   on_warning: OnWarning = no_warning) -> PreparedPoints:
    """A scaling sweep's points planned (hpcdl.sweep.grid.plan_points) from ``base`` as
    `prepare_job` plans one job, dry run or not: the image's build record read once for
    every point's check, the request as the cluster sees it (the image and code as the
    nodes see them), and each point planned once with its run directory in
    ``sweep_dir`` (created by the submission, never here), mapped to the cluster's;
    those plans are what gets submitted, the inputs checked here first for real.
    Raises ValidationError (naming the point), RenderError before anything is written."""
    cluster.check_data(base)  # dry run or not (prepare_job's first check too)
    facts = cluster.image_facts(base)
    mode = runtime_mode(cluster, base, on_warning)
    if for_reading(prof, cluster):
        return PreparedPoints(base, plan_points(prof, base, points, image_facts=facts,
                                                runtime_mode=mode), [], None)
    base, notes = cluster.request_for(base)
    plans = plan_points(prof, base, points, sweep_dir, facts, mode,
                        place=cluster.place)  # raises before writing
    if not cluster.planning:
        cluster.check_inputs(base, image=plans[0][1].container.image)
    cluster_dir = cluster.place.cluster_path(sweep_dir) if cluster.place.remote else None
    return PreparedPoints(base, plans, notes, cluster_dir)


@dataclass(frozen=True)
class PreparedArray:
    """A parameter sweep made ready to submit as one job array: the base request as the
    cluster sees it, the array's plan, and for a dry run the notes of what it left
    unchecked (None for real). ``cluster_dir``: the sweep directory on the cluster when
    it is copied there (a login: profile), else None."""

    request: JobRequest
    plan: ArrayPlan
    notes: list[str] | None
    cluster_dir: str | None


def prepare_array(prof: Profile, base: JobRequest, points: list[Point], cluster: Cluster, *,
                  sweep_dir: Path, max_concurrent: int | None,
                  on_warning: OnWarning = no_warning) -> PreparedArray:
    """A parameter sweep's points planned as one job array (hpcdl.sweep.arrays.plan_array)
    as `prepare_job` plans one job: the image's build record read here, the request as
    the cluster sees it with every point's run directory mapped to the cluster's, the
    number of points against the cluster's MaxArraySize (asked of the scheduler; a dry
    run over a transport asks nothing and says so), and for real the inputs checked
    here. Raises ValidationError, RenderError before anything is written."""
    cluster.check_data(base)  # dry run or not (prepare_job's first check too)
    facts = cluster.image_facts(base)
    mode = runtime_mode(cluster, base, on_warning)
    base, notes = cluster.request_for(base)
    if notes is not None and cluster.remote:  # a dry run asks the cluster nothing
        cluster_max = None
        notes.append(f"not checked: the number of points against the cluster's "
                     f"MaxArraySize (a submission asks {cluster.executor.target})")
    else:
        cluster_max = arrays.cluster_array_size(cluster.scheduler)
    plan = arrays.plan_array(prof, base, points, sweep_dir=sweep_dir,
                             max_concurrent=max_concurrent, image_facts=facts,
                             runtime_mode=mode, place=cluster.place,
                             cluster_max_array_size=cluster_max)  # raises before writing
    cluster_dir = cluster.place.cluster_path(plan.sweep_dir) if cluster.place.remote else None
    if not cluster.planning:
        # Here's inputs; the cluster's were checked (for_cluster).
        cluster.check_inputs(base, image=plan.plans[0].container.image)
    return PreparedArray(base, plan, notes, cluster_dir)
