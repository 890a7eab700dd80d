#!/usr/bin/env python3
"""Training throughput (images/sec) on synthetic data, in the spirit of Horovod's
``pytorch_synthetic_benchmark.py``: one fixed random batch per rank, a few warm-up
batches, then ``--num-iters`` timed iterations of ``--num-batches-per-iter`` steps.
No input pipeline is involved: this measures compute plus gradient allreduce.

  torchrun --nproc-per-node 2 examples/synthetic_benchmark.py --backend ddp --model resnet18 \
      --image-size 32 --batch-size 16 --threads 1
  horovodrun -np 2 python3 examples/synthetic_benchmark.py --backend horovod --model resnet18

Rank 0 prints a line per iteration and, last, ``{"hpcdl_result": {...}}`` (with the
share of step time spent waiting for gradient synchronisation, ``sync_share``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import trainkit  # noqa: F401  (puts hpcdl on sys.path when run from a checkout)
from trainkit.say import say

from hpcdl.jobside.protocol import result_line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Synthetic-data training throughput with Horovod, DDP or one process.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--backend", choices=("horovod", "ddp", "none"), default="horovod")
    p.add_argument("--model", choices=("resnet50", "resnet18"), default="resnet50")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--num-warmup-batches", type=int, default=10)
    p.add_argument("--num-batches-per-iter", type=int, default=10)
    p.add_argument("--num-iters", type=int, default=10)
    p.add_argument("--fp16-allreduce", action="store_true")
    p.add_argument("--amp", choices=("auto", "on", "off"), default="auto")
    p.add_argument("--threads", type=int, default=None, help="torch threads per rank")
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args(argv)
    if args.image_size < 32:
        p.error(f"--image-size {args.image_size} is below ResNet's minimum of 32")
    for name in ("batch_size", "num_batches_per_iter", "num_iters"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def run(args: argparse.Namespace) -> dict[str, Any] | None:
    import torch
    import torch.nn.functional as F
    from trainkit.dist import Backend, init_backend, sync_figures
    from trainkit.resnet import build_model

    from hpcdl.jobside import requeue, steps

    if args.threads:
        torch.set_num_threads(args.threads)
    backend = Backend() if args.backend == "none" else init_backend(args.backend)
    if args.backend == "none":
        backend._pin_device()
    rank, size, device = backend.rank, backend.size, backend.device
    cuda = device.type == "cuda"
    use_amp = cuda if args.amp == "auto" else args.amp == "on" and cuda
    fmt = torch.channels_last if cuda else torch.contiguous_format

    torch.manual_seed(args.seed)
    model = build_model(args.model, args.num_classes).to(device,
                                                          memory_format=backend.param_format(fmt))
    optimizer: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * size)
    train_model, optimizer = backend.wrap(
        model, optimizer, fp16_allreduce=args.fp16_allreduce, batches_per_allreduce=1
    )
    backend.broadcast_state(model, optimizer, None)
    scaler = torch.amp.GradScaler("cuda") if use_amp else None

    torch.manual_seed(args.seed + rank)
    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
    data = data.contiguous(memory_format=fmt)
    target = torch.randint(args.num_classes, (args.batch_size,), device=device)

    def step() -> float:
        optimizer.zero_grad()
        with torch.autocast(device.type, enabled=use_amp):
            loss = F.cross_entropy(train_model(data), target)
        backend.backward(scaler.scale(loss) if scaler is not None else loss)
        sync = backend.synchronize_then_step(optimizer, scaler)
        if rank == 0:  # a step completed (written once; hpcdl/jobside/requeue.py)
            requeue.mark_step(1)
        steps.beat()  # the hang watchdog's progress (at most once a second; hpcdl/jobside/steps.py)
        return sync

    def log(msg: str) -> None:
        if rank == 0:
            say(msg)

    log(
        f"benchmark: {args.model} {args.image_size}px, batch {args.batch_size}/rank, {size} rank(s), "
        f"backend {args.backend}, device {device.type}, threads {torch.get_num_threads()}, "
        f"amp {'on' if use_amp else 'off'}, fp16 allreduce {'on' if args.fp16_allreduce else 'off'}"
    )
    for _ in range(args.num_warmup_batches):
        step()
    rates = []
    timed_seconds = timed_sync = 0.0
    for i in range(args.num_iters):
        start = time.perf_counter()
        for _ in range(args.num_batches_per_iter):
            timed_sync += step()
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        timed_seconds += seconds
        rate = args.batch_size * args.num_batches_per_iter / seconds
        rates.append(rate)
        log(f"iter #{i}: {rate:.1f} img/sec per rank")
    mean = statistics.fmean(rates)
    conf = 1.96 * statistics.stdev(rates) if len(rates) > 1 else 0.0
    log(f"img/sec per rank: {mean:.1f} +- {conf:.1f}")
    log(f"total img/sec on {size} rank(s): {size * mean:.1f} +- {size * conf:.1f}")
    # Ranks may differ: report the allreduced total, not rank 0's rate times size.
    total = backend.allreduce_sum(torch.tensor([mean], dtype=torch.float64), name="bench.total")
    sync = sync_figures(backend, args.num_iters * args.num_batches_per_iter, timed_seconds, timed_sync)
    result = {
        "backend": args.backend,
        "arch": args.model,
        "world_size": size,
        "nodes": backend.nodes,
        "device": device.type,
        "threads_per_rank": torch.get_num_threads(),
        "image_size": args.image_size,
        "global_batch": args.batch_size * size,
        "images_per_sec": round(float(total[0]), 2),
        "images_per_sec_per_rank": round(float(total[0]) / size, 2),
        "rank0_images_per_sec_ci95": round(conf, 2),
        "iterations": [round(r, 2) for r in rates],
        **sync,
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
