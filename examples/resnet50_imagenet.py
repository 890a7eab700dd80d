#!/usr/bin/env python3
"""ResNet-50 (or -18) on ImageNet with Horovod or PyTorch DDP, on CPU or GPU.

Runs unchanged under torchrun, mpirun, horovodrun and srun (rank and world come from
hpcdl.jobside.world). What it does, as the Horovod/DDP tutorials teach:

* one GPU per local rank; AMP and channels_last on GPU only (the parameters stay
  contiguous under Horovod, which allreduces contiguous tensors only);
* LR scaled by world size x batches-per-allreduce (linear, or sqrt), warmed up per
  step over --warmup-epochs, then divided by 10 at 1/3, 2/3 and 8/9 of the epochs;
* parameters, optimizer state and AMP's loss scale broadcast from rank 0 at start and
  after --resume;
* a DistributedSampler (set_epoch every epoch) so each rank reads its own shard;
  augmentation seeded per sample, so runs and resumes are reproducible;
* loss/top-1/top-5 summed across ranks with allreduce;
* checkpoints written by rank 0 only, atomically, the last N kept; --resume picks
  the newest and continues mid-epoch if it stopped there;
* Horovod fp16 gradient compression and --batches-per-allreduce (DDP: fp16 comm
  hook and no_sync accumulation);
* data-loader workers from SLURM_CPUS_PER_TASK; --stage-to copies the dataset to
  node-local disk once per node.

Rank 0 prints one line per epoch and, last, ``{"hpcdl_result": {...}}``, which also
carries the mean step time and the share of it spent waiting for gradient
synchronisation (``sync_share``; see trainkit/dist.py for how). Every rank
prints ``hpcdl_rank_checksum rank=R host=H checksum=C`` (its final weights' hash).
Every rank also writes one JSON line per step into --metrics-dir (default
$HPCDL_RUN_DIR/metrics under hpcdl; hpcdl.jobside.steps has the format): what
`hpcdl report` draws.

Quick CPU try:
  hpcdl data make-tiny /tmp/tiny --classes 10 --per-class 20
  torchrun --nproc-per-node 2 examples/resnet50_imagenet.py --backend ddp \
      --arch resnet18 --data /tmp/tiny --image-size 32 --batch-size 8 --epochs 2
"""

from __future__ import annotations

import argparse
import math
import os
import random
import socket
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trainkit  # noqa: F401  (puts hpcdl on sys.path when run from a checkout)
from trainkit.say import say

from hpcdl.jobside.errors import HpcdlError, UserInputError
from hpcdl.jobside.protocol import rank_line, result_line
from hpcdl.jobside.steps import StepWriter, default_dir
from hpcdl.jobside.world import World, detect_world

if TYPE_CHECKING:  # torch is imported only once the run starts
    import torch
    from trainkit.loop import Checkpoints, Progress, RequeueWatch, Timing, TrainData, Training

DEFAULTS = {"epochs": 90, "batch_size": 32, "lr": 0.0125, "warmup_epochs": 5.0}


def default_workers(env: dict[str, str] | os._Environ[str], local_size: int, gpu: bool) -> int:
    """Data-loader workers: the CPUs Slurm gave this task, minus one for the training
    loop; without Slurm, a share of this machine's cores (none on CPU-only runs, where
    workers would compete with the compute threads)."""
    cpus = env.get("SLURM_CPUS_PER_TASK") or env.get("SRUN_CPUS_PER_TASK")
    if cpus and cpus.isdigit():
        return max(0, int(cpus) - 1)
    if not gpu:
        return 0
    # Up to 8: on an H200 (16 cores) the synthetic ResNet-50 run trained at 5,096 img/s
    # with 8 workers against 4,466 with 4 (docs/benchmarks.md, GPU check 2026-11-28).
    return max(0, min(8, (os.cpu_count() or 1) // max(1, local_size) - 1))


def default_threads(env: dict[str, str] | os._Environ[str], local_size: int) -> int:
    """Intra-op threads per rank: Slurm's CPUs per task, else this machine's cores
    shared between the ranks on it (oversubscribing cores slows every rank down)."""
    cpus = env.get("SLURM_CPUS_PER_TASK") or env.get("SRUN_CPUS_PER_TASK")
    if cpus and cpus.isdigit():
        return max(1, int(cpus))
    return max(1, (os.cpu_count() or 1) // max(1, local_size))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="ResNet on ImageNet (ImageFolder layout) with Horovod or DDP.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--backend", choices=("horovod", "ddp"), default="horovod")
    p.add_argument("--arch", choices=("resnet50", "resnet18"), default="resnet50")
    data = p.add_argument_group("data")
    data.add_argument("--data", metavar="DIR", help="ImageFolder root with train/ and val/")
    data.add_argument("--synthetic", action="store_true", help="random images, no dataset")
    data.add_argument("--synthetic-size", type=int, default=12800, help="synthetic train images")
    data.add_argument("--synthetic-val-size", type=int, default=1280)
    data.add_argument("--num-classes", type=int, default=1000, help="(synthetic mode)")
    data.add_argument(
        "--synthetic-dtype",
        choices=("uint8", "float32"),
        default="uint8",
        help="synthetic images as 8-bit pixels normalised on the training device (a "
        "quarter of the bytes through the loader and the copy), or as float32 (before "
        "2026-11-28; the same draws, not quantised)",
    )
    data.add_argument("--stage-to", metavar="DIR", help="copy --data here once per node first")
    data.add_argument("--image-size", type=int, default=224)
    data.add_argument("--workers", type=int, default=None, help="[default: SLURM_CPUS_PER_TASK-1]")
    data.add_argument("--val-batches", type=int, default=0, help="cap eval batches (0: all)")
    data.add_argument(
        "--decode",
        choices=("auto", "cpu", "gpu", "tensor"),
        default="auto",
        help="JPEG decode and augmentation: cpu (PIL in the loader workers), gpu (workers "
        "read bytes; nvJPEG and tensor ops on the GPU), tensor (gpu's path with PIL "
        "decoding, on the training device), auto (gpu when CUDA and torchvision's nvJPEG "
        "work, else cpu)",
    )
    train = p.add_argument_group("training")
    train.add_argument(
        "--batch-size", type=int, default=DEFAULTS["batch_size"], help="per rank, per sub-batch"
    )
    train.add_argument(
        "--batches-per-allreduce",
        type=int,
        default=1,
        help="sub-batches accumulated locally per allreduce",
    )
    train.add_argument("--epochs", type=int, default=DEFAULTS["epochs"])
    train.add_argument(
        "--max-steps", type=int, default=0, help="stop after this many optimizer steps (0: no cap)"
    )
    train.add_argument("--lr", type=float, default=DEFAULTS["lr"], help="base LR for one rank")
    train.add_argument("--lr-scaling", choices=("linear", "sqrt", "none"), default="linear")
    train.add_argument("--warmup-epochs", type=float, default=DEFAULTS["warmup_epochs"])
    train.add_argument("--momentum", type=float, default=0.9)
    train.add_argument("--wd", type=float, default=5e-5, help="weight decay")
    train.add_argument("--zero-init-residual", action="store_true")
    train.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to fp16")
    train.add_argument(
        "--amp", choices=("auto", "on", "off"), default="auto", help="auto: on with CUDA"
    )
    train.add_argument("--seed", type=int, default=42)
    train.add_argument("--threads", type=int, default=None, help="torch threads per rank")
    ck = p.add_argument_group("checkpoints")
    ck.add_argument("--checkpoint-dir", default="checkpoints", help="'' disables checkpoints")
    ck.add_argument("--keep-checkpoints", type=int, default=3, metavar="N")
    ck.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        metavar="STEPS",
        help="also checkpoint every N steps (0: at epoch ends and the end only)",
    )
    ck.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        default=None,
        metavar="PATH",
        help="resume from PATH, or the newest checkpoint in --checkpoint-dir",
    )
    p.add_argument("--log-every", type=int, default=0, help="rank-0 step lines every N steps")
    p.add_argument(
        "--step-sleep",
        type=float,
        default=0.0,
        metavar="S",
        help="sleep S seconds after every step (slows a test run down enough to interrupt it)",
    )
    p.add_argument("--dist-timeout", type=float, default=600, help="seconds for collectives")
    p.add_argument(
        "--metrics-dir",
        default=default_dir(),
        metavar="DIR",
        help="one JSON line per step per rank into DIR/rank-RRRRR.jsonl ('' disables) "
        "[default: $HPCDL_RUN_DIR/metrics, set by hpcdl's job script, else off]",
    )
    testing = p.add_argument_group(
        "testing", "make one rank slow on purpose (hpcdl's straggler test; not for real runs)")
    testing.add_argument("--slow-rank", type=int, default=None, metavar="R",
                         help="the rank that sleeps --slow-ms inside every step")
    testing.add_argument("--slow-ms", type=float, default=0.0, metavar="MS",
                         help="milliseconds rank --slow-rank sleeps per step (before forward)")
    args = p.parse_args(argv)
    problems = []
    if not args.synthetic and not args.data:
        problems.append("pass --data DIR (ImageFolder layout) or --synthetic")
    for name in (
        "batch_size",
        "batches_per_allreduce",
        "epochs",
        "image_size",
        "synthetic_size",
        "num_classes",
    ):
        if getattr(args, name) < 1:
            problems.append(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(args, name)})")
    if args.resume == "latest" and not args.checkpoint_dir:
        problems.append("--resume without a path needs --checkpoint-dir to look in")
    if args.slow_ms < 0 or (args.slow_ms and args.slow_rank is None):
        problems.append(f"--slow-ms {args.slow_ms:g} needs --slow-rank R and must be >= 0")
    if args.image_size < 32:
        problems.append(f"--image-size {args.image_size} is below ResNet's minimum of 32")
    if problems:
        p.error("; ".join(problems))
    return args


def log(rank: int, msg: str) -> None:
    if rank == 0:
        say(msg)


def build_datasets(args: argparse.Namespace, data_root: str | None) -> tuple[Any, Any, int]:
    import torch
    from trainkit.data import ImageFolderDataset, SyntheticImages

    if args.synthetic:
        dtype = torch.uint8 if args.synthetic_dtype == "uint8" else torch.float32
        train = SyntheticImages(args.synthetic_size, args.num_classes, args.image_size,
                                args.seed, dtype)
        val = SyntheticImages(
            args.synthetic_val_size, args.num_classes, args.image_size, args.seed + 1, dtype
        )
        return train, val, args.num_classes
    from hpcdl.jobside.imagefolder import scan_imagefolder

    assert data_root is not None
    folder = scan_imagefolder(data_root)
    train = ImageFolderDataset(folder.samples["train"], args.image_size, train=True, seed=args.seed)
    val = ImageFolderDataset(folder.samples["val"], args.image_size, train=False)
    return train, val, len(folder.classes)


@dataclass
class Decode:
    """How --data's JPEGs are decoded: ``mode`` cpu (PIL in the loader workers), gpu or
    tensor (trainkit.gpudecode, ``decode`` its batch decoder); None for --synthetic."""

    mode: str | None
    decode: Any = None
    note: str = ""  # why auto chose cpu


def resolve_decode(choice: str, device: torch.device, synthetic: bool) -> Decode:
    """--decode resolved on this rank's device. Raises UserInputError for --decode gpu
    where nvJPEG cannot run."""
    if synthetic:
        return Decode(None)
    if choice == "cpu":
        return Decode("cpu")
    from trainkit.gpudecode import nvjpeg_decoder, pil_batch_decoder

    if choice == "tensor":
        return Decode("tensor", pil_batch_decoder(device))
    decode, why = nvjpeg_decoder(device)
    if decode is not None:
        return Decode("gpu", decode)
    if choice == "gpu":
        raise UserInputError(f"--decode gpu: {why}", hint="use --decode cpu or auto")
    return Decode("cpu", note=why)


def prepare_data(args: argparse.Namespace, world: World) -> tuple[str | None, float | None]:
    """Stage the dataset (once per node) and return (path to read, staging seconds)."""
    if args.synthetic or not args.data:
        return None, None
    if not args.stage_to:
        return args.data, None
    from trainkit.staging import stage_dataset

    from hpcdl.jobside.imagefolder import scan_imagefolder

    scan_imagefolder(args.data)  # fail on a bad source before copying it anywhere
    path, seconds, copied = stage_dataset(args.data, args.stage_to, local_rank=world.local_rank)
    if copied:
        say(f"staged {args.data} -> {path} in {seconds:.2f} s (host {socket.gethostname()})")
    return str(path), seconds


def set_up(args: argparse.Namespace, world: World, num_classes: int) -> Training:
    """Backend, model, optimizer (scaled LR, the backend's wrapper) and AMP scaler,
    as a trainkit.loop.Training."""
    import torch
    from torch import nn
    from trainkit.dist import init_backend
    from trainkit.loop import Training
    from trainkit.resnet import build_model

    cuda = torch.cuda.is_available()
    if cuda:
        # Every batch has the same shape: let cuDNN time its convolution algorithms once
        # and keep the fastest (NVIDIA's ResNet-50 reference figures are measured so).
        torch.backends.cudnn.benchmark = True
    torch.set_num_threads(args.threads or default_threads(os.environ, world.local_size))
    backend = init_backend(args.backend, timeout_s=args.dist_timeout)
    use_amp = cuda if args.amp == "auto" else args.amp == "on" and cuda
    # Same seed everywhere for the initial weights (rank 0's are broadcast anyway);
    # per-rank seeds for anything random on a rank (dropout, worker RNGs).
    torch.manual_seed(args.seed)
    model = build_model(args.arch, num_classes, zero_init_residual=args.zero_init_residual)
    memory_format = torch.channels_last if cuda else torch.contiguous_format
    model = model.to(backend.device, memory_format=backend.param_format(memory_format))
    torch.manual_seed(args.seed + backend.rank)
    random.seed(args.seed + backend.rank)
    optimizer: torch.optim.Optimizer = torch.optim.SGD(
        model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.wd
    )
    train_model, optimizer = backend.wrap(
        model,
        optimizer,
        fp16_allreduce=args.fp16_allreduce,
        batches_per_allreduce=args.batches_per_allreduce,
    )
    scaler = torch.amp.GradScaler("cuda") if use_amp else None
    return Training(backend=backend, model=model, train_model=train_model, optimizer=optimizer,
                    scaler=scaler, criterion=nn.CrossEntropyLoss(),
                    memory_format=memory_format, use_amp=use_amp, cuda=cuda)


def resume(args: argparse.Namespace, t: Training, num_classes: int,
           global_batch: int) -> tuple[Progress, str | None]:
    """(Progress, checkpoint resumed from): rank 0 loads --resume's checkpoint (if any),
    then its weights, optimizer state, AMP loss scale and position go to every rank,
    fresh or resumed."""
    from trainkit.loop import Progress, find_resume_state

    progress = Progress(global_batch=global_batch)
    resumed_from = None
    if args.resume and t.backend.rank == 0:
        found = find_resume_state(args.resume, args.checkpoint_dir)
        if found is not None:
            path, state = found
            if state.get("arch") != args.arch or state.get("num_classes") != num_classes:
                raise UserInputError(
                    f"--resume {path}: checkpoint is {state.get('arch')} with {state.get('num_classes')} "
                    f"classes, this run is {args.arch} with {num_classes}"
                )
            progress = t.load_state(state)
            resumed_from = str(path)
    # AMP's loss scale too: a rank left at the fresh scale would scale its gradients
    # differently from rank 0 before they are averaged, and unscale by its own.
    scaler_state = t.scaler.state_dict() if t.scaler is not None else None
    progress, resumed_from, scaler_state = t.backend.broadcast_state(
        t.model, t.optimizer, (progress, resumed_from, scaler_state))
    if t.scaler is not None and scaler_state:
        t.scaler.load_state_dict(scaler_state)
    if progress.global_batch != global_batch and progress.step_in_epoch:
        # The shards of a half-done epoch depend on the world size: restart at the next epoch.
        log(
            t.backend.rank,
            f"resume: global batch {progress.global_batch} -> {global_batch}; continuing at the next epoch",
        )
        progress.epoch, progress.step_in_epoch = progress.epoch + 1, 0
    progress.global_batch = global_batch
    return progress, resumed_from


def load_data(args: argparse.Namespace, t: Training, train_set: Any,
              val_set: Any, dec: Decode) -> tuple[TrainData, Any]:
    """(TrainData, validation batches): this rank's shards and their loaders; with
    --decode gpu/tensor the loaders read the files' bytes and ``dec`` decodes them on the
    device. Raises UserInputError when a rank's shard holds less than one batch."""
    from torch.utils.data import DataLoader, Subset
    from trainkit.data import ResumableDistributedSampler, even_shard
    from trainkit.loop import TrainData, worker_context

    on_device = dec.mode in ("gpu", "tensor")
    val_decoder = collate = None
    if on_device:
        from trainkit.gpudecode import DeviceDecode, JpegFiles, collate_encoded

        train_decoder = DeviceDecode(args.image_size, True, t.device, dec.decode,
                                     t.memory_format, seed=args.seed, names=train_set.samples)
        val_decoder = DeviceDecode(args.image_size, False, t.device, dec.decode,
                                   t.memory_format, names=val_set.samples)
        train_set, val_set = JpegFiles(train_set.samples), JpegFiles(val_set.samples)
        collate = collate_encoded

    rank, size = t.backend.rank, t.backend.size
    workers = (
        args.workers
        if args.workers is not None
        else default_workers(os.environ, t.backend.local_size, t.cuda)
    )
    sampler = ResumableDistributedSampler(
        train_set, num_replicas=size, rank=rank, shuffle=True, seed=args.seed, drop_last=True
    )
    data = TrainData(dataset=train_set, sampler=sampler,
                     batch=args.batch_size * args.batches_per_allreduce, workers=workers,
                     pin_memory=t.cuda and not on_device, collate_fn=collate,
                     decoder=train_decoder if on_device else None)
    if data.steps_per_epoch < 1:
        raise UserInputError(
            f"{len(train_set)} training images give each of {size} ranks {len(sampler)}, "
            f"fewer than one batch of {data.batch}",
            hint="lower --batch-size or use more images",
        )
    val_loader = DataLoader(
        Subset(val_set, even_shard(len(val_set), size, rank)),
        batch_size=args.batch_size,
        num_workers=workers,
        pin_memory=t.cuda and not on_device,
        collate_fn=collate,
    )
    data.loader_kwargs = worker_context(workers, args.backend)
    if val_decoder is not None:
        from trainkit.gpudecode import DecodedBatches

        return data, DecodedBatches(val_loader, val_decoder, epoch=0)
    return data, val_loader


@dataclass
class RunSetup:
    """What run() decided before the first step (the first line and the result say it)."""

    world: World
    data_root: str | None
    stage_seconds: float | None
    global_batch: int
    target_lr: float
    total_steps: int = 0
    resumed_from: str | None = None
    decode: Decode | None = None


@dataclass
class Outcome:
    """What the training loop ends with."""

    final_loss: float = math.nan
    top1: float | None = None
    top5: float | None = None
    requeue: bool = False  # stopped for a requeue (checkpoint written)
    first_step_at: float | None = None  # wall clock: the first step began
    decode_fallbacks: int | None = None  # --decode gpu/tensor: images decoded by PIL, all ranks


def train(args: argparse.Namespace, t: Training, s: RunSetup, progress: Progress,
          data: TrainData, val_loader: Any, timing: Timing, ckpt: Checkpoints,
          metrics: StepWriter) -> Outcome:
    """The epochs: steps at the scheduled LR, then the summed loss, evaluation, the
    epoch line and a checkpoint. Stops early, with a checkpoint, when a requeue is
    agreed on."""
    import torch
    from trainkit.loop import RequeueWatch

    from hpcdl.jobside import requeue

    out = Outcome()
    decoded = 0
    watch = RequeueWatch(t.backend)
    while progress.epoch < args.epochs and progress.global_step < s.total_steps:
        epoch = progress.epoch
        sums, lr, epoch_start = train_epoch(args, t, s, progress, data, timing, ckpt, watch, out,
                                            metrics)
        if out.requeue:
            # Mid-epoch: the checkpoint keeps the position; the next attempt continues there.
            ckpt.save(t, progress)
            log(
                t.backend.rank,
                f"requeue: stopped after step {progress.global_step}/{s.total_steps}, "
                f"checkpoint {ckpt.last}; exiting {requeue.EXIT_REQUEUE} (requeue me)",
            )
            return out
        epoch_time = time.monotonic() - epoch_start
        sums = t.backend.allreduce_sum(sums, name=f"train.{epoch}.{progress.global_step}")
        n = max(1.0, float(sums[2]))
        out.final_loss = float(sums[0]) / n
        train_top1 = float(sums[1]) / n
        out.top1, out.top5, n_val = t.evaluate(
            val_loader, args.val_batches, name=f"val.{progress.epoch}.{progress.global_step}")
        if not args.synthetic:
            # On every rank, whichever way it decodes (auto may choose differently on a
            # rank whose nvJPEG fails): a collective all of them call.
            decoders = [d for d in (data.decoder, getattr(val_loader, "decoder", None)) if d]
            counts = t.backend.allreduce_sum(
                torch.tensor([float(sum(d.fallbacks for d in decoders)),
                              float(sum(d.images for d in decoders))], dtype=torch.float64),
                name=f"decode.{progress.epoch}.{progress.global_step}")
            out.decode_fallbacks, decoded = int(counts[0]), int(counts[1])
        progress.add_epoch_time(epoch, epoch_time)
        if not math.isfinite(out.final_loss):
            raise RuntimeError(f"epoch {epoch + 1}: training loss is {out.final_loss}")
        log(
            t.backend.rank,
            (
                f"epoch {epoch + 1}/{args.epochs}  step {progress.global_step}  loss {out.final_loss:.4f}  "
                f"train top1 {100 * train_top1:.1f}%  val top1 {100 * out.top1:.1f}%  top5 {100 * out.top5:.1f}% "
                f"({n_val} images)  lr {lr:.5f}  {epoch_time:.2f} s"
            ),
        )
        if decoded:
            log(t.backend.rank, f"decode {s.decode.mode if s.decode else '?'}: "
                f"{out.decode_fallbacks} of {decoded} images decoded so far fell back to "
                "the CPU (PIL)")
        if progress.step_in_epoch >= data.steps_per_epoch:
            progress.epoch += 1
            progress.step_in_epoch = 0
        ckpt.save(t, progress)
    return out


def train_epoch(args: argparse.Namespace, t: Training, s: RunSetup, progress: Progress,
                data: TrainData, timing: Timing, ckpt: Checkpoints, watch: RequeueWatch,
                out: Outcome, metrics: StepWriter) -> tuple[torch.Tensor, float, float]:
    """The steps of the current epoch (from where it stands), each at its scheduled LR,
    each recorded in ``metrics`` (the wait for the batch, the step, its sync wait).
    Returns (this rank's loss*n, top-1 hits, n; the last LR; when the epoch began).
    Sets ``out.requeue`` and stops when all ranks agree a requeue was asked for."""
    import torch
    from trainkit.loop import DevicePrefetch, QueuedStep
    from trainkit.schedule import lr_at

    from hpcdl.jobside import requeue

    loader = data.loader(progress.epoch, progress.step_in_epoch)
    batches: Any = loader
    if data.decoder is not None:
        from trainkit.gpudecode import DecodedBatches

        batches = DecodedBatches(loader, data.decoder, progress.epoch)
    elif t.cuda:
        batches = DevicePrefetch(loader, t.device, t.memory_format)
    t.model.train()
    sums = torch.zeros(3, dtype=torch.float64, device=t.device)  # loss*n, top-1 hits, n
    epoch_start = time.monotonic()
    slow_s = args.slow_ms / 1000 if args.slow_rank == t.backend.rank else 0.0
    fetch_start = epoch_start
    # A step's figures are read (waiting for it) once the next step is queued, so the
    # GPU never sits idle while the host prepares a step: (step, data wait, lr, step).
    unread: tuple[int, float, float, QueuedStep] | None = None

    def record(step: int, data_s: float, lr: float, queued: QueuedStep) -> None:
        step_s, sync_s = queued.seconds(), queued.sync_seconds()
        loss = float(queued.loss.detach())
        if t.backend.rank == 0:  # this attempt completed a step (writes once; hpcdl/jobside/requeue.py)
            requeue.mark_step(step)
        timing.add(data.batch * t.backend.size, step_s, sync_s)
        metrics.step(step, epoch=progress.epoch, step_s=step_s, data_s=data_s,
                     sync_s=sync_s, images=data.batch, loss=loss, lr=lr)
        if args.log_every and step % args.log_every == 0:
            log(t.backend.rank, f"  step {step}/{s.total_steps} loss {loss:.4f} lr {lr:.5f}")

    for x, y in batches:
        step_start = time.monotonic()
        data_s = step_start - fetch_start
        if out.first_step_at is None:
            out.first_step_at = time.time()
        lr = lr_at(
            progress.epoch,
            progress.step_in_epoch,
            data.steps_per_epoch,
            base_lr=args.lr,
            target_lr=s.target_lr,
            warmup_epochs=args.warmup_epochs,
            total_epochs=args.epochs,
        )
        # On the GPU a step's time runs from the previous step's end (the period
        # between two steps, whatever the GPU waited for in between) when there is one.
        start = unread[3].end if t.cuda and unread is not None else t.mark()
        if slow_s:  # --slow-rank: this rank's own work takes longer; the others wait in sync
            time.sleep(slow_s)
        queued = t.queue_step(x, y, lr, args.batches_per_allreduce, sums, start=start)
        progress.step_in_epoch += 1
        progress.global_step += 1
        if unread is not None:
            record(*unread)
        unread = (progress.global_step, data_s, lr, queued)
        checkpoint = bool(args.checkpoint_every) and progress.global_step % args.checkpoint_every == 0
        if not t.cuda or checkpoint:  # on the CPU the step is done: nothing to overlap
            record(*unread)
            unread = None
        if checkpoint:
            ckpt.save(t, progress)
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if watch.active and progress.global_step < s.total_steps \
                and watch.agreed(progress.global_step):
            out.requeue = True
            break
        if progress.global_step >= s.total_steps:
            break
        fetch_start = time.monotonic()
    if unread is not None:
        record(*unread)
    return sums.cpu(), lr, epoch_start


def header_line(args: argparse.Namespace, t: Training, s: RunSetup, data: TrainData,
                progress: Progress) -> str:
    """Rank 0's first line: the run's shape and settings."""
    import torch

    return (
        f"hpcdl {args.backend}: {t.backend.size} ranks on {t.backend.nodes} node(s) via {s.world.launcher}, "
        f"device {t.device.type}, {args.arch} {args.image_size}px, global batch {s.global_batch}, "
        f"lr {args.lr:g} -> {s.target_lr:g} ({args.lr_scaling}, warm-up {args.warmup_epochs:g} epochs), "
        f"{data.steps_per_epoch} steps/epoch, {s.total_steps} steps, workers {data.workers}, "
        f"threads {torch.get_num_threads()}, amp {'on' if t.use_amp else 'off'}"
        + (f", decode {s.decode.mode}" if s.decode and s.decode.mode else "")
        + (f" ({s.decode.note})" if s.decode and s.decode.note else "")
        + (
            f", resumed from {s.resumed_from} at step {progress.global_step}"
            if s.resumed_from
            else ""
        )
    )


def result_record(args: argparse.Namespace, t: Training, s: RunSetup, progress: Progress,
                  out: Outcome, timing: Timing, checkpoint: str | None,
                  started: tuple[float, float]) -> dict[str, Any]:
    """The final weights' checksum line (every rank), then the ``hpcdl_result`` record
    (collectives: every rank calls this). ``started``: (time.monotonic(), time.time())
    when run() began."""
    from trainkit.dist import sync_figures
    from trainkit.metrics import param_checksum

    size = t.backend.size
    checksum = param_checksum(t.model)
    say(rank_line(t.backend.rank, checksum))
    everyone = t.backend.allgather_object(checksum, name="final_checksum")
    images_per_sec = timing.images_per_sec
    sync = sync_figures(t.backend, timing.timed_steps, timing.seconds, timing.sync)
    return {
        "backend": args.backend,
        "arch": args.arch,
        "launcher": s.world.launcher,
        "world_size": size,
        "nodes": t.backend.nodes,
        "device": t.device.type,
        "amp": t.use_amp,
        "image_size": args.image_size,
        "global_batch": s.global_batch,
        "lr": s.target_lr,
        "images_per_sec": round(images_per_sec, 2) if images_per_sec else None,
        "images_per_sec_per_rank": round(images_per_sec / size, 2) if images_per_sec else None,
        "epoch_times": progress.epoch_times,
        **sync,
        "final_loss": out.final_loss,
        "top1": out.top1,
        "top5": out.top5,
        "checkpoint": checkpoint,
        "resumed_from": s.resumed_from,
        "param_checksum": checksum,
        "ranks_agree": len(set(everyone)) == 1,
        "steps": progress.global_step,
        "steps_this_run": timing.steps,
        "data": "synthetic" if args.synthetic else s.data_root,
        "synthetic_dtype": args.synthetic_dtype if args.synthetic else None,
        "decode": s.decode.mode if s.decode else None,
        "decode_fallbacks": out.decode_fallbacks,
        "stage_seconds": round(s.stage_seconds, 3) if s.stage_seconds is not None else None,
        "wall_time": round(time.monotonic() - started[0], 3),
        "started_at": round(started[1], 3),
        "first_step_at": round(out.first_step_at, 3) if out.first_step_at is not None else None,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Train as ``args`` say. Returns {"rank", "result"} (rank 0's result is printed by
    main), or {"rank", "requeue": True} when stopped for a requeue. Raises HpcdlError
    (one-line messages) for bad data or settings."""
    # Wall-clock stamps (this node's clock) for measuring start-up from outside:
    # run() entered (imports done) and the first training step began.
    started = (time.monotonic(), time.time())
    world = detect_world()
    data_root, stage_seconds = prepare_data(args, world)
    # Datasets are checked on every rank before any collective starts, so a bad path
    # fails fast on all ranks with the same one-line message instead of a hang.
    train_set, val_set, num_classes = build_datasets(args, data_root)

    from trainkit.loop import Checkpoints, Timing
    from trainkit.schedule import scaled_lr

    t = set_up(args, world, num_classes)
    rank, size = t.backend.rank, t.backend.size
    s = RunSetup(world, data_root, stage_seconds,
                 global_batch=args.batch_size * args.batches_per_allreduce * size,
                 target_lr=scaled_lr(args.lr, size, args.batches_per_allreduce, args.lr_scaling))
    progress, s.resumed_from = resume(args, t, num_classes, s.global_batch)
    s.decode = resolve_decode(args.decode, t.device, args.synthetic)
    data, val_loader = load_data(args, t, train_set, val_set, s.decode)
    s.total_steps = args.epochs * data.steps_per_epoch
    if args.max_steps:
        s.total_steps = min(s.total_steps, args.max_steps)
    log(rank, header_line(args, t, s, data, progress))

    timing = Timing()
    metrics = StepWriter(args.metrics_dir, rank, world_size=size,
                         local_rank=t.backend.local_rank)
    ckpt = Checkpoints(args.checkpoint_dir, args.keep_checkpoints, rank, meta={
        "arch": args.arch, "num_classes": num_classes, "image_size": args.image_size,
        "world_size": size})
    out = train(args, t, s, progress, data, val_loader, timing, ckpt, metrics)
    metrics.close()
    result = None if out.requeue else result_record(args, t, s, progress, out, timing,
                                                    ckpt.last, started)
    t.backend.barrier()
    t.backend.shutdown()
    if result is None:
        return {"rank": rank, "requeue": True, "result": {}}
    return {"rank": rank, "result": result}


def last_line(message: str) -> str:
    # Errors re-raised from a data-loader worker carry the worker's traceback in the
    # message; the user needs only its last line.
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else message
    prefix = "hpcdl.jobside.errors."
    if last.startswith(prefix) and ": " in last:
        last = last.split(": ", 1)[1]
    return last


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        out = run(args)
    except HpcdlError as err:
        say(f"error: {last_line(err.message)}", sys.stderr)
        if err.hint:
            say(f"hint: {err.hint}", sys.stderr)
        return err.exit_code
    if out.get("requeue"):
        from hpcdl.jobside.requeue import EXIT_REQUEUE

        return EXIT_REQUEUE
    if out["rank"] == 0:
        say(result_line(out["result"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
