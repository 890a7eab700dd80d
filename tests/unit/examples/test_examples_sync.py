"""The examples' gradient-sync timing (trainkit.dist): for DDP, the time backward()
went on after the last gradient was accumulated, which is the wait for allreduces
still in flight; the timing hooks leave DDP's gradients as they were. Under the host's real Horovod (one
rank, one process): what its GPU runs depend on that the CPU shows the same way:
contiguous tensors only (channels_last parameters, a resumed channels_last momentum),
and AMP's step order with fp16 compression and accumulated sub-batches. (Horovod's
timing is checked in the distributed example tests: it needs a Horovod job.)"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from trainkit.dist import GradReadyTimes, sync_figures  # noqa: E402


def test_wait_runs_from_the_last_gradient_to_backward_returning():
    times = GradReadyTimes(torch.device("cpu"))
    param = torch.zeros(1)
    times.ready(param)
    time.sleep(0.05)
    times.ready(param)  # the last gradient counts, not the first
    time.sleep(0.1)
    times.returned()
    assert 0.09 <= times.take_wait() < 0.5
    assert times.take_wait() == 0.0  # reset: a step without a backward waited nothing
    times.returned()  # backward without any gradient (nothing registered fired)
    assert times.take_wait() == 0.0


def _delayed_allreduce(seconds: float):
    """A DDP comm hook whose 'allreduce' (identity, one rank) finishes ``seconds`` later."""

    def hook(state, bucket):
        fut = torch.futures.Future()
        threading.Timer(seconds, fut.set_result, args=(bucket.buffer(),)).start()
        return fut

    return hook


@pytest.fixture
def one_rank_group(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rdzv", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _ddp_grads(delay: float | None) -> tuple[list, float]:
    """Gradients of one backward through a DDP-wrapped model with the timing hooks of
    DDPBackend.wrap, and the wait they measured."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 2))
    model = DDP(module)
    if delay is not None:
        model.register_comm_hook(None, _delayed_allreduce(delay))
    times = GradReadyTimes(torch.device("cpu"))
    for param in module.parameters():
        param.register_post_accumulate_grad_hook(times.ready)
    model(torch.ones(4, 8)).sum().backward()
    times.returned()
    return [p.grad.clone() for p in module.parameters()], times.take_wait()


def test_a_slow_allreduce_shows_up_as_the_wait(one_rank_group):
    _, fast = _ddp_grads(None)
    _, slow = _ddp_grads(0.3)
    assert fast < 0.1
    assert 0.25 <= slow < 1.5


def test_the_timing_hooks_leave_ddp_gradients_unchanged(one_rank_group):
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    plain = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 2)))
    plain(torch.ones(4, 8)).sum().backward()
    timed, _ = _ddp_grads(None)
    assert all(torch.equal(p.grad, g) for p, g in zip(plain.parameters(), timed, strict=True))


class _OneRank:
    size = 1

    def allreduce_sum(self, tensor, name):
        return tensor


def test_sync_figures_are_means_per_step_and_a_share():
    figures = sync_figures(_OneRank(), steps=4, step_seconds=2.0, sync_seconds=0.5)
    assert figures == {"step_seconds": 0.5, "sync_seconds": 0.125, "sync_share": 0.25}
    assert sync_figures(_OneRank(), 0, 0.0, 0.0)["sync_share"] is None


class _DoublingDist:
    """torch.distributed's all_reduce as two ranks holding the same values would give."""

    class ReduceOp:
        SUM = "sum"

    def __init__(self) -> None:
        self.reduced: list = []

    def all_reduce(self, tensor, op):
        self.reduced.append(tensor)
        tensor.mul_(2)


def test_ddp_allreduce_sum_reduces_a_tensor_on_the_ranks_device_in_place():
    # The gloo path (a CPU rank, CPU sums) reduces the caller's tensor itself, no copy;
    # only a CUDA rank's CPU tensors go through a GPU copy (tests/unit/examples/test_examples_gpu.py).
    from trainkit.dist import DDPBackend

    backend = object.__new__(DDPBackend)
    backend.device = torch.device("cpu")
    backend.dist = _DoublingDist()
    sums = torch.tensor([1.0, 2.5], dtype=torch.float64)
    assert backend.allreduce_sum(sums, name="sums") is sums
    assert sums.tolist() == [2.0, 5.0] and backend.dist.reduced == [sums]


# The Horovod checks below run in one process with the host's real Horovod (one rank:
# hvd.init() and torch's import cost ~3 s, paid once): each check_* is a function of the
# backend returning what its test asserts on.
_HOROVOD_CHECKS = r"""
import io, json, warnings
import torch
from torch import nn
from trainkit.dist import HorovodBackend
from trainkit.loop import Training

cl = torch.channels_last


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 6 * 6, 2))


def check_channels_last(backend):
    out = {"param_format": str(backend.param_format(cl))}
    try:  # what Horovod does with channels_last parameters, as the example had on a GPU
        backend.hvd.broadcast_parameters(nn.Conv2d(3, 4, 3).to(memory_format=cl).state_dict(), 0)
        out["channels_last_params"] = "broadcast"
    except ValueError as e:
        out["channels_last_params"] = str(e)
    model = net().to(memory_format=backend.param_format(cl))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, opt = backend.wrap(model, opt, fp16_allreduce=False, batches_per_allreduce=1)
    before = model[0].weight.detach().clone()
    for _ in range(2):  # the second step has momentum buffers, which a resume broadcasts
        x = torch.randn(2, 3, 8, 8).contiguous(memory_format=cl)
        nn.functional.cross_entropy(model(x), torch.tensor([0, 1])).backward()
        backend.synchronize_then_step(opt, None)
        opt.zero_grad()
    backend.broadcast_state(model, opt, {"epoch": 1})
    out["moved"] = not torch.equal(before, model[0].weight)
    out["momentum"] = len(opt.state)
    return out


def check_resume(backend):
    # The checkpoint the example writes under DDP on a GPU: its parameters are channels_last
    # there, so their gradients and momentum buffers are too, and torch.save keeps strides.
    ddp = net().to(memory_format=cl)
    sgd = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(2, 3, 8, 8).contiguous(memory_format=cl)
    nn.functional.cross_entropy(ddp(x), torch.tensor([0, 1])).backward()
    sgd.step()
    raw = io.BytesIO()
    torch.save({"model": ddp.state_dict(), "optimizer": sgd.state_dict(), "scaler": None,
                "progress": {"epoch": 1, "global_step": 4}}, raw)
    raw.seek(0)
    state = torch.load(raw, map_location="cpu", weights_only=False)
    saved = state["optimizer"]["state"][0]["momentum_buffer"]
    out = {"saved_channels_last": not saved.is_contiguous()}
    # Resumed under Horovod: parameters contiguous (param_format), rank 0 loads the state.
    model = net().to(memory_format=backend.param_format(cl))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = backend.wrap(model, optimizer, fp16_allreduce=False,
                                    batches_per_allreduce=1)
    t = Training(backend=backend, model=model, train_model=model, optimizer=optimizer,
                 scaler=None, criterion=nn.CrossEntropyLoss(), memory_format=cl,
                 use_amp=False, cuda=False)
    t.load_state(state)  # rank 0 of the example's resume()
    try:
        backend.broadcast_state(model, optimizer, None)
        out["broadcast"] = "ok"
    except ValueError as e:
        out["broadcast"] = str(e)
    buf = optimizer.state[model[0].weight]["momentum_buffer"]
    out["momentum_kept"] = torch.equal(buf, saved)
    t.step(x, torch.tensor([0, 1]), 0.1, 1, torch.zeros(3, dtype=torch.float64))  # trains on
    out["trained"] = bool(torch.isfinite(model[0].weight).all())
    return out


def check_amp_fp16(backend):
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, opt = backend.wrap(model, opt, fp16_allreduce=True, batches_per_allreduce=2)
    # One rank: DistributedOptimizer registers its allreduce hooks only for size > 1 (or
    # elastic); registered here, every gradient goes through Horovod's allreduce as on several.
    if backend.size == 1:
        opt._register_hooks()
    reduced = []
    allreduce = opt._allreduce_grad_async

    def counted(p):
        reduced.append(p)
        return allreduce(p)

    opt._allreduce_grad_async = counted
    # GradScaler("cpu") runs the CUDA scaler's logic (unscale_, inf check, skip, backoff).
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24)
    t = Training(backend=backend, model=model, train_model=model, optimizer=opt, scaler=scaler,
                 criterion=nn.CrossEntropyLoss(), memory_format=torch.contiguous_format,
                 use_amp=False, cuda=False)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 3, 8, 8, generator=g), torch.tensor([0, 1] * 4)
    out = {"params": len(list(model.parameters()))}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        before = [p.detach().clone() for p in model.parameters()]
        t.step(x, y, 0.1, 2, torch.zeros(3, dtype=torch.float64))
        out["overflow_grads_inf"] = not all(bool(torch.isfinite(p.grad).all())
                                            for p in model.parameters())
        out["overflow_skipped"] = all(torch.equal(a, b)
                                      for a, b in zip(before, model.parameters()))
        out["scale_after_overflow"] = scaler.get_scale()
        out["allreduces_first_step"] = len(reduced)
        scaler.update(new_scale=64.0)
        before = [p.detach().clone() for p in model.parameters()]
        for _ in range(2):
            t.step(x, y, 0.1, 2, torch.zeros(3, dtype=torch.float64))
        out["moved"] = all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
        out["allreduces"] = len(reduced)
        out["momentum"] = len(opt.state)
    out["warnings"] = [str(w.message)[:120] for w in caught if "horovod" in w.filename]
    return out


backend = HorovodBackend()
out = {name[len("check_"):]: check(backend)
       for name, check in list(globals().items()) if name.startswith("check_")}
backend.shutdown()
print(json.dumps(out))
"""


@functools.cache
def _horovod_checks() -> dict:
    """_HOROVOD_CHECKS' results, by check, from one Horovod process with trainkit
    importable (skipped where Horovod is not installed)."""
    pytest.importorskip("horovod.torch")
    examples = Path(__file__).resolve().parents[3] / "examples"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [
        str(examples), os.environ.get("PYTHONPATH")])))
    ran = subprocess.run([sys.executable, "-c", _HOROVOD_CHECKS], env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    assert ran.returncode == 0, ran.stderr[-2000:]
    got: dict = json.loads(ran.stdout.strip().splitlines()[-1])
    return got


def test_horovod_trains_and_broadcasts_with_channels_last_inputs() -> None:
    """On a GPU the example feeds channels_last batches; Horovod refuses non-contiguous
    tensors, so under it the parameters (and so their gradients and momentum) stay
    contiguous. Checked with a real Horovod on the CPU: the same refusal, the same path."""
    got = _horovod_checks()["channels_last"]
    assert got["channels_last_params"] == "Tensor is required to be contiguous."
    assert got["param_format"] == "torch.contiguous_format"
    assert got["moved"] is True and got["momentum"] > 0


def test_horovod_resumes_a_checkpoint_with_channels_last_momentum() -> None:
    """A checkpoint written by DDP on a GPU holds channels_last momentum buffers, which
    the optimizer's load_state_dict keeps as they are; Horovod's broadcast_optimizer_state
    refuses them (non-contiguous), so rank 0 of a Horovod resume died there."""
    got = _horovod_checks()["resume"]
    assert got["saved_channels_last"] is True
    assert got["broadcast"] == "ok"
    assert got["momentum_kept"] is True and got["trained"] is True


def test_horovod_fp16_overflow_reaches_the_scaler_and_sub_batches_reduce_once() -> None:
    """The step order the example uses under Horovod with AMP (Horovod's pytorch_mnist
    example: synchronize, scaler.unscale_, skip_synchronize, scaler.step, update), with
    --fp16-allreduce and --batches-per-allreduce 2: a loss scale that overflows fp16 in
    the compressed allreduce comes back as inf, so the scaler skips the step and halves
    its scale; clean steps update every parameter; two backward passes give one allreduce
    per parameter; Horovod warns about nothing (no step without skip_synchronize)."""
    got = _horovod_checks()["amp_fp16"]
    assert got["overflow_grads_inf"] is True and got["overflow_skipped"] is True
    assert got["scale_after_overflow"] == 2.0**23
    assert got["allreduces_first_step"] == got["params"] == 6
    assert got["moved"] is True and got["momentum"] == 6
    assert got["allreduces"] == 3 * got["params"]
    assert got["warnings"] == []
