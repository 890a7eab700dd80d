"""The one road from a request to what gets submitted, for every command that submits
(submit, probe; scale and sweep through hpcdl.sweep.prepare, alloc through
``prepare_alloc``), dry run or not: ``prepare`` is its one sequence.

The job path reads one way: request -> ``prepare_job`` (here: the cluster's view of the
request, the checks, the plan with its run directory decided) -> hpcdl.jobs.flow
(submit, follow) -> result. A dry run walks the same road and differs only in what it
does not do: it asks the cluster nothing it can do without (the Cluster's ``planning``
handle, see Cluster.for_cluster's notes), and creates, ships and submits nothing; what
it prints is the plan a submission made now submits.

Policy lives here; hpcdl.cli parses options, calls, and prints. Nothing here prints:
warnings go to the caller's ``on_warning`` as they arise (before a later refusal, as a
command shows them), refusals go up as hpcdl errors (ValidationError, RenderError,
UserInputError) before anything is written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from hpcdl.core.gpuarch import ImageArchFacts
from hpcdl.jobs.cluster import Cluster, connect
from hpcdl.jobs.submit import plan_run
from hpcdl.plan import JobPlan, JobRequest, RuntimeMode, build_plan
from hpcdl.profiles.schema import Profile
from hpcdl.schedulers.dialects import dialect_for, refuse

# One warning line's text (the caller prefixes "warning: ").
OnWarning = Callable[[str], None]


def no_warning(_: str) -> None:
    return None


def open_cluster(prof: Profile, command: str, *, dry_run: bool,
                 run_dir: Path | None = None) -> Cluster:
    """The profile's Cluster for ``command``, and what it refuses before a request is
    built: ``command`` on a scheduler hpcdl does not submit to (PBS): refused for real, and
    for a dry run too where the dry run would print no script of it (a sweep's job
    array, an allocation: hpcdl.schedulers.dialects.refuse), so a dry run refuses what
    the command refuses. ``run_dir``: the --run-dir given, whose parent holds the local
    copy. Opens nothing. Raises ValidationError, UserInputError."""
    cluster = connect(prof, local_root=run_dir.resolve().parent if run_dir else None,
                      dry_run=dry_run)
    refuse(prof, command, dry_run=dry_run)  # exit 2; --dry-run offered where it prints the script
    return cluster


def runtime_mode(cluster: Cluster, request: JobRequest,
                 on_warning: OnWarning = no_warning) -> RuntimeMode | None:
    """How the request's container runtime will run its ranks (Cluster.runtime_mode),
    its warning to ``on_warning`` when this host cannot run images as this user. None
    for a cluster elsewhere: this machine is not its nodes."""
    mode, warning = cluster.runtime_mode(request)
    if warning:
        on_warning(warning)
    return mode


@dataclass(frozen=True)
class Inputs:
    """What every plan of one command is made from, decided once by ``prepare``: the
    request as the cluster sees it (the image and code as the nodes see them; as given
    for a script for reading), the image's build record (None unchecked), the runtime
    mode, and ``notes``: for a dry run what it left unchecked (lines to show, the plan
    may add its own), None for real. ``reading``: a dry run for a scheduler hpcdl only
    writes scripts for (PBS, ``for_reading``): plan without a run directory."""

    request: JobRequest
    image_facts: ImageArchFacts | None
    runtime_mode: RuntimeMode | None
    notes: list[str] | None
    reading: bool


P = TypeVar("P")


def prepare(prof: Profile, request: JobRequest, cluster: Cluster,
            plan: Callable[[Inputs], P], first: Callable[[P], JobPlan], *,
            check_image: bool = True, on_warning: OnWarning = no_warning) -> tuple[Inputs, P]:
    """The one prepare sequence of every command that submits (one job, a scaling
    sweep's points, a sweep's job array), dry run or not (``cluster.planning``): --code
    only where it is copied (Cluster.check_code); the dataset's kind (a file is not a
    dataset); the image's build record for the plan's GPU-architecture check and the
    runtime mode, read here where the cluster sees this host's files; the request as
    the cluster sees it (request_for); ``plan`` of those Inputs (raises before
    anything is written); the dataset's many-files warning (the dataset the plan
    decided: ``first`` names the plan's first job); and for real the inputs (that job's
    image, the dataset, the script) checked here.

    ``check_image``: False for the probe, whose job reads no build record and whose
    inputs are not checked before submission (as `hpcdl probe` has always done).
    Returns the Inputs and the plan. Raises ValidationError, RenderError."""
    cluster.check_code(request.files.code_dir)
    cluster.check_data(request)
    facts = cluster.image_facts(request) if check_image else None
    mode = runtime_mode(cluster, request, on_warning)
    if for_reading(prof, cluster):
        inputs = Inputs(request, facts, mode, [], reading=True)
    else:
        seen, notes = cluster.request_for(request)
        inputs = Inputs(seen, facts, mode, notes, reading=False)
    planned = plan(inputs)  # raises before writing
    # After the plan accepted the request (a refusal stays one line); on this host's
    # files only: over SSH --data is a path on the cluster.
    job = first(planned)
    if check_image and (crowded := cluster.many_files_warning(job.data)):
        on_warning(crowded)
    if not cluster.planning and check_image:
        cluster.check_inputs(inputs.request, image=job.container.image)
    return inputs, planned


def for_reading(prof: Profile, cluster: Cluster) -> bool:
    """A dry run for a scheduler hpcdl only writes scripts for (PBS): hpcdl never makes a
    run directory for it, so the script shows none (./job, $PBS_O_WORKDIR) instead of
    one nobody creates."""
    return cluster.planning and not dialect_for(prof.scheduler.type).submits


@dataclass(frozen=True)
class Prepared:
    """A request made ready to submit: the connection it goes through, the request as
    the cluster sees it and the plan (with its run directory) that gets submitted.
    ``notes``: for a dry run, what it left unchecked (lines to show); None for real.
    ``conn`` is None for a PBS dry run: hpcdl connects to no PBS server."""

    conn: Cluster | None
    request: JobRequest
    plan: JobPlan
    notes: list[str] | None


def prepare_job(prof: Profile, request: JobRequest, cluster: Cluster, *,
                run_name: str | None = None, check_image: bool = True,
                on_warning: OnWarning = no_warning) -> Prepared:
    """``request`` made ready to submit through ``cluster`` (open_cluster's; a planning
    handle is a dry run) by ``prepare``, planned with its run directory decided
    (plan_run: ``request.files.run_dir``, else a new name under $HPCDL_RUNS from
    ``run_name``, chosen now). ``check_image``: see ``prepare``.
    Raises ValidationError, RenderError before anything is written."""
    def plan(ready: Inputs) -> JobPlan:
        if ready.reading:
            return build_plan(prof, ready.request, ready.image_facts, ready.runtime_mode)
        # Planned once, with the run directory it will use; that plan is what gets submitted.
        return plan_run(prof, ready.request, run_name=run_name, image_facts=ready.image_facts,
                        runtime_mode=ready.runtime_mode, place=cluster.place)

    ready, planned = prepare(prof, request, cluster, plan, lambda p: p,
                             check_image=check_image, on_warning=on_warning)
    notes = ready.notes
    if notes is not None and not ready.reading and planned.spec.run_dir is not None:
        where = " on the cluster" if cluster.remote else ""
        if ready.request.files.run_dir is None:
            notes.insert(0, f"run directory{where} {planned.spec.run_dir}: the name a "
                            f"submission made now gets (one made later gets a new name; "
                            f"--run-dir pins it); nothing is created")
        else:
            notes.insert(0, f"run directory{where} {planned.spec.run_dir} (--run-dir); "
                            f"nothing is created")
    return Prepared(None if ready.reading else cluster, ready.request, planned, notes)
