"""Every documented bench command runs: each bench under bench/ at its smallest size,
against the real sandbox where it needs one, must exit 0 and print what it measured, the
machine, and the command to rerun (parametrized per bench, so a failure names it).

The sizes are the smallest that still measure something (one repeat, a few steps, one
node where the bench allows it); the figures are not checked, only that they are there.

Left out, and why:
  bench_probe.py          another engineer owns it (and its test, test_probe.py)
  bench_gpu_image.py,     need an NVIDIA GPU (and the multi-GB GPU image)
  gpu_check.py
  bench_image.py,         a full image build (minutes on 2 cores) is what they measure
  bench_build_check.py,
  bench_unsquash.py
  bench_sandbox_net.py,   each starts clusters of its own (network namespaces, 3 to 32
  bench_image_stage.py,   nodes) and runs the image on every node: minutes each, over
  bench_scale_faults.py,  this module's budget of ~3 minutes on 2 cores
  bench_scale_nodes.py,
  bench_spares.py
  bench_remote.py,        need the ordinary user's venv and the SSH login node that
  bench_remote_detect.py  tests/integration/conftest_remote.py sets up (as do their tests)
  bench_training.py       four launchers (torchrun, horovodrun, mpirun) x 1 and 2 ranks:
                          over the budget even at one batch
  bench_metrics.py        run by hand at its smallest size (--calls 200 --steps 3
                          --repeats 1): passes, but 63 s (two torchrun starts of ResNet-50)
  bench_data.py           run by hand at its smallest size (--classes 2 --per-class 4
                          --val-per-class 1 --images 8 --batch 4): passes, but 79 s (the
                          loader with 0-2 workers, three variants, each a torch start)
  bench_data_nodes.py     run by hand at its smallest size (--classes 10 --per-class 20
                          --own-cluster): passes in 53 s, 85 s with --epochs 2 (three 2-node
                          jobs in the image, each a torch start per rank), over the
                          budget on a loaded machine; needs root (fanotify)
The rest took 137 s together on this 2-core VM with the sandbox up and other tests
running (load ~7; 2026-11-26): bench_e2e (42 s), the hang watchdog (28 s) and
bench_track's MLflow set-up (20 s) are most of it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.parallel import SANDBOX

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 600  # s: a hard limit per bench; the smoke sizes take seconds to a minute


@dataclass(frozen=True)
class Bench:
    script: str
    args: tuple[str, ...]
    measured: str  # a regular expression for the line with the measured figure
    slurm: bool = False  # needs the shared sandbox
    image: bool = False  # needs the CPU image (passed as --image)


BENCHES = [
    Bench("bench_rankenv.py", ("--runs", "5"),
          r"medians of 5 runs: /bin/true [\d.]+ ms; through the staged wrapper file [\d.]+ ms"),
    Bench("bench_cluster_user.py", ("--pairs", "0", "--repeats", "3"),
          r"staging the job-side files: \d+ files, \d+ bytes; .* copying median [\d.]+ ms"),
    Bench("bench_track.py", ("--steps", "20", "--ranks", "2"), r"^mlflow_sqlite_first_s\s+[\d.]+$"),
    Bench("bench_scale.py", ("--planning", "--points", "8", "--profile-nodes", "16",
                             "--repeats", "1"),
          r"hpcdl scale --dry-run, 8 points \(CLI\)\s+[\d.]+"),
    Bench("bench_detect.py", ("--nodes", "2", "--repeats", "1"), r"\s+2\s+2\s+[\d.]+"),
    # Root (loop mounts, dropping the page cache): as make test runs.
    Bench("bench_pack_blocks.py", ("--classes", "3", "--per-class", "4", "--blocks", "4K,auto",
                                   "--repeats", "1"),
          r"^--block-size auto\s+[\d.]+\s+[\d.]+\s+[\d.]+$"),
    Bench("bench_polling.py", ("--jobs", "1", "--real-jobs", "1", "--real-seconds", "1",
                               "--baseline-cycles", "2"),
          r"sandbox, 1 jobs\s+batched\s+\d+\s+[\d.]+\s+\d+", slurm=True),
    Bench("bench_sweep.py", ("--points", "10", "--follow", "10", "--throttle", "5",
                             "--real", "10"),
          r"sandbox\s+10 array\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+1\s+\d+", slurm=True),
    Bench("bench_submit.py", ("--pairs", "1", "--wait-pairs", "1"),
          r"cli: hpcdl submit\s+1\s+[\d.]+ ms\s+[\d.]+ ms\s+[\d.]+", slurm=True),
    # 30 s, not the bench's 10: in a whole run the ranks' start-up (the image, torch's
    # import) alone was quiet for over 10 s, and the watchdog fired before the hang.
    Bench("bench_hang_watchdog.py", ("--runs", "1", "--timeout", "30", "--nodes", "1",
                                     "--gpus", "2"),
          r"hang -> diagnosis, median of 1 .*: [\d.]+ s: silent", slurm=True, image=True),
    Bench("bench_e2e.py", ("--pairs", "1", "--steps", "3", "--nodes", "1", "--gpus", "1",
                           "--backend", "ddp", "--warmups", "0"),
          r"images/sec\s+[\d.]+\s+[\d.]+\s+[\d.]+", slurm=True, image=True),
    Bench("bench_scale.py", ("--nodes", "1", "--gpus", "1", "--backends", "ddp", "--steps", "3",
                             "--batch-size", "4", "--repeats", "1"),
          r"^ddp-n1-g1-b4\s+1\s+[\d.]+\s+1\.00", slurm=True, image=True),
]


def _id(bench: Bench) -> str:
    name = bench.script.removesuffix(".py")
    if bench.script == "bench_scale.py":
        name += "-sweep" if bench.slurm else "-planning"
    return name


@pytest.mark.parametrize("bench", [
    # The sandbox's benches run in its xdist group (tests/parallel.py): the fixture is
    # asked for inside the test, where the grouping cannot see it.
    pytest.param(b, id=_id(b), marks=[m for m, on in ((pytest.mark.slurm, b.slurm),
                                                       (pytest.mark.xdist_group(SANDBOX), b.slurm),
                                                       (pytest.mark.apptainer, b.image)) if on])
    for b in BENCHES])
def test_bench_smoke(bench: Bench, request: pytest.FixtureRequest) -> None:
    if bench.slurm:
        request.getfixturevalue("slurm_cluster")
    args = list(bench.args)
    if bench.image:
        args += ["--image", str(request.getfixturevalue("cpu_image"))]
    argv = [sys.executable, str(REPO / "bench" / bench.script), *args]
    # hpcdl from this checkout, in the bench and in every `python -m hpcdl` it starts.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    res = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, check=False,
                         cwd=REPO, env=env)
    out = res.stdout
    shown = f"{' '.join(argv)} (exit {res.returncode}):\n{out[-4000:]}\n{res.stderr[-4000:]}"
    assert res.returncode == 0, shown
    assert "Traceback" not in res.stderr, shown
    assert re.search(bench.measured, out, re.MULTILINE), f"no measured line: {shown}"
    assert re.search(r"^machine: .*cores\W{1,3}\d+", out, re.MULTILINE), \
        f"no machine line: {shown}"
    rerun = re.search(r"^(?:rerun|reproduce|command): .*python3 bench/" + re.escape(bench.script),
                      out, re.MULTILINE)
    assert rerun, f"no command to rerun: {shown}"
