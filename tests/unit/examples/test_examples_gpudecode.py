"""The device decode path (examples/trainkit/gpudecode.py) through its CPU equivalent:
PIL as the "device" decoder and the CPU as the device (``--decode tensor``), the same
code --decode gpu runs with nvJPEG on a GPU (tests/unit/examples/test_examples_gpu.py
checks that part on a GPU). Real JPEG/PNG files written with PIL."""

from __future__ import annotations

import io
import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.unit.conftest_examples import EXAMPLES

torch = pytest.importorskip("torch")
Image = pytest.importorskip("PIL.Image")
pytestmark = pytest.mark.torch


def _photo(w: int, h: int, seed: int) -> Any:
    """An RGB image with structure in both directions (a crop or a flip shows)."""
    g = torch.Generator().manual_seed(seed)
    base = torch.rand(3, 6, 8, generator=g)
    img = torch.nn.functional.interpolate(base[None], size=(h, w), mode="bilinear")[0]
    ramp = torch.linspace(0, 1, w).view(1, 1, w)
    arr = ((0.6 * img + 0.4 * ramp) * 255).clamp(0, 255).byte().permute(1, 2, 0).contiguous()
    return Image.frombytes("RGB", (w, h), bytes(arr.flatten().tolist()))


def _write(path: Path, img: Any, fmt: str = "JPEG", **kw: Any) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, fmt, quality=95, **kw)
    return str(path)


@pytest.fixture
def samples(tmp_path: Path) -> list[tuple[str, int]]:
    sizes = [(120, 90), (90, 130), (200, 150), (64, 64), (150, 100), (100, 160)]
    return [(_write(tmp_path / f"c{i % 2}" / f"{i}.JPEG", _photo(w, h, i)), i % 2)
            for i, (w, h) in enumerate(sizes)]


def _decoder(size: int, train: bool, samples: list[tuple[str, int]], **kw: Any) -> Any:
    from trainkit.gpudecode import DeviceDecode, pil_batch_decoder

    device = torch.device("cpu")
    return DeviceDecode(size, train, device, kw.pop("decode", pil_batch_decoder(device)),
                        names=samples, **kw)


def _batch(samples: list[tuple[str, int]], indices: list[int]) -> Any:
    from trainkit.gpudecode import JpegFiles, collate_encoded

    files = JpegFiles(samples)
    return collate_encoded([files[i] for i in indices])


def test_the_frame_header_says_what_nvjpeg_is_offered(tmp_path: Path) -> None:
    from trainkit.gpudecode import device_decodable, jpeg_frame

    def encoded(img: Any, fmt: str = "JPEG", **kw: Any) -> bytes:
        buf = io.BytesIO()
        img.save(buf, fmt, **kw)
        return buf.getvalue()

    rgb = _photo(40, 30, 0)
    assert jpeg_frame(encoded(rgb)) == (0xC0, 3) and device_decodable(encoded(rgb))
    assert jpeg_frame(encoded(rgb, progressive=True)) == (0xC2, 3)
    assert device_decodable(encoded(rgb.convert("L")))  # grayscale: nvJPEG gives RGB
    assert jpeg_frame(encoded(rgb.convert("CMYK"))) == (0xC0, 4)
    assert not device_decodable(encoded(rgb.convert("CMYK")))
    assert not device_decodable(encoded(rgb, "PNG"))  # a PNG with a .JPEG name
    assert not device_decodable(b"") and not device_decodable(b"\xff\xd8\xff\xe0\x00")
    assert jpeg_frame(b"\xff\xd8\xff\xda\x00\x02") is None  # a scan before the frame


def test_a_training_batch_has_the_cpu_paths_shape_layout_and_range(samples) -> None:
    from trainkit.data import MEAN, STD

    dec = _decoder(32, True, samples, memory_format=torch.channels_last, seed=3)
    x, y = dec(_batch(samples, [0, 1, 2, 3, 4, 5]), epoch=1)
    assert x.shape == (6, 3, 32, 32) and x.dtype == torch.float32 and x.device.type == "cpu"
    assert x.is_contiguous(memory_format=torch.channels_last)
    assert y.tolist() == [0, 1, 0, 1, 0, 1] and y.dtype == torch.int64
    lo = torch.tensor([(0 - m) / s for m, s in zip(MEAN, STD, strict=True)]).view(1, 3, 1, 1)
    hi = torch.tensor([(1 - m) / s for m, s in zip(MEAN, STD, strict=True)]).view(1, 3, 1, 1)
    assert bool(((x >= lo - 1e-4) & (x <= hi + 1e-4)).all())
    assert x.std() > 0.1  # images, not a constant
    assert dec.images == 6 and dec.fallbacks == 0


def test_the_crop_box_and_flip_are_drawn_as_the_cpu_path_draws_them(samples, monkeypatch) -> None:
    import trainkit.gpudecode as gd
    from trainkit.data import ImageFolderDataset, random_resized_crop_box

    boxes: list[tuple[int, int, int, int]] = []

    def spy(w: int, h: int, rng: random.Random) -> tuple[int, int, int, int]:
        boxes.append(box := random_resized_crop_box(w, h, rng))
        return box

    monkeypatch.setattr(gd, "random_resized_crop_box", spy)
    size, seed, epoch = 48, 7, 2
    cpu = ImageFolderDataset(samples, size, train=True, seed=seed)
    cpu.set_epoch(epoch)
    dec = _decoder(size, True, samples, seed=seed)
    order = [5, 2, 0, 3, 1, 4]
    x, _ = dec(_batch(samples, order), epoch=epoch)
    flipped_any = False
    for k, index in enumerate(order):
        w, h = Image.open(samples[index][0]).size
        rng = random.Random(f"{seed}/{epoch}/{index}")  # the CPU path's generator
        assert boxes[k] == random_resized_crop_box(w, h, rng)
        flipped = rng.random() < 0.5
        flipped_any |= flipped
        ref = cpu[index][0]
        # Same box and flip: equal up to PIL's uint8 rounding between its two passes.
        diff = (x[k] - ref).abs()
        assert float(diff.mean()) < 0.03 and float(diff.max()) < 0.25, (index, float(diff.max()))
        # ... and the comparison can tell a flip apart.
        assert float((x[k].flip(-1) - ref).abs().mean()) > 3 * float(diff.mean()) + 0.01
    assert flipped_any  # the seed above flips some of them


def test_validation_resizes_the_short_side_and_crops_the_centre_as_the_cpu_path(samples) -> None:
    from trainkit.data import ImageFolderDataset

    cpu = ImageFolderDataset(samples, 40, train=False)
    x, y = _decoder(40, False, samples)(_batch(samples, [0, 1, 2]), epoch=0)
    assert x.shape == (3, 3, 40, 40) and y.tolist() == [0, 1, 0]
    for k in range(3):
        diff = (x[k] - cpu[k][0]).abs()
        assert float(diff.mean()) < 0.03 and float(diff.max()) < 0.25


@pytest.fixture
def same_size(tmp_path: Path) -> list[tuple[str, int]]:
    """Photos of two sizes, five and three of each, and one of its own: two groups
    resized together and one image resized alone."""
    sizes = [(120, 90)] * 5 + [(70, 100)] * 3 + [(64, 48)]
    return [(_write(tmp_path / f"c{i % 2}" / f"{i}.JPEG", _photo(w, h, i)), i % 2)
            for i, (w, h) in enumerate(sizes)]


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("size", [40, 160])  # shrinking, and enlarging some
def test_images_of_one_size_are_resized_together_as_one_by_one(same_size, train: bool,
                                                                size: int) -> None:
    order = [3, 8, 0, 5, 1, 6, 2, 7, 4]
    batch = _batch(same_size, order)
    together = _decoder(size, train, same_size, seed=4)
    together.group_chunk = 2  # and a group split in chunks
    alone = _decoder(size, train, same_size, seed=4)
    alone.group_from = 10**9  # the per-image F.interpolate way
    x, y = together(batch, epoch=3)
    ref, ref_y = alone(batch, epoch=3)
    assert x.shape == ref.shape == (9, 3, size, size) and torch.equal(y, ref_y)
    # The same maths (F.interpolate's antialiased bilinear weights): float rounding.
    assert float((x - ref).abs().max()) < 1e-3


def test_images_resized_together_match_the_cpu_paths_crop_and_flip(same_size) -> None:
    from trainkit.data import ImageFolderDataset, random_resized_crop_box

    size, seed, epoch = 48, 7, 2
    cpu = ImageFolderDataset(same_size, size, train=True, seed=seed)
    cpu.set_epoch(epoch)
    x, _ = _decoder(size, True, same_size, seed=seed)(_batch(same_size, list(range(9))),
                                                      epoch=epoch)
    flipped = 0
    for k in range(9):
        ref = cpu[k][0]
        diff = (x[k] - ref).abs()
        assert float(diff.mean()) < 0.03 and float(diff.max()) < 0.25, (k, float(diff.max()))
        # ... and the comparison can tell a flip apart.
        assert float((x[k].flip(-1) - ref).abs().mean()) > 3 * float(diff.mean()) + 0.01
        rng = random.Random(f"{seed}/{epoch}/{k}")  # the CPU path's generator
        random_resized_crop_box(120 if k < 5 else 70 if k < 8 else 64,
                                90 if k < 5 else 100 if k < 8 else 48, rng)
        flipped += rng.random() < 0.5
    assert 0 < flipped < 9  # flipped and unflipped images in the groups


def test_resample_weights_are_a_normalised_triangle_over_the_crop() -> None:
    from trainkit.gpudecode import resample_weights

    t = torch.tensor
    w = resample_weights(t([10.0, 0.0]), t([40.0, 20.0]), t([8.0, 8.0]), t([0.0, 0.0]),
                         t([False, True]), 8, 60)
    assert w.shape == (2, 8, 60) and torch.allclose(w.sum(-1), torch.ones(2, 8))
    assert float(w[0, :, :10].abs().sum()) == 0 and float(w[0, :, 50:].abs().sum()) == 0
    assert float(w[1, :, 20:].abs().sum()) == 0  # nothing outside the crop
    # Image 1 flipped: its first output pixel is its crop's last.
    plain = resample_weights(t([0.0]), t([20.0]), t([8.0]), t([0.0]), None, 8, 60)
    assert torch.allclose(w[1], plain[0].flip(0))
    # As F.interpolate(antialias=True) of the crop: a row of pixels through both.
    row = torch.rand(1, 1, 1, 60, generator=torch.Generator().manual_seed(0))
    want = torch.nn.functional.interpolate(row[..., 10:50], size=(1, 8), mode="bilinear",
                                           align_corners=False, antialias=True)
    assert torch.allclose(w[0] @ row[0, 0, 0], want.flatten(), atol=1e-5)


def test_images_nvjpeg_is_not_offered_fall_back_to_pil_and_are_counted(tmp_path: Path) -> None:
    photo = _photo(80, 60, 1)
    odd = [
        (_write(tmp_path / "a" / "cmyk.JPEG", photo.convert("CMYK")), 0),
        (_write(tmp_path / "a" / "png.JPEG", photo, "PNG"), 0),  # PNG data, JPEG name
        (_write(tmp_path / "a" / "gray.JPEG", photo.convert("L")), 1),  # offered: gray -> RGB
        (_write(tmp_path / "a" / "rgb.JPEG", photo), 1),
    ]
    offered: list[int] = []

    def device(datas: list[Any]) -> list[Any]:
        from trainkit.gpudecode import pil_decode

        offered.append(len(datas))
        return [pil_decode(d, "x") for d in datas]

    dec = _decoder(32, True, odd, decode=device)
    x, _ = dec(_batch(odd, [0, 1, 2, 3]), epoch=0)
    assert offered == [2] and dec.fallbacks == 2 and dec.images == 4
    assert x.shape == (4, 3, 32, 32) and bool(torch.isfinite(x).all())


def test_an_image_the_device_refuses_is_found_and_decoded_with_pil(samples) -> None:
    from trainkit.gpudecode import pil_decode

    calls: list[int] = []

    def picky(datas: list[Any]) -> list[Any]:  # as nvJPEG failing a batch for one image
        calls.append(len(datas))
        if any(len(d) == len(bad) for d in datas):
            raise RuntimeError("nvjpegDecode failed: unsupported")
        return [pil_decode(d, "x") for d in datas]

    batch = _batch(samples, [0, 1, 2, 3])
    bad = torch.split(batch[0], batch[1].tolist())[2]
    dec = _decoder(32, True, samples, decode=picky)
    x, _ = dec(batch, epoch=0)
    assert calls == [4, 1, 1, 1, 1] and dec.fallbacks == 1 and x.shape == (4, 3, 32, 32)
    # Through the same crop and resize: as if the device had decoded it.
    ref, _ = _decoder(32, True, samples)(batch, epoch=0)
    assert torch.allclose(x, ref)


def test_a_file_no_decoder_reads_is_named(tmp_path: Path) -> None:
    from hpcdl.errors import UserInputError

    broken = [(_write(tmp_path / "a" / "ok.JPEG", _photo(40, 40, 0)), 0)]
    truncated = tmp_path / "a" / "cut.JPEG"
    truncated.write_bytes(Path(broken[0][0]).read_bytes()[:40])
    empty = tmp_path / "a" / "empty.JPEG"
    empty.write_bytes(b"")
    broken += [(str(truncated), 0), (str(empty), 0)]
    for index in (1, 2):
        with pytest.raises(UserInputError, match=f"dataset image {broken[index][0]}: cannot be decoded"):
            _decoder(32, True, broken)(_batch(broken, [0, index]), epoch=0)


def test_decoded_batches_come_from_the_background_thread_in_order(samples) -> None:
    from torch.utils.data import DataLoader
    from trainkit.gpudecode import DecodedBatches, JpegFiles, collate_encoded

    loader = DataLoader(JpegFiles(samples), batch_size=2, collate_fn=collate_encoded)
    dec = _decoder(32, True, samples, seed=1)
    got = list(DecodedBatches(loader, dec, epoch=4))
    assert len(got) == 3 and dec.images == 6
    direct = _decoder(32, True, samples, seed=1)
    for k, (x, y) in enumerate(got):
        ex, ey = direct(_batch(samples, [2 * k, 2 * k + 1]), epoch=4)
        assert torch.equal(x, ex) and torch.equal(y, ey)
    # Stopping early (--val-batches, --max-steps) ends the thread.
    for _ in DecodedBatches(loader, dec, epoch=0):
        break
    import threading

    assert not [t for t in threading.enumerate() if t.name == "device-decode"]


def test_an_error_in_the_decode_thread_is_raised_in_the_training_thread(tmp_path: Path) -> None:
    from torch.utils.data import DataLoader
    from trainkit.gpudecode import DecodedBatches, JpegFiles, collate_encoded

    from hpcdl.errors import UserInputError

    bad = tmp_path / "a" / "bad.JPEG"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"<html>not found</html>")
    items = [(str(bad), 0)]
    loader = DataLoader(JpegFiles(items), batch_size=1, collate_fn=collate_encoded)
    with pytest.raises(UserInputError, match="bad.JPEG: cannot be decoded"):
        list(DecodedBatches(loader, _decoder(32, True, items), epoch=0))


def test_decode_choice_on_a_machine_without_a_gpu() -> None:
    sys.path.insert(0, str(EXAMPLES))
    import resnet50_imagenet as ex

    from hpcdl.errors import UserInputError

    cpu = torch.device("cpu")
    assert ex.resolve_decode("auto", cpu, synthetic=True).mode is None
    assert ex.resolve_decode("cpu", cpu, synthetic=False).mode == "cpu"
    auto = ex.resolve_decode("auto", cpu, synthetic=False)
    assert auto.mode == "cpu" and "CUDA" in auto.note
    assert ex.resolve_decode("tensor", cpu, synthetic=False).mode == "tensor"
    with pytest.raises(UserInputError, match="--decode gpu: nvJPEG decodes onto a CUDA device"):
        ex.resolve_decode("gpu", cpu, synthetic=False)
    assert ex.parse_args(["--synthetic"]).decode == "auto"


def test_the_example_trains_through_the_tensor_path(tmp_path: Path) -> None:
    from hpcdl.data.tiny import TinySpec, make_tiny

    make_tiny(tmp_path / "tiny", TinySpec(classes=2, per_class=8, val_per_class=2, size=48))
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    env.update(PYTHONPATH=str(EXAMPLES.parent), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    argv = [sys.executable, str(EXAMPLES / "resnet50_imagenet.py"), "--backend", "ddp",
            "--arch", "resnet18", "--data", str(tmp_path / "tiny"), "--image-size", "32",
            "--batch-size", "4", "--epochs", "1", "--workers", "1", "--decode", "tensor",
            "--checkpoint-dir", "", "--metrics-dir", "", "--threads", "1"]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env,
                         cwd=tmp_path, stdin=subprocess.DEVNULL, check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "decode tensor" in res.stdout.splitlines()[0]
    assert "decode tensor: 0 of 20 images decoded so far fell back" in res.stdout
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith('{"hpcdl_result"'))
    result = json.loads(line)["hpcdl_result"]
    assert result["decode"] == "tensor" and result["decode_fallbacks"] == 0
    assert result["steps"] == 4 and result["final_loss"] > 0
