"""The examples' gradient-sync timing (trainkit.dist): DDP's timed comm hook measures
from the last bucket ready to the last allreduce done, and leaves DDP's gradients as
the default allreduce makes them. (Horovod's timing is checked in the distributed
example tests: it needs a Horovod job.)"""

from __future__ import annotations

import threading
import time

import pytest

torch = pytest.importorskip("torch")

from trainkit.dist import BucketTimes, sync_figures  # noqa: E402


def _delayed(seconds: float):
    """An inner hook whose 'allreduce' finishes ``seconds`` after it was launched."""

    def inner(_state, bucket):
        fut = torch.futures.Future()
        threading.Timer(seconds, fut.set_result, args=(bucket,)).start()
        return fut

    return inner


def test_wait_is_last_ready_to_last_done():
    times = BucketTimes(torch.device("cpu"))
    hook = times.timed(_delayed(0.25))
    futures = [hook(None, torch.ones(2)), hook(None, torch.ones(2))]
    for fut in futures:
        assert torch.equal(fut.wait(), torch.ones(2))  # the hook passes the result through
    waited = times.take_wait()
    assert 0.2 <= waited < 1.0
    assert times.take_wait() == 0.0  # reset: a step without communication waited nothing


def test_an_allreduce_done_before_backward_ends_costs_nothing():
    times = BucketTimes(torch.device("cpu"))
    early = times.timed(_delayed(0.0))(None, torch.ones(1))
    early.wait()
    time.sleep(0.05)
    times.timed(_delayed(0.0))(None, torch.ones(1)).wait()
    assert times.take_wait() < 0.05


def test_ddp_with_the_timed_hook_gives_the_default_gradients(tmp_path, monkeypatch):
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rdzv", rank=0, world_size=1)
    try:
        grads = []
        times = BucketTimes(torch.device("cpu"))
        for timed in (False, True):
            torch.manual_seed(0)
            model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 2)))
            if timed:
                model.register_comm_hook(None, times.timed(default_hooks.allreduce_hook))
            model(torch.ones(4, 8)).sum().backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))
        assert 0.0 <= times.take_wait() < 1.0
    finally:
        dist.destroy_process_group()


class _OneRank:
    size = 1

    def allreduce_sum(self, tensor, name):
        return tensor


def test_sync_figures_are_means_per_step_and_a_share():
    figures = sync_figures(_OneRank(), steps=4, step_seconds=2.0, sync_seconds=0.5)
    assert figures == {"step_seconds": 0.5, "sync_seconds": 0.125, "sync_share": 0.25}
    assert sync_figures(_OneRank(), 0, 0.0, 0.0)["sync_share"] is None
