"""``hpcdl data``: make and check datasets in the ImageFolder (ImageNet) layout."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

import click

from hpcdl.data.mount import is_packed_name
from hpcdl.data.packed import (
    COMPRESSIONS,
    DEFAULT_COMPRESSION,
    execute,
    pack_plan,
    parse_block_size,
    scan_packed,
)
from hpcdl.data.tiny import TinySpec, make_tiny
from hpcdl.jobside.imagefolder import scan_imagefolder


@click.group()
def data() -> None:
    """Datasets for the training examples (ImageFolder layout: DIR/train, DIR/val)."""


@data.command("make-tiny")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--classes", default=10, show_default=True, help="Number of classes.")
@click.option("--per-class", default=20, show_default=True, help="Training images per class.")
@click.option(
    "--val-per-class",
    default=None,
    type=int,
    help="Validation images per class [default: per-class / 4, at least 1].",
)
@click.option("--size", default=64, show_default=True, help="Image side in pixels.")
@click.option("--seed", default=0, show_default=True, help="Same seed, same files.")
@click.option("--imagenet-like", is_flag=True,
              help="ImageNet's sizes (mostly 500x375 / 375x500, 300-800 wide) and bytes "
                   "(~110 KB at quality 90: smooth colour fields, shapes, texture, grain) "
                   "instead of --size stripes: for benchmarks (~5 ms an image).")
@click.option(
    "--force", is_flag=True, help="Replace DIRECTORY if it exists (swapped in when complete)."
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
def make_tiny_cmd(
    directory: str,
    classes: int,
    per_class: int,
    val_per_class: int | None,
    size: int,
    seed: int,
    imagenet_like: bool,
    force: bool,
    as_json: bool,
) -> None:
    """Write a tiny ImageNet-format dataset of real JPEGs into DIRECTORY.

    \b
    Example:
      hpcdl data make-tiny /tmp/tiny --classes 10 --per-class 20
      python3 examples/resnet50_imagenet.py --data /tmp/tiny --arch resnet18 --image-size 32
    """
    if val_per_class is None:
        val_per_class = max(1, per_class // 4)
    spec = TinySpec(classes, per_class, val_per_class, size, seed, imagenet_like)
    start = time.monotonic()
    summary = make_tiny(directory, spec, force=force)
    summary["seconds"] = round(time.monotonic() - start, 3)
    if as_json:
        click.echo(json.dumps(summary))
    else:
        click.echo(
            f"wrote {summary['train_images']} train + {summary['val_images']} val JPEGs "
            f"({classes} classes, "
            + ("ImageNet-like" if imagenet_like else f"{size}x{size}")
            + f", {summary['bytes'] / 2**20:.1f} MiB) to {summary['path']} in "
            f"{summary['seconds']} s"
        )


@data.command("check")
@click.argument("directory", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
def check_cmd(directory: str, as_json: bool) -> None:
    """Check that DIRECTORY (or a packed DATA.sqfs) is a usable ImageFolder dataset
    (exit 2 with the reason if not). A packed file is listed with unsquashfs, not
    mounted."""
    if Path(directory).is_file() or is_packed_name(directory):
        folder = scan_packed(directory)
    else:
        folder = scan_imagefolder(directory)
    summary = {"path": str(folder.root), "classes": len(folder.classes), **folder.counts()}
    if as_json:
        click.echo(json.dumps(summary))
    else:
        click.echo(
            f"{folder.root}: {len(folder.classes)} classes, "
            f"{summary['train']} train / {summary['val']} val images"
        )


@data.command("pack")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="The packed file to write (DATA.sqfs).")
@click.option("--compression", type=click.Choice(COMPRESSIONS), default=DEFAULT_COMPRESSION,
              show_default=True,
              help="mksquashfs compression. JPEGs barely shrink; gzip is read by every "
                   "kernel and squashfuse, lz4 decodes faster (docs/guide/data.md).")
@click.option("--processors", type=click.IntRange(min=1), metavar="N",
              help="mksquashfs threads (default: every CPU).")
@click.option("--block-size", "block_size", default="auto", show_default=True,
              metavar="auto|SIZE",
              help="mksquashfs block size, a power of two from 4K to 1M. auto: the "
                   "smallest one at least the median file size, 4K to 128K: a shuffled "
                   "read of small images decompresses less of their neighbours "
                   "(docs/guide/data.md).")
@click.option("--decode", is_flag=True,
              help="Also decode every image with PIL (slow: every pixel), beyond the "
                   "cheap checks each image always gets.")
@click.option("--force", is_flag=True, help="Replace OUTPUT if it exists (once complete).")
@click.option("--dry-run", is_flag=True, help="Check DIRECTORY, print the mksquashfs argv, "
                                              "write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
def pack_cmd(directory: str, output: str, compression: str, processors: int | None,
             block_size: str, decode: bool, force: bool, dry_run: bool,
             as_json: bool) -> None:
    """Pack the ImageFolder dataset DIRECTORY into one read-only SquashFS file.

    A job reads it with `hpcdl submit --data DATA.sqfs`: bound into the image
    (Apptainer's image mount) or mounted on each node with squashfuse, so the
    shared filesystem serves one file instead of one open per image. The same
    tree always gives the same bytes; OUTPUT.hash records the file's sha256 and
    the tree's. Written under a temporary name beside OUTPUT, renamed when
    complete. DIRECTORY must pass `hpcdl data check` (exit 2 with the reason).

    Symbolic links (a class directory on another disk, a linked image) are
    followed and packed as what they point to, as `hpcdl data check` counts them;
    a link that loops back is refused. Every image is checked before anything is
    written, without decoding it: not empty, its first bytes a JPEG, PNG, PPM, BMP
    or WEBP; a JPEG ends with its FFD9 marker (in its last 1 KiB), a PNG with its
    IEND chunk, a BMP or WEBP is as long as its header says. The first bad file is
    named (exit 2). --decode also decodes each one.

    \b
    Example:
      hpcdl data make-tiny /scratch/tiny && hpcdl data pack /scratch/tiny -o /scratch/tiny.sqfs
      hpcdl data check /scratch/tiny.sqfs
    """
    plan = pack_plan(directory, output, compression=compression, force=force,
                     processors=processors, block_size=parse_block_size(block_size),
                     decode=decode)
    if dry_run:
        if as_json:
            click.echo(json.dumps({"argv": list(plan.argv), "output": str(plan.output),
                                   "files": plan.files, "classes": plan.classes,
                                   **plan.counts}))
        else:
            click.echo(shlex.join(plan.argv))
        return

    def progress(done: int, total: int) -> None:
        if not as_json:
            click.echo(f"packed {done}/{total} files", err=True)

    start = time.monotonic()
    summary = execute(plan, progress=progress)
    summary["seconds"] = round(time.monotonic() - start, 3)
    if as_json:
        click.echo(json.dumps(summary))
    else:
        click.echo(f"packed {summary['files']} files ({plan.classes} classes, "
                   f"{summary['train']} train / {summary['val']} val) into "
                   f"{summary['path']}: {summary['size'] / 1048576:.1f} MiB in "
                   f"{summary['seconds']} s; sha256 {summary['hash'][:16]}... in "
                   f"{plan.record_path.name}")
