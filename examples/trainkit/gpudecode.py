"""JPEGs decoded and augmented on the training device, a batch at a time.

The CPU path (trainkit.data.ImageFolderDataset) decodes and augments each image with
PIL in the loader workers; on a fast GPU those workers cannot keep up (docs/benchmarks.md
"GPU check": 2,848 img/s from 16 workers against 3,794 trained). Here the workers only
read each file's bytes (JpegFiles, collate_encoded) and the training process decodes the
whole batch with nvJPEG (``torchvision.io.decode_jpeg(list, device="cuda")``), then
crops, flips, resizes and normalises it with tensor ops on the GPU (DeviceDecode), in a
background thread on its own CUDA stream one or two batches ahead (DecodedBatches).

The crop box and the flip are drawn exactly as the CPU path draws them: from
``random.Random(f"{seed}/{epoch}/{index}")`` with trainkit.data.random_resized_crop_box,
so a sample gets the same box whichever path reads it. The pixels differ by rounding
only (PIL resizes to uint8, this path stays in float).

Images nvJPEG is not offered (not a JPEG: a PNG with a .JPEG name; CMYK/YCCK, lossless or
arithmetic-coded JPEGs, read from the frame header) or that it refuses are decoded with
PIL instead, one by one, and go through the same augmentation; ``DeviceDecode.fallbacks``
counts them. The same code runs on the CPU with PIL as the "device" decoder
(``--decode tensor``), which is how it is tested on machines without a GPU (and without
torchvision, which does not load beside the CPU build of torch).
"""

from __future__ import annotations

import contextlib
import inspect
import io
import queue
import random
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from hpcdl.jobside.errors import UserInputError
from trainkit.data import MEAN, STD, random_resized_crop_box, val_resize_size

# Frame markers (SOFn) nvJPEG decodes: baseline, extended and progressive Huffman.
# Lossless (C3, C7, CB, CF) and arithmetic-coded (C9-CF) frames go to PIL.
_DEVICE_SOF = (0xC0, 0xC1, 0xC2)
_ALL_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # C4 DHT, C8 JPG, CC DAC

# A batch of encoded files: (all bytes one after another, each file's length, labels,
# sample indices, whether the device decoder is offered each one).
Encoded = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def jpeg_frame(data: bytes) -> tuple[int, int] | None:
    """(SOF marker, colour components) from a JPEG's frame header; None when ``data``
    is not a JPEG or its header ends before the frame."""
    if data[:3] != b"\xff\xd8\xff":
        return None
    i, n = 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte before a marker
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # markers without a length
            i += 2
            continue
        if marker in _ALL_SOF:
            return (marker, data[i + 9]) if i + 10 <= n else None
        if marker == 0xDA:  # a scan before any frame: malformed
            return None
        i += 2 + int.from_bytes(data[i + 2:i + 4], "big")
    return None


def device_decodable(data: bytes) -> bool:
    """Whether nvJPEG is offered these bytes: a Huffman-coded JPEG of 1 or 3 components."""
    frame = jpeg_frame(data)
    return frame is not None and frame[0] in _DEVICE_SOF and frame[1] in (1, 3)


class JpegFiles(Dataset):
    """The samples' file bytes, undecoded: what a loader worker does for DeviceDecode.
    Items are (bytes as a 1-D uint8 tensor, label, index, device_decodable)."""

    def __init__(self, samples: Sequence[tuple[str, int]]) -> None:
        self.samples = list(samples)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch  # the augmentation's seed is drawn where it runs: DeviceDecode

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int, bool]:
        path, label = self.samples[index]
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError as exc:
            raise UserInputError(f"dataset image {path}: cannot be read ({exc.strerror})") from None
        raw = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data \
            else torch.empty(0, dtype=torch.uint8)
        return raw, label, index, device_decodable(data)


def collate_encoded(items: Sequence[tuple[torch.Tensor, int, int, bool]]) -> Encoded:
    """One tensor of all the batch's bytes (one shared-memory block from a worker, not
    one per file) and the lengths to split it by."""
    return (torch.cat([it[0] for it in items]),
            torch.tensor([len(it[0]) for it in items], dtype=torch.int64),
            torch.tensor([it[1] for it in items], dtype=torch.int64),
            torch.tensor([it[2] for it in items], dtype=torch.int64),
            torch.tensor([it[3] for it in items], dtype=torch.bool))


def pil_decode(data: torch.Tensor, name: str) -> torch.Tensor:
    """An image's bytes decoded with PIL to a uint8 RGB tensor (3, H, W), as the CPU path
    decodes (``convert("RGB")``: grayscale and CMYK become RGB)."""
    from PIL import Image, UnidentifiedImageError

    try:
        raw_bytes = data.numpy().tobytes()
    except RuntimeError:  # torch built without numpy: slower, and only for the odd image
        raw_bytes = bytes(data.tolist())
    try:
        with Image.open(io.BytesIO(raw_bytes)) as im:
            img = im.convert("RGB")
    except (OSError, UnidentifiedImageError, ValueError) as exc:
        raise UserInputError(f"dataset image {name}: cannot be decoded ({exc})") from None
    raw = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
    return raw.view(img.height, img.width, 3).permute(2, 0, 1)


def nvjpeg_decoder(device: torch.device) -> tuple[Callable[[list[torch.Tensor]], list[torch.Tensor]] | None, str]:
    """(batched nvJPEG decode onto ``device``, "") when torchvision has it and it decodes
    a small JPEG there; else (None, why not)."""
    if device.type != "cuda":
        return None, f"nvJPEG decodes onto a CUDA device, not {device.type}"
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
    except Exception as exc:  # missing, or a build that does not load beside this torch
        return None, f"torchvision.io does not import ({type(exc).__name__}: {str(exc)[:120]})"
    if "device" not in inspect.signature(decode_jpeg).parameters:
        return None, "this torchvision's decode_jpeg has no device argument"

    def decode(datas: list[torch.Tensor]) -> list[torch.Tensor]:
        out = decode_jpeg(datas, mode=ImageReadMode.RGB, device=device)
        return list(out) if isinstance(out, (list, tuple)) else [out]

    try:
        from PIL import Image

        buf = io.BytesIO()
        Image.new("RGB", (16, 8), (200, 100, 50)).save(buf, "JPEG")
        probe = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
        got = decode([probe, probe])
        # torch.device("cuda") (no index) names the current GPU, where the images land.
        on = got[0].device if got else None
        if len(got) != 2 or tuple(got[0].shape) != (3, 8, 16) or on is None \
                or on.type != device.type or device.index not in (None, on.index):
            return None, (f"decode_jpeg on {device} gave {[tuple(g.shape) for g in got]}"
                          f" on {on}")
    except Exception as exc:
        return None, f"decode_jpeg on {device} failed ({type(exc).__name__}: {str(exc)[:120]})"
    return decode, ""


def pil_batch_decoder(device: torch.device) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
    """The device decoder's CPU equivalent (``--decode tensor``): PIL, then onto ``device``."""

    def decode(datas: list[torch.Tensor]) -> list[torch.Tensor]:
        return [pil_decode(d, "(batch)").to(device) for d in datas]

    return decode


class DeviceDecode:
    """Decode a batch of encoded files on ``device`` and augment it there as the CPU path
    does: training, the random-resized crop (box and flip drawn as trainkit.data draws
    them), resized to ``size`` (bilinear, antialiased as PIL does when shrinking);
    validation, the short side resized then the centre crop. Returns (images, labels)
    on ``device``: float, normalised, in ``memory_format``."""

    def __init__(self, size: int, train: bool, device: torch.device,
                 decode: Callable[[list[torch.Tensor]], list[torch.Tensor]],
                 memory_format: torch.memory_format = torch.contiguous_format, seed: int = 0,
                 names: Sequence[tuple[str, int]] | None = None) -> None:
        self.size = size
        self.train = train
        self.device = device
        self.decode = decode
        self.memory_format = memory_format
        self.seed = seed
        self.names = names
        self.mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(STD, device=device).view(1, 3, 1, 1)
        self.images = 0
        self.fallbacks = 0  # images decoded with PIL: not offered to, or refused by, decode

    def _name(self, index: int) -> str:
        return self.names[index][0] if self.names is not None else f"#{index}"

    def decode_batch(self, datas: list[torch.Tensor], offered: list[bool],
                     indices: list[int]) -> list[torch.Tensor]:
        """Each image as uint8 (3, H, W) on the device: the offered ones in one call of
        the device decoder (one by one when the batch call fails, to find the image it
        refuses), the rest and the refused with PIL."""
        out: list[torch.Tensor | None] = [None] * len(datas)
        want = [i for i, ok in enumerate(offered) if ok]
        if want:
            try:
                for i, img in zip(want, self.decode([datas[i] for i in want]), strict=True):
                    out[i] = img
            except Exception:  # one image spoils nvJPEG's batch call: find which
                for i in want:
                    with contextlib.suppress(Exception):
                        out[i] = self.decode([datas[i]])[0]
        images = []
        for i, img in enumerate(out):
            if img is None or img.dim() != 3 or img.shape[0] not in (1, 3):
                self.fallbacks += 1
                img = pil_decode(datas[i], self._name(indices[i])).to(self.device)
            elif img.shape[0] == 1:  # grayscale: as PIL's convert("RGB")
                img = img.expand(3, -1, -1)
            images.append(img)
        self.images += len(images)
        return images

    def _resize(self, img: torch.Tensor, height: int, width: int) -> torch.Tensor:
        return F.interpolate(img.unsqueeze(0).float(), size=(height, width), mode="bilinear",
                             align_corners=False, antialias=True)[0]

    # Images of one size, at least this many in a batch, are cropped and resized together
    # (resample_weights: two batched matrix products for the lot); fewer, one by one
    # with F.interpolate (3-4 kernels each). The maths are the same; the gpu_check
    # tuning variant per_image_crop sets it past any batch to measure the old way.
    group_from = 2
    # Images per pair of matrix products: bounds the float copy's memory (128 of 500x375:
    # 288 MB, and the weights of a group of 256: 2 x 86 MB).
    group_chunk = 128

    def augment(self, images: list[torch.Tensor], indices: list[int], epoch: int) -> torch.Tensor:
        """The batch cropped, flipped, resized and normalised, as (N, 3, size, size).

        Each image's geometry (box and flip, drawn exactly as before) is a row of
        numbers; images that share a size go through ``resample_weights`` together, one
        group per size (a generated set is one size; ImageNet's are mostly four): for 256
        images of one size 78 tensor ops in all (torch.profiler on the CPU), against 777
        one by one (3 an image), and no tensor op per image on the GPU's side. Up to float
        rounding it is F.interpolate(antialias=True) of the crop."""
        s = self.size
        out = torch.empty(len(images), 3, s, s, device=self.device,
                          memory_format=self.memory_format)
        # (offset, length, resized to, first output index) across, the same down, flip
        geometry: list[tuple[int, int, int, int, int, int, int, int, bool]] = []
        for img, index in zip(images, indices, strict=True):
            _, h, w = img.shape
            if self.train:
                rng = random.Random(f"{self.seed}/{epoch}/{index}")
                left, top, right, bottom = random_resized_crop_box(w, h, rng)
                geometry.append((left, right - left, s, 0, top, bottom - top, s, 0,
                                 rng.random() < 0.5))
            else:
                rw, rh = val_resize_size(w, h, s)
                geometry.append((0, w, rw, (rw - s) // 2, 0, h, rh, (rh - s) // 2, False))
        groups: dict[tuple[int, int], list[int]] = {}
        for k, img in enumerate(images):
            groups.setdefault((img.shape[1], img.shape[2]), []).append(k)
        singles = [k for ks in groups.values() if len(ks) < self.group_from for k in ks]
        flips = []
        for k in singles:
            ox, lx, rx, sx, oy, ly, ry, sy, flip = geometry[k]
            crop = images[k][:, oy:oy + ly, ox:ox + lx]
            out[k] = self._resize(crop, ry, rx)[:, sy:sy + s, sx:sx + s]
            if flip:
                flips.append(k)
        batched = [ks for ks in groups.values() if len(ks) >= self.group_from]
        if batched:
            order = [k for ks in batched for k in ks]
            rows = torch.tensor([[*geometry[k][:8], float(geometry[k][8]), k] for k in order],
                                dtype=torch.float64)
            if self.device.type == "cuda":  # pinned: no host wait for the stream's work
                rows = rows.pin_memory()
            rows = rows.to(self.device, non_blocking=True)
            at = 0
            for ks in batched:  # the weights once a group, the pixels a chunk at a time
                g = rows[at:at + len(ks)]
                at += len(ks)
                _, h, w = images[ks[0]].shape
                across = resample_weights(g[:, 0], g[:, 1], g[:, 2], g[:, 3], g[:, 8] > 0, s, w)
                down = resample_weights(g[:, 4], g[:, 5], g[:, 6], g[:, 7], None, s, h)
                where = g[:, 9].long()
                for first in range(0, len(ks), self.group_chunk):
                    part = slice(first, first + self.group_chunk)
                    x = torch.stack([images[k] for k in ks[part]]).float()  # (n, 3, h, w)
                    # Across first, then down: the order of F.interpolate's (and PIL's)
                    # two passes.
                    x = torch.matmul(x, across[part].transpose(1, 2).unsqueeze(1))  # (n, 3, h, s)
                    x = torch.matmul(down[part].unsqueeze(1), x)  # (n, 3, s, s)
                    out.index_copy_(0, where[part], x)
        if flips:  # one gather for the batch's single images, not a kernel per image
            which = torch.tensor(flips)
            if self.device.type == "cuda":
                which = which.pin_memory()
            which = which.to(self.device, non_blocking=True)
            out[which] = out[which].flip(-1)
        return out.div_(255).sub_(self.mean).div_(self.std)

    def __call__(self, batch: Encoded, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
        data, lengths, labels, indices, offered = batch
        datas = list(torch.split(data, lengths.tolist()))
        idx = indices.tolist()
        images = self.decode_batch(datas, offered.tolist(), idx)
        return self.augment(images, idx, epoch), labels.to(self.device, non_blocking=True)


def resample_weights(offset: torch.Tensor, length: torch.Tensor, resized: torch.Tensor,
                     start: torch.Tensor, flip: torch.Tensor | None, out: int,
                     full: int) -> torch.Tensor:
    """(G, out, full) matrices that crop, resize and (where ``flip``) mirror one axis of
    G images ``full`` pixels long: output pixel o of image g is row o of matrix g times
    the image's pixels along that axis. The crop is ``length`` pixels from ``offset``,
    resized to ``resized`` pixels of which outputs start..start+out are kept (all (G,)
    tensors on the device). The weights are F.interpolate's for bilinear with
    antialias=True (PIL's filter): a triangle one output pixel wide, stretched by the
    scale when shrinking, clipped to the crop and normalised to sum 1."""
    device = offset.device
    # float32: pixel positions are exact in it, and float64 would double the (G, out,
    # full) temporaries (G=256 of 500 px: 115 MB each in float32).
    offset, length, resized, start = (t.float() for t in (offset, length, resized, start))
    o = torch.arange(out, device=device, dtype=torch.float32)
    i = o.expand(len(offset), out) if flip is None \
        else torch.where(flip[:, None], out - 1 - o, o)
    i = i + start[:, None]
    scale = length / resized
    inv = torch.where(scale >= 1, 1 / scale, torch.ones_like(scale))
    centre = scale[:, None] * (i + 0.5)  # (G, out), in crop pixels
    p = torch.arange(full, device=device, dtype=torch.float32) - offset[:, None]  # (G, full)
    x = (p[:, None, :] + 0.5 - centre[:, :, None]) * inv[:, None, None]
    inside = ((p >= 0) & (p < length[:, None]))[:, None, :]
    w = (1 - x.abs()).clamp_(min=0).mul_(inside)
    return w.div_(w.sum(-1, keepdim=True).clamp_(min=1e-12))


_END = object()


class DecodedBatches:
    """A bytes loader's batches, decoded and augmented by ``decoder`` in a background
    thread (on a CUDA stream of its own) up to ``depth`` batches ahead of the training
    step: the host work of the next batch runs while the training thread waits for the
    GPU, and the GPU work overlaps the step's kernels. Errors in the thread are raised
    in the iterating one."""

    def __init__(self, loader: Any, decoder: DeviceDecode, epoch: int, depth: int = 2) -> None:
        self.loader = loader
        self.decoder = decoder
        self.epoch = epoch
        self.depth = depth

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        device = self.decoder.device
        cuda = device.type == "cuda"
        ready: queue.Queue[Any] = queue.Queue(maxsize=self.depth)
        stop = threading.Event()

        def put(item: Any) -> bool:
            while not stop.is_set():
                try:
                    ready.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        # Started here, in the training thread: the loader's worker processes are forked
        # from it, not from the decode thread.
        batches = iter(self.loader)

        def produce() -> None:
            try:
                with contextlib.ExitStack() as ctx:
                    if cuda:
                        ctx.enter_context(torch.cuda.device(device))
                        ctx.enter_context(torch.cuda.stream(torch.cuda.Stream(device)))
                    for batch in batches:
                        x, y = self.decoder(batch, self.epoch)
                        event = None
                        if cuda:
                            event = torch.cuda.Event()
                            event.record()
                        if not put((x, y, event)):
                            return
            except BaseException as exc:  # handed to the training thread, raised there
                put(exc)
                return
            put(_END)

        thread = threading.Thread(target=produce, name="device-decode", daemon=True)
        thread.start()
        try:
            while True:
                got = ready.get()
                if got is _END:
                    return
                if isinstance(got, BaseException):
                    raise got
                x, y, event = got
                if event is not None:
                    compute = torch.cuda.current_stream(device)
                    compute.wait_event(event)
                    # Made on the decode stream, used on this one: keep the allocator from
                    # handing their memory out again before the step is done with them.
                    x.record_stream(compute)
                    y.record_stream(compute)
                yield x, y
        finally:
            stop.set()
            thread.join(timeout=60)
