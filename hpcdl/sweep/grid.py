"""A scaling sweep: the grid of points (backend x nodes x GPUs per node x batch size)
that ``hpcdl scale`` submits, each checked against the profile before anything is
written, and the sweep's record (sweep.json). Pure functions, apart from the record.

    runs/sweep-<YYYYmmdd-HHMMSS>-<xxxx>/
        sweep.json                      the grid, the shared settings, a job per point
        horovod-n1-g2-b32-<stamp>-<x>/  one ordinary run directory per point

Every point runs the bundled example with the same settings; only the point's own
values differ, so the points are comparable.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from hpcdl.core.atomic import write_json_atomic
from hpcdl.core.gpuarch import ImageArchFacts
from hpcdl.errors import ValidationError
from hpcdl.jobs.place import HERE, RunPlace
from hpcdl.jobs.rundir import new_run_path, runs_root
from hpcdl.plan import BACKENDS, JobPlan, JobRequest, RuntimeMode, build_plan
from hpcdl.profiles.schema import Profile

SWEEP_FILE = "sweep.json"
# The example's batch-size flag: the sweep sets it per point, so -X may not.
BATCH_FLAG = "--batch-size"


@dataclass(frozen=True, order=True)
class SweepPoint:
    backend: str
    nodes: int
    gpus: int  # per node; one rank per GPU (one rank per node when 0)
    batch_size: int | None = None  # per rank; None: the profile's or the example's default

    @property
    def ranks(self) -> int:
        return self.nodes * max(self.gpus, 1)

    @property
    def label(self) -> str:
        """Short and file-name safe, e.g. ``horovod-n2-g4-b64``."""
        batch = f"-b{self.batch_size}" if self.batch_size is not None else ""
        return f"{self.backend}-n{self.nodes}-g{self.gpus}{batch}"


def new_sweep_id() -> str:
    """``sweep-<YYYYmmdd-HHMMSS>-<xxxx>``: the sweep directory's name."""
    return f"sweep-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def default_job_name(sweep_id: str) -> str:
    """The job name a sweep's points share (Slurm's singleton dependency keys on it)."""
    return f"hpcdl-scale-{sweep_id.rsplit('-', 1)[-1]}"


def parse_int_list(field: str, text: str, minimum: int = 1) -> tuple[int, ...]:
    """``"1,2,4"`` -> (1, 2, 4), in the given order, duplicates dropped.

    Raises ValidationError naming the option and the bad item.
    """
    values: list[int] = []
    for item in (part.strip() for part in text.split(",")):
        if not item.isdigit() or int(item) < minimum:
            raise ValidationError(
                f"{field}: '{item}' in '{text}' is not a whole number >= {minimum}"
                if item else f"{field}: '{text}' has an empty item (write e.g. 1,2,4)")
        if int(item) not in values:
            values.append(int(item))
    return tuple(values)


def parse_backends(text: str) -> tuple[str, ...]:
    """``"horovod,ddp"`` -> ("horovod", "ddp"). Raises ValidationError for an unknown one."""
    out: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        if item not in BACKENDS:
            raise ValidationError(f"backend: '{item}' in '{text}' is not one of "
                                  f"{', '.join(BACKENDS)}")
        if item not in out:
            out.append(item)
    return tuple(out)


def expand(backends: tuple[str, ...], nodes: tuple[int, ...], gpus: tuple[int, ...],
           batch_sizes: tuple[int, ...] | None) -> list[SweepPoint]:
    """Every combination, ordered by backend, batch size, then ranks (smallest first,
    so the 1-rank baseline runs first)."""
    sizes: tuple[int | None, ...] = batch_sizes or (None,)
    points = [SweepPoint(b, n, g, s)
              for b, s, n, g in itertools.product(backends, sizes, nodes, gpus)]
    return sorted(points, key=lambda p: (backends.index(p.backend), sizes.index(p.batch_size),
                                         p.ranks, p.nodes))


def point_request(base: JobRequest, point: SweepPoint) -> JobRequest:
    """The job request of one point: the shared settings plus the point's own."""
    extra = (f"{BATCH_FLAG}={point.batch_size}",) if point.batch_size is not None else ()
    return dataclasses.replace(
        base, placement=dataclasses.replace(base.placement, nodes=point.nodes, gpus=point.gpus),
        launch=dataclasses.replace(base.launch, backend=point.backend,
                                   example_args=(*base.launch.example_args, *extra)))


def check_base(base: JobRequest, sweeping_batch: bool) -> None:
    """What a sweep cannot take. Raises ValidationError."""
    if base.launch.command:
        raise ValidationError("command: a sweep runs the bundled example; a custom COMMAND "
                              "cannot report the throughput a scaling table needs")
    if sweeping_batch and any(arg == BATCH_FLAG or arg.startswith(BATCH_FLAG + "=")
                              for arg in base.launch.example_args):
        raise ValidationError(f"example-arg: {BATCH_FLAG} is set per point by --batch-size; "
                              f"drop it from -X")


def pin_partition(profile: Profile, base: JobRequest,
                  points: list[SweepPoint]) -> tuple[JobRequest, str]:
    """``base`` with the one partition every point runs on, and why that one.

    Speedup against a baseline means something only on the same hardware (the ZIH
    study computes it per partition), so without --partition the sweep takes the
    smallest partition that fits its largest point (most nodes and most GPUs per
    node: the grid always has that corner) for all points. Raises ValidationError,
    naming that point, when no partition fits it.
    """
    if base.placement.partition is not None or not points:
        return base, "requested with --partition"
    most_nodes, most_gpus = max(p.nodes for p in points), max(p.gpus for p in points)
    corner = next(p for p in points if (p.nodes, p.gpus) == (most_nodes, most_gpus))
    ((_, plan),) = plan_points(profile, base, [corner])
    return (dataclasses.replace(base, placement=dataclasses.replace(
        base.placement, partition=plan.spec.partition.name)),
            f"the largest point, {corner.label}: {plan.partition_reason}")


def sweep_path(sweep_id: str) -> Path:
    """The sweep directory's absolute path (not created): ``<runs root>/<sweep_id>``."""
    return runs_root().resolve() / sweep_id


def plan_points(profile: Profile, base: JobRequest, points: list[SweepPoint],
                sweep_dir: Path | None = None,
                image_facts: ImageArchFacts | None = None,
                runtime_mode: RuntimeMode | None = None,
                place: RunPlace = HERE) -> list[tuple[SweepPoint, JobPlan]]:
    """A validated plan for every point, or ValidationError naming the first point
    that cannot run (and why) before anything is written. With ``sweep_dir`` each
    point's run directory (under it, named after the point) is decided here, so
    these plans are the ones submitted; without, they are for showing (--dry-run).
    ``image_facts``, ``runtime_mode``: as for build_plan (the image's GPU architectures, read by
    hpcdl.jobs.preflight). ``place``: where the cluster reads the run directories (their
    paths in the plans are the cluster's)."""
    plans = []
    for point in points:
        request = point_request(base, point)
        if sweep_dir is not None:
            run_dir = place.cluster_path(new_run_path(point.label, sweep_dir))
            request = dataclasses.replace(
                request, files=dataclasses.replace(request.files, run_dir=run_dir))
        try:
            plans.append((point, build_plan(profile, request, image_facts, runtime_mode)))
        except ValidationError as err:
            raise ValidationError(f"point {point.label} ({point.ranks} ranks): {err.message}",
                                  hint=err.hint) from err
    return plans


class PointEntry(TypedDict):
    """One point in sweep.json: the point's values, its job id and run directory
    (relative to the sweep directory) once submitted."""

    backend: str
    nodes: int
    gpus: int
    batch_size: int | None
    ranks: int
    label: str
    job_id: str | None
    run_dir: str | None


class SweepRecord(TypedDict, total=False):
    """sweep.json: the shared settings, one entry per point, and why it stopped
    (``aborted``) when the scheduler refused a point."""

    sweep_id: str
    created_at: str
    profile: str
    partition: str | None
    image: str | None
    synthetic: bool
    data: str | None
    example_args: list[str]
    concurrent: bool
    points: list[PointEntry]
    aborted: str
    # `hpcdl sweep` (hpcdl.sweep.arrays): "params", the parameters' names, the array
    # throttle, the job name and every array submitted (the first, then each retry).
    kind: str
    params: list[str]
    max_concurrent: int | None
    job_name: str
    arrays: list[dict[str, Any]]


def sweep_record(sweep_id: str, profile: str, base: JobRequest, concurrent: bool,
                 points: list[PointEntry]) -> SweepRecord:
    """sweep.json's content: the shared settings and one entry per point."""
    return {
        "sweep_id": sweep_id,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "profile": profile,
        "partition": base.placement.partition,
        "image": base.container.image,
        "synthetic": base.data.synthetic,
        "data": base.data.path,
        "example_args": list(base.launch.example_args),
        "concurrent": concurrent,
        "points": points,
    }


def point_entry(point: SweepPoint, run_dir: Path | None = None,
                job_id: str | None = None) -> PointEntry:
    """One point in sweep.json (run_dir relative to the sweep directory)."""
    return PointEntry(backend=point.backend, nodes=point.nodes, gpus=point.gpus,
                      batch_size=point.batch_size, ranks=point.ranks, label=point.label,
                      job_id=job_id, run_dir=run_dir.name if run_dir else None)


def write_sweep(sweep_dir: Path, record: SweepRecord) -> None:
    write_json_atomic(sweep_dir / SWEEP_FILE, dict(record))


def read_sweep(sweep_dir: Path) -> SweepRecord | None:
    """sweep.json of ``sweep_dir``, or None when it is not a sweep directory."""
    path = sweep_dir / SWEEP_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValidationError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(record, dict) or not isinstance(record.get("points"), list):
        raise ValidationError(f"{path}: has no 'points' list; not written by hpcdl scale")
    return SweepRecord(**record)  # type: ignore[typeddict-item]
