"""A tiny ImageNet-format dataset of real JPEGs, for tests and first runs.

Each class gets its own colour and stripe direction, with per-image jitter, so a
small network can learn it in a few epochs. Output is deterministic for a given
seed (same pixels, same JPEG encoder settings) and written atomically: into a
temporary sibling directory, renamed into place when complete.
"""

from __future__ import annotations

import colorsys
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcdl.data import imagenet_like
from hpcdl.errors import UserInputError

MARKER = ".hpcdl-tiny"


@dataclass(frozen=True)
class TinySpec:
    classes: int = 10
    per_class: int = 20
    val_per_class: int = 5
    size: int = 64
    seed: int = 0
    # ImageNet's sizes and ~110 KB JPEGs (hpcdl.data.imagenet_like) instead of size x
    # size stripes: for the benches.
    imagenet_like: bool = False

    def check(self) -> None:
        """Raises UserInputError naming the field, value and limit."""
        limits = {
            "classes": (self.classes, 1, 1000),
            "per_class": (self.per_class, 1, 100000),
            # 1 at least: `data pack` and the examples refuse a split with empty classes.
            "val_per_class": (self.val_per_class, 1, 100000),
            "size": (self.size, 8, 1024),
        }
        for name, (value, lo, hi) in limits.items():
            if not lo <= value <= hi:
                raise UserInputError(f"--{name.replace('_', '-')} {value} is outside {lo}-{hi}")


def class_name(index: int) -> str:
    """WordNet-id-like directory names, as ImageNet uses (n00000000, n00000001, ...)."""
    return f"n{index:08d}"


def _draw(spec: TinySpec, label: int, rng: random.Random) -> Any:
    from PIL import Image, ImageDraw  # lazily: the CLI path stays light

    hue = label / spec.classes
    r, g, b = (int(255 * c) for c in colorsys.hsv_to_rgb(hue, 0.75, 0.9))
    jitter = [rng.randint(-25, 25) for _ in range(3)]
    bg = tuple(max(0, min(255, c + j)) for c, j in zip((r, g, b), jitter, strict=True))
    img = Image.new("RGB", (spec.size, spec.size), bg)
    draw = ImageDraw.Draw(img)
    # Stripe direction and spacing depend on the class, offset on the image.
    period = 4 + (label % 4) * 3
    offset = rng.randrange(period)
    width = max(1, period // 3)
    fg = (255 - bg[0], 255 - bg[1], 255 - bg[2])
    horizontal = label % 2 == 0
    for pos in range(offset - period, spec.size + period, period):
        if horizontal:
            draw.rectangle([0, pos, spec.size, pos + width - 1], fill=fg)
        else:
            draw.rectangle([pos, 0, pos + width - 1, spec.size], fill=fg)
    # A small square at a random place: something to crop around.
    s = max(2, spec.size // 6)
    x, y = rng.randrange(spec.size - s), rng.randrange(spec.size - s)
    draw.rectangle([x, y, x + s, y + s], fill=(rng.randrange(256),) * 3)
    return img


def make_tiny(
    root: str | os.PathLike[str], spec: TinySpec, *, force: bool = False
) -> dict[str, Any]:
    """Write ``root/{train,val}/<class>/<class>_<i>.JPEG``; return a summary dict.

    Raises UserInputError for bad sizes, or when ``root`` exists and is not empty
    (unless ``force``, which replaces it only once the new one is complete).
    """
    spec.check()
    dest = Path(root)
    if dest.exists() and not dest.is_dir():
        raise UserInputError(f"{dest} exists and is not a directory")
    if dest.is_dir() and any(dest.iterdir()) and not force:
        raise UserInputError(
            f"{dest} exists and is not empty", hint="pick another directory or pass --force"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    pools = imagenet_like.noise_pools(spec.seed) if spec.imagenet_like else None
    written = 0
    try:
        counts = {"train": 0, "val": 0}
        for split, n in (("train", spec.per_class), ("val", spec.val_per_class)):
            split_seed = 0 if split == "train" else 1
            for label in range(spec.classes):
                cdir = tmp / split / class_name(label)
                cdir.mkdir(parents=True)
                for i in range(n):
                    out = cdir / f"{class_name(label)}_{i}.JPEG"
                    if pools is not None:
                        img = imagenet_like.draw(_np_rng(spec.seed, split_seed, label, i),
                                                 label, spec.classes, pools)
                        img.save(out, "JPEG", quality=imagenet_like.QUALITY)
                    else:
                        rng = random.Random(f"{spec.seed}/{split_seed}/{label}/{i}")
                        _draw(spec, label, rng).save(out, "JPEG", quality=90)
                    written += out.stat().st_size
                    counts[split] += 1
        (tmp / MARKER).write_text(
            f"classes={spec.classes} per_class={spec.per_class} "
            f"val_per_class={spec.val_per_class} "
            + ("imagenet_like" if spec.imagenet_like else f"size={spec.size}")
            + f" seed={spec.seed}\n"
        )
        if dest.exists():
            old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
            dest.rename(old)
            tmp.rename(dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {
        "path": str(dest),
        "classes": spec.classes,
        "train_images": counts["train"],
        "val_images": counts["val"],
        "size": "imagenet-like" if spec.imagenet_like else spec.size,
        "seed": spec.seed,
        "bytes": written,
    }


def _np_rng(seed: int, split: int, label: int, index: int) -> Any:
    import numpy as np

    return np.random.default_rng([seed, split, label, index])
