"""``hpcdl data``: make and check datasets in the ImageFolder (ImageNet) layout."""

from __future__ import annotations

import json
import time

import click

from hpcdl.data.imagefolder import scan_imagefolder
from hpcdl.data.tiny import TinySpec, make_tiny


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
    spec = TinySpec(classes, per_class, val_per_class, size, seed)
    start = time.monotonic()
    summary = make_tiny(directory, spec, force=force)
    summary["seconds"] = round(time.monotonic() - start, 3)
    if as_json:
        click.echo(json.dumps(summary))
    else:
        click.echo(
            f"wrote {summary['train_images']} train + {summary['val_images']} val JPEGs "
            f"({classes} classes, {size}x{size}) to {summary['path']} in {summary['seconds']} s"
        )


@data.command("check")
@click.argument("directory", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
def check_cmd(directory: str, as_json: bool) -> None:
    """Check that DIRECTORY is a usable ImageFolder dataset (exit 2 with the reason if not)."""
    folder = scan_imagefolder(directory)
    summary = {"path": str(folder.root), "classes": len(folder.classes), **folder.counts()}
    if as_json:
        click.echo(json.dumps(summary))
    else:
        click.echo(
            f"{folder.root}: {len(folder.classes)} classes, "
            f"{summary['train']} train / {summary['val']} val images"
        )
