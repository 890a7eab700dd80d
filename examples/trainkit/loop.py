"""The pieces of a training loop that the examples compose: where training stands
(Progress), the objects one run steps (Training: one optimizer step over
--batches-per-allreduce sub-batches, evaluation, checkpoint state), the per-epoch
train loader (TrainData), throughput timing (Timing), checkpoints written by rank 0
(Checkpoints), finding the state to resume from, and the requeue stop agreed on by
all ranks (RequeueWatch).

Nothing here prints except the resume lines (through trainkit.say); the example
owns its progress lines and its result record.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from trainkit.checkpoint import load_checkpoint, load_latest_valid, save_checkpoint
from trainkit.data import ResumableDistributedSampler, normalise
from trainkit.dist import Backend
from trainkit.metrics import topk_correct, topk_hits
from trainkit.say import say


@dataclass
class Progress:
    """Where training stands; saved in checkpoints and broadcast on resume."""

    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0
    global_batch: int = 0
    epoch_times: list[float] = field(default_factory=list)

    def add_epoch_time(self, epoch: int, seconds: float) -> None:
        """Record ``epoch``'s time; a resumed epoch adds its remaining time to what the
        first run measured."""
        if len(self.epoch_times) > epoch:
            self.epoch_times[epoch] = round(self.epoch_times[epoch] + seconds, 4)
        else:
            self.epoch_times.append(round(seconds, 4))


@dataclass
class QueuedStep:
    """A step that may still be running on the GPU: its loss (a tensor) and how to read
    its time once it is done. Reading either figure waits for the step, so the loop
    reads a step's figures after it has queued the next one."""

    loss: torch.Tensor
    start: Any  # Training.mark() where the step began: a CUDA event or host seconds
    end: Any
    sync: Callable[[], float]  # seconds waited for gradient synchronisation
    cuda: bool

    def seconds(self) -> float:
        """The step's time from its start mark to its end (on the GPU's clock on CUDA:
        from when the GPU reached the step, so a step queued ahead is not charged for
        the one before it)."""
        if not self.cuda:
            return float(self.end - self.start)
        self.end.synchronize()
        return float(self.start.elapsed_time(self.end)) / 1000.0

    def sync_seconds(self) -> float:
        if self.cuda:
            self.end.synchronize()
        return self.sync()


@dataclass
class Training:
    """The objects one run steps. ``model`` is the bare module (evaluation,
    checkpoints, checksum); ``train_model`` is what forward/backward go through (the
    DDP wrapper under DDP); ``optimizer`` is the backend's (Horovod's wrapper)."""

    backend: Backend
    model: nn.Module
    train_model: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: Any  # torch.amp.GradScaler, or None without AMP
    criterion: nn.Module
    memory_format: torch.memory_format
    use_amp: bool
    cuda: bool

    @property
    def device(self) -> torch.device:
        return self.backend.device

    def _to_device(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y) on the device, x in the memory format; 8-bit images (the synthetic
        default) normalised there, after the copy: the CPU runs the same maths."""
        x = x.to(self.device, non_blocking=True, memory_format=self.memory_format)
        return (normalise(x) if x.dtype == torch.uint8 else x,
                y.to(self.device, non_blocking=True))

    def mark(self) -> Any:
        """Where a step begins: a CUDA event recorded now on the GPU, else the host clock."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.monotonic()

    def step(self, x: torch.Tensor, y: torch.Tensor, lr: float, n_chunks: int,
             sums: torch.Tensor) -> tuple[torch.Tensor, float]:
        """One optimizer step, finished: (the last sub-batch's loss, the seconds spent
        waiting for gradient synchronisation). See ``queue_step``."""
        queued = self.queue_step(x, y, lr, n_chunks, sums, start=self.mark())
        return queued.loss, queued.sync_seconds()

    def queue_step(self, x: torch.Tensor, y: torch.Tensor, lr: float, n_chunks: int,
                   sums: torch.Tensor, start: Any) -> QueuedStep:
        """One optimizer step at ``lr`` over ``n_chunks`` sub-batches of (x, y), queued
        and not waited for: on a GPU the host returns while the kernels run, so the
        caller can queue the next step before it reads this one's figures (reading
        them here, or synchronising, left the GPU idle while the host prepared every
        step). Adds (loss*n, top-1 hits, n) of every sub-batch to ``sums`` in place.
        ``start`` is ``mark()`` taken where the caller's step began."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad()
        x, y = self._to_device(x, y)
        # --batches-per-allreduce: k sub-batches, gradients accumulated locally; only
        # the last backward pass communicates (Horovod counts passes, DDP via no_sync).
        for i, (xs, ys) in enumerate(zip(x.chunk(n_chunks), y.chunk(n_chunks), strict=True)):
            sync = (
                contextlib.nullcontext() if i == n_chunks - 1
                else self.backend.no_sync(self.train_model)
            )
            with sync:
                with torch.autocast(self.device.type, enabled=self.use_amp):
                    out = self.train_model(xs)
                    loss = self.criterion(out, ys)
                scaled = loss / n_chunks
                self.backend.backward(self.scaler.scale(scaled) if self.scaler is not None
                                      else scaled)
            # Added up where ``sums`` lives (the GPU in CUDA runs: reading the loss here
            # would make the host wait for the backward pass before queueing the step).
            loss64 = loss.detach().to(sums.device, torch.float64)
            hits = topk_hits(out.detach().float(), ys, (1,))[0].to(sums.device, torch.float64)
            sums += torch.stack([loss64 * len(ys), hits, torch.ones_like(hits) * len(ys)])
        sync = self.backend.step_deferred(self.optimizer, self.scaler)
        return QueuedStep(loss=loss, start=start, end=self.mark(), sync=sync, cuda=self.cuda)

    def evaluate(self, loader: DataLoader, max_batches: int, name: str) -> tuple[float, float, int]:
        """(top-1, top-5, images) over every rank's shard of ``loader`` (a collective:
        every rank calls it); ``max_batches`` > 0 caps the batches per rank."""
        self.model.eval()
        counts = torch.zeros(3, dtype=torch.float64)
        with torch.no_grad():
            for i, (x, y) in enumerate(loader):
                if max_batches and i >= max_batches:
                    break
                x, y = self._to_device(x, y)
                with torch.autocast(self.device.type, enabled=self.use_amp):
                    out = self.model(x)  # the bare module: DDP's forward would sync buffers
                c1, c5 = topk_correct(out.float(), y)
                counts += torch.tensor([c1, c5, len(y)], dtype=torch.float64)
        counts = self.backend.allreduce_sum(counts, name=name)
        n = max(1.0, float(counts[2]))
        return float(counts[0]) / n, float(counts[1]) / n, int(counts[2])

    def state(self, progress: Progress, **meta: Any) -> dict[str, Any]:
        """What a checkpoint holds: weights, optimizer and scaler state, the progress,
        and ``meta`` (what a resume checks against)."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "progress": progress.__dict__,
            **meta,
        }

    def load_state(self, state: dict[str, Any]) -> Progress:
        """Load a checkpoint's weights, optimizer and scaler state; its Progress."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        return Progress(**state["progress"])


@dataclass
class TrainData:
    """The training set, this rank's resumable shard of it and how it is loaded."""

    dataset: Any  # has set_epoch(epoch) (augmentation seeded per epoch and sample)
    sampler: ResumableDistributedSampler
    batch: int  # per loader batch: --batch-size x --batches-per-allreduce
    workers: int
    pin_memory: bool
    loader_kwargs: dict[str, Any] = field(default_factory=dict)
    # --decode gpu/tensor: the loader yields encoded files (trainkit.gpudecode.collate_encoded)
    # and ``decoder`` (a trainkit.gpudecode.DeviceDecode) decodes them on the device.
    collate_fn: Any = None
    decoder: Any = None
    # Of a whole epoch, fixed here: the sampler's length shrinks while it skips what a
    # resumed epoch already did.
    steps_per_epoch: int = field(init=False)

    def __post_init__(self) -> None:
        self.steps_per_epoch = len(self.sampler) // self.batch

    def loader(self, epoch: int, step_in_epoch: int) -> DataLoader:
        """The loader for ``epoch``, starting after the ``step_in_epoch`` steps done."""
        self.sampler.set_position(epoch, step_in_epoch * self.batch)
        self.dataset.set_epoch(epoch)
        return DataLoader(
            self.dataset,
            batch_size=self.batch,
            sampler=self.sampler,
            num_workers=self.workers,
            pin_memory=self.pin_memory,
            drop_last=True,
            collate_fn=self.collate_fn,
            **self.loader_kwargs,
        )


class DevicePrefetch:
    """A loader's batches already on the GPU, in the training's memory format: the next
    batch's copy is queued on a side stream before the current step's kernels, so it
    runs while they do instead of between two steps (154 MB per 256-image batch of
    float32, 39 MB of uint8). 8-bit images are normalised there too, on that stream."""

    def __init__(self, loader: DataLoader, device: torch.device,
                 memory_format: torch.memory_format) -> None:
        self.loader = loader
        self.device = device
        self.memory_format = memory_format

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        copies = torch.cuda.Stream(self.device)
        compute = torch.cuda.current_stream(self.device)
        batches = iter(self.loader)

        def queue_next() -> tuple[torch.Tensor, torch.Tensor] | None:
            batch = next(batches, None)
            if batch is None:
                return None
            with torch.cuda.stream(copies):
                x = batch[0].to(self.device, non_blocking=True)
                x = x.contiguous(memory_format=self.memory_format)
                return (normalise(x) if x.dtype == torch.uint8 else x,
                        batch[1].to(self.device, non_blocking=True))

        upcoming = queue_next()
        while upcoming is not None:
            compute.wait_stream(copies)
            x, y = upcoming
            # Made on the side stream, used on this one: keep the allocator from
            # handing their memory out again before the step has finished with them.
            x.record_stream(compute)
            y.record_stream(compute)
            upcoming = queue_next()
            yield x, y


def worker_context(workers: int, backend: str) -> dict[str, Any]:
    """DataLoader keyword arguments for the worker processes' start method."""
    if workers > 0 and backend == "horovod":
        # Forking a process that has initialised MPI can crash with some fabrics
        # (Horovod's own examples use forkserver for that reason).
        import multiprocessing as mp

        if "forkserver" in mp.get_all_start_methods():
            return {"multiprocessing_context": "forkserver"}
    return {}


@dataclass
class Timing:
    """Throughput over this run's steps, leaving out its first (allocator and
    thread-pool warm-up)."""

    steps: int = 0  # steps this run, the first included
    images: int = 0
    seconds: float = 0.0
    sync: float = 0.0  # of ``seconds``, waiting for gradient synchronisation

    def add(self, images: int, seconds: float, sync_seconds: float) -> None:
        """Count a step of ``images`` that took ``seconds``."""
        self.steps += 1
        if self.steps > 1:
            self.images += images
            self.seconds += seconds
            self.sync += sync_seconds

    @property
    def timed_steps(self) -> int:
        return max(0, self.steps - 1)

    @property
    def images_per_sec(self) -> float | None:
        return self.images / self.seconds if self.seconds > 0 else None


@dataclass
class Checkpoints:
    """Checkpoints written by rank 0 only into ``directory`` ('' disables), the last
    ``keep`` kept, each with ``meta`` (what a resume checks against); ``last`` is the
    newest this run wrote."""

    directory: str
    keep: int
    rank: int
    meta: dict[str, Any] = field(default_factory=dict)
    last: str | None = None

    def save(self, training: Training, progress: Progress) -> None:
        if self.rank != 0 or not self.directory:
            return
        state = training.state(progress, **self.meta)
        self.last = str(save_checkpoint(self.directory, progress.global_step, state,
                                        keep=self.keep))


def find_resume_state(resume: str, directory: str) -> tuple[Path, dict[str, Any]] | None:
    """The checkpoint to resume from: ``resume`` as a path, or for "latest" the newest
    in ``directory`` that loads. A damaged one (killed mid-write, full disk) is skipped
    with a line saying so, for the one before it. None (with a line) when there is
    none. Raises what torch.load raises for an explicit path that does not load."""
    path: Path | None = None
    if resume == "latest":
        found = load_latest_valid(directory)
        if found is not None:
            path, state, skipped = found
            for why in skipped:
                say(f"resume: skipping damaged checkpoint {why}")
    else:
        path = Path(resume)
        state = load_checkpoint(path)
    if path is None:
        say(f"resume: no checkpoint in {directory}; starting fresh")
        return None
    return path, state


class RequeueWatch:
    """The requeue contract (hpcdl/jobside/requeue.py): the batch shell creates
    $HPCDL_REQUEUE_FLAG on Slurm's signal; SIGTERM/SIGUSR2 reaching a rank only set a
    flag too. Checked after every step, agreed on by all ranks (one tiny allreduce),
    acted on outside any handler. Inactive (no collective) without the variable."""

    def __init__(self, backend: Backend) -> None:
        from hpcdl.jobside import requeue

        self.backend = backend
        self.active = bool(os.environ.get(requeue.FLAG_ENV))
        if self.active:
            requeue.watch_signals()

    def agreed(self, step: int) -> bool:
        """Whether any rank was asked to stop (a collective: every rank calls it)."""
        from hpcdl.jobside import requeue

        asked = torch.tensor([1.0 if requeue.requested() else 0.0], dtype=torch.float64)
        asked = self.backend.allreduce_sum(asked, name=f"requeue.{step}")
        return float(asked[0]) > 0
