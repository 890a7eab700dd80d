#!/usr/bin/env python3
"""The requeue contract for your own training script (hpcdl submit --requeue / --chain).

    hpcdl submit -p sandbox -N 1 -G 1 --requeue -- python3 examples/requeue_contract.py

What hpcdl's batch script gives every rank (hpcdl/requeue.py documents it):

* ``$HPCDL_CHECKPOINT_DIR``: keep checkpoints here; every attempt sees the same one.
* ``$HPCDL_REQUEUE_FLAG``: a file that appears when Slurm's signal came (time limit
  soon, or preemption). Check it at step boundaries, never act in a signal handler:
  finish the step, write a checkpoint atomically, exit 85.
* Start by loading the newest checkpoint that loads (fall back past a damaged one).

Multi-rank scripts must agree on stopping at the same step (e.g. all-reduce the
flag's 0/1), or the others wait in their next collective. This one is a single
process with a counter as its "model", so it runs anywhere, with or without hpcdl.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

EXIT_REQUEUE = 85  # hpcdl.requeue.EXIT_REQUEUE: "checkpoint written, requeue me"


def requested() -> bool:
    flag = os.environ.get("HPCDL_REQUEUE_FLAG")
    return bool(flag and Path(flag).exists())


def save(directory: Path, step: int, state: dict) -> None:
    # Atomic: a temp file in the same directory, fsync, rename over the final name.
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".ckpt-", suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, directory / f"ckpt-{step:08d}.json")


def load_newest(directory: Path) -> dict | None:
    for path in sorted(directory.glob("ckpt-*.json"), reverse=True):
        try:
            return dict(json.loads(path.read_text()))
        except (OSError, ValueError):
            print(f"skipping damaged checkpoint {path.name}", file=sys.stderr)
    return None


def main(steps: int = 100, step_seconds: float = 0.5) -> int:
    ckpt = Path(os.environ.get("HPCDL_CHECKPOINT_DIR", "checkpoints"))
    state = load_newest(ckpt) or {"step": 0, "total": 0}
    print(f"attempt {os.environ.get('SLURM_RESTART_COUNT', '0')}: starting at step {state['step']}")
    while state["step"] < steps:
        time.sleep(step_seconds)  # one training step
        state = {"step": state["step"] + 1, "total": state["total"] + state["step"]}
        if state["step"] % 20 == 0:
            save(ckpt, state["step"], state)  # periodic: what a crash resumes from
        if requested():
            save(ckpt, state["step"], state)
            print(f"stopping after step {state['step']}: requeue me")
            return EXIT_REQUEUE
    save(ckpt, state["step"], state)
    print(f"done: total {state['total']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
