"""The sweeps' preparations, through hpcdl.jobs.prepare.prepare as one job's: a scaling
sweep's points (``prepare_points``, hpcdl scale) and a parameter sweep as one job array
(``prepare_array``, hpcdl sweep), dry run or not; each adds only how its plans are made.
Nothing here prints: warnings go to ``on_warning``, refusals go up as hpcdl errors
before anything is written."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hpcdl.jobs.cluster import Cluster
from hpcdl.jobs.prepare import Inputs, OnWarning, no_warning, prepare
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
    """A scaling sweep's points planned (hpcdl.sweep.grid.plan_points) from ``base`` by
    hpcdl.jobs.prepare.prepare, as one job is: the image's build record read once for
    every point's check, and each point planned once with its run directory in
    ``sweep_dir`` (created by the submission, never here), mapped to the cluster's
    (none for a script for reading); those plans are what gets submitted.
    Raises ValidationError (naming the point), RenderError before anything is written."""
    def plan(ready: Inputs) -> list[tuple[SweepPoint, JobPlan]]:
        if ready.reading:
            return plan_points(prof, ready.request, points, image_facts=ready.image_facts,
                               runtime_mode=ready.runtime_mode)
        return plan_points(prof, ready.request, points, sweep_dir, ready.image_facts,
                           ready.runtime_mode, place=cluster.place)

    ready, plans = prepare(prof, base, cluster, plan, lambda p: p[0][1],
                           on_warning=on_warning)
    remote = not ready.reading and cluster.place.remote
    return PreparedPoints(ready.request, plans, ready.notes,
                          cluster.place.cluster_path(sweep_dir) if remote else None)


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
    by hpcdl.jobs.prepare.prepare, as one job is: every point's run directory mapped to
    the cluster's, and the number of points against the cluster's MaxArraySize (asked
    of the scheduler; a dry run over a transport asks nothing and says so). A scheduler
    without Slurm's arrays was refused before (open_cluster). Raises ValidationError,
    RenderError before anything is written."""
    def plan(ready: Inputs) -> ArrayPlan:
        if ready.notes is not None and cluster.remote:  # a dry run asks the cluster nothing
            cluster_max = None
            ready.notes.append(f"not checked: the number of points against the cluster's "
                               f"MaxArraySize (a submission asks {cluster.executor.target})")
        else:
            cluster_max = arrays.cluster_array_size(cluster.scheduler)
        return arrays.plan_array(prof, ready.request, points, sweep_dir=sweep_dir,
                                 max_concurrent=max_concurrent, image_facts=ready.image_facts,
                                 runtime_mode=ready.runtime_mode, place=cluster.place,
                                 cluster_max_array_size=cluster_max)

    ready, plan_ = prepare(prof, base, cluster, plan, lambda p: p.plans[0],
                           on_warning=on_warning)
    cluster_dir = cluster.place.cluster_path(plan_.sweep_dir) if cluster.place.remote else None
    return PreparedArray(ready.request, plan_, ready.notes, cluster_dir)
