"""Input pipeline without torchvision: ImageFolder + transforms with PIL, synthetic
images, and a DistributedSampler that can resume in the middle of an epoch.

Random augmentation is drawn from a generator seeded by (seed, epoch, sample index),
not from the process's global RNG: a sample is augmented the same way whichever
rank or data-loader worker reads it, and a resumed run sees exactly the images the
uninterrupted run would have seen.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import Dataset, DistributedSampler

from hpcdl.jobside.errors import UserInputError

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def _to_tensor(img: object, size: int) -> torch.Tensor:
    raw = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)  # type: ignore[attr-defined]
    x = raw.view(size, size, 3).permute(2, 0, 1).float().div_(255)
    mean = torch.tensor(MEAN).view(3, 1, 1)
    std = torch.tensor(STD).view(3, 1, 1)
    return (x - mean) / std


def random_resized_crop_box(
    width: int, height: int, rng: random.Random, scale: tuple[float, float] = (0.08, 1.0)
) -> tuple[int, int, int, int]:
    """Inception-style crop box (left, top, right, bottom), as torchvision's RandomResizedCrop."""
    area = width * height
    log_ratio = (math.log(3 / 4), math.log(4 / 3))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        ratio = math.exp(rng.uniform(*log_ratio))
        w = round(math.sqrt(target * ratio))
        h = round(math.sqrt(target / ratio))
        if 0 < w <= width and 0 < h <= height:
            left = rng.randint(0, width - w)
            top = rng.randint(0, height - h)
            return left, top, left + w, top + h
    side = min(width, height)  # fallback: central square
    left, top = (width - side) // 2, (height - side) // 2
    return left, top, left + side, top + side


def train_transform(img: object, size: int, rng: random.Random) -> torch.Tensor:
    from PIL import Image

    assert isinstance(img, Image.Image)
    box = random_resized_crop_box(img.width, img.height, rng)
    out = img.resize((size, size), Image.BILINEAR, box=box)
    if rng.random() < 0.5:
        out = out.transpose(Image.FLIP_LEFT_RIGHT)
    return _to_tensor(out, size)


def val_resize_size(width: int, height: int, size: int) -> tuple[int, int]:
    """(width, height) an image is resized to before validation's centre crop: the short
    side to size*256/224, never below ``size`` (trainkit.gpudecode does the same)."""
    short = max(size, round(size * 256 / 224))
    scale = short / min(width, height)
    return max(size, round(width * scale)), max(size, round(height * scale))


def val_transform(img: object, size: int) -> torch.Tensor:
    """Resize the short side to size*256/224, then centre-crop size x size."""
    from PIL import Image

    assert isinstance(img, Image.Image)
    w, h = val_resize_size(img.width, img.height, size)
    img = img.resize((w, h), Image.BILINEAR)
    left, top = (w - size) // 2, (h - size) // 2
    return _to_tensor(img.crop((left, top, left + size, top + size)), size)


class ImageFolderDataset(Dataset):
    """Samples from ``hpcdl.jobside.imagefolder.scan_imagefolder`` decoded with PIL."""

    def __init__(
        self, samples: Sequence[tuple[str, int]], size: int, train: bool, seed: int = 0
    ) -> None:
        self.samples = list(samples)
        self.size = size
        self.train = train
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from PIL import Image, UnidentifiedImageError

        path, label = self.samples[index]
        try:
            with Image.open(path) as im:
                img = im.convert("RGB")
        except (OSError, UnidentifiedImageError) as exc:
            raise UserInputError(f"dataset image {path}: cannot be decoded ({exc})") from None
        if self.train:
            rng = random.Random(f"{self.seed}/{self.epoch}/{index}")
            return train_transform(img, self.size, rng), label
        return val_transform(img, self.size), label


class SyntheticImages(Dataset):
    """Random images and labels, a pure function of (seed, index): same on every rank.

    ``dtype`` uint8 (the default) gives each image as 8-bit pixels that ``normalise``
    turns into the float input on the training device, as a decoded JPEG would be: a
    quarter of float32's bytes through the loader's shared memory, pinning and the copy
    (float32 images were 154 MB a 256-image batch, and the same batch kept on an H200
    trained 1.15x faster: docs/benchmarks.md, GPU check 2026-11-28). They are the same
    unit-normal draws as float32's, quantised: ``(z * STD + MEAN) * 255`` rounded and
    clipped to 0..255, so after ``normalise`` each value is within half a level
    (0.0088) of the draw clipped to the range a pixel can hold (-2.12..2.25 for red,
    -1.80..2.64 for blue). float32 gives the draws themselves."""

    def __init__(self, length: int, num_classes: int, size: int, seed: int = 0,
                 dtype: torch.dtype = torch.uint8) -> None:
        if dtype not in (torch.uint8, torch.float32):
            raise ValueError(f"synthetic images are uint8 or float32, not {dtype}")
        self.length = length
        self.num_classes = num_classes
        self.size = size
        self.seed = seed
        self.dtype = dtype

    def set_epoch(self, epoch: int) -> None:
        pass  # no augmentation

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        label = int(torch.randint(self.num_classes, (1,), generator=g))
        block = synthetic_block(self.size)
        if block == 1:
            image = torch.randn(3, self.size, self.size, generator=g)
            return (image if self.dtype == torch.float32 else quantise(image)), label
        # Drawing 224x224x3 normal values per image kept 4 loader workers from feeding
        # one H200 (45% of each step spent waiting, docs/benchmarks.md "GPU check"):
        # draw a coarse grid and repeat each value over a block of pixels instead
        # (quantised before the repeat: the same pixels, a block's work once).
        side = -(-self.size // block)
        coarse = torch.randn(1, 3, side, side, generator=g)
        if self.dtype == torch.uint8:
            coarse = quantise(coarse)
        return torch.nn.functional.interpolate(coarse, size=(self.size, self.size))[0], label


def quantise(z: torch.Tensor) -> torch.Tensor:
    """Unit-normal draws as the 8-bit pixels whose ``normalise`` is nearest to them."""
    mean = torch.tensor(MEAN).view(3, 1, 1)
    std = torch.tensor(STD).view(3, 1, 1)
    return (z * std + mean).mul_(255).round_().clamp_(0, 255).to(torch.uint8)


_NORMALISE: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def normalise(x: torch.Tensor) -> torch.Tensor:
    """A batch (N, 3, H, W) of 8-bit pixels as the float input the model trains on:
    /255, minus MEAN, over STD, on x's device and in x's memory format (the maths of
    ``_to_tensor`` and of trainkit.gpudecode). MEAN and STD are put on each device
    once: a tensor made on a GPU from host values would wait for that GPU's queue."""
    consts = _NORMALISE.get(x.device)
    if consts is None:
        consts = _NORMALISE.setdefault(x.device, (
            torch.tensor(MEAN, device=x.device).view(1, 3, 1, 1),
            torch.tensor(STD, device=x.device).view(1, 3, 1, 1)))
    return x.float().div_(255).sub_(consts[0]).div_(consts[1])


def synthetic_block(size: int) -> int:
    """Side of the square of pixels that share one random value in a synthetic image:
    1 (every pixel drawn) up to 63 px, so the small images of tests and CPU runs are
    unchanged; about size/32 above."""
    return max(1, size // 32) if size >= 64 else 1


class ResumableDistributedSampler(DistributedSampler):
    """DistributedSampler (shuffle per epoch via set_epoch, one shard per rank) that can
    skip the samples this rank already consumed in the current epoch, for a resume."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.skip = 0

    def set_position(self, epoch: int, samples_done: int) -> None:
        self.set_epoch(epoch)
        self.skip = samples_done

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        skip, self.skip = self.skip, 0  # only the first pass after a resume skips
        return iter(indices[skip:])

    def __len__(self) -> int:
        return self.num_samples - self.skip


def shard_indices(
    length: int,
    world_size: int,
    rank: int,
    epoch: int,
    seed: int,
    shuffle: bool = True,
    drop_last: bool = False,
) -> list[int]:
    """The indices ``rank`` reads in ``epoch`` (what the sampler yields), for tests and tools."""

    class _Len:
        def __len__(self) -> int:
            return length

    sampler = DistributedSampler(
        _Len(),
        num_replicas=world_size,
        rank=rank,
        shuffle=shuffle,
        seed=seed,
        drop_last=drop_last,  # type: ignore[arg-type]
    )
    sampler.set_epoch(epoch)
    return list(sampler)


def even_shard(length: int, world_size: int, rank: int) -> list[int]:
    """A strided shard without padding (for evaluation: counts are summed across ranks,
    so uneven shards are fine and no sample is counted twice)."""
    return list(range(rank, length, world_size))
