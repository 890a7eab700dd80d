"""The one road from a request to what gets submitted, for every command that submits
(submit, probe; scale and sweep take it through hpcdl.sweep.prepare), dry run or not.

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


def open_cluster(prof: Profile, command: str, *, dry_run: bool, run_dir: Path | None = None,
                 hang_timeout: float | None = None) -> Cluster:
    """The profile's Cluster for ``command``, and what it refuses before a request is
    built: --hang-timeout over a transport to elsewhere (Cluster.check_hang_watch), and
    a real ``command`` on a scheduler hpcdl does not submit to (a PBS script is for
    reading). ``run_dir``: the --run-dir given, whose parent holds the local copy.
    Opens nothing. Raises ValidationError, UserInputError."""
    cluster = connect(prof, local_root=run_dir.resolve().parent if run_dir else None,
                      dry_run=dry_run)
    cluster.check_hang_watch(hang_timeout)  # the watchdog reads the run directory where it is
    if not dry_run:
        refuse(prof, command)  # exit 2; --dry-run offered where it prints the script
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
    handle is a dry run): --code only where it is copied (Cluster.check_code); the
    image's build record for the plan's GPU-architecture check and the runtime mode,
    read here where the cluster sees this host's files; the request as the cluster sees
    it (for_cluster) and the plan with its run directory decided (plan_run:
    ``request.run_dir``, else a new name under $HPCDL_RUNS from ``run_name``, chosen
    now); the dataset's many-files warning; and for real the inputs (image, dataset,
    script) checked here.

    ``check_image``: False for the probe, whose job reads no build record and whose
    inputs are not checked before submission (as `hpcdl probe` has always done).
    Raises ValidationError, RenderError before anything is written."""
    dry_run = cluster.planning
    cluster.check_code(request.code_dir)
    cluster.check_data(request)
    facts = cluster.image_facts(request) if check_image else None
    mode = runtime_mode(cluster, request, on_warning)
    ready = _plan(prof, request, cluster, run_name=run_name, image_facts=facts,
                  runtime_mode=mode)
    # After the plan accepted the request (a refusal stays one line); on this host's
    # files only: over SSH --data is a path on the cluster.
    if check_image and (crowded := cluster.many_files_warning(ready.request)):
        on_warning(crowded)
    if not dry_run and check_image:
        assert ready.conn is not None  # a real submission always has its connection
        ready.conn.check_inputs(ready.request, image=ready.plan.container.image)
    return ready


def for_reading(prof: Profile, cluster: Cluster) -> bool:
    """A dry run for a scheduler hpcdl only writes scripts for (PBS): hpcdl never makes a
    run directory for it, so the script shows none (./job, $PBS_O_WORKDIR) instead of
    one nobody creates."""
    return cluster.planning and not dialect_for(prof.scheduler.type).submits


def _plan(prof: Profile, request: JobRequest, conn: Cluster, *, run_name: str | None,
          image_facts: ImageArchFacts | None, runtime_mode: RuntimeMode | None) -> Prepared:
    """The request as the cluster sees it and its plan, with the dry run's notes."""
    facts = image_facts
    if for_reading(prof, conn):
        return Prepared(None, request, build_plan(prof, request, facts, runtime_mode), [])
    request, notes = conn.request_for(request)
    # Planned once, with the run directory it will use; that plan is what gets submitted.
    plan = plan_run(prof, request, run_name=run_name, image_facts=facts,
                    runtime_mode=runtime_mode, place=conn.place)  # raises before writing
    if notes is not None and plan.spec.run_dir is not None:
        where = " on the cluster" if conn.remote else ""
        if request.run_dir is None:
            notes.insert(0, f"run directory{where} {plan.spec.run_dir}: the name a submission "
                            f"made now gets (one made later gets a new name; --run-dir "
                            f"pins it); nothing is created")
        else:
            notes.insert(0, f"run directory{where} {plan.spec.run_dir} (--run-dir); nothing is "
                            f"created")
    return Prepared(conn, request, plan, notes)
