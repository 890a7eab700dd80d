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

    from hpcdl.data.imagefolder import scan_imagefolder
    from hpcdl.data.tiny import TinySpec, make_tiny

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

    from hpcdl.core.errors import UserInputError

    bad = tmp_path / "x.JPEG"
    bad.write_bytes(b"\xff\xd8\xff\xe0 truncated")
    with pytest.raises(UserInputError, match="cannot be decoded"):
        ImageFolderDataset([(str(bad), 0)], 32, train=False)[0]


def test_synthetic_images_are_deterministic() -> None:
    from trainkit.data import SyntheticImages

    a, b = SyntheticImages(10, 5, 32, seed=1), SyntheticImages(10, 5, 32, seed=1)
    assert torch.equal(a[3][0], b[3][0]) and a[3][1] == b[3][1]
    assert not torch.equal(a[3][0], a[4][0])
