#!/usr/bin/env python3
"""How long `hpcdl track` takes for a 1,000-step, 8-rank run: the run's metrics written by
the real writer (hpcdl.jobside.steps.StepWriter, default buffering, 8 rank files), then
tracked through hpcdl.track (what the CLI runs, in this process):

  read        reading and aggregating the 8 rank files (hpcdl.track.source.read_run)
  tensorboard first pass (every step written) and second pass (nothing new: the event
              file is read back to find that out)
  mlflow      the same into a local sqlite store (sqlite:///TMP/mlflow.db), and with
              --server into a real `mlflow server` started here (loopback, its own sqlite
              store): first pass (the run created, 6 series x 1,000 points, the report
              made and uploaded) and second pass (the histories read back, nothing
              logged); a 2-step run is tracked first into each store, so mlflow's import
              and a new store's tables (``setup``) are apart

  python3 bench/bench_track.py                 # 1,000 steps, 8 ranks, local store only
  python3 bench/bench_track.py --server        # also a real tracking server
  python3 bench/bench_track.py --steps 200 --ranks 4 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import describe, facts_line  # noqa: E402
from hpcdl.jobside.steps import StepWriter, metrics_dir  # noqa: E402
from hpcdl.track.run import Sinks, track_once  # noqa: E402
from hpcdl.track.source import read_run  # noqa: E402


def make_run(run_dir: Path, steps: int, ranks: int) -> None:
    """A finished run: plan.json, result.json, and every rank's metrics (the real writer)."""
    run_dir.mkdir(parents=True)
    (run_dir / "plan.json").write_text(json.dumps({
        "nodes": max(1, ranks // 4), "gpus_per_node": min(4, ranks), "ntasks": ranks,
        "backend": "ddp", "profile": "bench", "job_name": "bench",
        "command": ["python3", "train.py", "--lr", "0.1", "--batch-size", "32"]}))
    (run_dir / "result.json").write_text(json.dumps({
        "state": "COMPLETED", "hpcdl_result": {"images_per_sec": 1234.5, "steps": steps}}))
    for rank in range(ranks):
        w = StepWriter(metrics_dir(run_dir), rank, world_size=ranks, host=f"n{rank // 4}",
                       attempt=0, job_id="1")
        for i in range(1, steps + 1):
            w.step(i, epoch=i // 100, step_s=0.1 + 0.001 * rank, data_s=0.002, sync_s=0.01,
                   images=32, loss=3.0 / i, lr=0.1)
        w.close()


def timed(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return round(time.perf_counter() - start, 3), out


def start_server(store: Path) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
            f"sqlite:///{store}/server.db", "--artifacts-destination", str(store / "artifacts"),
            "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              cwd=store, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        try:
            urllib.request.urlopen(uri + "/health", timeout=2).close()
            return server, uri
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("mlflow server did not start") from None
            time.sleep(0.3)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--server", action="store_true", help="also track into a real mlflow server")
    p.add_argument("--json", metavar="PATH", help="also write the figures here")
    args = p.parse_args()
    print("machine: " + facts_line(describe(packages=("mlflow", "tensorboard"))))
    print(f"command: python3 bench/bench_track.py --steps {args.steps} --ranks {args.ranks}"
          + (" --server" if args.server else ""))
    figures: dict[str, Any] = {"steps": args.steps, "ranks": args.ranks}
    with tempfile.TemporaryDirectory(prefix="bench-track-") as tmp:
        base = Path(tmp)
        run = base / "bench-20260101-000000-abcdef"
        make_run(run, args.steps, args.ranks)
        figures["read_s"], source = timed(lambda: read_run(run))
        assert len(source.points) == args.steps
        from hpcdl.track.to_tensorboard import TensorBoardSink

        for label in ("tensorboard_first_s", "tensorboard_again_s"):
            sinks = Sinks(tensorboard=TensorBoardSink(base / "tb"))
            figures[label], _ = timed(lambda s=sinks: track_once([run], s))  # type: ignore[misc]
            sinks.close()
        from hpcdl.track.to_mlflow import MlflowSink

        targets = [("sqlite", f"sqlite:///{base}/mlflow.db")]
        server = None
        if args.server:
            (base / "server").mkdir()
            server, uri = start_server(base / "server")
            targets.append(("server", uri))
        try:
            make_run(base / "warm-up", 2, 1)
            for name, uri in targets:
                # A tiny run first: mlflow's import and a new store's tables (seconds,
                # once per store) are not the tracking's cost.
                figures[f"mlflow_{name}_setup_s"], _ = timed(lambda u=uri: track_once(
                    [base / "warm-up"], Sinks(mlflow=MlflowSink(u, "bench"))))
                for label in ("first", "again"):
                    sinks = Sinks(mlflow=MlflowSink(uri, "bench"))
                    figures[f"mlflow_{name}_{label}_s"], out = timed(
                        lambda s=sinks: track_once([run], s))  # type: ignore[misc]
                    figures[f"mlflow_{name}_{label}_points"] = out[0]["mlflow"]["points_logged"]
        finally:
            if server is not None:
                os.killpg(server.pid, 15)
                server.wait(timeout=30)
    for key, value in figures.items():
        print(f"{key:32} {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
