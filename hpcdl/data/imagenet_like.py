"""ImageNet-like JPEGs for the benches (``hpcdl data make-tiny --imagenet-like``): the
sizes and the bytes of real ImageNet photos, not 1 KB stripes, so a packed file's
block size, a loader's decode and a filesystem's reads cost what they cost on ImageNet.

Sizes follow ImageNet's train set (most are 500 pixels on the long side: 500x375,
500x333, 375x500, 333x500; the rest 300-800 wide, aspect 0.75-1.6); the pictures are
smooth colour fields at two scales (sky, walls, light) with hard-edged shapes on them
(objects: edges for the encoder) and texture plus grain over everything, so a quality-90
JPEG is ~110 KB as ImageNet's are (not the few KB a flat image gives). Numbers measured
in docs/benchmarks.md (Datasets). Deterministic from the seed: the noise comes from
one pool per seed, each image a crop of it at offsets its own generator draws.
"""

from __future__ import annotations

import colorsys
from typing import Any

POOL = 1024  # the noise pools' side: the largest image drawn fits in it
# (share, width, height): ImageNet's common shapes; the rest drawn in _size.
SHAPES = ((0.40, 500, 375), (0.15, 500, 333), (0.10, 375, 500), (0.05, 333, 500))
# Grain and texture strength, tuned so quality-90 JPEGs average ~110 KB.
GRAIN, TEXTURE = 16.0, 28.0
QUALITY = 90


def noise_pools(seed: int) -> tuple[Any, Any]:
    """Full-resolution grain and a texture (noise at ~3-pixel scale), one pair per
    seed: cropping these per image costs nothing next to drawing new noise."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng([seed, 0x1A6E])
    grain = rng.standard_normal((POOL, POOL), dtype=np.float32)
    coarse = rng.standard_normal((POOL // 3, POOL // 3), dtype=np.float32)
    texture = np.asarray(Image.fromarray(coarse).resize((POOL, POOL), Image.Resampling.BILINEAR))
    return grain, texture


def image_size(rng: Any) -> tuple[int, int]:
    """(width, height) as ImageNet's train set has them."""
    u = float(rng.random())
    for share, w, h in SHAPES:
        if u < share:
            return w, h
        u -= share
    w = int(rng.integers(300, 801))
    return w, max(200, min(800, int(w / float(rng.uniform(0.75, 1.6)))))


def draw(rng: Any, label: int, classes: int, pools: tuple[Any, Any]) -> Any:
    """One picture (a PIL image) of class ``label``: its hue tints the colour field, so
    a network can tell classes apart a little."""
    import numpy as np
    from PIL import Image, ImageDraw

    w, h = image_size(rng)
    sw, sh = max(4, w // 8), max(4, h // 8)
    r, g, b = colorsys.hsv_to_rgb(label / max(1, classes), 0.5, 0.6)
    base = np.array([r, g, b], np.float32) * 255 + rng.uniform(-30, 30, 3).astype(np.float32)
    field = np.broadcast_to(base, (sh, sw, 3)).copy()
    for cells, weight in ((3, 60.0), (12, 30.0)):
        small = rng.standard_normal((max(2, cells * sh // sw), cells, 3), dtype=np.float32)
        up = np.stack([np.asarray(Image.fromarray(small[:, :, c]).resize((sw, sh),
                                                                         Image.Resampling.BICUBIC))
                       for c in range(3)], -1)
        field += weight * up
    pic = Image.fromarray(np.clip(field, 0, 255).astype(np.uint8)).resize((w, h),
                                                                          Image.Resampling.BICUBIC)
    pen = ImageDraw.Draw(pic)
    for _ in range(int(rng.integers(4, 10))):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        box = [x0, y0, x0 + int(rng.integers(20, w // 2)), y0 + int(rng.integers(20, h // 2))]
        fill = tuple(int(c) for c in rng.integers(0, 256, 3))
        (pen.ellipse if rng.random() < 0.5 else pen.rectangle)(box, fill=fill)
    grain, texture = pools
    gy, gx = int(rng.integers(0, POOL - h + 1)), int(rng.integers(0, POOL - w + 1))
    ty, tx = int(rng.integers(0, POOL - h + 1)), int(rng.integers(0, POOL - w + 1))
    noise = GRAIN * grain[gy:gy + h, gx:gx + w] + TEXTURE * texture[ty:ty + h, tx:tx + w]
    out = np.asarray(pic, np.float32) + noise[:, :, None]
    return Image.fromarray(np.clip(out, 0, 255).astype(np.uint8))

