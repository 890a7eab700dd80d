#!/usr/bin/env python3
"""What the per-step metrics cost (hpcdl/jobside/steps.py), against the step time of the
bundled example as the sandbox profile runs it, side by side in one run.

1. The writer alone: ``StepWriter.step`` called ``--calls`` times with a step's real
   values (the loss taken from a torch scalar with ``float(loss.detach())``, as the
   example does), default buffering (a write every 50 steps or 10 s) into a temporary
   directory: microseconds per step, the flushes included.
2. The example: ``examples/resnet50_imagenet.py`` natively under ``torchrun
   --standalone --nproc-per-node 1`` with the sandbox profile's example defaults
   (ResNet-50, 32 px, batch 4, 1 thread) and ``--max-steps``, ``--repeats`` times with
   the metrics on and off, interleaved so background load hits both alike: the
   median step time each way (the example's own ``step_seconds``).

The cost is (1) / (2)'s step time; the on/off difference of (2) is printed beside it as
a check, though on a shared machine its noise is larger than the cost.

  python3 bench/bench_metrics.py                       # defaults below
  python3 bench/bench_metrics.py --steps 60 --repeats 5 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import describe, facts_line  # noqa: E402
from hpcdl.core.proc import run  # noqa: E402
from hpcdl.jobside.protocol import parse_result  # noqa: E402
from hpcdl.jobside.steps import StepWriter, read_metrics  # noqa: E402

EXAMPLE = ROOT / "examples" / "resnet50_imagenet.py"


def sandbox_defaults() -> list[str]:
    """The sandbox profile's defaults for the example (what `hpcdl submit -p sandbox` runs)."""
    from hpcdl.profiles import load_profile

    return list(load_profile("sandbox").examples.per_example["resnet50_imagenet.py"])


def writer_cost(calls: int) -> float:
    """Seconds per StepWriter.step call (median of 5 batches of ``calls``)."""
    import torch

    loss = torch.tensor(2.345)
    batches = []
    with tempfile.TemporaryDirectory() as tmp:
        for b in range(5):
            w = StepWriter(Path(tmp) / str(b), 0, world_size=4, host="n1", attempt=0)
            start = time.perf_counter()
            for i in range(calls):
                w.step(i + 1, epoch=0, step_s=0.1234, data_s=0.0012, sync_s=0.0321, images=4,
                       loss=float(loss.detach()), lr=0.008)
            w.close()
            batches.append((time.perf_counter() - start) / calls)
    return statistics.median(batches)


def example_run(steps: int, metrics_dir: str) -> tuple[float, float | None]:
    """(the example's step_seconds, median step_s from its metrics file or None)."""
    args = [a for a in sandbox_defaults() if not a.startswith("--max-steps")]
    argv = ["torchrun", "--standalone", "--nproc-per-node", "1", str(EXAMPLE), "--backend",
            "ddp", "--synthetic", "--checkpoint-dir=", *args, f"--max-steps={steps}",
            f"--metrics-dir={metrics_dir}"]
    res = run(argv, timeout=900, cwd=ROOT, check=False)
    if res.returncode != 0:
        raise SystemExit(f"example failed ({res.returncode}):\n{res.stdout[-2000:]}\n"
                         f"{res.stderr[-2000:]}")
    result = parse_result(res.stdout)
    assert result is not None, res.stdout[-2000:]
    from_file = None
    if metrics_dir:
        recs = read_metrics(metrics_dir)[0]["steps"][1:]
        from_file = statistics.median(r["step_s"] for r in recs)
    return float(result["step_seconds"]), from_file


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=20000, help="writer calls per batch")
    p.add_argument("--steps", type=int, default=40, help="example steps per run")
    p.add_argument("--repeats", type=int, default=3, help="example runs each way")
    p.add_argument("--json", metavar="PATH", help="also write the figures here")
    args = p.parse_args()
    print("machine: " + facts_line(describe(packages=("torch",))))
    print(f"command: python3 bench/bench_metrics.py --calls {args.calls} --steps {args.steps} "
          f"--repeats {args.repeats}")
    per_call = writer_cost(args.calls)
    on: list[float] = []
    off: list[float] = []
    file_steps: list[float] = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            step, from_file = example_run(args.steps, tmp)
        on.append(step)
        if from_file is not None:
            file_steps.append(from_file)
        off.append(example_run(args.steps, "")[0])
    step_on, step_off = statistics.median(on), statistics.median(off)
    figures: dict[str, Any] = {
        "writer_us_per_step": round(per_call * 1e6, 2),
        "example_step_ms_metrics_on": round(step_on * 1000, 2),
        "example_step_ms_metrics_off": round(step_off * 1000, 2),
        "example_step_ms_from_metrics_file": round(statistics.median(file_steps) * 1000, 2),
        "writer_share_of_step_pct": round(100 * per_call / step_off, 4),
        "on_vs_off_pct": round(100 * (step_on - step_off) / step_off, 2),
        "runs": {"on_ms": [round(x * 1000, 2) for x in on],
                 "off_ms": [round(x * 1000, 2) for x in off]},
        "example_args": [*sandbox_defaults(), f"--max-steps={args.steps}"],
    }
    print(f"example: {EXAMPLE.name} (1 rank, torchrun, DDP), sandbox defaults, "
          f"{args.steps} steps, {args.repeats} runs each way (medians)")
    print(f"{'what':<48} {'value':>12}")
    print(f"{'metrics writer, per step (flushes included)':<48} "
          f"{figures['writer_us_per_step']:>9.2f} us")
    print(f"{'example step, metrics off':<48} {figures['example_step_ms_metrics_off']:>9.2f} ms")
    print(f"{'example step, metrics on':<48} {figures['example_step_ms_metrics_on']:>9.2f} ms")
    print(f"{'example step, from its metrics file (on)':<48} "
          f"{figures['example_step_ms_from_metrics_file']:>9.2f} ms")
    print(f"{'writer cost / step time':<48} {figures['writer_share_of_step_pct']:>10.4f} %")
    print(f"{'on vs off (noise of a shared machine included)':<48} "
          f"{figures['on_vs_off_pct']:>+10.2f} %")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
