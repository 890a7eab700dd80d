#!/usr/bin/env python3
"""A first distributed run: a small CNN learns generated 28x28 digits in seconds on CPU.

No download: digits are drawn as seven-segment glyphs with random offset, stroke
width and noise, deterministically from (seed, index). Same practices as the
ResNet example, in fewer lines: backend init, LR scaled by world size,
DistributedSampler with set_epoch, allreduced metrics, rank-0 result line.

  python3 examples/mnist_small.py --backend none
  torchrun --nproc-per-node 2 examples/mnist_small.py --backend ddp
  horovodrun -np 2 python3 examples/mnist_small.py --backend horovod
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import trainkit  # noqa: F401  (puts hpcdl on sys.path when run from a checkout)
from trainkit.say import say

from hpcdl.jobside.protocol import rank_line, result_line

# Segments a..g of a seven-segment display as (row0, col0, row1, col1) on a 5x3 grid.
_SEGMENTS = {
    "a": (0, 0, 0, 2), "b": (0, 2, 2, 2), "c": (2, 2, 4, 2), "d": (4, 0, 4, 2),
    "e": (2, 0, 4, 0), "f": (0, 0, 2, 0), "g": (2, 0, 2, 2),
}  # fmt: skip
_DIGITS = ["abcdef", "bc", "abged", "abgcd", "fgbc", "afgcd", "afgedc", "abc", "abcdefg", "abcdfg"]


def make_digit(label: int, index: int, seed: int) -> Any:
    """A 1x28x28 float tensor showing ``label``; a pure function of its arguments."""
    import torch

    g = torch.Generator().manual_seed(seed * 1_000_003 + index)
    img = torch.zeros(28, 28)
    scale = 4 + int(torch.randint(0, 2, (1,), generator=g))  # pixels per grid unit
    top = int(torch.randint(1, 28 - 4 * scale, (1,), generator=g))
    left = int(torch.randint(1, 28 - 2 * scale - 2, (1,), generator=g))
    width = 1 + int(torch.randint(0, 2, (1,), generator=g))
    for seg in _DIGITS[label]:
        r0, c0, r1, c1 = _SEGMENTS[seg]
        y0, x0 = top + r0 * scale, left + c0 * scale
        y1, x1 = top + r1 * scale + width, left + c1 * scale + width
        img[y0:y1, x0:x1] = 1.0
    img += 0.2 * torch.randn(28, 28, generator=g)
    return img.clamp_(0, 1).unsqueeze(0)


class Digits:
    """Map-style dataset of generated digits (labels cycle 0-9 by index)."""

    def __init__(self, length: int, seed: int) -> None:
        self.length, self.seed = length, seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[Any, int]:
        label = index % 10
        return make_digit(label, index, self.seed), label


def build_net() -> Any:
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 64), nn.ReLU(), nn.Linear(64, 10),
    )  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Small CNN on generated digits: a first distributed run.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--backend", choices=("horovod", "ddp", "none"), default="ddp")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--lr", type=float, default=0.05, help="for one rank; scaled by world size")
    p.add_argument("--train-size", type=int, default=3000)
    p.add_argument("--val-size", type=int, default=500)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=42)
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, Any] | None:
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, DistributedSampler, Subset
    from trainkit.data import even_shard
    from trainkit.dist import Backend, init_backend
    from trainkit.metrics import param_checksum
    from trainkit.schedule import scaled_lr

    from hpcdl.jobside import requeue, steps

    if args.threads:
        torch.set_num_threads(args.threads)
    backend = Backend() if args.backend == "none" else init_backend(args.backend)
    rank, size = backend.rank, backend.size
    torch.manual_seed(args.seed)
    model = build_net().to(backend.device)
    optimizer: torch.optim.Optimizer = torch.optim.SGD(
        model.parameters(), lr=scaled_lr(args.lr, size), momentum=0.9
    )
    train_model, optimizer = backend.wrap(
        model, optimizer, fp16_allreduce=False, batches_per_allreduce=1
    )
    backend.broadcast_state(model, optimizer, None)

    train_set, val_set = Digits(args.train_size, args.seed), Digits(args.val_size, args.seed + 1)
    sampler = DistributedSampler(
        train_set, size, rank, shuffle=True, seed=args.seed, drop_last=True
    )
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    val_loader = DataLoader(Subset(val_set, even_shard(len(val_set), size, rank)), batch_size=256)
    start = time.monotonic()
    loss_avg = acc = float("nan")
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        sums = torch.zeros(2, dtype=torch.float64)
        for x, y in loader:
            x, y = x.to(backend.device), y.to(backend.device)
            optimizer.zero_grad()
            loss = F.cross_entropy(train_model(x), y)
            loss.backward()
            optimizer.step()
            if rank == 0:  # a step completed (written once, at the first; hpcdl/jobside/requeue.py)
                requeue.mark_step(1)
            steps.beat()  # the hang watchdog's progress (at most once a second; hpcdl/jobside/steps.py)
            sums += torch.tensor([float(loss.detach()) * len(y), len(y)], dtype=torch.float64)
        model.eval()
        hits = torch.zeros(2, dtype=torch.float64)
        with torch.no_grad():
            for x, y in val_loader:
                pred = model(x.to(backend.device)).argmax(1).cpu()
                hits += torch.tensor([int((pred == y).sum()), len(y)], dtype=torch.float64)
        sums = backend.allreduce_sum(sums, name=f"mnist.train.{epoch}")
        hits = backend.allreduce_sum(hits, name=f"mnist.val.{epoch}")
        loss_avg, acc = float(sums[0] / sums[1]), float(hits[0] / hits[1])
        if rank == 0:
            say(f"epoch {epoch + 1}/{args.epochs}  loss {loss_avg:.4f}  val acc {100 * acc:.1f}%")
    elapsed = time.monotonic() - start
    checksum = param_checksum(model)
    say(rank_line(rank, checksum))
    result = {
        "backend": args.backend,
        "arch": "small-cnn",
        "world_size": size,
        "global_batch": args.batch_size * size,
        "final_loss": loss_avg,
        "top1": acc,
        "images_per_sec": round(args.epochs * len(sampler) * size / elapsed, 2),
        "param_checksum": checksum,
        "wall_time": round(elapsed, 3),
    }
    backend.barrier()
    backend.shutdown()
    return result if rank == 0 else None


def main(argv: list[str] | None = None) -> int:
    result = run(parse_args(argv))
    if result is not None:
        say(result_line(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
