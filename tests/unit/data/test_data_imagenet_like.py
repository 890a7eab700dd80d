"""hpcdl/data/imagenet_like.py: image sizes as ImageNet's train set has them (property),
and pictures that are deterministic per seed, of their drawn size, and JPEGs of
ImageNet's weight rather than a flat image's."""

from __future__ import annotations

import io
from collections import Counter

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from hpcdl.data.imagenet_like import POOL, QUALITY, SHAPES, draw, image_size, noise_pools


@given(st.integers(0, 2**32 - 1))
def test_every_size_fits_the_noise_pool_and_imagenets_range(seed):
    w, h = image_size(np.random.default_rng(seed))
    assert (w, h) in {(sw, sh) for _, sw, sh in SHAPES} or (300 <= w <= 800 and 200 <= h <= 800)
    assert w <= POOL and h <= POOL


def test_the_common_shapes_come_in_their_shares():
    rng = np.random.default_rng(7)
    counts = Counter(image_size(rng) for _ in range(4000))
    assert abs(counts[(500, 375)] / 4000 - 0.40) < 0.03
    assert abs(counts[(333, 500)] / 4000 - 0.05) < 0.015


def test_a_picture_is_deterministic_and_weighs_like_a_photo():
    pools = noise_pools(3)
    a = draw(np.random.default_rng([3, 1]), 1, 10, pools)
    b = draw(np.random.default_rng([3, 1]), 1, 10, noise_pools(3))
    assert a.tobytes() == b.tobytes()
    c = draw(np.random.default_rng([3, 2]), 1, 10, pools)
    assert a.tobytes() != c.tobytes()
    assert a.mode == "RGB" and a.size == image_size(np.random.default_rng([3, 1]))
    buf = io.BytesIO()
    a.save(buf, "JPEG", quality=QUALITY)
    assert buf.tell() > 40_000  # a flat picture of this size is a few KB
