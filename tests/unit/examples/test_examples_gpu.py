"""The examples' GPU paths on a real NVIDIA GPU, natively (no Slurm or Apptainer): one
GPU per local rank, AMP with channels_last, a checkpoint of CUDA tensors resumed, NCCL
collectives on the CPU tensors the loop keeps its sums in, and the ResNet example end to
end on DDP over NCCL, resumed from its own checkpoint; where Horovod imports (skipped,
saying why, where it does not), the same under Horovod: fp16-compressed allreduce of CUDA
gradients with AMP and two sub-batches, a resume from a DDP checkpoint, the example.

Every test here is ``gpu``-marked and skipped without CUDA (CI and the development
machines have none). ``bench/gpu_check.py`` runs them on a lent GPU machine with
``--noconftest`` (the device has torch and pytest at best, not hpcdl's other
dependencies that tests/conftest.py's plugins import), so this module needs nothing
from a conftest: it puts examples/ on sys.path itself.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.unit.conftest_examples import EXAMPLES

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.torch,
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="no CUDA device (torch.cuda.is_available() is False)"),
]

REPO = EXAMPLES.parent
EXAMPLE = EXAMPLES / "resnet50_imagenet.py"
RUN_TIMEOUT = 300  # s: CUDA torch start-up, NCCL init and cuDNN's autotuning of a small run


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _training(init_scale: float = 2.0**16, seed: int = 0) -> Any:
    """A trainkit Training on this process's GPU as the example builds it (channels_last,
    AMP with a GradScaler), without a process group: the base Backend."""
    from torch import nn
    from trainkit.dist import Backend
    from trainkit.loop import Training
    from trainkit.resnet import build_model

    backend = Backend()
    backend._pin_device()
    torch.manual_seed(seed)
    model = build_model("resnet18", 10).to(backend.device, memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-5)
    return Training(backend=backend, model=model, train_model=model, optimizer=optimizer,
                    scaler=torch.amp.GradScaler("cuda", init_scale=init_scale),
                    criterion=nn.CrossEntropyLoss(), memory_format=torch.channels_last,
                    use_amp=True, cuda=True)


def _batch(n: int = 16, size: int = 64) -> tuple[Any, Any]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 3, size, size, generator=g).pin_memory()
    y = torch.randint(0, 10, (n,), generator=g).pin_memory()
    return x, y


def test_each_local_rank_drives_its_own_gpu() -> None:
    from trainkit.dist import Backend

    count = torch.cuda.device_count()
    # local rank == count wraps to GPU 0: a launcher that narrowed CUDA_VISIBLE_DEVICES
    # to one GPU per rank leaves every rank seeing "its" GPU as index 0.
    for local_rank in range(count + 1):
        backend = Backend()
        backend.local_rank = local_rank
        backend._pin_device()
        assert backend.device == torch.device("cuda", local_rank % count)
        assert torch.cuda.current_device() == local_rank % count
    torch.cuda.set_device(0)


def test_amp_and_channels_last_train_on_the_gpu() -> None:
    t = _training()
    x, y = _batch()
    with torch.no_grad(), torch.autocast("cuda"):
        out = t.model(x.to("cuda", memory_format=torch.channels_last))
    assert out.dtype == torch.float16  # autocast really runs the model in half precision
    assert t.model.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    before = [p.detach().clone() for p in t.model.parameters()]
    sums = torch.zeros(3, dtype=torch.float64)
    # The scaler starts at 2**16 and skips the steps whose fp16 gradients overflow,
    # halving its scale each time: several steps so that some of them update.
    for _ in range(8):
        loss, sync_s = t.step(x, y, 0.05, 1, sums)
    assert torch.isfinite(loss) and sync_s == 0.0
    assert int(sums[2]) == 8 * len(y)
    assert any(not torch.equal(a, b) for a, b in zip(before, t.model.parameters(), strict=True))
    assert t.model.conv1.weight.is_cuda and 0 < t.scaler.get_scale() <= 2.0**16


def test_two_sub_batches_accumulate_on_the_gpu() -> None:
    t = _training(init_scale=128.0)
    x, y = _batch()
    sums = torch.zeros(3, dtype=torch.float64)
    loss, _ = t.step(x, y, 0.05, 2, sums)  # --batches-per-allreduce 2: x.chunk(2)
    assert torch.isfinite(loss) and int(sums[2]) == len(y)


def test_prefetched_batches_are_the_loaders_own_on_the_gpu() -> None:
    from torch.utils.data import DataLoader, TensorDataset
    from trainkit.loop import DevicePrefetch

    g = torch.Generator().manual_seed(2)
    images, labels = torch.randn(40, 3, 16, 16, generator=g), torch.arange(40)
    loader = DataLoader(TensorDataset(images, labels), batch_size=8, pin_memory=True)
    got = list(DevicePrefetch(loader, torch.device("cuda", 0), torch.channels_last))
    assert len(got) == len(loader) == 5
    for i, (x, y) in enumerate(got):
        assert x.is_cuda and y.is_cuda and x.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(x.cpu(), images[8 * i: 8 * i + 8])
        assert torch.equal(y.cpu(), labels[8 * i: 8 * i + 8])


def test_uint8_batches_are_normalised_on_the_gpu_as_on_the_host() -> None:
    from torch.utils.data import DataLoader
    from trainkit.data import SyntheticImages, normalise
    from trainkit.loop import DevicePrefetch

    data = SyntheticImages(24, 10, 64, seed=3)  # uint8, the synthetic default
    loader = DataLoader(data, batch_size=8, pin_memory=True)
    got = list(DevicePrefetch(loader, torch.device("cuda", 0), torch.channels_last))
    assert len(got) == 3
    for (x, _), (pixels, _) in zip(got, loader, strict=True):
        assert x.dtype == torch.float32 and x.is_contiguous(memory_format=torch.channels_last)
        assert torch.allclose(x.cpu(), normalise(pixels), atol=1e-6)
    # and a uint8 batch handed straight to a step (evaluation's path) trains as well
    t = _training(init_scale=128.0)
    pixels, y = next(iter(loader))
    loss, _ = t.step(pixels, y, 0.05, 1, torch.zeros(3, dtype=torch.float64))
    assert torch.isfinite(loss)


def test_the_steps_sums_add_up_on_the_gpu_as_on_the_host() -> None:
    x, y = _batch()
    sums = {"cuda": torch.zeros(3, dtype=torch.float64, device="cuda"),
            "cpu": torch.zeros(3, dtype=torch.float64)}
    for where in sums:  # the same first step (same seed) adding into each
        _training(init_scale=128.0).step(x, y, 0.05, 2, sums[where])
    assert sums["cuda"].is_cuda and int(sums["cuda"][2]) == len(y)
    assert torch.equal(sums["cuda"][1:].cpu(), sums["cpu"][1:])  # hits and images: counts
    assert torch.allclose(sums["cuda"].cpu(), sums["cpu"], rtol=1e-5)


def test_the_sync_wait_takes_one_pair_of_events_per_backward_pass() -> None:
    """Not an event per gradient (host time in backward), and a pass's pair is not
    recorded again by the next pass: the loop reads a step's wait after queueing the
    next step."""
    from trainkit.dist import GradReadyTimes

    times = GradReadyTimes(torch.device("cuda", 0))
    a = torch.randn(64, 64, device="cuda", requires_grad=True)
    b = torch.randn(64, 64, device="cuda", requires_grad=True)
    for param in (a, b):
        param.register_post_accumulate_grad_hook(times.ready)
    (a @ b).sum().backward()
    times.returned()
    first = times.marks
    deferred = times.take_deferred()
    (a @ b).sum().backward()
    times.returned()
    second = times.marks
    assert first is not None and second is not None and first[0] is not first[1]
    assert {id(e) for e in first}.isdisjoint(id(e) for e in second)
    assert 0.0 <= deferred() < 1.0  # read after the next pass: still its own events
    assert 0.0 <= times.take_wait() < 1.0 and times.take_wait() == 0.0


def test_a_checkpoint_of_cuda_tensors_resumes_the_same_state(tmp_path: Path) -> None:
    from trainkit.loop import Checkpoints, Progress, find_resume_state

    t = _training(init_scale=128.0)  # small enough that no step is skipped for overflow
    x, y = _batch()
    sums = torch.zeros(3, dtype=torch.float64)
    for _ in range(2):
        t.step(x, y, 0.05, 1, sums)
    progress = Progress(epoch=0, step_in_epoch=2, global_step=2, global_batch=len(y))
    ckpt = Checkpoints(str(tmp_path), keep=2, rank=0, meta={"arch": "resnet18", "num_classes": 10})
    ckpt.save(t, progress)
    found = find_resume_state("latest", str(tmp_path))
    assert found is not None and str(found[0]) == ckpt.last
    state = found[1]
    assert all(not v.is_cuda for v in state["model"].values())  # loaded onto the CPU

    fresh = _training(init_scale=128.0, seed=1)
    resumed = fresh.load_state(state)
    assert resumed.global_step == 2 and resumed.step_in_epoch == 2
    saved, loaded = t.model.state_dict(), fresh.model.state_dict()
    assert list(saved) == list(loaded)
    for name in saved:
        assert loaded[name].is_cuda and torch.equal(saved[name], loaded[name]), name
    old_opt, new_opt = t.optimizer.state_dict(), fresh.optimizer.state_dict()
    assert old_opt["state"] and old_opt["state"].keys() == new_opt["state"].keys()
    for key, entry in old_opt["state"].items():
        buf = new_opt["state"][key]["momentum_buffer"]
        assert buf.is_cuda and torch.equal(entry["momentum_buffer"], buf)
    assert fresh.scaler.get_scale() == t.scaler.get_scale()


def test_ddp_over_nccl_reduces_the_loops_cpu_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist
    from torch import nn
    from trainkit.dist import DDPBackend

    from hpcdl.jobside.world import World, torch_env

    world = World(rank=0, world_size=1, local_rank=0, local_size=1, nodes=1,
                  master_addr="127.0.0.1", master_port=_free_port(), launcher="single")
    for key, value in torch_env(world).items():
        monkeypatch.setenv(key, value)  # DDPBackend exports them; monkeypatch restores them
    backend = DDPBackend(world, timeout_s=120)
    try:
        assert dist.get_backend() == "nccl" and backend.device.type == "cuda"
        # The loop's loss sums and eval counts are CPU tensors; NCCL has no CPU backend.
        sums = torch.tensor([1.5, 2.0, 3.0], dtype=torch.float64)
        out = backend.allreduce_sum(sums, name="sums")
        assert out is sums and not out.is_cuda and out.tolist() == [1.5, 2.0, 3.0]
        on_gpu = torch.ones(2, device=backend.device)
        assert backend.allreduce_sum(on_gpu, name="gpu").tolist() == [1.0, 1.0]
        assert backend.allgather_object("rank0", name="names") == ["rank0"]
        model = nn.Linear(4, 2).to(backend.device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        wrapped, optimizer = backend.wrap(model, optimizer, fp16_allreduce=True,
                                          batches_per_allreduce=1)
        assert backend.broadcast_state(model, optimizer, ("progress", None)) == ("progress", None)
        backend.backward(wrapped(torch.randn(8, 4, device=backend.device)).sum())
        assert backend.synchronize_then_step(optimizer, None) >= 0.0
        backend.barrier()
    finally:
        backend.shutdown()


def test_ddp_broadcasts_the_optimizer_state_as_cpu_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pickled CUDA tensor unpickles onto the GPU it came from: rank 0's optimizer state,
    pickled as CUDA tensors by broadcast_object_list, lands on rank 0's GPU on every rank
    (a CUDA context each there, refused in exclusive-process mode). Not observable with one
    GPU (every rank's is cuda:0): what rank 0 hands to the object broadcast is checked."""
    import torch.distributed as dist
    from torch import nn
    from trainkit.dist import DDPBackend

    from hpcdl.jobside.world import World, torch_env

    world = World(rank=0, world_size=1, local_rank=0, local_size=1, nodes=1,
                  master_addr="127.0.0.1", master_port=_free_port(), launcher="single")
    for key, value in torch_env(world).items():
        monkeypatch.setenv(key, value)
    backend = DDPBackend(world, timeout_s=120)
    sent: list[Any] = []

    def recorded(objects: list[Any], *args: Any, **kwargs: Any) -> None:
        sent.extend(objects)
        dist.broadcast_object_list(objects, *args, **kwargs)

    try:
        model = nn.Linear(4, 2).to(backend.device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        wrapped, optimizer = backend.wrap(model, optimizer, fp16_allreduce=False,
                                          batches_per_allreduce=1)
        backend.backward(wrapped(torch.randn(8, 4, device=backend.device)).sum())
        backend.synchronize_then_step(optimizer, None)  # CUDA momentum buffers
        monkeypatch.setattr(backend, "dist", type("Recording", (), {
            "broadcast": staticmethod(dist.broadcast),
            "broadcast_object_list": staticmethod(recorded)})())
        assert backend.broadcast_state(model, optimizer, ("progress", None)) == ("progress", None)
        states = [o for o in sent if isinstance(o, dict) and "state" in o]
        assert len(states) == 1 and states[0]["state"]
        tensors = [v for entry in states[0]["state"].values() for v in entry.values()
                   if isinstance(v, torch.Tensor)]
        assert tensors and not any(t.is_cuda for t in tensors)
        assert all(b["momentum_buffer"].is_cuda for b in optimizer.state.values())
    finally:
        monkeypatch.undo()
        dist.destroy_process_group()


def _run_example(tmp_path: Path, *extra: str) -> dict[str, Any]:
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
           "PYTHONPATH": str(REPO)}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(key, None)  # a single process, not a rank of some outer launcher
    argv = [sys.executable, str(EXAMPLE), "--backend", "ddp", "--synthetic", "--arch", "resnet18",
            "--image-size", "64", "--batch-size", "32", "--synthetic-size", "128",
            "--synthetic-val-size", "64", "--num-classes", "10", "--workers", "2",
            "--checkpoint-dir", str(tmp_path / "ck"), "--metrics-dir", "", *extra]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT, env=env,
                         cwd=tmp_path, stdin=subprocess.DEVNULL, check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith('{"hpcdl_result"')]
    assert lines, res.stdout[-3000:]
    result: dict[str, Any] = json.loads(lines[-1])["hpcdl_result"]
    return result


def test_the_example_trains_and_resumes_on_ddp_over_nccl(tmp_path: Path) -> None:
    first = _run_example(tmp_path, "--epochs", "1")
    assert first["device"] == "cuda" and first["amp"] is True and first["ranks_agree"]
    assert first["steps"] == 4 and first["images_per_sec"] > 0
    assert first["checkpoint"] and Path(first["checkpoint"]).is_file()
    second = _run_example(tmp_path, "--epochs", "2", "--resume")
    assert second["resumed_from"] == first["checkpoint"]
    assert second["steps"] == 8 and second["steps_this_run"] == 4


# --- --decode gpu: nvJPEG through torchvision, then the augmentation on the GPU ---------


def _nvjpeg() -> Any:
    from trainkit.gpudecode import nvjpeg_decoder

    decode, why = nvjpeg_decoder(torch.device("cuda", torch.cuda.current_device()))
    if decode is None:
        pytest.skip(f"no nvJPEG here: {why}")
    return decode


def test_nvjpeg_takes_the_current_gpu_by_its_bare_name() -> None:
    from trainkit.gpudecode import nvjpeg_decoder

    _nvjpeg()
    decode, why = nvjpeg_decoder(torch.device("cuda"))  # as gpu_check's data step asks
    assert decode is not None, why


def _jpegs(tmp_path: Path, sizes: list[tuple[int, int]] | None = None) -> list[tuple[str, int]]:
    from PIL import Image

    out = []
    for i, (w, h) in enumerate(sizes or [(120, 90), (90, 130), (200, 150), (64, 64)]):
        g = torch.Generator().manual_seed(i)
        small = torch.rand(1, 3, 6, 8, generator=g)
        img = torch.nn.functional.interpolate(small, size=(h, w), mode="bilinear")[0]
        arr = (img * 255).byte().permute(1, 2, 0).contiguous()
        path = tmp_path / f"{i}.JPEG"
        Image.frombytes("RGB", (w, h), bytes(arr.flatten().tolist())).save(path, quality=95)
        out.append((str(path), i % 2))
    return out


def test_nvjpeg_decodes_a_batch_as_pil_does(tmp_path: Path) -> None:
    from trainkit.gpudecode import JpegFiles, pil_decode

    decode = _nvjpeg()
    files = JpegFiles(_jpegs(tmp_path))
    datas = [files[i][0] for i in range(len(files))]
    got = decode(datas)
    assert len(got) == len(datas)
    for img, data in zip(got, datas, strict=True):
        ref = pil_decode(data, "ref")
        assert img.is_cuda and img.dtype == torch.uint8 and img.shape == ref.shape
        # Two JPEG decoders: IDCT and chroma upsampling differ by a few levels (nvJPEG of
        # torchvision 0.26 against Pillow 12.3 on an H200: up to 3.8 on average over an
        # image, where two different images of these differ by tens).
        diff = (img.cpu().int() - ref.int()).abs().float()
        assert float(diff.mean()) < 6 and float(diff.max()) < 40


def test_the_gpu_batch_matches_the_tensor_path_on_the_cpu(tmp_path: Path) -> None:
    from trainkit.gpudecode import DeviceDecode, JpegFiles, collate_encoded, pil_batch_decoder

    decode = _nvjpeg()
    samples = _jpegs(tmp_path)
    files = JpegFiles(samples)
    batch = collate_encoded([files[i] for i in range(len(files))])
    device = torch.device("cuda", torch.cuda.current_device())
    gpu = DeviceDecode(32, True, device, decode, torch.channels_last, seed=5, names=samples)
    cpu = DeviceDecode(32, True, torch.device("cpu"), pil_batch_decoder(torch.device("cpu")),
                       seed=5, names=samples)
    x, y = gpu(batch, epoch=1)
    ex, ey = cpu(batch, epoch=1)
    assert x.is_cuda and x.is_contiguous(memory_format=torch.channels_last)
    assert x.shape == ex.shape == (4, 3, 32, 32) and y.cpu().tolist() == ey.tolist()
    assert float((x.cpu() - ex).abs().mean()) < 0.05  # same boxes and flips; decoders differ
    assert gpu.fallbacks == 0 and gpu.images == 4


def test_images_of_one_size_are_resized_together_on_the_gpu_as_one_by_one(tmp_path: Path) -> None:
    from trainkit.gpudecode import DeviceDecode, JpegFiles, collate_encoded

    decode = _nvjpeg()
    samples = _jpegs(tmp_path, [(120, 90)] * 5 + [(64, 64)] * 2 + [(90, 130)])
    files = JpegFiles(samples)
    batch = collate_encoded([files[i] for i in range(len(files))])
    device = torch.device("cuda", torch.cuda.current_device())
    for train in (True, False):
        together = DeviceDecode(48, train, device, decode, torch.channels_last, seed=5)
        alone = DeviceDecode(48, train, device, decode, torch.channels_last, seed=5)
        alone.group_from = 10**9
        x, _ = together(batch, epoch=1)
        ref, _ = alone(batch, epoch=1)
        assert x.is_cuda and x.is_contiguous(memory_format=torch.channels_last)
        # fp32 matrix products against the antialiasing kernel: float rounding only
        assert float((x - ref).abs().max()) < 1e-3, train


def test_images_nvjpeg_cannot_take_fall_back_and_are_counted_on_the_gpu(tmp_path: Path) -> None:
    from PIL import Image
    from trainkit.gpudecode import DecodedBatches, DeviceDecode, JpegFiles, collate_encoded

    decode = _nvjpeg()
    samples = _jpegs(tmp_path)
    photo = Image.open(samples[0][0]).convert("RGB")
    photo.convert("CMYK").save(tmp_path / "cmyk.JPEG", "JPEG")
    photo.save(tmp_path / "png.JPEG", "PNG")
    photo.convert("L").save(tmp_path / "gray.JPEG", "JPEG")
    photo.save(tmp_path / "progressive.JPEG", "JPEG", progressive=True)
    samples += [(str(tmp_path / n), 0) for n in ("cmyk.JPEG", "png.JPEG", "gray.JPEG",
                                                 "progressive.JPEG")]
    loader = torch.utils.data.DataLoader(JpegFiles(samples), batch_size=4,
                                         collate_fn=collate_encoded, num_workers=2)
    device = torch.device("cuda", torch.cuda.current_device())
    dec = DeviceDecode(32, True, device, decode, torch.channels_last, names=samples)
    got = list(DecodedBatches(loader, dec, epoch=0))
    assert len(got) == 2 and all(x.shape == (4, 3, 32, 32) and x.is_cuda for x, _ in got)
    assert all(bool(torch.isfinite(x).all()) for x, _ in got)
    # CMYK and the PNG are never offered to nvJPEG; grayscale and progressive are, and
    # count only if this nvJPEG refuses them.
    assert 2 <= dec.fallbacks <= 4 and dec.images == 8


def test_the_example_trains_from_jpegs_with_gpu_decode(tmp_path: Path) -> None:
    from hpcdl.data.tiny import TinySpec, make_tiny

    _nvjpeg()
    make_tiny(tmp_path / "tiny", TinySpec(classes=4, per_class=16, val_per_class=2, size=96))
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
           "PYTHONPATH": str(REPO)}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(key, None)
    argv = [sys.executable, str(EXAMPLE), "--backend", "ddp", "--arch", "resnet18",
            "--data", str(tmp_path / "tiny"), "--image-size", "64", "--batch-size", "16",
            "--epochs", "1", "--workers", "2", "--decode", "gpu", "--checkpoint-dir", "",
            "--metrics-dir", ""]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT, env=env,
                         cwd=tmp_path, stdin=subprocess.DEVNULL, check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "decode gpu" in res.stdout and "decode gpu: 0 of 72 images" in res.stdout
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith('{"hpcdl_result"'))
    result = json.loads(line)["hpcdl_result"]
    assert result["device"] == "cuda" and result["decode"] == "gpu"
    assert result["decode_fallbacks"] == 0 and result["steps"] == 4


# --- Horovod with CUDA tensors: NCCL, fp16 compression, AMP, a resume ------------------
#
# Horovod is absent from a bare lent machine: gpu_check's horovod step builds it (NCCL,
# Gloo, no MPI) after this file has run. These skip, saying why, until `import
# horovod.torch` works in this interpreter (its site on PYTHONPATH). One GPU: one rank
# (NCCL takes no two ranks on one GPU), whose DistributedOptimizer registers its allreduce
# hooks only where size > 1; the checks register them so the gradients really go through
# Horovod's fp16-compressed allreduce of CUDA tensors.


def _horovod() -> None:
    try:
        import horovod.torch  # noqa: F401
    except Exception as exc:  # not installed, or a build that does not load beside this torch
        pytest.skip(f"import horovod.torch fails ({type(exc).__name__}: {str(exc)[:160]}); "
                    "Horovod is built by gpu_check's horovod step only")


def _horovod_env() -> dict[str, str]:
    """One Horovod rank without a launcher (Gloo's single-process mode, as gpu_check's
    horovod step runs it), trainkit and hpcdl importable, Horovod's site kept."""
    env = {**os.environ, "HOROVOD_GLOO_IFACE": "lo", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port()),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), str(EXAMPLES),
                                                       os.environ.get("PYTHONPATH")]))}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(key, None)
    return env


_HOROVOD_GPU = r"""
import io, json, sys, warnings
import torch
from torch import nn
from trainkit.dist import HorovodBackend
from trainkit.loop import Training
from trainkit.resnet import build_model

backend = HorovodBackend()
hvd = backend.hvd
out = {"cuda_built": bool(hvd.cuda_built()), "device": str(backend.device), "size": backend.size}
if not out["cuda_built"]:
    print(json.dumps(out))
    sys.exit(0)
cl = torch.channels_last


def training(init_scale):
    # As set_up() builds it under Horovod on a GPU, with --fp16-allreduce and
    # --batches-per-allreduce 2.
    torch.manual_seed(0)
    model = build_model("resnet18", 10).to(backend.device,
                                           memory_format=backend.param_format(cl))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-5)
    model, opt = backend.wrap(model, opt, fp16_allreduce=True, batches_per_allreduce=2)
    if backend.size == 1:
        opt._register_hooks()
    return Training(backend=backend, model=model, train_model=model, optimizer=opt,
                    scaler=torch.amp.GradScaler("cuda", init_scale=init_scale),
                    criterion=nn.CrossEntropyLoss(), memory_format=cl, use_amp=True, cuda=True)


g = torch.Generator().manual_seed(1)
x = torch.randn(16, 3, 64, 64, generator=g).pin_memory()
y = torch.randint(0, 10, (16,), generator=g).pin_memory()
t = training(2.0**24)  # overflows fp16 in the compressed allreduce
backend.broadcast_state(t.model, t.optimizer, None)  # fresh: CUDA parameters
sums = torch.zeros(3, dtype=torch.float64, device=backend.device)
before = [p.detach().clone() for p in t.model.parameters()]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    t.step(x, y, 0.05, 2, sums)
    out["overflow_skipped"] = all(torch.equal(a, b) for a, b in zip(before, t.model.parameters()))
    out["scale_after_overflow"] = t.scaler.get_scale()
    t.scaler.update(new_scale=128.0)
    for _ in range(3):
        loss, sync_s = t.step(x, y, 0.05, 2, sums)
out["warnings"] = [str(w.message)[:120] for w in caught if "horovod" in w.filename]
out["loss_finite"] = bool(torch.isfinite(loss)) and sync_s >= 0
out["scale"] = t.scaler.get_scale()  # 128 kept: none of the three steps was skipped
out["moved"] = sum(not torch.equal(a, b) for a, b in zip(before, t.model.parameters()))
out["params"] = len(before)
grad = t.model.conv1.weight.grad
out["grad"] = [grad.is_cuda, grad.is_contiguous(), str(grad.dtype)]
out["images"] = int(sums[2])
out["cpu_sums"] = backend.allreduce_sum(sums.cpu(), name="sums").tolist() == sums.cpu().tolist()
out["gpu_sum"] = backend.allreduce_sum(torch.ones(2, device=backend.device), name="g").tolist()
out["gathered"] = backend.allgather_object("r0", name="names")

# Resumed from what the example checkpoints under DDP on this GPU: channels_last
# parameters, so channels_last momentum, and a loss scale of 512.
ddp = build_model("resnet18", 10).to(backend.device, memory_format=cl)
sgd = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
with torch.autocast("cuda"):
    ddp_loss = nn.functional.cross_entropy(ddp(x.to(backend.device, memory_format=cl)),
                                           y.to(backend.device))
ddp_loss.backward()
sgd.step()
raw = io.BytesIO()
torch.save({"model": ddp.state_dict(), "optimizer": sgd.state_dict(),
            "scaler": torch.amp.GradScaler("cuda", init_scale=512.0).state_dict(),
            "progress": {"epoch": 1, "global_step": 4}}, raw)
raw.seek(0)
state = torch.load(raw, map_location="cpu", weights_only=False)
saved = state["optimizer"]["state"][0]["momentum_buffer"]
r = training(2.0**16)
r.load_state(state)
r.backend.broadcast_state(r.model, r.optimizer, None)
buf = r.optimizer.state[r.model.conv1.weight]["momentum_buffer"]
out["resumed"] = [not saved.is_contiguous(), buf.is_cuda, buf.is_contiguous(),
                  torch.equal(buf.cpu(), saved), r.scaler.get_scale()]
loss, _ = r.step(x, y, 0.05, 2, torch.zeros(3, dtype=torch.float64, device=backend.device))
out["resumed_trains"] = bool(torch.isfinite(loss))
backend.shutdown()
print(json.dumps(out))
"""


def test_horovod_trains_and_resumes_with_cuda_tensors() -> None:
    _horovod()
    ran = subprocess.run([sys.executable, "-c", _HOROVOD_GPU], env=_horovod_env(),
                         capture_output=True, text=True, timeout=RUN_TIMEOUT, cwd=REPO,
                         stdin=subprocess.DEVNULL, check=False)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    got = json.loads(ran.stdout.strip().splitlines()[-1])
    if not got["cuda_built"]:
        pytest.skip("this Horovod is built without CUDA (hvd.cuda_built() is False): its "
                    "collectives take no CUDA tensors")
    assert got["device"].startswith("cuda") and got["size"] == 1
    # fp16 compression overflowing a 2**24 loss scale: inf back, the step skipped
    assert got["overflow_skipped"] is True and got["scale_after_overflow"] == 2.0**23
    assert got["warnings"] == [] and got["loss_finite"] is True and got["scale"] == 128.0
    assert got["moved"] == got["params"]  # momentum and weight decay move every tensor
    assert got["grad"] == [True, True, "torch.float32"]  # decompressed, contiguous
    assert got["images"] == 4 * 16
    assert got["cpu_sums"] is True and got["gpu_sum"] == [1.0, 1.0]
    assert got["gathered"] == ["r0"]
    # saved channels_last, now on the GPU, contiguous, equal; rank 0's loss scale
    assert got["resumed"] == [True, True, True, True, 512.0]
    assert got["resumed_trains"] is True


def _run_example_horovod(tmp_path: Path, *extra: str) -> dict[str, Any]:
    argv = [sys.executable, str(EXAMPLE), "--backend", "horovod", "--synthetic", "--arch",
            "resnet18", "--image-size", "64", "--batch-size", "16", "--batches-per-allreduce",
            "2", "--fp16-allreduce", "--synthetic-size", "128", "--synthetic-val-size", "64",
            "--num-classes", "10", "--workers", "2", "--checkpoint-dir", str(tmp_path / "ck"),
            "--metrics-dir", "", *extra]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT,
                         env=_horovod_env(), cwd=tmp_path, stdin=subprocess.DEVNULL, check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith('{"hpcdl_result"')]
    assert lines, res.stdout[-3000:]
    result: dict[str, Any] = json.loads(lines[-1])["hpcdl_result"]
    return result


def test_the_example_trains_and_resumes_under_horovod_on_the_gpu(tmp_path: Path) -> None:
    _horovod()
    first = _run_example_horovod(tmp_path, "--epochs", "1")
    assert first["backend"] == "horovod" and first["device"] == "cuda" and first["amp"] is True
    assert first["steps"] == 4 and first["ranks_agree"] and first["images_per_sec"] > 0
    second = _run_example_horovod(tmp_path, "--epochs", "2", "--resume")
    assert second["resumed_from"] == first["checkpoint"]
    assert second["steps"] == 8 and second["steps_this_run"] == 4
