"""`hpcdl push IMAGE -p PROFILE`: copy a local image to the cluster a profile reaches
over SSH (hpcdl.remote.images does the work; this prints)."""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:  # imported where used, as before: `hpcdl push --help` loads none of them
    from hpcdl.remote.images import Pushed, PushPlan


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
    from hpcdl.remote.images import check_image, copy_argv, plan_push, push_image
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
        copy = copy_argv(ex, local, plan.temp_path(DRY_RUN_TOKEN))
        click.echo(dry_run_text(image, local, plan, copy, as_json))
    else:
        click.echo(pushed_text(image, push_image(ex, prof.login, local, note=note), as_json))


# --dry-run shows this in place of the temporary name's random part.
DRY_RUN_TOKEN = "RANDOM"


def dry_run_text(image: Path, local: Path, plan: PushPlan, copy: list[str],
                 as_json: bool) -> str:
    """What --dry-run says: that the copy is there (or its twin, to link), or the rsync
    (``copy``, to the temporary name) and the mv that would run. Pure."""
    from hpcdl.remote.images import human_mb, rename_argv

    if as_json:
        return json.dumps({**dataclasses.asdict(plan), "local": str(local)})
    if plan.already_there:
        return (f"{image} already on {plan.host}:{plan.remote_path} (sha256 "
                f"{plan.sha256}; nothing would move)")
    if plan.twin:
        return (f"would link {plan.host}:{plan.remote_path} to {plan.twin} there "
                f"(the same content; nothing would move)")
    mv = shlex.join(rename_argv(plan.temp_path(DRY_RUN_TOKEN), plan.remote_path))
    return "\n".join([f"would push {image} ({human_mb(plan.size)}, sha256 {plan.sha256}) "
                      f"-> {plan.host}:{plan.remote_path}",
                      f"  {shlex.join(copy)}",
                      f"  then on {plan.host}: {mv}"])


def pushed_text(image: Path, done: Pushed, as_json: bool) -> str:
    """What a push says it did: linked to a twin, found there, or moved (how much, how
    fast). Pure."""
    from hpcdl.remote.images import human_mb

    if as_json:
        return json.dumps(done.record())
    if done.linked_from:
        return (f"pushed {image} -> {done.host}:{done.remote_path} (the same content as "
                f"{done.linked_from} there, linked; nothing moved)")
    if done.already_there:
        return (f"{image} already on {done.host}:{done.remote_path} (sha256 {done.sha256}; "
                f"nothing moved)")
    return (f"pushed {image} -> {done.host}:{done.remote_path} "
            f"({human_mb(done.bytes_moved)} moved in {done.seconds:.1f} s)")
