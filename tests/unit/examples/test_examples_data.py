"""Examples' input pipeline: shards, resumable sampler, transforms, dataset errors."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("epoch", [0, 5])
def test_shards_disjoint_and_covering(world: int, epoch: int) -> None:
    from trainkit.data import shard_indices

    n = 120  # divisible by every world size here: no padding
    shards = [shard_indices(n, world, r, epoch, seed=3) for r in range(world)]
    seen = [i for s in shards for i in s]
    assert len(seen) == len(set(seen)) == n
    assert set(seen) == set(range(n))
    assert len({len(s) for s in shards}) == 1  # equal work per rank


def test_shards_with_drop_last_stay_disjoint() -> None:
    from trainkit.data import shard_indices

    shards = [shard_indices(103, 4, r, 0, seed=0, drop_last=True) for r in range(4)]
    seen = [i for s in shards for i in s]
    assert len(seen) == len(set(seen)) == 100


def test_set_epoch_reshuffles_and_seed_is_shared() -> None:
    from trainkit.data import shard_indices

    assert shard_indices(64, 2, 0, 0, seed=1) != shard_indices(64, 2, 0, 1, seed=1)
    assert shard_indices(64, 2, 0, 1, seed=1) == shard_indices(64, 2, 0, 1, seed=1)


def test_resumable_sampler_skips_once() -> None:
    from trainkit.data import ResumableDistributedSampler

    data = list(range(40))
    s = ResumableDistributedSampler(data, num_replicas=2, rank=1, shuffle=True, seed=5)
    s.set_epoch(3)
    full = list(s)
    s.set_position(3, 8)
    assert len(s) == len(full) - 8
    assert list(s) == full[8:]
    assert list(s) == full  # the skip applies to the first pass only


def test_even_shard_for_eval() -> None:
    from trainkit.data import even_shard

    shards = [even_shard(10, 3, r) for r in range(3)]
    assert sorted(i for s in shards for i in s) == list(range(10))


def test_crop_box_inside_image() -> None:
    from trainkit.data import random_resized_crop_box

    rng = random.Random(0)
    for _ in range(200):
        left, top, right, bottom = random_resized_crop_box(64, 48, rng)
        assert 0 <= left < right <= 64 and 0 <= top < bottom <= 48


def test_imagefolder_dataset_on_tiny_jpegs(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    from trainkit.data import ImageFolderDataset

    from hpcdl.data.tiny import TinySpec, make_tiny
    from hpcdl.jobside.imagefolder import scan_imagefolder

    make_tiny(tmp_path / "t", TinySpec(classes=2, per_class=3, val_per_class=1, size=48))
    folder = scan_imagefolder(tmp_path / "t")
    train = ImageFolderDataset(folder.samples["train"], 32, train=True, seed=1)
    x, y = train[0]
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32 and y in (0, 1)
    assert torch.isfinite(x).all()
    # Augmentation is a function of (seed, epoch, index): same call, same tensor.
    assert torch.equal(train[2][0], train[2][0])
    train.set_epoch(1)
    val = ImageFolderDataset(folder.samples["val"], 32, train=False)
    assert val[0][0].shape == (3, 32, 32)


def test_corrupt_image_is_a_user_error(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    from trainkit.data import ImageFolderDataset

    from hpcdl.errors import UserInputError

    bad = tmp_path / "x.JPEG"
    bad.write_bytes(b"\xff\xd8\xff\xe0 truncated")
    with pytest.raises(UserInputError, match="cannot be decoded"):
        ImageFolderDataset([(str(bad), 0)], 32, train=False)[0]


def test_synthetic_images_are_deterministic() -> None:
    from trainkit.data import SyntheticImages

    a, b = SyntheticImages(10, 5, 32, seed=1), SyntheticImages(10, 5, 32, seed=1)
    assert torch.equal(a[3][0], b[3][0]) and a[3][1] == b[3][1]
    assert not torch.equal(a[3][0], a[4][0])


def test_small_synthetic_images_draw_every_pixel() -> None:
    from trainkit.data import SyntheticImages, quantise

    # Up to 63 px every pixel is drawn, as before the coarse grid; float32 gives the
    # draws themselves, uint8 (the default) the same draws quantised.
    g = torch.Generator().manual_seed(1 * 1_000_003 + 3)
    label = int(torch.randint(5, (1,), generator=g))
    draws = torch.randn(3, 63, 63, generator=g)
    image, got_label = SyntheticImages(10, 5, 63, seed=1, dtype=torch.float32)[3]
    assert got_label == label and torch.equal(image, draws)
    image, got_label = SyntheticImages(10, 5, 63, seed=1)[3]
    assert got_label == label and image.dtype == torch.uint8
    assert torch.equal(image, quantise(draws))


@pytest.mark.parametrize("size", [32, 224])
def test_uint8_synthetic_images_normalise_to_the_float32_draws(size: int) -> None:
    from trainkit.data import MEAN, STD, SyntheticImages, normalise

    floats = torch.stack([SyntheticImages(6, 5, size, seed=2, dtype=torch.float32)[i][0]
                          for i in range(6)])
    pixels = torch.stack([SyntheticImages(6, 5, size, seed=2)[i][0] for i in range(6)])
    assert pixels.dtype == torch.uint8 and pixels.nbytes * 4 == floats.nbytes
    got = normalise(pixels)
    assert got.dtype == torch.float32 and got.shape == floats.shape
    # Within half a pixel level of the draw, clipped to what a pixel can hold.
    lo = torch.tensor([-m / s for m, s in zip(MEAN, STD, strict=True)]).view(1, 3, 1, 1)
    hi = torch.tensor([(1 - m) / s for m, s in zip(MEAN, STD, strict=True)]).view(1, 3, 1, 1)
    assert float((got - floats.clamp(lo, hi)).abs().max()) <= 0.5 / 255 / min(STD) + 1e-6
    # The maths of the PIL path's _to_tensor, in the batch's own memory format.
    last = normalise(pixels.contiguous(memory_format=torch.channels_last))
    assert last.is_contiguous(memory_format=torch.channels_last) and torch.equal(last, got)


def test_synthetic_images_are_uint8_or_float32() -> None:
    from trainkit.data import SyntheticImages

    with pytest.raises(ValueError, match="uint8 or float32"):
        SyntheticImages(4, 2, 32, dtype=torch.float16)


def test_large_synthetic_images_repeat_a_coarse_grid() -> None:
    from trainkit.data import SyntheticImages, quantise, synthetic_block

    assert [synthetic_block(n) for n in (8, 63, 64, 224, 225)] == [1, 1, 2, 7, 7]
    data = SyntheticImages(50, 1000, 224, seed=0, dtype=torch.float32)
    image, _ = data[7]
    assert image.shape == (3, 224, 224) and image.dtype == torch.float32
    assert torch.equal(image, SyntheticImages(50, 1000, 224, seed=0, dtype=torch.float32)[7][0])
    # uint8: the same grid, quantised before it is repeated.
    assert torch.equal(SyntheticImages(50, 1000, 224, seed=0)[7][0], quantise(image))
    # 7x7 blocks of one value, the blocks drawn independently (unit normal).
    assert torch.equal(image[:, :7, :7], image[:, :1, :1].expand(3, 7, 7))
    assert not torch.equal(image[:, :7, :7], image[:, 7:14, :7])
    stack = torch.stack([data[i][0] for i in range(20)])
    assert abs(float(stack.mean())) < 0.05 and 0.9 < float(stack.std()) < 1.1
    assert len({data[i][0][0, 0, 0].item() for i in range(20)}) == 20
