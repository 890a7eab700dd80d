#!/usr/bin/env python3
"""GPU check: one command that proves hpcdl's GPU paths on a lent GPU machine (one
NVIDIA GPU, torch with CUDA and torchvision, no Slurm, Apptainer, Horovod or network)
in under 10 minutes, and writes what it found as JSON and as a markdown table.

Steps, each with its own time budget; a failed step is recorded with its error's last
lines and the next one still runs (the report is rewritten after every step, so even a
killed run leaves what it finished):

  1. gpu_tests     the gpu-marked tests, natively: tests/unit/examples/test_examples_gpu.py with
                   pytest --noconftest (skipped, saying so, when pytest is missing); the
                   other gpu-marked tests need Apptainer and the GPU image
  2. example       examples/resnet50_imagenet.py (synthetic uint8 data, ResNet-50, AMP and
                   channels_last, batch 256) under `python -m torch.distributed.run
                   --nproc-per-node 1` (DDP over NCCL, world 1) and plain; images/s after
                   warm-up against a minimal training loop of the same model and batch
                   (the ceiling: the ratio is the example's own overhead) and against
                   NVIDIA's published ResNet-50 v1.5 AMP figures
  2b. tuning      the example's step, part by part: the example in one process per
                   variant with one change patched in (by default synthetic_float32, the
                   old input, and device_batch, no input path), then a profiler trace
  3. data          the example's JPEG loader on a generated ImageNet-sized set
                   (hpcdl.data.tiny) with 4, 8 and 16 workers; decoding only (what any
                   lighter PIL pipeline is bounded by); nvJPEG decode and augmentation on
                   the GPU (torchvision.io.decode_jpeg(device='cuda')); whether each can
                   feed the rate the example trains at in step 2; then the example itself
                   training from those JPEGs with --decode gpu (--decode tensor, its CPU
                   equivalent, with --cpu), the same with the crop and resize image by
                   image (as before), --decode cpu and --synthetic, at most 8 loader
                   workers: images/s and the share of each step waiting for data
  4. checkpoint    a checkpoint written from GPU tensors with the example's own code
                   (trainkit.loop.Checkpoints), resumed into a fresh model: the same state
  5. apptainer_nv  `apptainer exec --nv`: the machine's Apptainer or the carried one
                   (Debian sid's .deb, unpacked and relocated) on a tiny image, without
                   and with --nv; skipped, saying why, where neither is there
  6. horovod       Horovod built there from the carried source archive (NCCL GPU
                   operations, Gloo) in what the check has left, then the example one
                   rank; skipped naming every missing prerequisite

What steps 5 and 6 take from the GPU machine's lack is prepared here first, into
.cache/gpu-carry (about 30 MiB), which the device tool is then told to carry:

  python3 bench/gpu_check.py --prepare-carry

--cpu runs the same steps small (ResNet-18, 32 px, a few steps, a few dozen images, 0-1
workers) with CUDA hidden, every GPU part reported as skipped with the reason; it
finishes in well under a minute on 2 cores. Exit status 1 if any step failed (skipped is
not failed). Files go to $OUT if set (the device tool's output folder), else here.

  python3 bench/gpu_check.py --json $OUT/gpu.json --md $OUT/gpu.md    # on the GPU machine
  python3 bench/gpu_check.py --cpu --json /tmp/gpu.json --md /tmp/gpu.md

Needs only the standard library, torch, torchvision (GPU decode and a second ceiling;
optional) and this checkout; nothing is installed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).resolve()
EXAMPLE = ROOT / "examples" / "resnet50_imagenet.py"
NATIVE_GPU_TESTS = ROOT / "tests" / "unit" / "examples" / "test_examples_gpu.py"
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]  # hpcdl, bench and trainkit

from bench.machine import describe, facts_line  # noqa: E402

CHILD_TAG = "GPU_CHECK_CHILD "
# NVIDIA DeepLearningExamples, PyTorch ResNet-50 v1.5, AMP, batch 256, one GPU (DALI
# loader, real ImageNet): training images/s as published, rounded.
PUBLIC = {"A100": 2500, "H100": 3000}
PUBLIC_SOURCE = ("NVIDIA DeepLearningExamples PyTorch ResNet-50 v1.5, AMP, batch 256, "
                 "one GPU: ~2,500 img/s on an A100, ~3,000 on an H100")
# The launch variables a surrounding job (Slurm, mpirun, torchrun, hpcdl) would leave:
# the check's runs are single processes or torchrun's own world of one.
_JOB_PREFIXES = ("SLURM_", "SRUN_", "OMPI_", "PMIX_", "PMI_", "HOROVOD_", "TORCHELASTIC_",
                 "HPCDL_")
_JOB_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
              "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES")


@dataclass(frozen=True)
class Sizes:
    """How big each step runs: the real thing on a GPU, a token of it on the CPU."""

    arch: str
    image_size: int
    batch: int
    classes: int
    example_steps: int  # steps of each example run
    example_warmup: int  # of them, left out of images/s (cuDNN autotuning, allocator)
    ceiling_steps: int
    ceiling_warmup: int
    tiny_classes: int  # the generated JPEG set
    tiny_per_class: int
    tiny_size: int
    loader_batch: int
    workers: tuple[int, ...]
    gpu_decode_batches: int
    threads: int  # torch threads per process, 0: the example's own default
    jpeg_steps: int = 0  # steps of each example run from the JPEGs (one epoch at most)
    jpeg_warmup: int = 0  # of them, left out of images/s
    budgets: dict[str, float] = field(default_factory=dict)  # seconds per step


GPU_SIZES = Sizes(
    arch="resnet50", image_size=224, batch=256, classes=1000,
    example_steps=50, example_warmup=15, ceiling_steps=40, ceiling_warmup=15,
    # 416 x 416 ~ the pixel count of an average ImageNet photo (~470 x 390); 5,128 files,
    # read again and again (sampled with replacement) from the page cache; 20 steps of
    # 256 for the example's own runs from them.
    tiny_classes=8, tiny_per_class=640, tiny_size=416,
    loader_batch=64, workers=(4, 8, 16), gpu_decode_batches=8, threads=0,
    jpeg_steps=20, jpeg_warmup=6,
    # Within the 560 s of the whole check (the lent machine's 10-minute call): what each
    # took on the H200 on 2026-11-28, plus a margin; Horovod's build gets what is left.
    budgets={"gpu_tests": 90, "example": 110, "tuning": 110, "data": 170, "checkpoint": 30,
             "apptainer_nv": 45, "horovod": 480},
)  # fmt: skip
CPU_SIZES = Sizes(
    arch="resnet18", image_size=32, batch=8, classes=10,
    example_steps=8, example_warmup=2, ceiling_steps=5, ceiling_warmup=2,
    tiny_classes=4, tiny_per_class=12, tiny_size=64,
    # One thread: two processes on 2 shared cores would otherwise oversubscribe them.
    loader_batch=8, workers=(0, 1), gpu_decode_batches=0, threads=1,
    jpeg_steps=6, jpeg_warmup=2,
    # Room for a loaded shared 2-core VM (load 9: 222 s for all of it, the tuning step's
    # four variants 58 s); idle, the whole check takes about a minute.
    budgets={"gpu_tests": 60, "example": 90, "tuning": 100, "data": 120, "checkpoint": 30,
             "apptainer_nv": 15, "horovod": 60},
)  # fmt: skip

STEPS = (
    ("gpu_tests", "gpu-marked tests"),
    ("example", "bundled example, synthetic"),
    ("tuning", "the example's step, part by part"),
    ("data", "JPEG data path"),
    ("checkpoint", "checkpoint round trip"),
    ("apptainer_nv", "apptainer --nv"),
    ("horovod", "Horovod from source, one rank"),
)


# ---------------------------------------------------------------------------------------
# Running things: every command in its own process group with a hard timeout


class StepFailed(Exception):
    """A step's failure; ``tail`` holds the last lines of the output that explain it."""

    def __init__(self, message: str, tail: str = "",
                 figures: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.tail = tail
        self.figures = figures or {}


@dataclass
class Ran:
    argv: list[str]
    returncode: int
    output: str
    seconds: float
    timed_out: bool


def last_lines(text: str, n: int = 25) -> str:
    return "\n".join(text.rstrip().splitlines()[-n:])


def clean_env(cpu: bool, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_JOB_PREFIXES) and k not in _JOB_NAMES}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    if cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""  # --cpu means CPU even on a GPU machine
    elif "CUDA_VISIBLE_DEVICES" in os.environ:
        env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
    env.update(extra or {})
    return env


def run_logged(argv: list[str], *, timeout: float, env: dict[str, str], log: Path,
               cwd: Path | None = None) -> Ran:
    """Run ``argv`` with its output (stdout and stderr) into ``log``. On timeout the whole
    process group is killed: torchrun's workers would otherwise outlive their launcher
    and keep the GPU busy for the next step."""
    start = time.monotonic()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as fh:
        fh.write(f"$ {shlex.join(argv)}\n")
        fh.flush()
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=cwd or ROOT, start_new_session=True)
        timed_out = False
        try:
            rc = proc.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            timed_out = True
            rc = 124
        finally:
            # Also after a normal exit: nothing the command started may outlive it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    output = log.read_text(errors="replace")
    if timed_out:
        with log.open("a") as fh:
            fh.write(f"\n[gpu_check: killed after {timeout:.0f} s]\n")
    return Ran(argv, rc, output, time.monotonic() - start, timed_out)


class Check:
    """Where the run stands: mode, sizes, budget, directories."""

    def __init__(self, cpu: bool, sizes: Sizes, budget: float, work: Path, logs: Path,
                 image: str | None) -> None:
        self.cpu = cpu
        self.sizes = sizes
        self.deadline = time.monotonic() + budget
        self.work = work
        self.logs = logs
        self.image = image
        self.facts: dict[str, Any] = {}
        self.results: dict[str, dict[str, Any]] = {}
        self.step_deadline = self.deadline
        self.variants: tuple[str, ...] = ()  # --variants: the tuning step's subset
        self.profile = True  # the tuning step's profiler trace
        self.ceiling_in_tuning = False  # the minimal loop measured in the tuning step too
        self.carry = ROOT / ".cache" / "gpu-carry"  # what --prepare-carry put there
        self.build_horovod = False  # --cpu: try the Horovod build too (minutes)
        self.torchvision_ceiling = False  # the example step's second ceiling

    def left(self) -> float:
        return min(self.step_deadline, self.deadline) - time.monotonic()

    def env(self, **extra: str) -> dict[str, str]:
        return clean_env(self.cpu, extra)

    def command(self, argv: list[str], name: str, cap: float | None = None,
                env: dict[str, str] | None = None, cwd: Path | None = None) -> Ran:
        """Run ``argv`` within what is left of the step (and ``cap``); raises StepFailed
        when nothing is left."""
        left = self.left() if cap is None else min(cap, self.left())
        if left < 3:
            raise StepFailed(f"{name}: no time left in the step's budget")
        return run_logged(argv, timeout=left, env=env or self.env(), log=self.logs / f"{name}.log",
                          cwd=cwd)

    def child(self, name: str, params: dict[str, Any], cap: float | None = None,
              log: str | None = None) -> dict[str, Any]:
        """Run one of this script's --child parts in a fresh interpreter (a crash, an
        out-of-memory or a hang there costs that part, not the report) and return the
        dict it printed. Raises StepFailed with the output's last lines otherwise."""
        argv = [sys.executable, str(SCRIPT), "--child", name, "--params", json.dumps(params)]
        ran = self.command(argv, f"child-{log or name}", cap)
        for line in reversed(ran.output.splitlines()):
            if line.startswith(CHILD_TAG):
                result: dict[str, Any] = json.loads(line[len(CHILD_TAG):])
                return result
        why = "timed out" if ran.timed_out else f"exit {ran.returncode}"
        raise StepFailed(f"{name} ({why}, {ran.seconds:.0f} s)", last_lines(ran.output))


# ---------------------------------------------------------------------------------------
# Step 1: the gpu-marked tests


def gpu_marked_files() -> list[Path]:
    marker = "pytest.mark." + "gpu"  # split: this file is no test and must not match itself
    return sorted(p for p in (ROOT / "tests").rglob("test_*.py") if marker in p.read_text())


def junit_cases(path: Path) -> list[dict[str, Any]]:
    import xml.etree.ElementTree as ET  # our own pytest's report, not outside input

    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for part in case:
            if part.tag in ("failure", "error"):
                outcome, message = "failed", (part.get("message") or "")[:300]
            elif part.tag == "skipped":
                outcome, message = "skipped", (part.get("message") or "")[:300]
        cases.append({"test": case.get("name"), "outcome": outcome,
                      "seconds": round(float(case.get("time") or 0), 2), "message": message})
    return cases


def native_gpu_pytest(c: Check, name: str, *select: str,
                      env: dict[str, str] | None = None) -> tuple[Ran, list[str], list[dict[str, Any]]]:
    """The gpu-marked tests of NATIVE_GPU_TESTS (``select``: more pytest arguments, e.g.
    ``-k horovod``): (the run, its argv, each test's outcome)."""
    junit = c.work / f"{name}.xml"
    # --noconftest: tests/conftest.py's plugins import hpcdl's own dependencies (yaml,
    # pydantic, ...), which a bare GPU machine lacks; the native module needs none.
    argv = [sys.executable, "-m", "pytest", "-m", "gpu", *select, "--noconftest", "-p",
            "no:cacheprovider", "-q", "-rs", "--tb=short", f"--junitxml={junit}",
            str(NATIVE_GPU_TESTS)]
    ran = c.command(argv, name, env=env)
    if ran.timed_out or not junit.is_file():
        raise StepFailed(f"pytest ({'timed out' if ran.timed_out else f'exit {ran.returncode}'})",
                         last_lines(ran.output))
    return ran, argv, junit_cases(junit)


def step_gpu_tests(c: Check) -> dict[str, Any]:
    if not c.facts.get("pytest_importable"):
        return skipped("pytest is not installed here (`import pytest` fails): the gpu-marked "
                       "tests were not run")
    ran, argv, cases = native_gpu_pytest(c, "pytest-gpu")
    others = [str(p.relative_to(ROOT)) for p in gpu_marked_files() if p != NATIVE_GPU_TESTS]
    # Those run the example under `apptainer exec --nv` from the GPU image, which their
    # fixtures build first (minutes, and the wheels a lent machine does not have).
    why_not = ("apptainer is not on PATH" if shutil.which("apptainer") is None
               else "needs the GPU image (scripts/build-image.sh --gpu); run them with pytest")
    counts = {k: sum(1 for t in cases if t["outcome"] == k) for k in ("passed", "failed", "skipped")}
    figures: dict[str, Any] = {
        "command": shlex.join(["python3", *argv[1:]]).replace(str(ROOT) + "/", ""),
        **counts, "tests": cases,
        "not_run": {f: f"runs under apptainer --nv: {why_not}" for f in others},
    }
    summary = f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"
    if counts["failed"] or ran.returncode not in (0, 5):
        raise StepFailed(f"{summary} (pytest exit {ran.returncode})", last_lines(ran.output),
                         figures)
    if not cases or counts["skipped"] == len(cases):
        reasons = sorted({t["message"] for t in cases}) or ["no test collected"]
        return skipped(f"all {len(cases)} gpu-marked tests skipped: {'; '.join(reasons)}", figures)
    return passed(summary, figures)


# ---------------------------------------------------------------------------------------
# Step 2: the bundled example, under torchrun and plain, against the ceiling


def example_args(s: Sizes, metrics: Path) -> list[str]:
    return ["--backend", "ddp", "--synthetic", "--arch", s.arch,
            "--image-size", str(s.image_size), "--batch-size", str(s.batch),
            "--synthetic-size", str(s.batch * s.example_steps),
            "--synthetic-val-size", str(s.batch * 2), "--val-batches", "1",
            "--num-classes", str(s.classes), "--epochs", "1",
            "--max-steps", str(s.example_steps), "--amp", "on", "--checkpoint-dir", "",
            "--metrics-dir", str(metrics),
            *(["--threads", str(s.threads)] if s.threads else [])]  # fmt: skip


def steady_rate(metrics: Path, batch: int, warmup: int) -> dict[str, Any]:
    """Images/s over the steps after ``warmup`` from the example's own per-step lines
    (rank 0): the batch over the data wait plus the step, so a loader that cannot keep
    up shows."""
    lines = [json.loads(ln) for ln in (metrics / "rank-00000.jsonl").read_text().splitlines()
             if ln.strip()]
    steps = [ln for ln in lines if "step" in ln and ln.get("step_s") is not None]
    timed = steps[warmup:]
    if not timed:
        raise StepFailed(f"only {len(steps)} steps in {metrics}: none after the {warmup} warm-up")
    busy = sum(ln["step_s"] + (ln.get("data_s") or 0.0) for ln in timed)
    data = sum(ln.get("data_s") or 0.0 for ln in timed)
    return {"images_per_sec": round(len(timed) * batch / busy, 1), "timed_steps": len(timed),
            "warmup_steps": warmup, "data_wait_share": round(data / busy, 3),
            "mean_step_s": round(busy / len(timed), 4)}


def wall_rate(metrics: Path, batch: int, warmup: int) -> float | None:
    """Images/s from the host's clock stamps of the step lines after ``warmup``: the
    period between step ends, whatever the step's own figures say."""
    lines = [json.loads(ln) for ln in (metrics / "rank-00000.jsonl").read_text().splitlines()
             if ln.strip()]
    stamps = [ln["t"] for ln in lines if "step" in ln and "t" in ln][warmup:]
    if len(stamps) < 3 or stamps[-1] <= stamps[0]:
        return None
    return round((len(stamps) - 1) * batch / (stamps[-1] - stamps[0]), 1)


def example_rates(metrics: Path, batch: int, warmup: int) -> dict[str, Any]:
    """``steady_rate``'s figures, with ``images_per_sec`` taken from the host's clock
    between step ends where the lines allow (``wall_rate``): on a GPU the loop reads a
    step's figures after it has queued the next, so the steps' own times can overlap the
    data wait. ``step_images_per_sec`` keeps the steps' own figure."""
    rates = steady_rate(metrics, batch, warmup)
    wall = wall_rate(metrics, batch, warmup)
    return {**rates, "step_images_per_sec": rates["images_per_sec"],
            "wall_images_per_sec": wall, "images_per_sec": wall or rates["images_per_sec"]}


def run_example_process(c: Check, argv: list[str], log: str, cap: float, env: dict[str, str],
                        what: str, figures: dict[str, Any] | None = None) -> tuple[Ran, dict[str, Any]]:
    """Run the example (``argv``) and return its output and result record; StepFailed
    naming ``what`` (with the step's ``figures`` so far) when it fails or prints no result."""
    from hpcdl.jobside.protocol import parse_result

    ran = c.command(argv, log, cap, env=env, cwd=c.work)
    result = parse_result(ran.output) if ran.returncode == 0 else None
    if result is None:
        why = "timed out" if ran.timed_out else f"exit {ran.returncode}"
        raise StepFailed(f"{what} ({why}, {ran.seconds:.0f} s)", last_lines(ran.output), figures)
    return ran, result


def run_example(c: Check, label: str, launcher: list[str], cap: float) -> dict[str, Any]:
    s = c.sizes
    metrics = c.work / f"metrics-{label}"
    argv = [*launcher, str(EXAMPLE), *example_args(s, metrics)]
    env = c.env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port())) if label == "plain" \
        else c.env()
    ran, result = run_example_process(c, argv, f"example-{label}", cap, env,
                                      f"example under {label}")
    expected = "cpu" if c.cpu else "cuda"
    if result.get("device") != expected or result.get("amp") is not (not c.cpu):
        raise StepFailed(f"example under {label} ran on {result.get('device')} with amp "
                         f"{result.get('amp')}, not on {expected}", last_lines(ran.output))
    header = re.search(r"workers (\d+), threads (\d+)", ran.output)
    out = {**example_rates(metrics, s.batch, s.example_warmup),
           "example_images_per_sec": result.get("images_per_sec"),
           "device": result.get("device"), "amp": result.get("amp"),
           "launcher": result.get("launcher"), "world_size": result.get("world_size"),
           "synthetic_dtype": result.get("synthetic_dtype"),
           "workers": int(header.group(1)) if header else None,
           "wall_s": round(ran.seconds, 1),
           "command": shlex.join(["python3", *argv[1:]]).replace(str(ROOT) + "/", "")}
    return out


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def public_reference(gpu_name: str | None) -> tuple[str, int] | None:
    """NVIDIA's figure for this GPU: an H200 is an H100's compute with more memory."""
    name = (gpu_name or "").upper()
    if "H100" in name or "H200" in name or "GH200" in name:
        return "H100", PUBLIC["H100"]
    if "A100" in name:
        return "A100", PUBLIC["A100"]
    return None


def step_example(c: Check) -> dict[str, Any]:
    s = c.sizes
    py = sys.executable
    figures: dict[str, Any] = {"model": s.arch, "image_size": s.image_size, "batch": s.batch,
                               "steps": s.example_steps, "amp": not c.cpu,
                               "channels_last": not c.cpu}
    errors: list[str] = []
    tails: list[str] = []
    runs: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        # A static rendezvous on 127.0.0.1 rather than --standalone, whose MASTER_ADDR is
        # this host's name: a lent machine without network may not resolve it.
        ("torchrun", lambda: run_example(
            c, "torchrun", [py, "-m", "torch.distributed.run", "--nnodes", "1",
                            "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
                            "--master-port", str(free_port())], cap=95)),
        ("ceiling", lambda: c.child("ceiling", {"model": "trainkit", **ceiling_params(c)},
                                    cap=50)),
        ("plain", lambda: run_example(c, "plain", [py], cap=75)),
    ]
    # torchvision's ResNet-50 in the same loop: a second opinion on the ceiling, within 1-2%
    # of trainkit's in all three runs of 2026-11-26/28; opt-in since, its ~20 s going to
    # the horovod step.
    if not c.cpu and c.facts.get("torchvision") and c.torchvision_ceiling:
        runs.append(("ceiling_torchvision",
                     lambda: c.child("ceiling", {"model": "torchvision", **ceiling_params(c)},
                                     log="ceiling-torchvision")))
    for label, fn in runs:
        try:
            figures[label] = fn()
        except StepFailed as exc:
            figures[label] = {"error": str(exc), "error_tail": exc.tail}
            if label != "ceiling_torchvision":  # a second opinion only: not the step's failure
                errors.append(f"{label}: {exc}")
                tails.append(exc.tail)
    ceiling = figures.get("ceiling", {}).get("images_per_sec")
    for label in ("torchrun", "plain"):
        rate = figures.get(label, {}).get("images_per_sec")
        if rate and ceiling:
            figures[f"{label}_of_ceiling"] = round(rate / ceiling, 3)
    ref = None if c.cpu else public_reference(c.facts.get("gpu_name"))
    best = figures.get("torchrun", {}).get("images_per_sec")
    if c.cpu:
        figures["public"] = {"skipped": "--cpu: NVIDIA's figures are GPU figures"}
    elif ref is None:
        figures["public"] = {"skipped": f"no published figure for {c.facts.get('gpu_name')}",
                             "source": PUBLIC_SOURCE}
    else:
        figures["public"] = {"gpu": ref[0], "images_per_sec": ref[1], "source": PUBLIC_SOURCE,
                             "torchrun_of_public": round(best / ref[1], 3) if best else None,
                             "ceiling_of_public": round(ceiling / ref[1], 3) if ceiling else None}
    parts = [f"{label} {figures[label]['images_per_sec']:,.0f}"
             for label in ("torchrun", "plain", "ceiling", "ceiling_torchvision")
             if figures.get(label, {}).get("images_per_sec")]
    summary = "img/s: " + ", ".join(parts) if parts else "no figure"
    if figures.get("torchrun_of_ceiling"):
        summary += f"; torchrun/ceiling {figures['torchrun_of_ceiling']:.2f}"
    if figures["public"].get("torchrun_of_public"):
        summary += (f"; {figures['public']['torchrun_of_public']:.2f} of NVIDIA's "
                    f"{figures['public']['images_per_sec']:,} ({figures['public']['gpu']})")
    if errors:
        raise StepFailed("; ".join(errors), "\n".join(tails), figures)
    return passed(summary, figures)


# ---------------------------------------------------------------------------------------
# Step 2b: what the example's step costs, part by part (variants side by side, one trace)

# Each variant runs the example in-process (plain launch, DDP world 1) with one change
# patched in, so a change is measured before it is made in the example. None of them
# changes the maths except where the name says so (no_ddp: no DDP wrapper at all).
TUNING_VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    # The synthetic images as float32, as before 2026-11-28 (154 MB a batch of 256
    # through shared memory, pinning and the copy, against uint8's 39 MB normalised on
    # the GPU): ``args`` are added to the example's own.
    "synthetic_float32": {"args": ["--synthetic-dtype", "float32"]},
    "sync_each_step": {"sync_each_step": True},  # the host waits for every step (the old loop)
    "no_grad_hooks": {"no_grad_hooks": True},
    "ddp_no_broadcast_buffers": {"ddp": {"broadcast_buffers": False}},
    "ddp_bucket_view": {"ddp": {"gradient_as_bucket_view": True}},
    "ddp_static_graph": {"ddp": {"static_graph": True}},
    "fused_sgd": {"fused_sgd": True},
    # fused SGD under the GradScaler gave a NaN loss in the first epoch (H200, torch 2.11)
    "ddp_all": {"ddp": {"broadcast_buffers": False, "gradient_as_bucket_view": True,
                        "static_graph": True}},
    "no_ddp": {"no_ddp": True},
    # The first batch again and again, already on the GPU: the loader, pinning and the
    # copy out of the step (what the minimal loop never pays).
    "device_batch": {"device_batch": True},
    "device_batch_no_ddp": {"device_batch": True, "no_ddp": True},
    # No Python hook per gradient at all (no_grad_hooks keeps the call, empty): each
    # one runs on autograd's thread and must take the GIL from the main thread.
    "no_param_hooks": {"no_param_hooks": True},
    "device_batch_no_param_hooks": {"device_batch": True, "no_param_hooks": True},
}
CPU_TUNING_VARIANTS = ("default", "synthetic_float32", "sync_each_step", "ddp_all")
# The GPU mode's default: the change of 2026-11-28 against the old input and against no
# input path at all (each ~22 s on the H200; all of them do not fit the step's budget:
# --variants picks others).
GPU_TUNING_VARIANTS = ("default", "synthetic_float32", "device_batch")


def step_tuning(c: Check) -> dict[str, Any]:
    s = c.sizes
    names = c.variants or (CPU_TUNING_VARIANTS if c.cpu else GPU_TUNING_VARIANTS)
    figures: dict[str, Any] = {"variants": {}}
    for name in names:
        metrics = c.work / f"metrics-tuning-{name}"
        params = {"variant": name, **TUNING_VARIANTS[name], "metrics": str(metrics),
                  "args": [*example_args(s, metrics), *TUNING_VARIANTS[name].get("args", [])],
                  "batch": s.batch,
                  "warmup": s.example_warmup, "port": free_port()}
        try:
            figures["variants"][name] = c.child("variant", params, cap=60, log=f"tuning-{name}")
        except StepFailed as exc:
            figures["variants"][name] = {"error": str(exc), "error_tail": exc.tail}
    if not c.cpu and c.profile:
        metrics = c.work / "metrics-tuning-profile"
        params = {"variant": "default", "profile": str(c.logs / "profile.txt"),
                  "metrics": str(metrics), "args": example_args(s, metrics), "batch": s.batch,
                  "warmup": s.example_warmup, "port": free_port()}
        try:
            figures["profile"] = c.child("variant", params, cap=90, log="tuning-profile")
        except StepFailed as exc:
            figures["profile"] = {"error": str(exc), "error_tail": exc.tail}
    if c.ceiling_in_tuning:
        try:
            figures["ceiling"] = c.child("ceiling", {"model": "trainkit", **ceiling_params(c)},
                                         cap=50, log="tuning-ceiling")
        except StepFailed as exc:
            figures["ceiling"] = {"error": str(exc), "error_tail": exc.tail}
    rates = {n: v.get("images_per_sec") for n, v in figures["variants"].items()}
    if figures.get("ceiling", {}).get("images_per_sec"):
        rates["ceiling"] = figures["ceiling"]["images_per_sec"]
    base = rates.get("default")
    parts = [f"{n} {r:,.0f}" + (f" ({r / base:.2f})" if base else "")
             for n, r in rates.items() if r]
    failed = [n for n, r in rates.items() if not r]
    if failed and len(failed) == len(rates):
        raise StepFailed(f"no variant ran: {', '.join(failed)}", "", figures)
    return passed("img/s: " + ", ".join(parts) + (f"; failed: {', '.join(failed)}" if failed
                                                    else ""), figures)


def child_variant(p: dict[str, Any]) -> dict[str, Any]:
    """The example in this process with one variant's changes patched in."""
    import runpy

    import torch
    import trainkit.dist as tdist
    import trainkit.loop as tloop

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(p["port"])})
    cuda = torch.cuda.is_available()
    if p.get("ddp"):
        base = torch.nn.parallel.DistributedDataParallel
        extra = dict(p["ddp"])

        class PatchedDDP(base):  # type: ignore[misc, valid-type]
            def __init__(self, *a: Any, **k: Any) -> None:
                super().__init__(*a, **{**k, **extra})

        torch.nn.parallel.DistributedDataParallel = PatchedDDP  # type: ignore[misc]
    if p.get("no_ddp"):
        def wrap(self: Any, model: Any, optimizer: Any, **_: Any) -> Any:
            return model, optimizer
        tdist.DDPBackend.wrap = wrap  # type: ignore[method-assign]
    if p.get("no_param_hooks"):
        torch.Tensor.register_post_accumulate_grad_hook = (  # type: ignore[method-assign]
            lambda self, hook: None)
    if p.get("no_grad_hooks"):
        tdist.GradReadyTimes.ready = lambda self, param: None  # type: ignore[method-assign]
    if p.get("per_image_crop"):  # --decode gpu/tensor's crop and resize image by image
        import trainkit.gpudecode as tgpu

        tgpu.DeviceDecode.group_from = 10**9
    if p.get("fused_sgd") and cuda:
        sgd = torch.optim.SGD

        def fused(*a: Any, **k: Any) -> Any:
            return sgd(*a, **{**k, "fused": True})
        torch.optim.SGD = fused  # type: ignore[misc, assignment]
    if p.get("device_batch"):
        prefetch_iter = tloop.DevicePrefetch.__iter__

        def same_batch(self: Any) -> Any:
            batches = prefetch_iter(self)
            first = next(batches)
            for _ in range(len(self)):
                yield first
        tloop.DevicePrefetch.__iter__ = same_batch  # type: ignore[method-assign]
    queue_step = tloop.Training.queue_step
    hooks: list[Callable[[], None]] = []
    if p.get("sync_each_step"):
        def wait_for_step() -> None:
            if cuda:
                torch.cuda.synchronize()
        hooks.append(wait_for_step)
    prof = None
    if p.get("profile"):
        from torch.profiler import ProfilerActivity, profile, schedule

        prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                       schedule=schedule(wait=p["warmup"], warmup=3, active=5, repeat=1))
        prof.start()
        hooks.append(prof.step)

    def patched(self: Any, *a: Any, **k: Any) -> Any:
        queued = queue_step(self, *a, **k)
        for hook in hooks:
            hook()
        return queued
    tloop.Training.queue_step = patched  # type: ignore[method-assign]
    sys.argv = [str(EXAMPLE), *p["args"]]
    try:
        runpy.run_path(str(EXAMPLE), run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    metrics = Path(p["metrics"])
    out: dict[str, Any] = {"variant": p["variant"],
                           **example_rates(metrics, p["batch"], p["warmup"])}
    if prof is not None:
        prof.stop()
        out["profile"] = profile_summary(prof, Path(p["profile"]))
    return out


def union_us(spans: list[tuple[float, float]]) -> float:
    """How long at least one of ``spans`` (start, end) was running."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def profile_summary(prof: Any, path: Path) -> dict[str, Any]:
    """The trace's top rows (host and GPU time) into ``path``; the GPU's busy share."""
    averages = prof.key_averages()
    tables = []
    for key in ("self_cpu_time_total", "self_cuda_time_total", "cpu_time_total"):
        with contextlib.suppress(Exception):
            tables.append(f"## sorted by {key}\n" + averages.table(sort_by=key, row_limit=30))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join(tables))
    kernels = [e for e in prof.events() if getattr(e, "device_type", None) is not None
               and str(e.device_type).endswith("CUDA")]
    # The union of the kernels' spans, not their sum: kernels on the copy stream and the
    # compute stream overlap (a sum read 2.02 of the wall on the H200, 2026-11-28).
    busy = union_us([(e.time_range.start, e.time_range.end) for e in kernels
                     if getattr(e, "time_range", None) is not None])
    spans = [(e.time_range.start, e.time_range.end) for e in prof.events()
             if getattr(e, "time_range", None) is not None]
    wall = (max(e for _, e in spans) - min(s for s, _ in spans)) if spans else 0.0
    return {"table": str(path), "gpu_kernel_us": round(busy, 1), "trace_wall_us": round(wall, 1),
            "gpu_busy_share": round(busy / wall, 3) if wall else None,
            "steps": 5}


def ceiling_params(c: Check) -> dict[str, Any]:
    s = c.sizes
    return {"arch": s.arch, "image_size": s.image_size, "batch": s.batch, "classes": s.classes,
            "steps": s.ceiling_steps, "warmup": s.ceiling_warmup, "threads": s.threads}


# ---------------------------------------------------------------------------------------
# Step 3: the data path


def step_data(c: Check) -> dict[str, Any]:
    s = c.sizes
    example = c.results.get("example", {}).get("figures", {})
    target, target_from = None, None
    for label in ("torchrun", "plain", "ceiling"):
        rate = example.get(label, {}).get("images_per_sec")
        if rate:
            target, target_from = rate, f"the example's training rate ({label})"
            break
    if target is None and not c.cpu:
        ref = public_reference(c.facts.get("gpu_name")) or ("H100", PUBLIC["H100"])
        target, target_from = float(ref[1]), f"NVIDIA's published figure ({ref[0]})"
    params = {"dir": str(c.work / "tiny"), "classes": s.tiny_classes, "per_class": s.tiny_per_class,
              "size": s.tiny_size, "image_size": s.image_size, "batch": s.loader_batch,
              "workers": list(s.workers), "gpu_decode_batches": s.gpu_decode_batches,
              "gpu_batch": s.batch, "target": target, "target_from": target_from}
    # Capped: the example's runs from the JPEGs below need the rest of the step.
    figures = c.child("data", params, cap=45 if c.cpu else 100)
    rates = figures["loader"]
    best = max(rates, key=lambda r: r["images_per_sec"])
    summary = ("example loader img/s: "
               + ", ".join(f"{r['workers']}w {r['images_per_sec']:,.0f}" for r in rates))
    if figures.get("decode_only"):
        summary += f"; decode only {figures['decode_only']['images_per_sec']:,.0f}"
    if figures.get("gpu_decode", {}).get("images_per_sec"):
        summary += (f"; nvJPEG on GPU {figures['gpu_decode']['images_per_sec']:,.0f} "
                    f"(image by image {figures['gpu_decode']['per_image_images_per_sec']:,.0f})")
    figures["best_loader"] = best
    if target:
        summary += f"; feeds {target:,.0f} img/s: {'yes' if figures['feeds'] else 'no'}"
    errors, tails = [], []
    training: dict[str, Any] = {}
    for label, extra in jpeg_runs(c):
        try:
            if label.endswith("_per_image"):
                training[label] = run_jpeg_variant(c, label, extra, {"per_image_crop": True},
                                                   cap=90 if c.cpu else 75)
            else:
                training[label] = run_jpeg_example(c, label, extra, cap=90 if c.cpu else 75)
        except StepFailed as exc:
            training[label] = {"error": str(exc), "error_tail": exc.tail}
            errors.append(f"{label}: {exc}")
            tails.append(exc.tail)
    plain = example.get("plain", {})
    if "synthetic" not in training and plain.get("images_per_sec"):
        # --cpu: step 2's plain run stands in (same model and batch), keeping the mode
        # under a minute; the GPU mode runs its own with the JPEG runs' steps.
        training["synthetic"] = {**plain, "from": "step example, plain run"}
    synthetic = training.get("synthetic", {}).get("images_per_sec")
    for run in training.values():
        if run.get("images_per_sec") and synthetic:
            run["of_synthetic"] = round(run["images_per_sec"] / synthetic, 3)
    figures["training"] = training
    parts = [f"{label} {r['images_per_sec']:,.0f} (data wait {r['data_wait_share']:.0%})"
             for label, r in training.items() if r.get("images_per_sec")]
    if parts:
        summary += "; the example from JPEGs img/s: " + ", ".join(parts)
    if errors:
        raise StepFailed(summary + "; " + "; ".join(errors), "\n".join(tails), figures)
    return passed(summary, figures)


def jpeg_runs(c: Check) -> list[tuple[str, list[str]]]:
    """(label, example arguments) of the example's runs from the generated JPEGs: the
    device decode first (what the step is for), then the two it is weighed against."""
    s = c.sizes
    device = "tensor" if c.cpu else "gpu"  # --cpu: the same code with PIL on the CPU
    data = ["--data", str(c.work / "tiny"), "--val-batches", "1"]
    synthetic = ["--synthetic", "--synthetic-size", str(s.batch * s.jpeg_steps),
                 "--synthetic-val-size", str(s.batch), "--val-batches", "1",
                 "--num-classes", str(s.tiny_classes)]
    return [(f"decode_{device}", [*data, "--decode", device]),
            # the crop and resize image by image, as before 2026-11-28: the same maths
            (f"decode_{device}_per_image", [*data, "--decode", device]),
            *([] if c.cpu else [("synthetic", synthetic)]),
            ("decode_cpu", [*data, "--decode", "cpu"])]


def jpeg_example_args(c: Check, metrics: Path, extra: list[str]) -> list[str]:
    s = c.sizes
    return ["--backend", "ddp", "--arch", s.arch,
            "--image-size", str(s.image_size), "--batch-size", str(s.batch), "--epochs", "1",
            "--max-steps", str(s.jpeg_steps), "--amp", "on", "--checkpoint-dir", "",
            "--workers", str(min(8, max(s.workers))), "--metrics-dir", str(metrics), *extra,
            *(["--threads", str(s.threads)] if s.threads else [])]  # fmt: skip


def run_jpeg_variant(c: Check, label: str, extra: list[str], patch: dict[str, Any],
                     cap: float) -> dict[str, Any]:
    """run_jpeg_example's run in one process with a tuning-style ``patch`` (child_variant):
    the example's own code with one change, measured the same way."""
    s = c.sizes
    metrics = c.work / f"metrics-jpeg-{label}"
    args = jpeg_example_args(c, metrics, extra)
    params = {"variant": label, **patch, "metrics": str(metrics), "args": args,
              "batch": s.batch, "warmup": s.jpeg_warmup, "port": free_port()}
    out = c.child("variant", params, cap=cap, log=f"jpeg-{label}")
    return {**out, "workers": min(8, max(s.workers)), "patch": patch,
            "decode": extra[extra.index("--decode") + 1] if "--decode" in extra else None,
            "command": shlex.join(["python3", str(EXAMPLE), *args]).replace(str(ROOT) + "/", "")
            + f"  # in bench/gpu_check.py's child_variant with {patch}"}


def run_jpeg_example(c: Check, label: str, extra: list[str], cap: float) -> dict[str, Any]:
    """The example, plain, training --max-steps jpeg_steps from the generated JPEGs (or
    synthetic data) with at most 8 loader workers: its steady images/s and data wait."""
    s = c.sizes
    metrics = c.work / f"metrics-jpeg-{label}"
    workers = min(8, max(s.workers))
    argv = [sys.executable, str(EXAMPLE), *jpeg_example_args(c, metrics, extra)]
    env = c.env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    ran, result = run_example_process(c, argv, f"example-jpeg-{label}", cap, env,
                                      f"example from JPEGs, {label}")
    return {**example_rates(metrics, s.batch, s.jpeg_warmup),
            "decode": result.get("decode"), "decode_fallbacks": result.get("decode_fallbacks"),
            "device": result.get("device"), "workers": workers, "steps": result.get("steps"),
            "wall_s": round(ran.seconds, 1),
            "command": shlex.join(["python3", *argv[1:]]).replace(str(ROOT) + "/", "")}


# ---------------------------------------------------------------------------------------
# Step 4: checkpoint round trip; step 5: apptainer --nv


def step_checkpoint(c: Check) -> dict[str, Any]:
    s = c.sizes
    figures = c.child("checkpoint", {"dir": str(c.work / "checkpoints"), "arch": s.arch,
                                     "classes": s.classes, "image_size": min(s.image_size, 64),
                                     "batch": min(s.batch, 32), "threads": s.threads})
    summary = (f"{figures['device']} state {'equal' if figures['equal'] else 'DIFFERENT'} after "
               f"resume ({figures['size_mib']:.0f} MiB, write {figures['write_s']:.2f} s, "
               f"read {figures['read_s']:.2f} s)")
    if not figures["equal"]:
        raise StepFailed(summary + ": " + "; ".join(figures["differences"][:5]), figures=figures)
    return passed(summary, figures)


# The capabilities by bit number (linux/capability.h), for APPTAINER_DROP_CAPS: root in
# these VMs lacks some (CAP_SYS_RESOURCE on the dev VM) and Apptainer requests them all
# unless told which to drop (scripts/install-apptainer.sh's wrapper does the same).
_CAPS = ("CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP "
         "LINUX_IMMUTABLE NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER "
         "SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE "
         "SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP "
         "MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF "
         "CHECKPOINT_RESTORE").split()


def missing_caps(status: str) -> list[str]:
    """The capabilities (CAP_ names) missing from a /proc/PID/status text's permitted set."""
    match = re.search(r"^CapPrm:\s*([0-9a-fA-F]+)$", status, re.M)
    if not match:
        return []
    permitted = int(match.group(1), 16)
    return [f"CAP_{name}" for bit, name in enumerate(_CAPS) if not permitted >> bit & 1]


def carried_apptainer(c: Check) -> tuple[Path | None, dict[str, Any]]:
    """Apptainer unpacked from the carried .deb (``--prepare-carry``) into the work
    directory, laid out as its relocation expects (prefix = two levels above the binary;
    its configuration in PREFIX/etc, its session directories under PREFIX/var and
    PREFIX/lib/var). (path of the binary or None, what was found)."""
    debs = sorted(c.carry.glob("apptainer_*.deb"))
    info: dict[str, Any] = {"carry": str(c.carry), "deb": debs[-1].name if debs else None}
    if not debs:
        return None, info
    dpkg_deb = shutil.which("dpkg-deb")
    if dpkg_deb is None:
        info["error"] = "dpkg-deb is not on PATH: the carried .deb cannot be unpacked"
        return None, info
    dest = c.work / "apptainer"
    ran = c.command([dpkg_deb, "-x", str(debs[-1]), str(dest)], "apptainer-unpack", cap=60)
    if ran.returncode != 0:
        info["error"] = f"dpkg-deb -x failed (exit {ran.returncode}): {last_lines(ran.output, 3)}"
        return None, info
    usr = dest / "usr"
    shutil.move(str(dest / "etc"), str(usr / "etc"))
    for session in ("var/lib/apptainer/mnt/session", "lib/var/lib/apptainer/mnt/session"):
        (usr / session).mkdir(parents=True, exist_ok=True)
    binary = usr / "bin" / "apptainer"
    # The repacked deb (scripts/install-apptainer.sh) keeps the real binary in libexec
    # behind a wrapper with absolute paths; sid's own has it in bin.
    if (usr / "libexec" / "apptainer").is_file():
        binary = usr / "libexec" / "apptainer"
    info["binary"] = str(binary.relative_to(c.work))
    return binary, info


def apptainer_env(c: Check) -> dict[str, str]:
    extra = {}
    caps = missing_caps(Path("/proc/self/status").read_text())
    if caps:
        extra["APPTAINER_DROP_CAPS"] = ",".join(caps)
    libs = c.carry / "lib"
    if libs.is_dir():  # libseccomp and libsqlite3 from the dev VM, for a machine without them
        have = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True,
                              check=False).stdout if shutil.which("ldconfig") else ""
        if any(lib.name.split(".so")[0] + ".so" not in have for lib in libs.iterdir()):
            extra["LD_LIBRARY_PATH"] = os.pathsep.join(
                [str(libs), *filter(None, [os.environ.get("LD_LIBRARY_PATH")])])
    return c.env(**extra)


def step_apptainer(c: Check) -> dict[str, Any]:
    if c.cpu:
        return skipped("--cpu: `--nv` passes the host's NVIDIA GPU into the container; "
                       "there is none in this mode")
    figures: dict[str, Any] = {"uid": os.getuid()}
    apptainer = shutil.which("apptainer") or shutil.which("singularity")
    images: list[Path] = []
    if apptainer is None:
        binary, info = carried_apptainer(c)
        figures["carried"] = info
        if binary is None:
            why = info.get("error") or (
                f"no apptainer_*.deb in {c.carry} (prepare it here with `python3 "
                "bench/gpu_check.py --prepare-carry` and carry .cache/gpu-carry)")
            return skipped(f"apptainer is not on PATH and none was carried: {why}", figures)
        apptainer = str(binary)
        images = sorted(c.carry.glob("*.sif")) + [d for d in sorted(c.carry.glob("*-root"))
                                                  if d.is_dir()]
    if c.image:
        images = [Path(c.image)]
    elif not images:
        images = [Path(os.environ.get("HPCDL_GPU_IMAGE")
                       or "/scratch/images/pytorch-horovod-gpu-pypi.sif")]
    images = [i for i in images if i.exists()]
    if not images:
        return skipped("no image to run (pass --image IMAGE.sif, or carry the tiny one "
                       "--prepare-carry writes)", figures)
    env = apptainer_env(c)
    figures["drop_caps"] = env.get("APPTAINER_DROP_CAPS")
    version = c.command([apptainer, "--version"], "apptainer-version", cap=20, env=env)
    figures["version"] = last_lines(version.output, 1)
    if version.returncode != 0:
        raise StepFailed(f"{apptainer} --version: exit {version.returncode}: "
                         f"{last_lines(version.output, 1)}", last_lines(version.output), figures)
    # A torch image is asked for torch's view of the GPU; a tiny one (no python) for
    # nvidia-smi's, which --nv binds in from the host with the driver's libraries.
    runs: dict[str, Any] = {}
    for image in images:
        torch_image = image.suffix == ".sif" and "torch" in image.name
        probe = (["python3", "-c", "import torch; print(torch.cuda.is_available(), "
                  "torch.cuda.device_count())"] if torch_image else ["nvidia-smi", "-L"])
        # First without --nv: a refused mount (loop device, FUSE) shows apart from --nv.
        bare = c.command([apptainer, "exec", str(image), "/bin/sh", "-c", "echo container-ok"],
                         f"apptainer-{image.name}", cap=60, env=env)
        ran = c.command([apptainer, "exec", "--nv", str(image), *probe],
                        f"apptainer-nv-{image.name}", cap=60, env=env)
        out = ran.output.strip().splitlines()
        ok = ran.returncode == 0 and (
            (out and out[-1].split()[:1] == ["True"]) if torch_image
            else any(line.startswith("GPU ") for line in out))
        runs[image.name] = {"ok": ok, "exit": ran.returncode, "probe": shlex.join(probe),
                            "seconds": round(ran.seconds, 1),
                            "output": last_lines(ran.output, 6),
                            "without_nv": {"ok": "container-ok" in bare.output,
                                           "exit": bare.returncode,
                                           "output": last_lines(bare.output, 4)}}
    figures["runs"] = runs
    good = [name for name, r in runs.items() if r["ok"]]
    if not good:
        # The refusal's own words (loop device, FUSE, capabilities, namespaces).
        first = next(iter(runs.values()))
        bare = ("the container itself ran without --nv" if first["without_nv"]["ok"] else
                f"without --nv it did not run either: {last_lines(first['without_nv']['output'], 1)}")
        raise StepFailed(f"apptainer exec --nv: no GPU in any container ({', '.join(runs)}): "
                         f"{last_lines(first['output'], 1)}; {bare}", first["output"], figures)
    bad = [name for name in runs if name not in good]
    return passed(f"apptainer exec --nv {', '.join(good)}: "
                  + "; ".join(last_lines(runs[n]["output"], 1) for n in good)
                  + (f"; failed: {', '.join(bad)}" if bad else ""), figures)


# ---------------------------------------------------------------------------------------
# Step 7: Horovod built on the machine from a carried source archive, one rank


def horovod_prerequisites(c: Check) -> dict[str, Any]:
    """What building Horovod with NCCL GPU operations needs, each found (a path or a
    version) or None: cmake, a C++ compiler, make or ninja, nvcc and the CUDA headers,
    torch's C++ headers, NCCL's header and library (the nvidia-nccl wheel torch loads),
    Python.h (or the carried CPython headers), setuptools, wheel and packaging (or
    carried wheels), and the source archive."""
    probe = (
        "import json, os, sys, sysconfig, importlib.util as u\n"
        "out = {'python': sys.version.split()[0], 'python_include': sysconfig.get_paths()['include']}\n"
        "import torch\n"
        "out['torch'] = torch.__version__; out['torch_cuda'] = torch.version.cuda\n"
        "out['torch_include'] = os.path.join(os.path.dirname(torch.__file__), 'include')\n"
        "try:\n"
        "    import nvidia.nccl as n\n"
        "    out['nccl_dir'] = list(n.__path__)[0]\n"
        "except Exception:\n"
        "    out['nccl_dir'] = None\n"
        "for m in ('setuptools', 'wheel', 'packaging', 'cffi', 'pycparser', 'horovod'):\n"
        "    out['has_' + m] = u.find_spec(m) is not None\n"
        "print(json.dumps(out))\n")
    ran = c.command([sys.executable, "-c", probe], "horovod-probe", cap=60)
    try:
        py = json.loads(ran.output.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise StepFailed("the probe of this python's torch failed", last_lines(ran.output)) from None
    bindir = Path(sys.executable).parent
    cuda_home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    nvcc = shutil.which("nvcc") or next((str(x) for x in [Path(cuda_home) / "bin" / "nvcc"]
                                         if x.is_file()), None)
    cuda_root = Path(nvcc).resolve().parents[1] if nvcc else None
    wheels = c.carry / "wheels"

    def carried(name: str) -> str | None:
        hit = sorted(wheels.glob(f"{name}-*.whl")) if wheels.is_dir() else []
        return f"carried {hit[-1].name}" if hit else None

    nccl = Path(py["nccl_dir"]) if py.get("nccl_dir") else None
    python_h = Path(py["python_include"]) / "Python.h"
    carried_h = c.carry / "python-include" / f"python{'.'.join(py['python'].split('.')[:2])}"
    sdists = sorted(c.carry.glob("horovod-*.tar.gz"))
    found: dict[str, Any] = {
        "source archive": str(sdists[-1]) if sdists else None,
        "cmake": shutil.which("cmake") or next((str(x) for x in [bindir / "cmake"] if x.is_file()),
                                               None),
        "C++ compiler": shutil.which("g++") or shutil.which("c++"),
        "make or ninja": shutil.which("make") or shutil.which("ninja")
        or next((str(x) for x in [bindir / "ninja"] if x.is_file()), None),
        "Python.h": str(python_h.parent) if python_h.is_file()
        else (str(carried_h) if (carried_h / "Python.h").is_file() else None),
        "torch C++ headers": py["torch_include"]
        if (Path(py["torch_include"]) / "torch" / "extension.h").is_file() else None,
        "setuptools": "installed" if py["has_setuptools"] else carried("setuptools"),
        "wheel": "installed" if py["has_wheel"] else carried("wheel"),
        "packaging": "installed" if py["has_packaging"] else carried("packaging"),
        # Horovod's setup_requires names cffi (for its torch extension) and setuptools
        # fetches what is missing from the index, which the GPU machine cannot reach.
        "cffi": "installed" if py["has_cffi"] else carried("cffi"),
        "pycparser": "installed" if py["has_pycparser"] or py["has_cffi"] else carried("pycparser"),
    }
    if not c.cpu:
        found.update({
            "nvcc": nvcc,
            "CUDA headers": str(cuda_root / "include")
            if cuda_root and (cuda_root / "include" / "cuda_runtime.h").is_file() else None,
            "nccl.h": str(nccl / "include" / "nccl.h")
            if nccl and (nccl / "include" / "nccl.h").is_file() else None,
            "libnccl.so.2": str(nccl / "lib" / "libnccl.so.2")
            if nccl and (nccl / "lib" / "libnccl.so.2").is_file() else None,
        })
    return {"found": found, "python": py["python"], "torch": py["torch"],
            "torch_cuda": py["torch_cuda"], "preinstalled_horovod": py["has_horovod"]}


def build_horovod(c: Check, pre: dict[str, Any], cap: float) -> tuple[Path, dict[str, Any]]:
    """Unpack, patch and build the carried sdist into a wheel, then install it and its
    carried dependencies into a folder of the work directory. The patches are
    scripts/build-horovod-gpu.sh's: C++17 at the top level and for the CUDA kernels
    (CUDA 13's headers refuse older), C++17 for horovod/torch (20 from torch 2.14, whose
    headers require it); Gloo as the controller (no MPI: one process needs no launcher);
    NCCL from the wheel torch loads, linked shared, through an unversioned symlink."""
    import tarfile

    found = pre["found"]
    sdist = Path(found["source archive"])
    src_root = c.work / "horovod-src"
    with tarfile.open(sdist) as tar:
        tar.extractall(src_root, filter="data")
    src = next(src_root.iterdir())
    major_minor = tuple(int(x) for x in re.findall(r"\d+", pre["torch"])[:2])
    torch_std = "20" if major_minor >= (2, 14) else "17"
    for rel, key, std in (("CMakeLists.txt", "CXX", "17"),
                          ("horovod/torch/CMakeLists.txt", "CXX", torch_std),
                          ("horovod/common/ops/cuda/CMakeLists.txt", "CUDA", "17")):
        f = src / rel
        text, n = re.subn(rf"set\(CMAKE_{key}_STANDARD \d+\)", f"set(CMAKE_{key}_STANDARD {std})",
                          f.read_text())
        if not n:
            raise StepFailed(f"the C++ standard patch did not apply to {rel} of {sdist.name}")
        f.write_text(text)
    # GCC 13 no longer pulls <string> and <stdexcept> in through other standard headers,
    # and these two use std::string and std::logic_error without including them.
    for rel in ("horovod/common/group_table.h", "horovod/common/common.h"):
        f = src / rel
        f.write_text("#include <stdexcept>\n#include <string>\n" + f.read_text())
    # CMAKE_POLICY_VERSION_MINIMUM: CMake 4 refuses Gloo's cmake_minimum_required(2.8)
    # unless told which policies to assume; older CMake ignores it.
    env = c.env(CMAKE_POLICY_VERSION_MINIMUM="3.5", HOROVOD_WITH_PYTORCH="1",
                HOROVOD_WITHOUT_TENSORFLOW="1",
                HOROVOD_WITHOUT_MXNET="1", HOROVOD_WITHOUT_MPI="1", HOROVOD_WITH_GLOO="1",
                HOROVOD_CPU_OPERATIONS="GLOO", MAKEFLAGS=f"-j{os.cpu_count() or 2}")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    if not (shutil.which("make") or "").strip() and found["make or ninja"]:
        env["CMAKE_GENERATOR"] = "Ninja"
    # Always on the compilers' path: Horovod's CMake asks `distutils.sysconfig` for it,
    # which Python 3.12 only has through setuptools' own site hook (absent when the
    # carried setuptools comes in by PYTHONPATH), and the carried headers live nowhere
    # a compiler looks.
    env["CPATH"] = os.pathsep.join(filter(None, [found["Python.h"], os.environ.get("CPATH")]))
    if not c.cpu:
        nccl_lib = c.work / "nccl-lib"
        nccl_lib.mkdir(exist_ok=True)
        (nccl_lib / "libnccl.so").symlink_to(found["libnccl.so.2"])
        cuda_root = str(Path(found["nvcc"]).resolve().parents[1])
        arch = str(c.facts.get("gpu_capability") or "9.0")
        env.update({"HOROVOD_GPU_OPERATIONS": "NCCL", "HOROVOD_NCCL_LINK": "SHARED",
                    "HOROVOD_NCCL_INCLUDE": str(Path(found["nccl.h"]).parent),
                    "HOROVOD_NCCL_LIB": str(nccl_lib), "CUDA_HOME": cuda_root,
                    "HOROVOD_CUDA_HOME": cuda_root, "HOROVOD_BUILD_CUDA_CC_LIST": arch.replace(".", ""),
                    "TORCH_CUDA_ARCH_LIST": arch})
        env["PATH"] = os.pathsep.join([str(Path(cuda_root) / "bin"), env["PATH"]])
    build_site = c.work / "horovod-build-site"  # setuptools/wheel/packaging when carried
    wheels = c.carry / "wheels"
    need = [m for m in ("setuptools", "wheel", "packaging", "cffi", "pycparser")
            if str(found[m]).startswith("carried")]
    # setuptools' own fetch of setup_requires ignores pip's --no-index: without these it
    # retries the unreachable index for minutes instead of failing on what is missing.
    env.update({"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)})
    if need:
        ran = c.command([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                         "--find-links", str(wheels), "--target", str(build_site), *need],
                        "horovod-build-deps", cap=60)
        if ran.returncode != 0:
            raise StepFailed(f"pip install of the carried {', '.join(need)} failed",
                             last_lines(ran.output))
        env["PYTHONPATH"] = os.pathsep.join([str(build_site), env["PYTHONPATH"]])
    out = c.work / "horovod-wheel"
    ran = c.command([sys.executable, "-m", "pip", "wheel", "-v", "--no-index",
                     "--no-build-isolation", "--no-deps", "-w", str(out), str(src)],
                    "horovod-build", cap=cap, env=env)
    built = sorted(out.glob("horovod-*.whl"))
    figures: dict[str, Any] = {"build_s": round(ran.seconds, 1), "timed_out": ran.timed_out,
                               "cxx_standard_torch": torch_std,
                               "gpu_operations": env.get("HOROVOD_GPU_OPERATIONS")}
    if ran.returncode != 0 or not built:
        reached = re.findall(r"\[\s*(\d+)%\]", ran.output)
        if ran.timed_out:
            why = (f"the build did not finish within {ran.seconds:.0f} s"
                   + (f" (make at {reached[-1]}%)" if reached else ""))
        else:
            errors = [ln for ln in ran.output.splitlines() if "error" in ln.lower()][:3]
            why = f"the build failed (exit {ran.returncode}): " + " | ".join(errors)[:400]
        raise StepFailed(why, last_lines(ran.output, 40), figures)
    figures["wheel"] = built[-1].name
    figures["wheel_mib"] = round(built[-1].stat().st_size / 2**20, 1)
    site = c.work / "horovod-site"
    deps = [str(w) for w in sorted(wheels.glob("*.whl"))
            if w.name.split("-")[0].lower() in ("cloudpickle", "psutil", "pyyaml", "packaging",
                                                "cffi", "pycparser")] \
        if wheels.is_dir() else []
    ran = c.command([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                     "--target", str(site), str(built[-1]), *deps], "horovod-install", cap=60)
    if ran.returncode != 0:
        raise StepFailed("pip install of the built wheel failed", last_lines(ran.output), figures)
    return site, figures


def step_horovod(c: Check) -> dict[str, Any]:
    pre = horovod_prerequisites(c)
    figures: dict[str, Any] = {"prerequisites": pre, "carry": str(c.carry)}
    missing = [name for name, where in pre["found"].items() if not where]
    if pre["preinstalled_horovod"] and not c.build_horovod:
        site = None
        figures["horovod"] = "installed here already"
    elif missing:
        hint = (" (prepare it here with `python3 bench/gpu_check.py --prepare-carry` and carry "
                ".cache/gpu-carry)" if "source archive" in missing else "")
        return skipped(f"cannot build Horovod here: missing {', '.join(missing)}{hint}", figures)
    elif c.cpu and not c.build_horovod:
        return skipped("--cpu: every prerequisite found; the build takes minutes, "
                       "--build-horovod tries it", figures)
    else:
        # Leave the example's one-rank run its time: the build gets the rest.
        site, built = build_horovod(c, pre, cap=max(10.0, c.left() - 45))
        figures.update(built)
    env = c.env(HOROVOD_GLOO_IFACE="lo", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(site), env["PYTHONPATH"]])
    check = ("import json, horovod.torch as hvd; hvd.init(); print(json.dumps({'size': hvd.size(), "
             "'nccl': hvd.nccl_built(), 'gloo': hvd.gloo_built(), 'mpi': hvd.mpi_built(), "
             "'cuda': hvd.cuda_built(), 'module': hvd.__file__}))")
    ran = c.command([sys.executable, "-c", check], "horovod-import", cap=60, env=env)
    try:
        figures["built_with"] = json.loads(ran.output.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise StepFailed(f"import horovod.torch; hvd.init() failed (exit {ran.returncode})",
                         last_lines(ran.output), figures) from None
    s = c.sizes
    metrics = c.work / "metrics-horovod"
    args = [a if a != "ddp" else "horovod" for a in example_args(s, metrics)]
    args[args.index("--max-steps") + 1] = str(min(s.example_steps, 30))
    argv = [sys.executable, str(EXAMPLE), *args]
    ran, result = run_example_process(c, argv, "example-horovod", c.left(), env,
                                      "the example under Horovod, one rank", figures)
    expected = "cpu" if c.cpu else "cuda"
    if result.get("device") != expected or result.get("backend") != "horovod":
        raise StepFailed(f"the Horovod example ran on {result.get('device')} with backend "
                         f"{result.get('backend')}", last_lines(ran.output), figures)
    figures["example"] = {**example_rates(metrics, s.batch, min(s.example_warmup, 10)),
                          "launcher": result.get("launcher"), "world_size": result.get("world_size"),
                          "device": result.get("device"),
                          "command": shlex.join(["python3", *argv[1:]]).replace(str(ROOT) + "/", "")}
    built = figures["built_with"]
    tests = ""
    if not c.cpu and c.facts.get("pytest_importable"):
        # The gpu-marked Horovod tests skip in the gpu_tests step, before Horovod is built:
        # here they run with the built Horovod on the path.
        ran, _, cases = native_gpu_pytest(c, "pytest-gpu-horovod", "-k", "horovod", env=env)
        counts = {k: sum(1 for t in cases if t["outcome"] == k)
                  for k in ("passed", "failed", "skipped")}
        figures["gpu_tests"] = {**counts, "tests": cases}
        tests = (f"; its gpu tests: {counts['passed']} passed, {counts['failed']} failed, "
                 f"{counts['skipped']} skipped")
        if counts["failed"] or ran.returncode not in (0, 5):
            raise StepFailed(f"Horovod's gpu-marked tests{tests} (pytest exit {ran.returncode})",
                             last_lines(ran.output), figures)
    return passed(f"Horovod {'built in ' + str(figures['build_s']) + ' s' if 'build_s' in figures else 'installed'}"
                  f" (NCCL {built['nccl']}, Gloo {built['gloo']}, CUDA {built['cuda']}); the example, "
                  f"one rank on {result.get('device')}: {figures['example']['images_per_sec']:,.0f} img/s"
                  f"{tests}", figures)


# ---------------------------------------------------------------------------------------
# --prepare-carry: here, with the package registry and this VM's Apptainer

HOROVOD_VERSION = "0.28.1"  # as scripts/build-horovod-gpu.sh
CARRY_LIMIT_MIB = 60  # of the device tool's 64 MiB for everything it carries


def tiny_rootfs(root: Path) -> None:
    """A directory image of this host's /bin/sh and the C library it and nvidia-smi (which
    --nv binds in from the GPU machine) load: enough for `exec --nv IMAGE nvidia-smi -L`."""
    libdir = Path("/lib/x86_64-linux-gnu")
    for sub in ("bin", "lib64", "lib/x86_64-linux-gnu", "usr/bin", "etc", "tmp", "var/tmp",
                "proc", "sys", "dev"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    shutil.copy(Path("/bin/sh").resolve(), root / "bin" / "sh")
    shutil.copy(Path("/lib64/ld-linux-x86-64.so.2").resolve(), root / "lib64" / "ld-linux-x86-64.so.2")
    for lib in ("libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1"):
        shutil.copy((libdir / lib).resolve(), root / "lib" / "x86_64-linux-gnu" / lib)
    for name in ("passwd", "group"):
        (root / "etc" / name).write_text("root:x:0:0:root:/root:/bin/sh\n" if name == "passwd"
                                         else "root:x:0:\n")


def prepare_carry(dest: Path, python: str) -> int:
    if not re.fullmatch(r"3\.\d{1,2}", python):
        print(f"--python {python!r}: want X.Y, e.g. 3.12", file=sys.stderr)
        return 2
    dest = dest.resolve()
    shutil.rmtree(dest, ignore_errors=True)
    (dest / "wheels").mkdir(parents=True)
    tag = "cp" + python.replace(".", "")
    pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps"]
    commands = [
        [*pip, "--no-binary", ":all:", "-d", str(dest), f"horovod=={HOROVOD_VERSION}"],
        [*pip, "--only-binary", ":all:", "--python-version", python, "--implementation", "cp",
         "--abi", tag, "--abi", "abi3", "--abi", "none", "--platform", "manylinux2014_x86_64",
         "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux_2_28_x86_64",
         "--platform", "any", "-d", str(dest / "wheels"),
         "cloudpickle", "psutil", "pyyaml", "packaging", "setuptools", "wheel", "cffi",
         "pycparser"],
    ]
    for argv in commands:
        ran = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=600)
        if ran.returncode != 0:
            print(f"{shlex.join(argv)}: exit {ran.returncode}\n{last_lines(ran.stderr, 10)}",
                  file=sys.stderr)
            return 1
    # CPython's headers, for a GPU machine whose python has no -dev package: any patch
    # release of the same X.Y builds extensions for it.
    headers = sorted(Path.home().glob(f".pyenv/versions/{python}.*/include/python{python}"))
    if headers:
        shutil.copytree(headers[-1], dest / "python-include" / f"python{python}")
    # Debian sid's Apptainer, as scripts/install-apptainer.sh fetched it: it needs glibc
    # 2.38 (the lent machine's Ubuntu 24.04 has 2.39), libseccomp and libsqlite3 (this
    # VM's are carried in case that machine lacks them).
    cache = Path(os.environ.get("HPCDL_CACHE") or "/var/cache/hpcdl") / "debs"
    debs = sorted(d for d in cache.glob("apptainer_*_amd64.deb") if "+hpcdl" not in d.name)
    apptainer = shutil.which("apptainer")
    if debs:
        shutil.copy(debs[-1], dest / debs[-1].name)
        (dest / "lib").mkdir()
        for lib in ("libseccomp.so.2", "libsqlite3.so.0"):
            shutil.copy(Path("/lib/x86_64-linux-gnu", lib).resolve(), dest / "lib" / lib)
    if apptainer:
        with tempfile.TemporaryDirectory(prefix="gpu-carry-") as tmp:
            root = Path(tmp) / "root"
            tiny_rootfs(root)
            ran = subprocess.run([apptainer, "build", "-F", str(dest / "tiny-nv.sif"), str(root)],
                                 capture_output=True, text=True, check=False, timeout=300)
            if ran.returncode != 0:
                print(f"apptainer build: exit {ran.returncode}\n{last_lines(ran.stderr, 10)}",
                      file=sys.stderr)
                return 1
        # The same as a directory (no loop or FUSE mount), unpacked from the SIF so that it
        # has /.singularity.d: its env scripts put --nv's bound libraries on LD_LIBRARY_PATH.
        ran = subprocess.run([apptainer, "build", "-F", "--sandbox", str(dest / "tiny-nv-root"),
                              str(dest / "tiny-nv.sif")],
                             capture_output=True, text=True, check=False, timeout=300)
        if ran.returncode != 0:
            print(f"apptainer build --sandbox: exit {ran.returncode}\n{last_lines(ran.stderr, 10)}",
                  file=sys.stderr)
            return 1
    files = sorted(f for f in dest.rglob("*") if f.is_file())
    total = sum(f.stat().st_size for f in files)
    manifest = {"python": python, "horovod": HOROVOD_VERSION, "bytes": total,
                "apptainer_deb": debs[-1].name if debs else None,
                "python_headers": str(headers[-1]) if headers else None,
                "files": {str(f.relative_to(dest)): f.stat().st_size for f in files
                          if f.parent == dest or f.parent.name in ("wheels", "lib")}}
    (dest / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
    for name, size in manifest["files"].items():
        print(f"{size / 2**20:8.2f} MiB  {name}")
    print(f"{total / 2**20:8.2f} MiB  in all ({len(files)} files) in {dest}")
    missing = [what for what, ok in (("Apptainer's .deb (scripts/install-apptainer.sh "
                                      "fetches it)", debs), ("CPython headers", headers),
                                     ("apptainer here (for the tiny image)", apptainer)) if not ok]
    if missing:
        print(f"left out: {'; '.join(missing)}")
    try:
        rel = dest.relative_to(ROOT)
        print(f'device tool: carry ["{rel}"]')
    except ValueError:
        print(f"(not under {ROOT}: the device tool carries paths of the repository only)")
    if total > CARRY_LIMIT_MIB * 2**20:
        print(f"{total / 2**20:.1f} MiB is over {CARRY_LIMIT_MIB} MiB", file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------------------------------
# Results


def passed(summary: str, figures: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"status": "passed", "summary": summary, "figures": figures or {}}


def skipped(reason: str, figures: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"status": "skipped", "reason": reason, "summary": reason, "figures": figures or {}}


STEP_FUNCS: dict[str, Callable[[Check], dict[str, Any]]] = {
    "gpu_tests": step_gpu_tests, "example": step_example, "tuning": step_tuning,
    "data": step_data,
    "checkpoint": step_checkpoint, "apptainer_nv": step_apptainer, "horovod": step_horovod,
}


def run_step(c: Check, name: str, title: str) -> dict[str, Any]:
    budget = c.sizes.budgets[name]
    start = time.monotonic()
    c.step_deadline = start + budget
    record: dict[str, Any] = {"name": name, "title": title, "budget_s": budget}
    try:
        if c.deadline - start < 3:
            raise StepFailed("the check's whole budget was spent before this step")
        record.update(STEP_FUNCS[name](c))
    except StepFailed as exc:
        record.update({"status": "failed", "summary": str(exc), "error": str(exc),
                       "error_tail": exc.tail, "figures": exc.figures})
    except Exception as exc:  # the step's own bug: recorded, and the next step still runs
        record.update({"status": "failed", "summary": f"{type(exc).__name__}: {exc}",
                       "error": f"{type(exc).__name__}: {exc}",
                       "error_tail": last_lines(traceback.format_exc()), "figures": {}})
    record["seconds"] = round(time.monotonic() - start, 1)
    return record


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    gpu = (f"{m.get('gpu_name')} ({m.get('gpu_memory_gib')} GiB), CUDA {m.get('torch_cuda')}, "
           f"driver {m.get('driver')}" if m.get("gpu_name") else "no GPU in use")
    lines = [
        f"# hpcdl GPU check ({report['mode']} mode)",
        "",
        f"- machine: {m.get('cpu')}, {m.get('cores')} cores, {m.get('os')}, python {m.get('python')}, "
        f"torch {m.get('torch')}, torchvision {m.get('torchvision')}; {gpu}",
        f"- command: `{report['command']}`",
        f"- {report['seconds']:.0f} s of a {report['budget_s']:.0f} s budget: "
        + ", ".join(f"{n} {k}" for k, n in report["counts"].items()),
        "",
        "| step | status | result | time (budget) |",
        "|---|---|---|---|",
    ]
    for i, step in enumerate(report["steps"], 1):
        text = str(step.get("summary", "")).replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {i}. `{step['name']}` {step['title']} | {step['status']} | {text} | "
                     f"{step.get('seconds', 0):.0f} s ({step['budget_s']:.0f} s) |")
    notes = [f"- `{s['name']}`: {s['error_tail'].strip().splitlines()[-1]}"
             for s in report["steps"] if s.get("error_tail", "").strip()]
    data = next((s for s in report["steps"] if s["name"] == "data"), {})
    if data.get("figures", {}).get("verdict"):
        notes.append(f"- data path: {data['figures']['verdict']}")
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"


def machine_facts(c: Check) -> dict[str, Any]:
    info = describe(packages=("torch", "torchvision", "pillow", "pytest"))
    try:
        facts = c.child("facts", {}, cap=90)
    except StepFailed as exc:
        facts = {"error": f"{exc}: {exc.tail.strip().splitlines()[-1] if exc.tail.strip() else ''}"}
    smi = shutil.which("nvidia-smi")
    if smi:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30, check=False).stdout
            facts["driver"] = out.strip().splitlines()[0] if out.strip() else None
    return {**info, **facts}


def write_report(report: dict[str, Any], json_path: Path, md_path: Path) -> None:
    for path, text in ((json_path, json.dumps(report, indent=2) + "\n"), (md_path, markdown(report))):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)  # a run killed mid-write still leaves the previous report whole


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", action="store_true",
                   help="hide CUDA and run every step small; GPU parts are skipped with the reason")
    p.add_argument("--json", metavar="FILE", help="the report [default: $OUT or . /gpu_check.json]")
    p.add_argument("--md", metavar="FILE", help="the markdown table [default: $OUT or . /gpu_check.md]")
    p.add_argument("--budget", type=float, default=None, metavar="S",
                   help="seconds for all steps together [default: 560 (GPU), 330 (--cpu)]")
    p.add_argument("--image", metavar="SIF", help="GPU image for the apptainer --nv step")
    p.add_argument("--only", metavar="STEP,...", type=lambda v: v.split(","),
                   help=f"run only these steps ({', '.join(n for n, _ in STEPS)}); the others "
                   "are reported as skipped")
    p.add_argument("--variants", metavar="NAME,...", type=lambda v: tuple(v.split(",")),
                   help=f"the tuning step's variants ({', '.join(TUNING_VARIANTS)}) "
                   "[default: all on a GPU, a few with --cpu]")
    p.add_argument("--no-profile", action="store_true",
                   help="leave out the tuning step's profiler trace")
    p.add_argument("--torchvision-ceiling", action="store_true",
                   help="the example step measures torchvision's ResNet-50 in the minimal "
                   "loop too")
    p.add_argument("--tuning-ceiling", action="store_true",
                   help="measure the minimal loop in the tuning step too (for --only tuning)")
    p.add_argument("--workers", metavar="N,...", type=lambda v: tuple(int(n) for n in v.split(",")),
                   help="the data step's loader worker counts [default: 4,8,16; 0,1 with --cpu]")
    p.add_argument("--keep", action="store_true", help="keep the working directory")
    p.add_argument("--carry-dir", metavar="DIR", type=Path,
                   help="what the apptainer_nv and horovod steps take from [default: "
                   ".cache/gpu-carry]")
    p.add_argument("--build-horovod", action="store_true",
                   help="build Horovod from the carried archive even with --cpu or where "
                   "one is installed (minutes)")
    p.add_argument("--prepare-carry", action="store_true",
                   help="here, not on the GPU machine: write into --carry-dir what the "
                   "apptainer_nv and horovod steps need there (Horovod's source archive, "
                   "wheels of its dependencies, CPython headers, Apptainer's .deb, a tiny "
                   "image), then print its size and the device tool's carry argument")
    p.add_argument("--python", default="3.12", metavar="X.Y",
                   help="with --prepare-carry: the GPU machine's python [default: 3.12]")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--params", default="{}", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    unknown = sorted(set(args.only or ()) - {n for n, _ in STEPS})
    if unknown:
        p.error(f"--only: no step {', '.join(unknown)}")
    unknown = sorted(set(args.variants or ()) - set(TUNING_VARIANTS))
    if unknown:
        p.error(f"--variants: no variant {', '.join(unknown)}")
    if args.child:
        return child_main(args.child, json.loads(args.params))
    if args.prepare_carry:
        return prepare_carry(args.carry_dir or ROOT / ".cache" / "gpu-carry", args.python)

    out_dir = Path(os.environ.get("OUT") or ".")
    json_path = Path(args.json) if args.json else out_dir / "gpu_check.json"
    md_path = Path(args.md) if args.md else out_dir / "gpu_check.md"
    logs = json_path.parent / f"{json_path.stem}-logs"
    shutil.rmtree(logs, ignore_errors=True)
    sizes = CPU_SIZES if args.cpu else GPU_SIZES
    if args.workers:
        sizes = dataclasses.replace(sizes, workers=args.workers)
    budget = args.budget or (330.0 if args.cpu else 560.0)
    if args.build_horovod:  # the build may take what the whole check has
        sizes = dataclasses.replace(sizes, budgets={**sizes.budgets, "horovod": budget})
    work = Path(tempfile.mkdtemp(prefix="hpcdl-gpu-check-"))
    c = Check(args.cpu, sizes, budget, work, logs, args.image)
    c.variants, c.profile = args.variants or (), not args.no_profile
    c.ceiling_in_tuning = args.tuning_ceiling
    c.build_horovod = args.build_horovod
    c.torchvision_ceiling = args.torchvision_ceiling
    if args.carry_dir:
        c.carry = args.carry_dir.resolve()
    started = time.monotonic()
    command = shlex.join([sys.executable, *sys.argv])
    try:
        c.step_deadline = c.deadline
        c.facts = machine_facts(c)
        print(f"machine: {facts_line(c.facts)}", flush=True)
        print(f"command: {command}", flush=True)
        report: dict[str, Any] = {"schema": 1, "mode": "cpu" if args.cpu else "gpu",
                                  "command": command, "budget_s": budget, "machine": c.facts,
                                  "public_reference": PUBLIC_SOURCE, "work_dir": str(work),
                                  "logs": str(logs), "steps": []}
        no_gpu = not args.cpu and not c.facts.get("cuda")
        for name, title in STEPS:
            if no_gpu:
                why = c.facts.get("error") or "torch.cuda.is_available() is False"
                record = {"name": name, "title": title, "budget_s": sizes.budgets[name],
                          "status": "failed", "seconds": 0.0, "figures": {},
                          "summary": f"no CUDA device ({why}); --cpu runs the CPU mode",
                          "error": f"no CUDA device ({why})"}
            elif args.only and name not in args.only:
                record = {"name": name, "title": title, "budget_s": sizes.budgets[name],
                          "seconds": 0.0, **skipped(f"not in --only {','.join(args.only)}")}
            else:
                record = run_step(c, name, title)
            c.results[name] = record
            report["steps"].append(record)
            report["seconds"] = round(time.monotonic() - started, 1)
            report["counts"] = {k: sum(1 for s in report["steps"] if s["status"] == k)
                                for k in ("passed", "failed", "skipped")}
            report["failed"] = [s["name"] for s in report["steps"] if s["status"] == "failed"]
            write_report(report, json_path, md_path)
            print(f"  {name:<13} {record['status']:<8} {record['seconds']:6.1f} s  "
                  f"{record['summary']}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(markdown(report), end="")
    print(f"report: {json_path}  table: {md_path}  logs: {logs}")
    return 1 if report["failed"] else 0


# ---------------------------------------------------------------------------------------
# Child parts: run in their own interpreter by Check.child; print CHILD_TAG + JSON last


def child_main(name: str, params: dict[str, Any]) -> int:
    funcs: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
        "facts": child_facts, "ceiling": child_ceiling, "data": child_data,
        "checkpoint": child_checkpoint, "variant": child_variant}
    result = funcs[name](params)
    print(CHILD_TAG + json.dumps(result), flush=True)
    return 0


def child_facts(_: dict[str, Any]) -> dict[str, Any]:
    import importlib.util

    import torch

    facts: dict[str, Any] = {"torch": torch.__version__, "torch_cuda": torch.version.cuda,
                             "cuda": torch.cuda.is_available(),
                             "pytest_importable": importlib.util.find_spec("pytest") is not None}
    try:
        import torchvision

        facts["torchvision"] = torchvision.__version__
    except Exception as exc:  # a CPU torch beside a CUDA torchvision fails in many ways
        facts["torchvision"] = None
        facts["torchvision_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    if facts["cuda"]:
        props = torch.cuda.get_device_properties(0)
        facts.update({
            "gpu_count": torch.cuda.device_count(), "gpu_name": props.name,
            "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "gpu_capability": f"{props.major}.{props.minor}",
            "cudnn": torch.backends.cudnn.version(),
            "nccl": _nccl_version(),
            "cuda_archs": torch.cuda.get_arch_list(),
        })
    return facts


def _nccl_version() -> str | None:
    import torch

    try:
        version = torch.cuda.nccl.version()
    except Exception as exc:  # a build without NCCL: worth knowing, not worth failing
        return f"unavailable ({type(exc).__name__})"
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def child_ceiling(p: dict[str, Any]) -> dict[str, Any]:
    """The same model and batch in the shortest training loop there is: one fixed batch
    already on the device, no loader, no per-step host sync, no metrics."""
    import torch
    from torch import nn

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if p.get("threads"):
        torch.set_num_threads(p["threads"])
    if p["model"] == "torchvision":
        import torchvision

        model = getattr(torchvision.models, p["arch"])(num_classes=p["classes"])
    else:
        from trainkit.resnet import build_model

        model = build_model(p["arch"], p["classes"])
    if cuda:
        torch.backends.cudnn.benchmark = True
    fmt = torch.channels_last if cuda else torch.contiguous_format
    model = model.to(device, memory_format=fmt)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-5)
    scaler = torch.amp.GradScaler("cuda") if cuda else None
    criterion = nn.CrossEntropyLoss()
    x = torch.randn(p["batch"], 3, p["image_size"], p["image_size"], device=device)
    x = x.contiguous(memory_format=fmt)
    y = torch.randint(0, p["classes"], (p["batch"],), device=device)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, enabled=cuda):
            loss = criterion(model(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()

    for _ in range(p["warmup"]):
        step()
    _sync(device)
    start = time.perf_counter()
    for _ in range(p["steps"]):
        step()
    _sync(device)
    seconds = time.perf_counter() - start
    out = {"model": f"{p['model']} {p['arch']}", "images_per_sec": round(p["steps"] * p["batch"] / seconds, 1),
           "timed_steps": p["steps"], "warmup_steps": p["warmup"], "seconds": round(seconds, 3)}
    if cuda:
        out["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return out


def _loader_rate(dataset: Any, workers: int, batch: int, pin: bool) -> dict[str, Any]:
    """Images/s the loader delivers once every worker is busy: the first 2 batches per
    worker (started together, while the workers start up) are left out."""
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    warm, timed = max(2, 2 * workers), max(6, 4 * workers)
    sampler = RandomSampler(dataset, replacement=True, num_samples=(warm + timed) * batch,
                            generator=torch.Generator().manual_seed(workers))
    loader = DataLoader(dataset, batch_size=batch, sampler=sampler, num_workers=workers,
                        pin_memory=pin, drop_last=True)
    start = time.perf_counter()
    first = warm_at = None
    count = 0
    for i, _ in enumerate(loader):
        now = time.perf_counter()
        if i == 0:
            first = now - start
        if i == warm - 1:
            warm_at = now
        count = i + 1
    end = time.perf_counter()
    assert warm_at is not None and count == warm + timed, (count, warm, timed)
    return {"workers": workers, "images_per_sec": round(timed * batch / (end - warm_at), 1),
            "timed_images": timed * batch, "first_batch_s": round(first or 0.0, 3)}


class DecodeOnly:
    """Decode with PIL and cut the centre ``size`` x ``size``, as uint8: no random crop, no
    resize, no flip, no float normalisation. Any PIL pipeline, however few augmentations
    it keeps, is at most this fast."""

    def __init__(self, samples: list[tuple[str, int]], size: int) -> None:
        self.samples = samples
        self.size = size

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        import torch
        from PIL import Image

        path, label = self.samples[index]
        with Image.open(path) as im:
            img = im.convert("RGB")
        left, top = (img.width - self.size) // 2, (img.height - self.size) // 2
        img = img.crop((left, top, left + self.size, top + self.size))
        raw = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
        return raw.view(self.size, self.size, 3).permute(2, 0, 1), label


def _gpu_decode_rate(samples: list[tuple[str, int]], size: int, batch: int,
                     batches: int) -> dict[str, Any]:
    """The example's own device decode (trainkit.gpudecode.DeviceDecode: nvJPEG through
    torchvision.io.decode_jpeg(device='cuda'), then the random-resized crop, flip and
    normalisation on the GPU), files read on the host in the main process: with images
    of one size cropped and resized together (the default) and one by one (as before
    2026-11-28), alone on the GPU."""
    import torch
    from trainkit.gpudecode import DeviceDecode, JpegFiles, collate_encoded, nvjpeg_decoder

    device = torch.device("cuda")
    decode, why = nvjpeg_decoder(device)
    if decode is None:
        raise RuntimeError(why)
    files = JpegFiles(samples)
    out: dict[str, Any] = {"timed_images": batches * batch, "batch": batch,
                           "note": "alone on the GPU; while training it shares the GPU"}
    for label, group_from in (("together", DeviceDecode.group_from), ("per_image", 10**9)):
        dec = DeviceDecode(size, True, device, decode, torch.channels_last, seed=0)
        dec.group_from = group_from
        rng = random.Random(0)

        def one_batch(dec: DeviceDecode, rng: random.Random) -> Any:
            return dec(collate_encoded([files[rng.randrange(len(files))] for _ in range(batch)]),
                       epoch=0)

        one_batch(dec, rng)  # nvJPEG's and the kernels' start-up
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(batches):
            one_batch(dec, rng)
        torch.cuda.synchronize()
        out[f"{label}_images_per_sec"] = round(batches * batch / (time.perf_counter() - start), 1)
    out["images_per_sec"] = out["together_images_per_sec"]
    out["together_of_per_image"] = round(out["together_images_per_sec"]
                                         / out["per_image_images_per_sec"], 3)
    return out


def child_data(p: dict[str, Any]) -> dict[str, Any]:
    import torch
    from trainkit.data import ImageFolderDataset

    from hpcdl.data.tiny import TinySpec, make_tiny
    from hpcdl.jobside.imagefolder import scan_imagefolder

    cuda = torch.cuda.is_available()
    start = time.perf_counter()
    made = make_tiny(p["dir"], TinySpec(classes=p["classes"], per_class=p["per_class"],
                                        val_per_class=1, size=p["size"]), force=True)
    generate_s = time.perf_counter() - start
    samples = scan_imagefolder(p["dir"]).samples["train"]
    mean_kib = sum(os.path.getsize(path) for path, _ in samples) / len(samples) / 1024
    out: dict[str, Any] = {
        "images": made["train_images"], "jpeg_size": f"{p['size']}x{p['size']}",
        "mean_jpeg_kib": round(mean_kib, 1), "generate_s": round(generate_s, 1),
        "train_image_size": p["image_size"], "batch": p["batch"],
        "note": ("files sampled with replacement from the page cache (decode and augmentation "
                 "cost, not disk); the generated stripes compress far better than photos "
                 f"({mean_kib:.0f} KiB vs ImageNet's ~110 KiB), so real JPEGs decode slower: "
                 "these rates are upper bounds"),
    }
    dataset = ImageFolderDataset(samples, p["image_size"], train=True, seed=0)
    out["loader"] = [_loader_rate(dataset, w, p["batch"], pin=cuda) for w in p["workers"]]
    most = max(p["workers"])
    size = min(p["image_size"], p["size"])
    out["decode_only"] = _loader_rate(DecodeOnly(samples, size), most, p["batch"], pin=cuda)
    if not cuda:
        out["gpu_decode"] = {"skipped": "no CUDA device (--cpu): nvJPEG needs a GPU"}
    else:
        try:
            out["gpu_decode"] = _gpu_decode_rate(samples, p["image_size"], p["gpu_batch"],
                                                 p["gpu_decode_batches"])
        except Exception as exc:  # torchvision missing or without nvJPEG: say which
            out["gpu_decode"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    target = p.get("target")
    best = max(r["images_per_sec"] for r in out["loader"])
    out["target_images_per_sec"] = target
    out["target_from"] = p.get("target_from")
    out["feeds"] = bool(target) and best >= target
    out["verdict"] = _verdict(out, target, p.get("target_from"))
    return out


def _verdict(out: dict[str, Any], target: float | None, target_from: str | None) -> str:
    if not target:
        return "nothing to compare with (no training figure from step 2)"
    best = max(out["loader"], key=lambda r: r["images_per_sec"])
    head = (f"the example's loader delivers at best {best['images_per_sec']:,.0f} img/s "
            f"({best['workers']} workers) against {target:,.0f} img/s, {target_from}: ")
    if best["images_per_sec"] >= target:
        return head + "it keeps up"
    options = []
    decode = out.get("decode_only", {}).get("images_per_sec")
    if decode:
        enough = "enough" if decode >= target else "not enough either"
        options.append(f"decoding alone with PIL ({out['decode_only']['workers']} workers) "
                       f"gives {decode:,.0f} img/s, so fewer augmentations would be {enough}")
    gpu = out.get("gpu_decode", {}).get("images_per_sec")
    if gpu:
        enough = "would" if gpu >= target else "would not"
        options.append(f"nvJPEG decode and augmentation on the GPU give {gpu:,.0f} img/s "
                       f"(alone on the GPU) and {enough}")
    return head + "it cannot keep up; " + "; ".join(options or ["no alternative measured"])


def child_checkpoint(p: dict[str, Any]) -> dict[str, Any]:
    """Train two steps on this process's GPU (AMP, channels_last as the example), save with
    the example's Checkpoints, load the latest with find_resume_state into a fresh model
    and optimizer, and compare everything bit for bit; then one more step on both."""
    import torch
    from torch import nn
    from trainkit.dist import Backend
    from trainkit.loop import Checkpoints, Progress, Training, find_resume_state
    from trainkit.resnet import build_model

    if p.get("threads"):
        torch.set_num_threads(p["threads"])
    backend = Backend()
    backend._pin_device()  # torch.cuda.set_device(local rank), as the example's backends do
    cuda = backend.device.type == "cuda"
    # Deterministic kernels, so that one more step after the resume can be compared too.
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    fmt = torch.channels_last if cuda else torch.contiguous_format

    def training(seed: int) -> Training:
        torch.manual_seed(seed)
        model = build_model(p["arch"], p["classes"]).to(backend.device, memory_format=fmt)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-5)
        # A small initial scale: the default 2**16 skips the first steps for overflow,
        # and a skipped step leaves no momentum to compare.
        scaler = torch.amp.GradScaler("cuda", init_scale=128.0) if cuda else None
        return Training(backend=backend, model=model, train_model=model, optimizer=optimizer,
                        scaler=scaler, criterion=nn.CrossEntropyLoss(), memory_format=fmt,
                        use_amp=cuda, cuda=cuda)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(p["batch"], 3, p["image_size"], p["image_size"], generator=g)
    y = torch.randint(0, p["classes"], (p["batch"],), generator=g)
    if cuda:
        x, y = x.pin_memory(), y.pin_memory()
    t = training(0)
    sums = torch.zeros(3, dtype=torch.float64)
    for _ in range(2):
        t.step(x, y, 0.01, 1, sums)
    progress = Progress(epoch=0, step_in_epoch=2, global_step=2, global_batch=p["batch"])
    ckpt = Checkpoints(p["dir"], keep=2, rank=0, meta={"arch": p["arch"], "num_classes": p["classes"]})
    start = time.perf_counter()
    ckpt.save(t, progress)
    write_s = time.perf_counter() - start
    start = time.perf_counter()
    found = find_resume_state("latest", p["dir"])
    read_s = time.perf_counter() - start
    assert found is not None and str(found[0]) == ckpt.last, (found, ckpt.last)
    fresh = training(1)
    resumed = fresh.load_state(found[1])
    differences = _differences(t, fresh, backend.device)
    if resumed.__dict__ != progress.__dict__:
        differences.append(f"progress {resumed.__dict__} != {progress.__dict__}")
    for _ in range(1):
        t.step(x, y, 0.01, 1, sums)
        fresh.step(x, y, 0.01, 1, torch.zeros(3, dtype=torch.float64))
    next_equal = all(torch.equal(a, b) for a, b in
                     zip(t.model.parameters(), fresh.model.parameters(), strict=True))
    return {"device": str(backend.device), "arch": p["arch"], "amp": cuda, "channels_last": cuda,
            "equal": not differences, "differences": differences,
            "tensors_compared": len(t.model.state_dict()) + len(t.optimizer.state_dict()["state"]),
            "next_step_equal": next_equal,
            "size_mib": round(Path(ckpt.last or "").stat().st_size / 2**20, 1),
            "write_s": round(write_s, 3), "read_s": round(read_s, 3)}


def _differences(a: Any, b: Any, device: Any) -> list[str]:
    """What differs between two Trainings' weights, buffers, optimizer and scaler state,
    and which loaded tensor is not on ``device``."""
    import torch

    out = []
    sa, sb = a.model.state_dict(), b.model.state_dict()
    for name in sa:
        if name not in sb or not torch.equal(sa[name], sb[name]):
            out.append(f"model.{name} differs")
        elif sb[name].device != device:
            out.append(f"model.{name} on {sb[name].device}, not {device}")
    oa, ob = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
    if not oa:
        out.append("no optimizer state to compare (every step skipped?)")
    for key, entry in oa.items():
        other = ob.get(key, {}).get("momentum_buffer")
        if other is None or not torch.equal(entry["momentum_buffer"], other):
            out.append(f"optimizer state {key} differs")
        elif other.device != device:
            out.append(f"optimizer state {key} on {other.device}, not {device}")
    if a.scaler is not None and a.scaler.state_dict() != b.scaler.state_dict():
        out.append(f"scaler {a.scaler.state_dict()} != {b.scaler.state_dict()}")
    return out


if __name__ == "__main__":
    sys.exit(main())
