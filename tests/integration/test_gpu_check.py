"""bench/gpu_check.py in its CPU mode, as a subprocess: the report the one call on a lent
GPU machine has to bring back is whole (every step, GPU parts skipped with a reason, CPU
parts measured), the markdown table has a row per step, and the machine and the command
to rerun are printed. The GPU mode itself needs a GPU: docs/benchmarks.md#gpu-check."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# One worker for the module: its tests share one run of the whole check (cpu_check, a
# module fixture), which two xdist workers would each run (~2 min of both cores).
pytestmark = [pytest.mark.torch, pytest.mark.xdist_group("gpu-check")]

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.py"
STEPS = ["gpu_tests", "example", "tuning", "data", "checkpoint", "apptainer_nv", "horovod"]
TIMEOUT = 420  # s: ~1 min on an idle 2-core VM, 222 s at load 9; the check's own budget is 330 s


@pytest.fixture(scope="module")
def cpu_check(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str, str]:
    out = tmp_path_factory.mktemp("gpu-check")
    res = subprocess.run([sys.executable, str(SCRIPT), "--cpu", "--json", str(out / "gpu.json"),
                          "--md", str(out / "gpu.md")], capture_output=True, text=True,
                         timeout=TIMEOUT, cwd=out, stdin=subprocess.DEVNULL, check=False)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    return json.loads((out / "gpu.json").read_text()), (out / "gpu.md").read_text(), res.stdout


def _steps(report: dict) -> dict[str, dict]:
    return {s["name"]: s for s in report["steps"]}


def test_every_step_is_reported_in_order_within_its_budget(cpu_check) -> None:
    report, _, stdout = cpu_check
    assert report["mode"] == "cpu" and [s["name"] for s in report["steps"]] == STEPS
    assert report["failed"] == [] and report["seconds"] < report["budget_s"]
    for step in report["steps"]:
        assert step["status"] in ("passed", "skipped"), step
        assert 0 <= step["seconds"] <= step["budget_s"] + 5, step  # a child may end late by its kill
    assert report["machine"]["cores"] >= 1 and report["machine"]["torch"]
    assert stdout.startswith("machine: ") and "\ncommand: " in stdout
    assert "gpu_check.py --cpu" in report["command"]


def test_gpu_parts_are_skipped_with_a_reason(cpu_check) -> None:
    steps = _steps(cpu_check[0])
    for name in ("gpu_tests", "apptainer_nv"):
        assert steps[name]["status"] == "skipped" and steps[name]["reason"], steps[name]
    # --cpu hides CUDA: the gpu-marked tests ran and skipped themselves, or pytest is absent.
    assert ("no CUDA device" in steps["gpu_tests"]["reason"]
            or "pytest is not installed" in steps["gpu_tests"]["reason"])
    if "no CUDA device" in steps["gpu_tests"]["reason"]:
        assert steps["gpu_tests"]["figures"]["skipped"] >= 5
    assert steps["example"]["figures"]["public"]["skipped"].startswith("--cpu")
    assert "no CUDA device" in steps["data"]["figures"]["gpu_decode"]["skipped"]


def test_the_example_is_measured_under_torchrun_plain_and_against_its_ceiling(cpu_check) -> None:
    fig = _steps(cpu_check[0])["example"]["figures"]
    assert _steps(cpu_check[0])["example"]["status"] == "passed"
    assert fig["torchrun"]["launcher"] == "torchrun" and fig["plain"]["launcher"] == "single"
    for run in ("torchrun", "plain"):
        assert fig[run]["device"] == "cpu" and fig[run]["world_size"] == 1
        assert fig[run]["images_per_sec"] > 0 and fig[run]["timed_steps"] == 6
        assert fig[run]["synthetic_dtype"] == "uint8"  # the default; float32 is a tuning variant
    assert fig["ceiling"]["images_per_sec"] > 0 and fig["ceiling"]["model"] == "trainkit resnet18"
    assert fig["torchrun_of_ceiling"] > 0 and fig["plain_of_ceiling"] > 0


def test_the_tuning_step_measures_each_variant_of_the_step(cpu_check) -> None:
    step = _steps(cpu_check[0])["tuning"]
    variants = step["figures"]["variants"]
    assert step["status"] == "passed" and list(variants) == ["default", "synthetic_float32",
                                                             "sync_each_step", "ddp_all"]
    for name, run in variants.items():
        assert run["variant"] == name and run["images_per_sec"] > 0, run
        assert run["timed_steps"] == 6 and run["wall_images_per_sec"] > 0
    assert "profile" not in step["figures"]  # the trace is the GPU mode's
    assert step["summary"].startswith("img/s: default ")


def test_the_data_path_is_measured_per_worker_count(cpu_check) -> None:
    step = _steps(cpu_check[0])["data"]
    fig = step["figures"]
    assert step["status"] == "passed" and fig["images"] == 48
    assert [r["workers"] for r in fig["loader"]] == [0, 1]
    assert all(r["images_per_sec"] > 0 for r in fig["loader"])
    assert fig["decode_only"]["images_per_sec"] > 0
    rate = _steps(cpu_check[0])["example"]["figures"]["torchrun"]["images_per_sec"]
    assert fig["target_images_per_sec"] == rate and isinstance(fig["feeds"], bool)
    assert fig["verdict"].startswith("the example's loader delivers at best")
    # The example itself from the JPEGs: the device decode's code with PIL on the CPU
    # (--decode tensor), the workers' PIL path, and step 2's synthetic run beside them.
    runs = fig["training"]
    assert list(runs) == ["decode_tensor", "decode_tensor_per_image", "decode_cpu", "synthetic"]
    for label, decode in (("decode_tensor", "tensor"), ("decode_cpu", "cpu")):
        run = runs[label]
        assert run["decode"] == decode and run["decode_fallbacks"] == 0, run
        assert run["images_per_sec"] > 0 and run["timed_steps"] == 4 and run["workers"] == 1
        assert 0 <= run["data_wait_share"] < 1 and run["of_synthetic"] > 0
        assert f"--decode {decode}" in run["command"]
    assert runs["synthetic"]["from"] == "step example, plain run"
    # The same decode with the crop and resize image by image (the old way), in one
    # process through child_variant's patch, measured the same way.
    old = runs["decode_tensor_per_image"]
    assert old["decode"] == "tensor" and old["patch"] == {"per_image_crop": True}
    assert old["images_per_sec"] > 0 and old["timed_steps"] == 4 and old["of_synthetic"] > 0
    assert "decode_tensor" in step["summary"] and "data wait" in step["summary"]


def test_the_checkpoint_round_trip_is_equal(cpu_check) -> None:
    step = _steps(cpu_check[0])["checkpoint"]
    fig = step["figures"]
    assert step["status"] == "passed" and fig["device"] == "cpu"
    assert fig["equal"] is True and fig["differences"] == [] and fig["tensors_compared"] > 100
    assert fig["next_step_equal"] is True and fig["size_mib"] > 1


def test_horovod_runs_the_example_one_rank_or_names_what_is_missing(cpu_check) -> None:
    step = _steps(cpu_check[0])["horovod"]
    fig = step["figures"]
    found = fig["prerequisites"]["found"]
    # The CPU mode asks only for what a CPU build needs; the GPU mode adds nvcc, CUDA's
    # headers and NCCL's.
    assert {"source archive", "cmake", "C++ compiler", "Python.h", "torch C++ headers"} <= set(found)
    assert "nvcc" not in found
    if fig["prerequisites"]["preinstalled_horovod"]:  # this VM: Horovod is installed
        assert step["status"] == "passed", step
        assert fig["built_with"]["gloo"] and fig["built_with"]["size"] == 1
        run = fig["example"]
        assert run["device"] == "cpu" and run["world_size"] == 1 and run["images_per_sec"] > 0
        assert "--backend horovod" in run["command"]
    else:  # no Horovod: skipped, naming what is missing or that the build takes minutes
        assert step["status"] == "skipped"
        assert step["reason"].startswith(("cannot build Horovod here: missing", "--cpu: "))


def test_the_markdown_table_has_a_row_per_step(cpu_check) -> None:
    report, md, _ = cpu_check
    rows = [line for line in md.splitlines() if line.startswith("| ") and "`" in line]
    assert len(rows) == len(STEPS)
    for i, (row, step) in enumerate(zip(rows, report["steps"], strict=True), 1):
        assert row.startswith(f"| {i}. `{step['name']}`") and f"| {step['status']} |" in row
    assert md.startswith("# hpcdl GPU check (cpu mode)")
