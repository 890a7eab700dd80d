"""`hpcdl profiles list|show|validate`."""

from __future__ import annotations

import json

import click

from hpcdl.profiles import list_profiles, load_profile, load_profile_file


@click.group()
def profiles() -> None:
    """Cluster profiles: what hpcdl knows about each cluster.

    Lookup order: --profile NAME|PATH, $HPCDL_PROFILE, ~/.config/hpcdl/profiles/,
    then the bundled profiles.
    """


@profiles.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_cmd(as_json: bool) -> None:
    """List the available profiles and where each comes from."""
    rows = []
    for source in list_profiles():
        prof = load_profile_file(source.path)
        rows.append({"name": source.name, "origin": source.origin, "path": str(source.path),
                     "description": prof.description,
                     "partitions": [p.name for p in prof.partitions]})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        click.echo(f"{r['name']:<{width}}  {r['origin']:<7}  {r['description']}")


@profiles.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the validated profile as JSON.")
def show(name: str, as_json: bool) -> None:
    """Show a profile: its partitions and limits, launcher and container runtime."""
    prof = load_profile(name)
    if as_json:
        click.echo(json.dumps(prof.model_dump(), indent=2))
        return
    click.echo(f"{prof.name}: {prof.description} (scheduler: {prof.scheduler.type})")
    header = f"  {'partition':<14} {'nodes':>5} {'max/job':>7} {'GPUs':>4} {'GPU type':<16} {'CPUs':>4} {'max time':>10}"
    click.echo(header)
    for p in prof.partitions:
        mark = "*" if p.default else " "
        click.echo(f" {mark}{p.name:<14} {p.nodes:>5} {p.node_limit:>7} {p.gpus_per_node:>4} "
                   f"{(p.gpu_type or '-'):<16} {p.cpus_per_node:>4} {p.max_time:>10}")
    mpi = prof.mpi.launcher + (f" --mpi={prof.mpi.srun_mpi}" if prof.mpi.launcher == "srun" and prof.mpi.srun_mpi else "")
    click.echo(f"  launcher: {mpi}")
    click.echo(f"  container: {prof.container.binary or prof.container.runtime}"
               f"{' --nv' if prof.container.nv else ''}; binds: {', '.join(prof.container.binds) or '-'}")
    click.echo(f"  modules: {' '.join(prof.modules) or '-'}")
    if prof.examples.args:
        click.echo(f"  example defaults: {' '.join(prof.examples.args)}")
    for example, args in prof.examples.per_example.items():
        click.echo(f"  {example} defaults: {' '.join(args) or '-'}")


@profiles.command("validate")
@click.argument("file", type=click.Path(dir_okay=False))
def validate(file: str) -> None:
    """Check a profile file against the schema (exit 2 naming file and field)."""
    prof = load_profile_file(file)
    click.echo(f"{file}: ok (profile {prof.name}, {len(prof.partitions)} partitions)")
