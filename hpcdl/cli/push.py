"""`hpcdl push IMAGE -p PROFILE`: copy a local image to the cluster a profile reaches
over SSH (hpcdl.remote.images does the work; this prints)."""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

import click


@click.command()
@click.argument("image", type=click.Path(path_type=Path))
@click.option("--profile", "-p", "profile", metavar="NAME|PATH",
              help="Cluster profile with a login: node (default: $HPCDL_PROFILE).")
@click.option("--json", "as_json", is_flag=True,
              help="Print what was done as one JSON object (image, host, remote_path, "
                   "sha256, size, bytes_moved, already_there, seconds, linked_from).")
@click.option("--dry-run", is_flag=True,
              help="Hash the image and ask the login node whether it is there; print what "
                   "would run (rsync, then mv) and copy nothing.")
def push(image: Path, profile: str | None, as_json: bool, dry_run: bool) -> None:
    """Copy IMAGE (a SIF, or a packed dataset DATA.sqfs) into the cluster's images
    directory over SSH.

    For a profile with a login: node (a cluster reached from a laptop). The copy
    goes to login.images (default: hpcdl-images in the remote home), named by
    the image's stem and the first 16 hex digits of its sha256
    (img.sif -> img-0123456789abcdef.sif): a rebuilt image is a new file, and
    pushing the same image again moves nothing (nor does the same content under
    another file name: the copy there is hard-linked). The copy is written under a
    temporary name and renamed into place, so the cluster never sees half an
    image under its final name. The sha256 is remembered (in ~/.cache/hpcdl)
    until the file's size or mtime changes.

    `hpcdl submit -p PROFILE --image IMAGE` then runs the pushed copy, and
    `--data DATA.sqfs` (`hpcdl data pack`) reads the pushed dataset (named
    <stem>-<hash>.sqfs).

    Exit 2: the profile has no login: node, IMAGE is missing or not an image,
    or the images directory cannot be written; exit 1: the transfer failed.

    \b
    Example:
      hpcdl push ~/images/pytorch-horovod-cpu.sif -p sandbox-remote --dry-run
      hpcdl push ~/images/pytorch-horovod-cpu.sif -p sandbox-remote
      hpcdl submit -p sandbox-remote -N 2 -G 4 --image ~/images/pytorch-horovod-cpu.sif
    """
    from hpcdl.errors import UserInputError
    from hpcdl.profiles import load_profile
    from hpcdl.remote.images import (
        check_image,
        copy_argv,
        human_mb,
        plan_push,
        push_image,
        rename_argv,
    )
    from hpcdl.schedulers.executor import ssh_transport

    prof = load_profile(profile)
    ex = ssh_transport(prof)  # opens nothing yet
    if ex is None or prof.login is None:
        raise UserInputError(f"profile {prof.name} has no login: node; push is for a cluster "
                             f"reached over SSH",
                             hint="on the cluster itself, pass the image's path to "
                                  "submit --image")
    local = image.expanduser().absolute()
    check_image(local)  # a missing image is refused before any connection

    def note(line: str) -> None:
        click.echo(line, err=True)

    if dry_run:
        plan = plan_push(ex, prof.login, local, note=note)
        if as_json:
            click.echo(json.dumps({**dataclasses.asdict(plan), "local": str(local)}))
        elif plan.already_there:
            click.echo(f"{image} already on {plan.host}:{plan.remote_path} (sha256 "
                       f"{plan.sha256}; nothing would move)")
        elif plan.twin:
            click.echo(f"would link {plan.host}:{plan.remote_path} to {plan.twin} there "
                       f"(the same content; nothing would move)")
        else:
            tmp = plan.temp_path("RANDOM")
            click.echo(f"would push {image} ({human_mb(plan.size)}, sha256 {plan.sha256}) "
                       f"-> {plan.host}:{plan.remote_path}")
            click.echo(f"  {shlex.join(copy_argv(ex, local, tmp))}")
            mv = shlex.join(rename_argv(tmp, plan.remote_path))
            click.echo(f"  then on {plan.host}: {mv}")
        return
    done = push_image(ex, prof.login, local, note=note)
    if as_json:
        click.echo(json.dumps(done.record()))
    elif done.linked_from:
        click.echo(f"pushed {image} -> {done.host}:{done.remote_path} (the same content as "
                   f"{done.linked_from} there, linked; nothing moved)")
    elif done.already_there:
        click.echo(f"{image} already on {done.host}:{done.remote_path} (sha256 {done.sha256}; "
                   f"nothing moved)")
    else:
        click.echo(f"pushed {image} -> {done.host}:{done.remote_path} "
                   f"({human_mb(done.bytes_moved)} moved in {done.seconds:.1f} s)")
