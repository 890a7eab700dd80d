#!/usr/bin/env python3
"""The requeue contract for your own training script (hpcdl submit --requeue / --chain).

    hpcdl submit -p sandbox -N 1 -G 1 --requeue -- python3 examples/requeue_contract.py

What hpcdl's batch script gives every rank (hpcdl/jobside/requeue.py documents it):

* ``$HPCDL_CHECKPOINT_DIR``: keep checkpoints here; every attempt sees the same one.
* ``$HPCDL_REQUEUE_FLAG``: a file that appears when Slurm's signal came (time limit
  soon, or preemption). Check it at step boundaries, never act in a signal handler:
  finish the step, write a checkpoint atomically, exit 85.
* Start by loading the newest checkpoint that loads (fall back past a damaged one).
* ``$HPCDL_PROGRESS_FILE``: create it once this attempt has completed its first step
  (any content; ``hpcdl.jobside.requeue.mark_step`` writes the attempt and step). The batch
  shell removes it before each attempt: an attempt that fails without it (and without
  exiting 85) failed before its first step (container, imports, rendezvous) and is not
  requeued, since it would fail again the same way; one that runs into its time limit
  without it looks hung and is not requeued either. hpcdl reports both in one line.

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

EXIT_REQUEUE = 85  # hpcdl.jobside.requeue.EXIT_REQUEUE: "checkpoint written, requeue me"


def requested() -> bool:
    flag = os.environ.get("HPCDL_REQUEUE_FLAG")
    return bool(flag and Path(flag).exists())


def mark_first_step(step: int) -> None:
    # Once per attempt, after its first step: "this attempt made progress".
    path = os.environ.get("HPCDL_PROGRESS_FILE")
    if path:
        Path(path).write_text(json.dumps({"attempt": int(os.environ.get("SLURM_RESTART_COUNT", "0")),
                                          "step": step, "time": time.time()}) + "\n")


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
    first = True
    while state["step"] < steps:
        time.sleep(step_seconds)  # one training step
        state = {"step": state["step"] + 1, "total": state["total"] + state["step"]}
        if first:
            mark_first_step(state["step"])
            first = False
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
