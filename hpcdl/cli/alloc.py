"""`hpcdl alloc`: salloc for interactive work, its request checked like `submit`'s."""

from __future__ import annotations

from dataclasses import replace

import click

from hpcdl.cli import options
from hpcdl.cli.options import Output, SectionedCommand
from hpcdl.jobs.prepare import open_cluster
from hpcdl.plan import FilesRequest, JobRequest, LaunchRequest, PlacementRequest
from hpcdl.profiles import load_profile


@click.command(cls=SectionedCommand)
@options.placement()
@options.output("dry_run", dry_run="Print what runs (salloc and its environment); run nothing.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[-- COMMAND ...]")
def alloc(profile: str | None, placement: PlacementRequest, files: FilesRequest,
          output: Output, command: tuple[str, ...]) -> None:
    """Allocate nodes for interactive work (salloc), checked like `submit`.

    Without COMMAND salloc opens a shell in the allocation; with it, salloc runs
    COMMAND there and returns its exit code. A profile with a login: node runs it
    there, over `ssh -t` (from the remote home directory).

    \b
    Examples:
      hpcdl alloc -p neuron -N 2 -G 4 -t 2:00:00 --dry-run
      hpcdl alloc -p sandbox -N 2 -G 4 -- srun hostname
    """
    prof = load_profile(profile)
    # hpcdl allocates where it submits
    cluster = open_cluster(prof, "alloc", dry_run=output.dry_run)
    request = JobRequest(placement=placement, launch=LaunchRequest(command=command),
                         files=replace(files, job_name=files.job_name or "interactive"))
    # Lazy: the salloc path is alloc's alone, and `hpcdl --help` imports nothing.
    from hpcdl.jobs.alloc import prepare_alloc, run_alloc

    ready = prepare_alloc(prof, request, cluster)
    plan = ready.plan
    if ready.notes is not None:
        click.echo(f"# partition {plan.partition}: {plan.partition_reason}", err=True)
        for note in ready.notes:
            click.echo(f"# {note}", err=True)
        click.echo(plan.script, nl=False)
        return
    raise SystemExit(run_alloc(plan, ready.executor))
