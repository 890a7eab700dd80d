"""Two distributed backends behind one small interface: Horovod and PyTorch DDP.

The training script calls the same methods whichever backend it runs on; each
method maps to that backend's idiomatic call (hvd.DistributedOptimizer vs
DistributedDataParallel, hvd.broadcast_* vs torch.distributed.broadcast, ...).

``synchronize_then_step`` returns the seconds the step spent waiting for gradient
synchronisation: the part of the allreduce that did not overlap with the backward
pass. Horovod: the wait in ``optimizer.synchronize()`` (its allreduces start from
backward hooks). DDP: from the moment the last gradient was accumulated to the
moment ``backward()`` returned (DDP waits for its bucket allreduces there), taken
by ``backend.backward(loss)``. No profiler and no timeline is needed, so it runs in
every job.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from hpcdl.jobside.errors import ConfigError
from hpcdl.jobside.world import World, detect_world, export_torch_env


class Backend:
    name = "none"
    rank = 0
    size = 1
    local_rank = 0
    local_size = 1
    nodes = 1

    def __init__(self) -> None:
        self.device = torch.device("cpu")

    def _pin_device(self) -> None:
        # One GPU per local rank: rank k on a node drives GPU k (mod what it can see,
        # so a launcher that already narrowed CUDA_VISIBLE_DEVICES to one GPU works).
        if torch.cuda.is_available():
            index = self.local_rank % torch.cuda.device_count()
            torch.cuda.set_device(index)
            self.device = torch.device("cuda", index)

    def param_format(self, memory_format: torch.memory_format) -> torch.memory_format:
        """The memory format the model's parameters take when its inputs come in
        ``memory_format`` (channels_last on a GPU)."""
        return memory_format

    # Overridden below.
    def wrap(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        fp16_allreduce: bool,
        batches_per_allreduce: int,
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        return model, optimizer

    def broadcast_state(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, extra: Any
    ) -> Any:
        return extra

    def allreduce_sum(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        return tensor

    def allgather_object(self, obj: Any, name: str) -> list[Any]:
        return [obj]

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        yield

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``; DDP also times what it waited for in there."""
        loss.backward()

    def synchronize_then_step(self, optimizer: torch.optim.Optimizer, scaler: Any) -> float:
        """optimizer.step(), going through the AMP GradScaler when there is one.

        Returns the seconds spent waiting for gradient synchronisation (none here).
        """
        _step(optimizer, scaler)
        return 0.0

    def step_deferred(self, optimizer: torch.optim.Optimizer,
                      scaler: Any) -> Callable[[], float]:
        """``synchronize_then_step`` whose wait is read later, by calling what it
        returns: a backend that times the wait on the GPU (DDP) does not make the host
        wait for the step here."""
        waited = self.synchronize_then_step(optimizer, scaler)
        return lambda: waited

    def barrier(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


class HorovodBackend(Backend):
    name = "horovod"

    def __init__(self) -> None:
        super().__init__()
        import horovod.torch as hvd

        self.hvd = hvd
        hvd.init()
        self.rank, self.size = hvd.rank(), hvd.size()
        self.local_rank, self.local_size = hvd.local_rank(), hvd.local_size()
        self.nodes = hvd.cross_size()
        self._pin_device()

    def param_format(self, memory_format: torch.memory_format) -> torch.memory_format:
        # Horovod's collectives take contiguous tensors only, and a channels_last
        # parameter's gradient and momentum are channels_last too: the parameters stay
        # contiguous, the inputs channels_last (cuDNN still picks channels_last kernels).
        return torch.contiguous_format

    def wrap(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        fp16_allreduce: bool,
        batches_per_allreduce: int,
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        hvd = self.hvd
        compression = hvd.Compression.fp16 if fp16_allreduce else hvd.Compression.none
        # backward_passes_per_step: gradients of k sub-batches accumulate locally and
        # are allreduced once, trading memory for k-times fewer allreduces.
        optimizer = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=model.named_parameters(),
            compression=compression,
            backward_passes_per_step=batches_per_allreduce,
            op=hvd.Average,
        )
        return model, optimizer

    def broadcast_state(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, extra: Any
    ) -> Any:
        hvd = self.hvd
        has_state = hvd.broadcast_object(
            len(optimizer.state) > 0, root_rank=0, name="has_opt_state"
        )
        if has_state:
            # A checkpoint written where the parameters were channels_last (DDP on a GPU)
            # holds channels_last momentum, and load_state_dict keeps its strides; Horovod
            # broadcasts contiguous tensors only. Replaced in optimizer.state, which
            # broadcast_optimizer_state's state_dict() hands out by reference.
            for param_state in optimizer.state.values():
                for key, value in param_state.items():
                    if torch.is_tensor(value) and not value.is_contiguous():
                        param_state[key] = value.contiguous()
            # Optimizer state first: on ranks with a fresh optimizer, Horovod initialises
            # it with a zero-gradient step, which (with weight decay) moves the weights;
            # the parameter broadcast below then overwrites them with rank 0's.
            hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        return hvd.broadcast_object(extra, root_rank=0, name="resume_state")

    def allreduce_sum(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        return self.hvd.allreduce(tensor, op=self.hvd.Sum, name=name)

    def allgather_object(self, obj: Any, name: str) -> list[Any]:
        return list(self.hvd.allgather_object(obj, name=name))

    def synchronize_then_step(self, optimizer: torch.optim.Optimizer, scaler: Any) -> float:
        # Finish the allreduces explicitly (timed), then step without a second sync;
        # AMP unscales in between, as Horovod's docs show for gradient clipping.
        clock = _WallClock(self.device)
        start = clock.now()  # on CUDA after the backward kernels have finished
        optimizer.synchronize()  # type: ignore[attr-defined]
        waited = clock.now() - start
        if scaler is not None:
            scaler.unscale_(optimizer)
        with optimizer.skip_synchronize():  # type: ignore[attr-defined]
            _step(optimizer, scaler)
        return waited

    def barrier(self) -> None:
        self.hvd.barrier()

    def shutdown(self) -> None:
        self.hvd.shutdown()


class DDPBackend(Backend):
    name = "ddp"

    def __init__(self, world: World | None = None, timeout_s: float = 600) -> None:
        super().__init__()
        import torch.distributed as dist

        self.dist = dist
        self.world = world or detect_world()
        self.rank, self.size = self.world.rank, self.world.world_size
        self.local_rank, self.local_size = self.world.local_rank, self.world.local_size
        self.nodes = self.world.nodes
        self._pin_device()
        self.grads = GradReadyTimes(self.device)
        # env:// reads RANK/WORLD_SIZE/MASTER_*: set them from whichever launcher ran us
        # (mpirun and srun do not set them; torchrun does and they pass through).
        _check_resolves(self.world)
        export_torch_env(self.world)
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        dist.init_process_group(
            backend,
            init_method="env://",
            rank=self.rank,
            world_size=self.size,
            timeout=datetime.timedelta(seconds=timeout_s),
            **({"device_id": self.device} if self.device.type == "cuda" else {}),
        )

    def wrap(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        fp16_allreduce: bool,
        batches_per_allreduce: int,
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        from torch.nn.parallel import DistributedDataParallel as DDP

        # Bucketing left at its default (25 MB buckets, overlapping with backward).
        ddp = DDP(model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        if fp16_allreduce:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        # Timestamps only. A comm hook wrapping DDP's allreduce in Python to time it
        # cost ~4% throughput (measured: 0.946-0.977 of plain DDP, 4 pairs); these
        # hooks cost nothing measurable on the CPU (0.995); on a GPU see GradReadyTimes.
        for param in model.parameters():
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(self.grads.ready)
        return ddp, optimizer

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()
        self.grads.returned()

    def synchronize_then_step(self, optimizer: torch.optim.Optimizer, scaler: Any) -> float:
        return self.step_deferred(optimizer, scaler)()

    def step_deferred(self, optimizer: torch.optim.Optimizer,
                      scaler: Any) -> Callable[[], float]:
        # DDP has already waited for its allreduces at the end of backward().
        _step(optimizer, scaler)
        return self.grads.take_deferred()

    def _broadcast_object(self, obj: Any) -> Any:
        box = [obj if self.rank == 0 else None]
        self.dist.broadcast_object_list(
            box, src=0, device=self.device if self.device.type == "cuda" else None
        )
        return box[0]

    def broadcast_state(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, extra: Any
    ) -> Any:
        for tensor in model.state_dict().values():
            self.dist.broadcast(tensor, src=0)  # in place: state_dict tensors share storage
        if self._broadcast_object(len(optimizer.state) > 0):
            # Sent as CPU copies: a pickled CUDA tensor unpickles (torch.load without
            # map_location) onto the GPU it was pickled from, rank 0's, on every rank,
            # which where all GPUs are visible puts the whole optimizer state and a CUDA
            # context of every rank on rank 0's GPU (refused outright in exclusive-process
            # mode). load_state_dict moves the state to each rank's parameters' device.
            state = self._broadcast_object(_on_cpu(optimizer.state_dict()) if self.rank == 0
                                           else None)
            if self.rank != 0:
                optimizer.load_state_dict(state)
        return self._broadcast_object(extra)

    def allreduce_sum(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        if tensor.device == self.device:
            self.dist.all_reduce(tensor, op=self.dist.ReduceOp.SUM)
            return tensor
        # A process group initialised with "nccl" has no backend for CPU tensors ("No
        # backend type associated with device type cpu"), and the loop's sums and
        # counts live on the CPU: reduce a copy on this rank's GPU, then copy it back
        # in place, as the gloo path above does.
        on_device = tensor.to(self.device)
        self.dist.all_reduce(on_device, op=self.dist.ReduceOp.SUM)
        tensor.copy_(on_device)
        return tensor

    def allgather_object(self, obj: Any, name: str) -> list[Any]:
        out: list[Any] = [None] * self.size
        self.dist.all_gather_object(out, obj)
        return out

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        with model.no_sync():  # type: ignore[operator]
            yield

    def barrier(self) -> None:
        self.dist.barrier()

    def shutdown(self) -> None:
        self.dist.destroy_process_group()


def _on_cpu(obj: Any) -> Any:
    """``obj`` (nested dicts, lists and tuples) with every tensor copied to the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return {key: _on_cpu(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_on_cpu(value) for value in obj)
    return obj


def _step(optimizer: torch.optim.Optimizer, scaler: Any) -> None:
    if scaler is None:
        optimizer.step()
    else:
        scaler.step(optimizer)
        scaler.update()


class _WallClock:
    """Seconds on the host clock; on CUDA it first waits for the queued kernels, so a
    difference covers GPU work done in between, not only its launch."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


class GradReadyTimes:
    """How long DDP's ``backward()`` went on after the last gradient was accumulated:
    the wait for the bucket allreduces that had not finished by then.

    DDP starts a bucket's allreduce as soon as its gradients are ready, while backward
    goes on; when the last gradient is in, backward's compute is done and what is
    left until ``backward()`` returns is synchronisation (plus copying the reduced
    buckets back). On CUDA the marks are CUDA events, so the difference is GPU time,
    not the time the host queued the work.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.last_ready: Any = None
        self.wait = 0.0
        # On CUDA the pair of events of the last backward pass, read in take_wait(): by
        # then the optimizer step is queued too, so waiting for the events leaves the
        # GPU no gap to sit idle in (reading them in returned() did: a gap per step).
        self.marks: tuple[Any, Any] | None = None
        # One pair of events per backward pass, the first recorded again at every
        # gradient: creating an event per gradient cost ~0.1 ms of host time per
        # parameter (profiled on an H200). A pair taken by take_deferred() is not
        # recorded again, so it can be read after the next step has been queued.
        self._events: tuple[Any, Any] | None = None

    def _mark(self, which: int = 0) -> Any:
        if not self.cuda:
            return time.perf_counter()
        if self._events is None:
            self._events = (torch.cuda.Event(enable_timing=True),
                            torch.cuda.Event(enable_timing=True))
        event = self._events[which]
        event.record()
        return event

    def _seconds(self, start: Any, end: Any) -> float:
        if not self.cuda:
            return float(end - start)
        end.synchronize()
        return float(start.elapsed_time(end)) / 1000.0

    def ready(self, _param: torch.Tensor) -> None:
        """A post-accumulate-grad hook: one more gradient is in."""
        self.last_ready = self._mark()

    def returned(self) -> None:
        """backward() returned: the wait of this backward pass (the last one counts)."""
        if self.last_ready is None:
            return
        if self.cuda:
            self.marks = (self.last_ready, self._mark(1))
        else:
            self.wait = max(0.0, self._seconds(self.last_ready, self._mark()))
        self.last_ready = None

    def take_wait(self) -> float:
        """The last backward pass's wait, then 0 until the next one."""
        return self.take_deferred()()

    def take_deferred(self) -> Callable[[], float]:
        """``take_wait`` to be called later: on CUDA the backward pass's events are
        read (waited for) only when the returned function is called."""
        if self.marks is not None:
            start, end = self.marks
            self.marks = None
            self._events = None  # the next backward pass records a pair of its own
            return lambda: max(0.0, self._seconds(start, end))
        waited, self.wait = self.wait, 0.0
        return lambda: waited


def _check_resolves(world: World) -> None:
    """Fail in one line instead of letting env:// init retry an unknown host for minutes.

    Raises ConfigError when MASTER_ADDR does not resolve.
    """
    try:
        socket.getaddrinfo(world.master_addr, world.master_port)
    except OSError:
        where = "MASTER_ADDR" if os.environ.get("MASTER_ADDR") else "rendezvous host"
        raise ConfigError(
            f"{where} {world.master_addr!r} (from {world.launcher}) does not resolve on "
            f"{socket.gethostname()}",
            hint="export MASTER_ADDR=<address of rank 0's node> before launching",
        ) from None


def sync_figures(backend: Backend, steps: int, step_seconds: float, sync_seconds: float) -> dict[str, Any]:
    """Step time and its gradient-synchronisation share, averaged over the ranks (a
    collective: every rank calls it). ``steps`` timed steps took ``step_seconds`` on
    this rank, of which ``sync_seconds`` were spent waiting for the allreduce."""
    totals = backend.allreduce_sum(
        torch.tensor([step_seconds, sync_seconds], dtype=torch.float64), name="sync_figures"
    )
    step_total, sync_total = float(totals[0]), float(totals[1])
    if steps < 1 or step_total <= 0:
        return {"step_seconds": None, "sync_seconds": None, "sync_share": None}
    per_rank_steps = steps * backend.size
    return {
        "step_seconds": round(step_total / per_rank_steps, 6),
        "sync_seconds": round(sync_total / per_rank_steps, 6),
        "sync_share": round(sync_total / step_total, 4),
    }


def init_backend(name: str, timeout_s: float = 600) -> Backend:
    """Initialise ``horovod`` or ``ddp``. Raises ValueError for another name and
    ImportError when Horovod is not installed."""
    if name == "horovod":
        return HorovodBackend()
    if name == "ddp":
        return DDPBackend(timeout_s=timeout_s)
    raise ValueError(f"unknown backend {name!r}")
