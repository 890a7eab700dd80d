"""A user's own torch.distributed (gloo) script for the hang watchdog's tests and
benchmark; it imports nothing of hpcdl and prints nothing special.

    python3 gloo_hang.py --steps N [--step-s S] [--slow-rank R] [--beat]

Every rank does N all_reduce steps, printing one line each (--beat: and writing its
heartbeat file after each, as hpcdl.jobside.steps.beat would: $HPCDL_HEARTBEAT_DIR/rank-R,
the progress the job's hang watchdog reads; written here without importing hpcdl). With --slow-rank R, rank R
then sleeps for an hour (slow_step) while the others wait in the next all_reduce: the
classic hang of one rank holding up the collective. Before it sleeps it prints
``HANG_START <epoch seconds>`` so a test can time the watchdog.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time


def slow_step() -> None:
    time.sleep(3600)  # the hang: the watchdog must name this frame


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--step-s", type=float, default=0.5)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--beat", action="store_true")
    args = parser.parse_args()
    print(f"rank {os.environ.get('RANK')} starting", flush=True)
    import torch
    import torch.distributed as dist

    print(f"rank {os.environ.get('RANK')} imported torch", flush=True)
    # Longer than any test: the watchdog, not gloo's own timeout, must end the hang.
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=1800))
    rank = dist.get_rank()
    value = torch.ones(4)
    for step in range(args.steps):
        dist.all_reduce(value)
        print(f"step {step} rank {rank} value {value[0].item():g}", flush=True)
        if args.beat and os.environ.get("HPCDL_HEARTBEAT_DIR"):
            with open(os.path.join(os.environ["HPCDL_HEARTBEAT_DIR"], f"rank-{rank}"), "w") as fh:
                fh.write(f"{step}\n")
        time.sleep(args.step_s)
    if rank == args.slow_rank:
        print(f"HANG_START {time.time():.3f} rank {rank}", flush=True)
        slow_step()
    dist.all_reduce(value)
    print(f"done rank {rank}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
