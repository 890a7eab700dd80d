"""`hpcdl profiles list|show|validate|detect|diff`."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import click

from hpcdl.profiles import list_profiles, load_profile, load_profile_file

if TYPE_CHECKING:
    from hpcdl.profiles.schema import Login
    from hpcdl.schedulers.registry import ClusterFacts


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
    if prof.scheduler.type == "pbs":
        mpi = "mpiexec -n N --ppn P (PBS Pro script; the profile's mpi.launcher is not used)"
    click.echo(f"  launcher: {mpi}")
    click.echo(f"  container: {prof.container.binary or prof.container.runtime}"
               f"{' --nv' if prof.container.nv else ''}; binds: {', '.join(prof.container.binds) or '-'}")
    click.echo(f"  modules: {' '.join(prof.modules) or '-'}")
    net = prof.interconnect
    if net.name or net.expected_busbw_gbs or net.socket_ifname:
        click.echo(f"  interconnect: {net.name or '-'}; expected busbw "
                   f"{f'{net.expected_busbw_gbs:g} GB/s' if net.expected_busbw_gbs else '-'}; "
                   f"interface {net.socket_ifname or '-'} (hpcdl probe compares with these)")
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


@profiles.command("detect")
@click.option("--name", help="Profile name (default: the cluster's own name).")
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False),
              help="Write the profile to FILE (atomically) instead of printing it.")
@click.option("--force", is_flag=True, help="Overwrite FILE when it exists.")
@click.option("--login", "login_at", metavar="[USER@]HOST",
              help="Detect the cluster behind this login node over SSH (a host name, an "
                   "address or an ~/.ssh/config alias); the profile gets a login: block.")
@click.option("--port", type=click.IntRange(1, 65535), help="SSH port (with --login).")
@click.option("--identity", metavar="KEY",
              help="Private key file, an absolute path (with --login).")
@click.option("--jump", metavar="[USER@]HOST[:PORT]",
              help="ProxyJump host(s), comma-separated (with --login).")
@click.option("--commands", metavar="DIR",
              help="Run the scheduler's commands from DIR (a site module's bin/, a release "
                   "sandbox's bin/); the profile's scheduler.commands names it.")
def detect(name: str | None, output: str | None, force: bool, login_at: str | None,
           port: int | None, identity: str | None, jump: str | None,
           commands: str | None) -> None:
    """Write a profile of the Slurm cluster this machine talks to, or, with --login,
    of the one behind a login node reached over SSH.

    Reads scontrol show partition/node/config, srun --mpi=list, sacctmgr show qos
    (when accounting answers) and the container runtime on this node (the login
    node, with --login); every value in the output has a comment saying where it came from. A heterogeneous
    partition is described by its smallest node. The Slurm release (scheduler.release,
    from SLURM_VERSION) decides what the job scripts do differently (the notes say
    what). What Slurm does not know (modules,
    env vars, binds, paths, account) is left for you to add. Commands that fail
    leave a GAP line in the header instead of stopping detection; a cluster whose
    partitions cannot be read is one error line (exit 1). SLURM_CONF picks the cluster.

    With --login every command runs on the login node over one SSH connection
    (your ~/.ssh/config applies; a passphrase or 2FA prompt comes once, first),
    and the profile's login: block names the node, so hpcdl submit from here runs
    there. An unknown host, a refused key or a login node without Slurm on its
    PATH is one error line (exit 2). How the compute nodes run the container
    runtime cannot be seen from here: set container.mode by hand.

    \b
    Examples:
      hpcdl profiles detect --name mycluster -o ~/.config/hpcdl/profiles/mycluster.yaml
      hpcdl profiles detect --login jdoe@login.cluster.example.org --name mycluster \\
          -o ~/.config/hpcdl/profiles/mycluster.yaml
      hpcdl profiles diff mycluster
    """
    from hpcdl.core.atomic import write_atomic
    from hpcdl.errors import UserInputError
    from hpcdl.schedulers.registry import describe_cluster

    if name is not None:
        _check_name(name)
    login = _login_of(login_at, port, identity, jump)
    if commands is not None:
        commands = _commands_dir(commands)
    target = Path(output).expanduser() if output else None
    if target is not None:
        if target.exists() and not force:
            raise UserInputError(f"output: {target} exists (pass --force to overwrite it)")
        if not target.parent.is_dir():
            raise UserInputError(f"output: folder {target.parent} does not exist")
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    found = describe_cluster(_gather(login, commands), name=name, when=when, login=login,
                             commands=commands)
    for note in found.notes:
        click.echo(f"note: {note}", err=True)
    if target is None:
        click.echo(found.text, nl=False)
        return
    write_atomic(target, found.text)
    click.echo(f"wrote {target} (profile {found.profile.name}, "
               f"{len(found.profile.partitions)} partitions)", err=True)


def _login_of(login_at: str | None, port: int | None, identity: str | None,
              jump: str | None) -> Login | None:
    """The profile's login: block from --login [USER@]HOST and its companions, each
    value checked as a token of its kind (exit 2 naming the option)."""
    from hpcdl.core.tokens import SSH_HOST, SSH_JUMP, SSH_USER, check_token
    from hpcdl.errors import UserInputError
    from hpcdl.profiles.schema import Login

    if login_at is None:
        given = [flag for flag, value in (("--port", port), ("--identity", identity),
                                          ("--jump", jump)) if value is not None]
        if given:
            raise UserInputError(f"{', '.join(given)}: only with --login [USER@]HOST")
        return None
    user, at, host = login_at.rpartition("@")
    checks = [("--login", host, SSH_HOST), ("--jump", jump, SSH_JUMP)]
    if at:
        checks.append(("--login", user, SSH_USER))
    for flag, value, kind in checks:
        if value is None:
            continue
        try:
            check_token(value, kind)
        except ValueError as exc:
            raise UserInputError(f"{flag}: {exc}") from None
    if identity is not None:
        if not Path(identity).is_absolute():
            raise UserInputError(f"--identity: {identity!r} is not an absolute path")
        if not Path(identity).is_file():
            raise UserInputError(f"--identity: {identity} is not a file")
    return Login(host=host, user=user if at else None, port=port, identity=identity,
                 jump=jump)


def _gather(login: Login | None, commands: str | None = None) -> ClusterFacts:
    """The live cluster's facts: this machine's, or the login node's over SSH; Slurm's
    commands from ``commands`` when given."""
    from hpcdl.schedulers.registry import detect_cluster

    return detect_cluster(login, commands)


def _commands_dir(commands: str) -> str:
    """--commands as scheduler.commands takes it (an absolute directory path, one
    token), or one line naming the option (exit 2)."""
    from hpcdl.core.tokens import SHARED_DIR, check_token
    from hpcdl.errors import UserInputError

    try:
        check_token(commands, SHARED_DIR)
    except ValueError as exc:
        raise UserInputError(f"--commands: {exc}") from None
    return commands


def _check_name(name: str) -> None:
    from hpcdl.errors import UserInputError

    if not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
        raise UserInputError(f"name: {name!r} is not a profile name (letters, digits, '_', '.', '-')")


@profiles.command("diff")
@click.argument("profile")
@click.option("--json", "as_json", is_flag=True, help="Print the differences as a JSON list.")
def diff(profile: str, as_json: bool) -> None:
    """What differs between a profile (NAME or PATH) and the live Slurm cluster.

    Detects the cluster as `profiles detect` does and compares partition by
    partition: where the profile claims more than the cluster has (jobs Slurm
    refuses), where it claims less (requests hpcdl refuses although Slurm would run
    them), GPU type, default partition, partitions missing, srun's MPI plugin and
    the container runtime. Exit 0 when they agree, 1 when they differ. A profile
    with a login: block is compared with the cluster behind that login node (over
    SSH, as `profiles detect --login` reads it).
    """
    from hpcdl.schedulers.registry import describe_cluster, profile_differences

    prof = load_profile(profile)
    facts = _gather(prof.login, prof.scheduler.commands)
    found = describe_cluster(facts, name=prof.name, login=prof.login)
    lines = profile_differences(prof, found.profile,
                        mpi_offered=facts.mpi.types if facts.mpi is not None else None,
                        runtime_found=facts.runtime.name is not None)
    if as_json:
        click.echo(json.dumps({"profile": prof.name, "cluster": facts.cluster_name,
                               "differences": lines, "notes": list(found.notes)}, indent=2))
    else:
        for note in found.notes:
            click.echo(f"note: {note}", err=True)
        if lines:
            for line in lines:
                click.echo(line)
        else:
            click.echo(f"profile {prof.name} agrees with cluster {facts.cluster_name or '?'}")
    if lines:
        raise SystemExit(1)
