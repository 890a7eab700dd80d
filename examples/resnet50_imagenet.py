#!/usr/bin/env python3
"""ResNet-50 (or -18) on ImageNet with Horovod or PyTorch DDP, on CPU or GPU.

Runs unchanged under torchrun, mpirun, horovodrun and srun (rank and world come from
hpcdl.launch.world). What it does, as the Horovod/DDP tutorials teach:

* one GPU per local rank; AMP and channels_last on GPU only;
* LR scaled by world size x batches-per-allreduce (linear, or sqrt), warmed up per
  step over --warmup-epochs, then divided by 10 at 1/3, 2/3 and 8/9 of the epochs;
* parameters and optimizer state broadcast from rank 0 at start and after --resume;
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

Quick CPU try:
  hpcdl data make-tiny /tmp/tiny --classes 10 --per-class 20
  torchrun --nproc-per-node 2 examples/resnet50_imagenet.py --backend ddp \
      --arch resnet18 --data /tmp/tiny --image-size 32 --batch-size 8 --epochs 2
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trainkit  # noqa: F401  (puts hpcdl on sys.path when run from a checkout)
from trainkit.say import say

from hpcdl.errors import HpcdlError, UserInputError
from hpcdl.launch.world import World, detect_world
from hpcdl.results.protocol import rank_line, result_line

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
    return max(0, min(4, (os.cpu_count() or 1) // max(1, local_size) - 1))


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
    data.add_argument("--stage-to", metavar="DIR", help="copy --data here once per node first")
    data.add_argument("--image-size", type=int, default=224)
    data.add_argument("--workers", type=int, default=None, help="[default: SLURM_CPUS_PER_TASK-1]")
    data.add_argument("--val-batches", type=int, default=0, help="cap eval batches (0: all)")
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
    if args.image_size < 32:
        problems.append(f"--image-size {args.image_size} is below ResNet's minimum of 32")
    if problems:
        p.error("; ".join(problems))
    return args


@dataclass
class Progress:
    """Where training stands; saved in checkpoints and broadcast on resume."""

    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0
    global_batch: int = 0
    epoch_times: list[float] = field(default_factory=list)


def log(rank: int, msg: str) -> None:
    if rank == 0:
        say(msg)


def build_datasets(args: argparse.Namespace, data_root: str | None) -> tuple[Any, Any, int]:
    from trainkit.data import ImageFolderDataset, SyntheticImages

    if args.synthetic:
        train = SyntheticImages(args.synthetic_size, args.num_classes, args.image_size, args.seed)
        val = SyntheticImages(
            args.synthetic_val_size, args.num_classes, args.image_size, args.seed + 1
        )
        return train, val, args.num_classes
    from hpcdl.data.imagefolder import scan_imagefolder

    assert data_root is not None
    folder = scan_imagefolder(data_root)
    train = ImageFolderDataset(folder.samples["train"], args.image_size, train=True, seed=args.seed)
    val = ImageFolderDataset(folder.samples["val"], args.image_size, train=False)
    return train, val, len(folder.classes)


def prepare_data(args: argparse.Namespace, world: World) -> tuple[str | None, float | None]:
    """Stage the dataset (once per node) and return (path to read, staging seconds)."""
    if args.synthetic or not args.data:
        return None, None
    if not args.stage_to:
        return args.data, None
    from trainkit.staging import stage_dataset

    from hpcdl.data.imagefolder import scan_imagefolder

    scan_imagefolder(args.data)  # fail on a bad source before copying it anywhere
    path, seconds, copied = stage_dataset(args.data, args.stage_to, local_rank=world.local_rank)
    if copied:
        say(f"staged {args.data} -> {path} in {seconds:.2f} s (host {socket.gethostname()})")
    return str(path), seconds


def run(args: argparse.Namespace) -> dict[str, Any]:
    wall_start = time.monotonic()
    # Wall-clock stamps (this node's clock) for measuring start-up from outside:
    # run() entered (imports done) and the first training step began.
    started_at = time.time()
    first_step_at: float | None = None
    world = detect_world()
    data_root, stage_seconds = prepare_data(args, world)
    # Datasets are checked on every rank before any collective starts, so a bad path
    # fails fast on all ranks with the same one-line message instead of a hang.
    train_set, val_set, num_classes = build_datasets(args, data_root)

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Subset
    from trainkit.checkpoint import load_checkpoint, load_latest_valid, save_checkpoint
    from trainkit.data import ResumableDistributedSampler, even_shard
    from trainkit.dist import init_backend, sync_figures
    from trainkit.metrics import param_checksum, topk_correct
    from trainkit.resnet import build_model
    from trainkit.schedule import lr_at, scaled_lr

    from hpcdl import requeue

    cuda = torch.cuda.is_available()
    torch.set_num_threads(args.threads or default_threads(os.environ, world.local_size))
    backend = init_backend(args.backend, timeout_s=args.dist_timeout)
    rank, size, device = backend.rank, backend.size, backend.device
    use_amp = cuda if args.amp == "auto" else args.amp == "on" and cuda
    workers = (
        args.workers
        if args.workers is not None
        else default_workers(os.environ, backend.local_size, cuda)
    )

    # Same seed everywhere for the initial weights (rank 0's are broadcast anyway);
    # per-rank seeds for anything random on a rank (dropout, worker RNGs).
    torch.manual_seed(args.seed)
    model = build_model(args.arch, num_classes, zero_init_residual=args.zero_init_residual)
    memory_format = torch.channels_last if cuda else torch.contiguous_format
    model = model.to(device, memory_format=memory_format)
    torch.manual_seed(args.seed + rank)
    random.seed(args.seed + rank)

    target_lr = scaled_lr(args.lr, size, args.batches_per_allreduce, args.lr_scaling)
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

    global_batch = args.batch_size * args.batches_per_allreduce * size
    progress = Progress(global_batch=global_batch)
    resumed_from = None
    if args.resume and rank == 0:
        path: Path | None = None
        if args.resume == "latest":
            # The newest checkpoint that loads: one damaged by a kill mid-write (or by a
            # full disk) is skipped, with a line saying so, for the one before it.
            found = load_latest_valid(args.checkpoint_dir)
            if found is not None:
                path, state, skipped = found
                for why in skipped:
                    say(f"resume: skipping damaged checkpoint {why}")
        else:
            path = Path(args.resume)
            state = load_checkpoint(path)
        if path is None:
            say(f"resume: no checkpoint in {args.checkpoint_dir}; starting fresh")
        else:
            if state.get("arch") != args.arch or state.get("num_classes") != num_classes:
                raise UserInputError(
                    f"--resume {path}: checkpoint is {state.get('arch')} with {state.get('num_classes')} "
                    f"classes, this run is {args.arch} with {num_classes}"
                )
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            if scaler is not None and state.get("scaler"):
                scaler.load_state_dict(state["scaler"])
            progress = Progress(**state["progress"])
            resumed_from = str(path)
    # Rank 0's weights, optimizer state and position go to every rank, whether fresh or resumed.
    progress, resumed_from = backend.broadcast_state(model, optimizer, (progress, resumed_from))
    if progress.global_batch != global_batch and progress.step_in_epoch:
        # The shards of a half-done epoch depend on the world size: restart at the next epoch.
        log(
            rank,
            f"resume: global batch {progress.global_batch} -> {global_batch}; continuing at the next epoch",
        )
        progress.epoch, progress.step_in_epoch = progress.epoch + 1, 0
    progress.global_batch = global_batch

    sampler = ResumableDistributedSampler(
        train_set, num_replicas=size, rank=rank, shuffle=True, seed=args.seed, drop_last=True
    )
    loader_batch = args.batch_size * args.batches_per_allreduce
    steps_per_epoch = len(sampler) // loader_batch
    if steps_per_epoch < 1:
        raise UserInputError(
            f"{len(train_set)} training images give each of {size} ranks {len(sampler)}, "
            f"fewer than one batch of {loader_batch}",
            hint="lower --batch-size or use more images",
        )
    total_steps = args.epochs * steps_per_epoch
    if args.max_steps:
        total_steps = min(total_steps, args.max_steps)
    val_loader = DataLoader(
        Subset(val_set, even_shard(len(val_set), size, rank)),
        batch_size=args.batch_size,
        num_workers=workers,
        pin_memory=cuda,
    )
    loader_kwargs: dict[str, Any] = {}
    if workers > 0 and args.backend == "horovod":
        # Forking a process that has initialised MPI can crash with some fabrics
        # (Horovod's own examples use forkserver for that reason).
        import multiprocessing as mp

        if "forkserver" in mp.get_all_start_methods():
            loader_kwargs["multiprocessing_context"] = "forkserver"

    criterion = nn.CrossEntropyLoss()
    log(
        rank,
        (
            f"hpcdl {args.backend}: {size} ranks on {backend.nodes} node(s) via {world.launcher}, "
            f"device {device.type}, {args.arch} {args.image_size}px, global batch {global_batch}, "
            f"lr {args.lr:g} -> {target_lr:g} ({args.lr_scaling}, warm-up {args.warmup_epochs:g} epochs), "
            f"{steps_per_epoch} steps/epoch, {total_steps} steps, workers {workers}, "
            f"threads {torch.get_num_threads()}, amp {'on' if use_amp else 'off'}"
            + (
                f", resumed from {resumed_from} at step {progress.global_step}"
                if resumed_from
                else ""
            )
        ),
    )

    ckpt_path: str | None = None

    def checkpoint() -> None:
        nonlocal ckpt_path
        if rank != 0 or not args.checkpoint_dir:
            return
        state = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else None,
            "progress": progress.__dict__,
            "arch": args.arch,
            "num_classes": num_classes,
            "image_size": args.image_size,
            "world_size": size,
        }
        ckpt_path = str(
            save_checkpoint(
                args.checkpoint_dir, progress.global_step, state, keep=args.keep_checkpoints
            )
        )

    def evaluate() -> tuple[float, float, int]:
        model.eval()
        counts = torch.zeros(3, dtype=torch.float64)
        with torch.no_grad():
            for i, (x, y) in enumerate(val_loader):
                if args.val_batches and i >= args.val_batches:
                    break
                x = x.to(device, non_blocking=True, memory_format=memory_format)
                y = y.to(device, non_blocking=True)
                with torch.autocast(device.type, enabled=use_amp):
                    out = model(x)  # the bare module: DDP's forward would sync buffers
                c1, c5 = topk_correct(out.float(), y)
                counts += torch.tensor([c1, c5, len(y)], dtype=torch.float64)
        counts = backend.allreduce_sum(counts, name=f"val.{progress.epoch}.{progress.global_step}")
        n = max(1.0, float(counts[2]))
        return float(counts[0]) / n, float(counts[1]) / n, int(counts[2])

    final_loss = math.nan
    top1 = top5 = None
    timed_images = 0
    timed_seconds = 0.0
    timed_sync = 0.0  # of timed_seconds, waiting for gradient synchronisation
    steps_this_run = 0
    n_chunks = args.batches_per_allreduce
    # Requeue contract (hpcdl/requeue.py): the batch shell creates $HPCDL_REQUEUE_FLAG on
    # Slurm's signal; SIGTERM/SIGUSR2 reaching a rank only set a flag too. Checked after
    # every step, agreed on by all ranks (one tiny allreduce), acted on outside any handler.
    watch_requeue = bool(os.environ.get(requeue.FLAG_ENV))
    if watch_requeue:
        requeue.watch_signals()
    stop_requested = False
    while progress.epoch < args.epochs and progress.global_step < total_steps:
        epoch = progress.epoch
        sampler.set_position(epoch, progress.step_in_epoch * loader_batch)
        train_set.set_epoch(epoch)
        loader = DataLoader(
            train_set,
            batch_size=loader_batch,
            sampler=sampler,
            num_workers=workers,
            pin_memory=cuda,
            drop_last=True,
            **loader_kwargs,
        )
        model.train()
        sums = torch.zeros(3, dtype=torch.float64)  # loss*n, top-1 hits, n
        epoch_start = time.monotonic()
        for x, y in loader:
            step_start = time.monotonic()
            if first_step_at is None:
                first_step_at = time.time()
            lr = lr_at(
                epoch,
                progress.step_in_epoch,
                steps_per_epoch,
                base_lr=args.lr,
                target_lr=target_lr,
                warmup_epochs=args.warmup_epochs,
                total_epochs=args.epochs,
            )
            for group in optimizer.param_groups:
                group["lr"] = lr
            optimizer.zero_grad()
            x = x.to(device, non_blocking=True, memory_format=memory_format)
            y = y.to(device, non_blocking=True)
            # --batches-per-allreduce: k sub-batches, gradients accumulated locally; only
            # the last backward pass communicates (Horovod counts passes, DDP via no_sync).
            for i, (xs, ys) in enumerate(zip(x.chunk(n_chunks), y.chunk(n_chunks), strict=True)):
                sync = (
                    contextlib.nullcontext() if i == n_chunks - 1 else backend.no_sync(train_model)
                )
                with sync:
                    with torch.autocast(device.type, enabled=use_amp):
                        out = train_model(xs)
                        loss = criterion(out, ys)
                    scaled = loss / n_chunks
                    backend.backward(scaler.scale(scaled) if scaler is not None else scaled)
                sums += torch.tensor(
                    [
                        float(loss.detach()) * len(ys),
                        topk_correct(out.detach().float(), ys, (1,))[0],
                        len(ys),
                    ],
                    dtype=torch.float64,
                )
            sync_seconds = backend.synchronize_then_step(optimizer, scaler)
            progress.step_in_epoch += 1
            progress.global_step += 1
            steps_this_run += 1
            if cuda:
                torch.cuda.synchronize()
            # Throughput leaves out each run's first step (allocator and thread-pool warm-up).
            if steps_this_run > 1:
                timed_images += loader_batch * size
                timed_seconds += time.monotonic() - step_start
                timed_sync += sync_seconds
            if args.log_every and progress.global_step % args.log_every == 0:
                log(
                    rank,
                    f"  step {progress.global_step}/{total_steps} loss {float(loss.detach()):.4f} lr {lr:.5f}",
                )
            if args.checkpoint_every and progress.global_step % args.checkpoint_every == 0:
                checkpoint()
            if args.step_sleep:
                time.sleep(args.step_sleep)
            if watch_requeue and progress.global_step < total_steps:
                asked = torch.tensor([1.0 if requeue.requested() else 0.0], dtype=torch.float64)
                asked = backend.allreduce_sum(asked, name=f"requeue.{progress.global_step}")
                if float(asked[0]) > 0:
                    stop_requested = True
                    break
            if progress.global_step >= total_steps:
                break
        if stop_requested:
            # Mid-epoch: the checkpoint keeps the position; the next attempt continues there.
            checkpoint()
            log(
                rank,
                f"requeue: stopped after step {progress.global_step}/{total_steps}, "
                f"checkpoint {ckpt_path}; exiting {requeue.EXIT_REQUEUE} (requeue me)",
            )
            backend.barrier()
            backend.shutdown()
            return {"rank": rank, "requeue": True, "result": {}}
        epoch_time = time.monotonic() - epoch_start
        sums = backend.allreduce_sum(sums, name=f"train.{epoch}.{progress.global_step}")
        n = max(1.0, float(sums[2]))
        final_loss = float(sums[0]) / n
        train_top1 = float(sums[1]) / n
        top1, top5, n_val = evaluate()
        # A resumed epoch adds its remaining time to what the first run measured.
        if len(progress.epoch_times) > epoch:
            progress.epoch_times[epoch] = round(progress.epoch_times[epoch] + epoch_time, 4)
        else:
            progress.epoch_times.append(round(epoch_time, 4))
        if not math.isfinite(final_loss):
            raise RuntimeError(f"epoch {epoch + 1}: training loss is {final_loss}")
        log(
            rank,
            (
                f"epoch {epoch + 1}/{args.epochs}  step {progress.global_step}  loss {final_loss:.4f}  "
                f"train top1 {100 * train_top1:.1f}%  val top1 {100 * top1:.1f}%  top5 {100 * top5:.1f}% "
                f"({n_val} images)  lr {lr:.5f}  {epoch_time:.2f} s"
            ),
        )
        if progress.step_in_epoch >= steps_per_epoch:
            progress.epoch += 1
            progress.step_in_epoch = 0
        checkpoint()

    checksum = param_checksum(model)
    say(rank_line(rank, checksum))
    everyone = backend.allgather_object(checksum, name="final_checksum")
    images_per_sec = timed_images / timed_seconds if timed_seconds > 0 else None
    timed_steps = max(0, steps_this_run - 1)
    sync = sync_figures(backend, timed_steps, timed_seconds, timed_sync)
    result = {
        "backend": args.backend,
        "arch": args.arch,
        "launcher": world.launcher,
        "world_size": size,
        "nodes": backend.nodes,
        "device": device.type,
        "amp": use_amp,
        "image_size": args.image_size,
        "global_batch": global_batch,
        "lr": target_lr,
        "images_per_sec": round(images_per_sec, 2) if images_per_sec else None,
        "images_per_sec_per_rank": round(images_per_sec / size, 2) if images_per_sec else None,
        "epoch_times": progress.epoch_times,
        **sync,
        "final_loss": final_loss,
        "top1": top1,
        "top5": top5,
        "checkpoint": ckpt_path,
        "resumed_from": resumed_from,
        "param_checksum": checksum,
        "ranks_agree": len(set(everyone)) == 1,
        "steps": progress.global_step,
        "steps_this_run": steps_this_run,
        "data": "synthetic" if args.synthetic else data_root,
        "stage_seconds": round(stage_seconds, 3) if stage_seconds is not None else None,
        "wall_time": round(time.monotonic() - wall_start, 3),
        "started_at": round(started_at, 3),
        "first_step_at": round(first_step_at, 3) if first_step_at is not None else None,
    }
    backend.barrier()
    backend.shutdown()
    return {"rank": rank, "result": result}


def one_line(message: str) -> str:
    # Errors re-raised from a data-loader worker carry the worker's traceback in the
    # message; the user needs only its last line.
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else message
    prefix = "hpcdl.errors."
    if last.startswith(prefix) and ": " in last:
        last = last.split(": ", 1)[1]
    return last


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        out = run(args)
    except HpcdlError as err:
        say(f"error: {one_line(err.message)}", sys.stderr)
        if err.hint:
            say(f"hint: {err.hint}", sys.stderr)
        return err.exit_code
    if out.get("requeue"):
        from hpcdl.requeue import EXIT_REQUEUE

        return EXIT_REQUEUE
    if out["rank"] == 0:
        say(result_line(out["result"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
