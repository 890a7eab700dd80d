"""A user's own torchrun-style script that follows hpcdl's resume contract (and imports
nothing of hpcdl), for the spare-node tests: it hangs once on one host.

    python3 resume_hang.py --steps N [--every K] [--hang-at S] [--hang-host HOST]
                           [--beat] [--hang-when-relaunched] [--hold-until FILE]

Every rank does N all_reduce steps of a running value, one line each. Rank 0 writes a
checkpoint (the value and the step) to $HPCDL_CHECKPOINT_DIR every K steps, atomically;
on start every rank resumes from the newest one. On HOST (its short host name) the rank
sleeps for an hour at step S (hang_here) while the others wait in the next all_reduce.
At the end rank 0 prints ``RESULT value=V steps=N resumed_from=STEP``: the value does not
depend on where the run was interrupted, so a relaunched run ends as an uninterrupted one.
With --beat every rank writes its heartbeat after each step as hpcdl's ranks do
($HPCDL_HEARTBEAT_DIR/rank-R: the step), by hand; with --hang-when-relaunched every rank
of a relaunched step ($HPCDL_CYCLE > 0) hangs before its first step, so before its first
heartbeat. With --hold-until every rank, its steps done, waits for FILE to exist before
the end (a line a second meanwhile, which the job's hang watchdog counts as progress): a
test that looks at the running step says when it has seen enough, instead of the step
training for as long as the test might look.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import time


def hang_here() -> None:
    time.sleep(3600)  # the hang: the watchdog names this frame


def newest(directory: str) -> tuple[int, float] | None:
    found = []
    for name in os.listdir(directory) if os.path.isdir(directory) else ():
        if name.startswith("step-") and name.endswith(".txt"):
            found.append(int(name[5:-4]))
    if not found:
        return None
    with open(os.path.join(directory, f"step-{max(found)}.txt")) as fh:
        return max(found), float(fh.read())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--hang-at", type=int, default=-1)
    parser.add_argument("--hang-host", default="")
    parser.add_argument("--step-s", type=float, default=0.3)
    parser.add_argument("--beat", action="store_true")
    parser.add_argument("--hang-when-relaunched", action="store_true")
    parser.add_argument("--hold-until", default="")
    args = parser.parse_args()
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=1800))
    rank = dist.get_rank()
    ckpt_dir = os.environ.get("HPCDL_CHECKPOINT_DIR", "checkpoints")
    start, value = 0, 1.0
    found = newest(ckpt_dir)
    if found is not None:
        start, value = found
    host = socket.gethostname().split(".")[0]
    tensor = torch.tensor([value], dtype=torch.float64)
    if args.hang_when_relaunched and int(os.environ.get("HPCDL_CYCLE", "0") or 0) > 0:
        print(f"HANG_AGAIN {time.time():.3f} rank {rank} host {host}", flush=True)
        hang_here()
    beat_dir = os.environ.get("HPCDL_HEARTBEAT_DIR", "") if args.beat else ""
    for step in range(start + 1, args.steps + 1):
        if step == args.hang_at and host == args.hang_host:
            print(f"HANG_START {time.time():.3f} rank {rank} host {host}", flush=True)
            hang_here()
        dist.all_reduce(tensor)
        tensor /= dist.get_world_size()
        tensor = tensor * 1.5 + step
        print(f"step {step} rank {rank} value {tensor.item():.6g}", flush=True)
        if beat_dir:
            with open(os.path.join(beat_dir, f"rank-{rank}"), "w") as fh:
                fh.write(f"{step}\n")
        if rank == 0 and step == start + 1 and os.environ.get("HPCDL_PROGRESS_FILE"):
            open(os.environ["HPCDL_PROGRESS_FILE"], "w").close()
        if rank == 0 and step % args.every == 0:
            os.makedirs(ckpt_dir, exist_ok=True)
            tmp = os.path.join(ckpt_dir, f".step-{step}.tmp")
            with open(tmp, "w") as fh:
                fh.write(repr(tensor.item()))
            os.replace(tmp, os.path.join(ckpt_dir, f"step-{step}.txt"))
        time.sleep(args.step_s)
    while args.hold_until and not os.path.exists(args.hold_until):
        print(f"HOLD rank {rank} host {host}: until {args.hold_until} exists", flush=True)
        time.sleep(1)
    if rank == 0:
        print(f"RESULT value={tensor.item()!r} steps={args.steps} resumed_from={start}",
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
