"""`hpcdl doctor` and `hpcdl inspect`: what the host and an image offer, and what clashes."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import click

from hpcdl.container.build import _is_definition
from hpcdl.container.recipes import inspect_definition
from hpcdl.container.runtime import runtime_mode
from hpcdl.doctor.host import host_facts
from hpcdl.doctor.image import ImageFacts, image_facts, require_image, unreadable_reason
from hpcdl.doctor.profile import profile_facts
from hpcdl.doctor.verdicts import report, verdicts
from hpcdl.profiles import load_profile


def _print_host(host) -> None:  # type: ignore[no-untyped-def]
    click.echo("host:")
    rt = f"{host.runtime} {host.runtime_version} ({host.runtime_path})" if host.runtime else "none"
    click.echo(f"  container runtime : {rt}")
    if host.access is not None and host.runtime:
        click.echo(f"  container access  : {runtime_mode(host.access)} (uid {host.access.euid})")
    tools = ", ".join(t for t, ok in host.slurm_tools.items() if ok) or "none"
    where = f", from {host.slurm_commands}" if host.slurm_commands else ""
    click.echo(f"  slurm             : {host.slurm_version or '-'} (tools: {tools}{where})")
    if host.slurm_release:
        differs = host.release_notes or ["as on 22.05: nothing differs"]
        click.echo(f"  slurm release     : {host.slurm_release}: {differs[0]}")
        for line in differs[1:]:
            click.echo(f"                      {line}")
    click.echo(f"  srun --mpi=list   : {', '.join(host.srun_mpi) or '-'}"
               + (f" ({', '.join(host.pmix_plugins)})" if host.pmix_plugins else ""))
    gpus = f"{len(host.gpus)} x {host.gpus[0]}, driver {host.driver_version}" if host.gpus else "none"
    click.echo(f"  GPUs              : {gpus}")
    click.echo(f"  MPI               : {host.mpi_flavour or '-'} {host.mpi_version or ''}".rstrip())


def _print_image(image) -> None:  # type: ignore[no-untyped-def]
    click.echo(f"image: {image.path}")
    if image.exists and not image.readable:
        click.echo(f"  error             : {unreadable_reason(image)}")
        return
    if not image.exists or image.error:
        click.echo(f"  error             : {image.error or 'does not exist'}")
        return
    click.echo(f"  python            : {image.python}")
    click.echo(f"  torch             : {image.torch} ("
               + (f"CUDA {image.torch_cuda}" if image.torch_cuda else "CPU build")
               + (f", NCCL {image.nccl}" if image.nccl else "") + ")")
    if image.torch_cuda:
        click.echo(f"  GPU architectures : {' '.join(image.cuda_archs) or '-'}")
    click.echo(f"  MPI               : {image.mpi_library or '-'}")
    if image.labels:
        click.echo("  labels            :")
        for key, value in sorted(image.labels.items()):
            click.echo(f"    {key} {value}")
    if image.horovod_table:
        click.echo("  horovodrun -cb    :")
        for line in image.horovod_table.rstrip().splitlines():
            click.echo(f"    {line.rstrip()}")
    else:
        click.echo(f"  horovod           : {image.horovod or 'not installed'}")


@click.command()
@click.option("--image", "-i", metavar="IMAGE", help="Also look inside this image.")
@click.option("--profile", "-p", metavar="NAME|PATH",
              help="Check the profile's launcher (srun --mpi, --nv) against this host.")
@click.option("--json", "as_json", is_flag=True, help="Facts and verdicts as JSON.")
def doctor(image: str | None, profile: str | None, as_json: bool) -> None:
    """Check the host (and an image) for what distributed training needs.

    Host: container runtime and version, Slurm tools, `srun --mpi=list`, GPUs and
    driver, MPI flavour and version. Image: torch, CUDA/NCCL, the Horovod capability
    table (as `horovodrun -cb` shows it), its MPI. Then one verdict per line, ok /
    warning / problem, each problem with its fix. Exit 1 when there is a problem.

    \b
    Examples:
      hpcdl doctor
      hpcdl doctor --image /var/cache/hpcdl/images/pytorch-horovod-cpu.sif -p sandbox
    """
    prof = profile_facts(profile) if profile else None
    binary = commands = None
    if profile:
        loaded = load_profile(profile)
        binary, commands = loaded.container.binary, loaded.scheduler.commands
    host = host_facts(binary, commands)
    img = image_facts(image, binary) if image and host.runtime else None
    if image and not host.runtime:
        img = ImageFacts(path=image, error="no container runtime to look inside it")
    checks = verdicts(host, img, prof)
    if as_json:
        click.echo(json.dumps(report(host, img, checks), indent=2))
    else:
        _print_host(host)
        if img:
            _print_image(img)
        click.echo("verdicts:")
        for v in checks:
            click.echo("  " + v.line().replace("\n", "\n  "))
    if any(v.level == "problem" for v in checks):
        raise SystemExit(1)


def _inspect_definition(path: str, as_json: bool) -> None:
    info = inspect_definition(Path(path))
    if as_json:
        click.echo(json.dumps(info.to_dict(), indent=2))
        return
    click.echo(f"definition   {info.path}")
    click.echo(f"bootstrap    {info.bootstrap}")
    click.echo(f"base         {info.base or '-'}")
    others = {k: v for k, v in info.header.items() if k not in ("bootstrap", "from")}
    for key, value in others.items():
        click.echo(f"{key:<12} {value}")
    click.echo(f"sections     {', '.join('%' + s for s in info.sections) or '-'}")
    click.echo(f"files        {len(info.files)}" + "".join(f"\n  {f}" for f in info.files))
    click.echo(f"labels       {len(info.labels)}" + "".join(f"\n  {v}" for v in info.labels))
    click.echo(f"environment  {len(info.environment)}"
               + "".join(f"\n  {v}" for v in info.environment))
    click.echo(f"%post lines  {info.post_lines}")


@click.command()
@click.argument("image", metavar="IMAGE|DEF")
@click.option("--json", "as_json", is_flag=True, help="Facts as JSON.")
def inspect(image: str, as_json: bool) -> None:
    """Show what is inside IMAGE: labels, python, torch/CUDA/NCCL, MPI, `horovodrun -cb`.

    Given a definition file (.def, or a file starting with Bootstrap:), show what it
    holds instead, parsed with spython: bootstrap, base, sections, files, labels.
    """
    if Path(image).is_file() and _is_definition(Path(image)):
        _inspect_definition(image, as_json)
        return

    facts = image_facts(require_image(image))
    if as_json:
        click.echo(json.dumps(asdict(facts), indent=2))
    else:
        _print_image(facts)
    if facts.error:
        raise SystemExit(1)
