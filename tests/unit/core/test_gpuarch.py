"""The GPU architecture table and the plan-time check (hpcdl/core/gpuarch.py), the build
record's image facts (the %test line hpcdl build keeps), and how the plan and the
preflight step use them. Pure functions on crafted facts; the real image's record is
checked in tests/integration/test_gpu_image.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hpcdl.container.build import parse_image_facts_line
from hpcdl.core.gpuarch import (
    ImageArchFacts,
    check_partition,
    compute_capability,
    facts_from_record,
    runs_on,
)
from hpcdl.doctor.host import HostFacts
from hpcdl.doctor.image import ImageFacts
from hpcdl.doctor.parse import parse_cuda_archs
from hpcdl.doctor.verdicts import verdicts
from hpcdl.errors import ValidationError
from hpcdl.jobs.preflight import image_arch_facts
from hpcdl.plan import JobRequest, build_plan
from hpcdl.profiles import load_profile

# torch 2.14.1+cu130 from PyPI (torch._C._cuda_getArchFlags(), read on this machine)
CU13 = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")
CU13_FACTS = ImageArchFacts(image="/img/gpu.sif", archs=CU13, torch="2.14.1+cu130",
                            torch_cuda="13.0")


@pytest.mark.parametrize(("gpu_type", "cc"), [
    ("V100", (7, 0)), ("V100 (NVLink)", (7, 0)), ("Tesla V100-SXM2-32GB", (7, 0)),
    ("A100", (8, 0)), ("A100-SXM4-40GB", (8, 0)), ("NVIDIA A100 80GB PCIe", (8, 0)),
    ("a100", (8, 0)), ("A10", (8, 6)), ("A40", (8, 6)), ("L40S", (8, 9)), ("L4", (8, 9)),
    ("H100", (9, 0)), ("h100_sxm5", (9, 0)), ("GH200", (9, 0)), ("H200", (9, 0)),
    ("B200", (10, 0)), ("K80", (3, 7)), ("RTX 2080 Ti", (7, 5)), ("T4", (7, 5)),
    ("P100", (6, 0)),
])
def test_compute_capability_of_named_gpus(gpu_type: str, cc: tuple[int, int]) -> None:
    assert compute_capability(gpu_type) == cc


@pytest.mark.parametrize("gpu_type", ["fake", "mi250x", "A1000X", "gpu", ""])
def test_unknown_gpu_types_are_none(gpu_type: str) -> None:
    assert compute_capability(gpu_type) is None


@pytest.mark.parametrize(("cc", "archs", "ok"), [
    ((7, 0), CU13, False),            # V100 on a CUDA 13 torch: no kernel
    ((8, 0), CU13, True),
    ((8, 9), CU13, True),             # sm_86 cubin runs on 8.9 (same major, higher minor)
    ((9, 0), CU13, True),
    ((10, 3), CU13, True),            # sm_100 cubin on 10.3
    ((12, 1), CU13, True),
    ((7, 0), ("sm_75", "compute_70"), True),   # PTX JIT-compiles upwards
    ((6, 0), ("sm_75", "compute_70"), False),
    ((9, 0), ("sm_80",), False),      # different major: a cubin does not run
    ((9, 0), ("sm_90a",), True),      # arch-specific: exactly that capability
    ((10, 0), ("sm_90a",), False),
    ((8, 0), ("bogus", "sm_x"), False),
    ((8, 0), (), False),
])
def test_runs_on(cc: tuple[int, int], archs: tuple[str, ...], ok: bool) -> None:
    assert runs_on(cc, archs) is ok


def test_v100_partition_with_a_cuda13_image_is_one_line_error() -> None:
    v = check_partition("cas_v100_4", "V100", 4, CU13_FACTS)
    assert v.warning is None and v.error is not None
    assert "\n" not in v.error
    for part in ("cas_v100_4", "V100", "sm_70", "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120",
                 "2.14.1+cu130", "/img/gpu.sif"):
        assert part in v.error


def test_supported_partition_says_nothing() -> None:
    assert check_partition("qgpu", "A100-SXM4-40GB", 8, CU13_FACTS) == check_partition(
        "p", "V100", 0, CU13_FACTS)
    v = check_partition("qgpu", "A100-SXM4-40GB", 8, CU13_FACTS)
    assert v.error is None and v.warning is None


def test_no_check_without_gpus_image_or_real_gpu_type() -> None:
    assert check_partition("p", "V100", 0, CU13_FACTS).error is None  # CPU-only job
    assert check_partition("p", "V100", 2, None).error is None  # no image
    none = check_partition("debug", "fake", 2, CU13_FACTS)  # the sandbox's fake GRES
    assert none.error is None and none.warning is None
    cpu = ImageArchFacts(image="cpu.sif", archs=(), torch="2.13.0+cpu", torch_cuda=None)
    assert check_partition("p", "V100", 2, cpu).error is None


@pytest.mark.parametrize(("gpu_type", "facts", "needle"), [
    ("MI250X", CU13_FACTS, "'MI250X' of partition p is not in hpcdl's table"),
    (None, CU13_FACTS, "partition p names no gpu_type"),
    ("V100", ImageArchFacts(image="docker://x/y:1", unknown="a remote image is not read"),
     "not checked: a remote image is not read for image docker://x/y:1"),
])
def test_what_was_not_checked_is_said(gpu_type: str | None, facts: ImageArchFacts,
                                      needle: str) -> None:
    v = check_partition("p", gpu_type, 2, facts)
    assert v.error is None and v.warning is not None
    assert v.warning.startswith("GPU architecture not checked")
    assert needle in v.warning


def test_facts_from_record() -> None:
    rec = {"image_facts": {"torch": "2.14.1+cu130", "torch_cuda": "13.0",
                           "cuda_archs": list(CU13), "nccl": "2.30.7"}}
    assert facts_from_record("i.sif", rec) == CU13_FACTS.__class__(
        image="i.sif", archs=CU13, torch="2.14.1+cu130", torch_cuda="13.0")
    assert facts_from_record("i.sif", None).unknown == "no hpcdl build record beside the image"
    assert "older hpcdl" in (facts_from_record("i.sif", {"hash": "x"}).unknown or "")
    bad = facts_from_record("i.sif", {"image_facts": {"cuda_archs": "sm_80"}})
    assert bad.archs is None and "malformed" in (bad.unknown or "")


def test_parse_image_facts_line() -> None:
    data = {"torch": "2.14.1+cu130", "torch_cuda": "13.0", "cuda_archs": ["sm_80"], "nccl": "2.30.7"}
    assert parse_image_facts_line("HPCDL_IMAGE_FACTS " + json.dumps(data) + "\n") == data
    # apptainer may prefix %test output
    assert parse_image_facts_line("INFO: HPCDL_IMAGE_FACTS " + json.dumps(data)) == data
    assert parse_image_facts_line("torch 2.14.1") is None
    assert parse_image_facts_line("HPCDL_IMAGE_FACTS {broken") is None
    assert parse_image_facts_line("HPCDL_IMAGE_FACTS [1, 2]") is None


def test_parse_cuda_archs_from_the_probe() -> None:
    assert parse_cuda_archs(["sm_75", "sm_90a", "compute_120"]) == ["sm_75", "sm_90a", "compute_120"]
    assert parse_cuda_archs("sm_80 sm_86") == ["sm_80", "sm_86"]
    assert parse_cuda_archs(["sm_80; rm -rf /", 3, "sm_86"]) == ["sm_86"]
    assert parse_cuda_archs(None) == []


def _gpu_image(archs: list[str]) -> ImageFacts:
    return ImageFacts(path="gpu.sif", python="3.11.2", torch="2.14.1+cu130", torch_cuda="13.0",
                      cuda_archs=archs, nccl="2.30.7", labels={"org.hpcdl.gpu": "true"})


def test_doctor_compares_the_host_gpu_with_the_image_archs() -> None:
    host = HostFacts(runtime="apptainer", gpus=["Tesla V100-SXM2-32GB"], driver_version="580.1",
                     driver_cuda="13.0", gpu_compute_cap="7.0")
    problems = [v for v in verdicts(host, _gpu_image(list(CU13))) if v.topic == "GPU architecture"]
    assert len(problems) == 1 and problems[0].level == "problem"
    assert "sm_70" in problems[0].message and "sm_75" in problems[0].message
    host_h100 = HostFacts(runtime="apptainer", gpus=["NVIDIA H100"], driver_version="580.1",
                          driver_cuda="13.0", gpu_compute_cap="9.0")
    checks = verdicts(host_h100, _gpu_image(list(CU13)))
    assert not [v for v in checks if v.topic == "GPU architecture"]
    image_line = next(v for v in checks if v.topic == "image")
    assert "GPU architectures sm_75 sm_80" in image_line.message and "NCCL 2.30.7" in image_line.message


def test_doctor_warns_about_a_cuda_torch_without_archs() -> None:
    checks = verdicts(HostFacts(runtime="apptainer"), _gpu_image([]))
    assert any(v.topic == "torch" and v.level == "warning" and "no GPU architecture" in v.message
               for v in checks)


def test_plan_refuses_neuron_v100_with_a_cuda13_image() -> None:
    neuron = load_profile("neuron")
    req = JobRequest.of(nodes=1, gpus=2, image="/img/gpu.sif")
    with pytest.raises(ValidationError) as err:
        build_plan(neuron, req, CU13_FACTS)
    assert "cas_v100_2: GPU type V100 is sm_70" in err.value.message
    assert err.value.hint and "--partition" in err.value.hint
    # Without the facts the plan does not check (and does not pretend it did).
    assert build_plan(neuron, req).warnings == ()
    ok = build_plan(neuron, JobRequest.of(nodes=1, gpus=2, image="/img/gpu.sif",
                                       partition="amd_a100_2"), CU13_FACTS)
    assert ok.spec.partition.name == "amd_a100_2" and ok.warnings == ()


def test_plan_carries_the_not_checked_warning() -> None:
    unknown = ImageArchFacts(image="/img/x.sif", unknown="no hpcdl build record beside the image")
    plan = build_plan(load_profile("neuron"), JobRequest.of(nodes=1, gpus=2, image="/img/x.sif"),
                      unknown)
    assert any("GPU architecture not checked: no hpcdl build record" in w for w in plan.warnings)


def _image_with_record(tmp_path: Path, record: dict[str, object] | None) -> Path:
    img = tmp_path / "gpu.sif"
    img.write_bytes(b"SIF")
    if record is not None:
        (tmp_path / "gpu.sif.hash").write_text(json.dumps({"version": 1, **record}))
    return img


def test_preflight_reads_the_build_record(tmp_path: Path) -> None:
    img = _image_with_record(tmp_path, {"image_facts": {
        "torch": "2.14.1+cu130", "torch_cuda": "13.0", "cuda_archs": list(CU13)}})
    facts = image_arch_facts(str(img))
    assert facts is not None and facts.archs == CU13 and facts.torch_cuda == "13.0"
    assert image_arch_facts(None) is None
    assert "remote" in (image_arch_facts("docker://nvcr.io/nvidia/pytorch:24.10-py3").unknown or "")
    assert "not a file" in (image_arch_facts(str(tmp_path / "missing.sif")).unknown or "")


def test_preflight_ignores_a_record_older_than_the_image(tmp_path: Path) -> None:
    img = _image_with_record(tmp_path, {"image_facts": {
        "torch": "2.14.1+cu130", "torch_cuda": "13.0", "cuda_archs": list(CU13)}})
    rec = tmp_path / "gpu.sif.hash"
    st = img.stat()
    os.utime(rec, ns=(st.st_atime_ns, st.st_mtime_ns - 10**9))
    facts = image_arch_facts(str(img))
    assert facts is not None and facts.archs is None
    assert facts.unknown == "its build record is older than the image"


def test_preflight_without_a_record(tmp_path: Path) -> None:
    facts = image_arch_facts(str(_image_with_record(tmp_path, None)))
    assert facts is not None and facts.unknown == "no hpcdl build record beside the image"


def test_submit_dry_run_refuses_in_one_line_exit_2(tmp_path: Path) -> None:
    from tests.unit.clirun import hpcdl

    img = _image_with_record(tmp_path, {"image_facts": {
        "torch": "2.14.1+cu130", "torch_cuda": "13.0", "cuda_archs": list(CU13)}})
    r = hpcdl("submit", "-p", "neuron", "-N", "1", "-G", "2", "--image", str(img), "--dry-run")
    assert r.returncode == 2 and r.stdout == ""
    first = r.stderr.strip().splitlines()[0]
    assert "cas_v100_2: GPU type V100 is sm_70" in first and str(img) in first, r.stderr
    assert "Traceback" not in r.stderr


def test_a_sweep_is_checked_point_by_point() -> None:
    from hpcdl.sweep.grid import expand, plan_points

    neuron = load_profile("neuron")
    base = JobRequest.of(image="/img/gpu.sif", partition="cas_v100_4")
    with pytest.raises(ValidationError) as err:
        plan_points(neuron, base, expand(("horovod",), (1,), (1, 2), None),
                    image_facts=CU13_FACTS)
    assert "GPU type V100 is sm_70" in err.value.message
    a100 = JobRequest.of(image="/img/gpu.sif", partition="amd_a100_4")
    assert len(plan_points(neuron, a100, expand(("horovod",), (1,), (1, 2), None),
                           image_facts=CU13_FACTS)) == 2
