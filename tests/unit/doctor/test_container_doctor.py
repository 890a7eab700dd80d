"""Doctor: parsing of tool output and the verdict rules, on crafted facts."""

from __future__ import annotations

import pytest

from hpcdl.container.runtime import missing_capabilities, parse_version
from hpcdl.doctor.host import HostFacts
from hpcdl.doctor.image import ImageFacts, apply_probe, probe_source
from hpcdl.doctor.parse import (
    parse_horovod_cb,
    parse_mpi_version,
    parse_shared_loop_devices,
)
from hpcdl.doctor.profile import ProfileFacts
from hpcdl.doctor.verdicts import Verdict, verdicts

CB_CPU = """Horovod v0.28.1:

Available Frameworks:
    [ ] TensorFlow
    [X] PyTorch
    [ ] MXNet

Available Controllers:
    [X] MPI
    [X] Gloo

Available Tensor Operations:
    [ ] NCCL
    [ ] DDL
    [ ] CCL
    [X] MPI
    [X] Gloo
"""


def host(**kw) -> HostFacts:  # type: ignore[no-untyped-def]
    base = dict(runtime="apptainer", runtime_version="1.4.5", runtime_path="/usr/bin/apptainer",
                slurm_version="22.05.8",
                slurm_tools={t: True for t in ("sbatch", "srun", "squeue")},
                srun_mpi=["cray_shasta", "none", "pmi2", "pmix"], pmix_plugins=["pmix_v4"],
                mpi_flavour="openmpi", mpi_version="4.1.4")
    base.update(kw)
    return HostFacts(**base)


def image(**kw) -> ImageFacts:  # type: ignore[no-untyped-def]
    parsed = parse_horovod_cb(CB_CPU)
    base = dict(path="img.sif", python="3.11.2", torch="2.13.0+cpu", horovod="0.28.1",
                horovod_frameworks=parsed["frameworks"], horovod_controllers=parsed["controllers"],
                horovod_operations=parsed["operations"], mpi_flavour="openmpi",
                mpi_version="4.1.4", labels={"org.hpcdl.pmix.version": "4.2.2",
                                             "org.hpcdl.gpu": "false"})
    base.update(kw)
    return ImageFacts(**base)


def levels(vs: list[Verdict]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for v in vs:
        out.setdefault(v.level, []).append(v.topic)
    return out


def problem(vs: list[Verdict], topic: str) -> Verdict:
    found = [v for v in vs if v.level == "problem" and v.topic == topic]
    assert found, f"no problem about {topic}: {vs}"
    assert found[0].fix, "every problem carries its fix"
    return found[0]


def test_parse_horovod_cb() -> None:
    p = parse_horovod_cb(CB_CPU)
    assert p["frameworks"] == {"TensorFlow": False, "PyTorch": True, "MXNet": False}
    assert p["controllers"] == {"MPI": True, "Gloo": True}
    assert p["operations"]["NCCL"] is False and p["operations"]["Gloo"] is True


@pytest.mark.parametrize("text,expected", [
    ("mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/",
     ("openmpi", "4.1.4")),
    ("Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4", ("openmpi", "4.1.4")),
    ("MPICH Version:      4.1.2\nMPICH Release date: ...", ("mpich", "4.1.2")),
    ("HYDRA build details:\n    Version:                                 3.4.1", ("mpich", "3.4.1")),
    ("Intel(R) MPI Library for Linux* OS, Version 2021.10 Build", ("intelmpi", "2021.10")),
    ("something else", (None, None)),
])
def test_parse_mpi_version(text: str, expected: tuple) -> None:
    assert parse_mpi_version(text) == expected


def test_parse_runtime_version() -> None:
    assert parse_version("apptainer version 1.4.5") == "1.4.5"
    assert parse_version("singularity-ce version 4.1.0-jammy") == "4.1.0-jammy"


def test_missing_capabilities() -> None:
    status = "Name:\tx\nCapPrm:\t000001fffeffffff\nCapEff:\t000001fffeffffff\n"
    assert missing_capabilities(status, 40) == ["CAP_SYS_RESOURCE"]
    assert missing_capabilities("CapPrm:\t000001ffffffffff\n", 40) == []
    assert missing_capabilities("no caps line", 40) == []


def test_all_good_has_no_problem() -> None:
    vs = verdicts(host(), image())
    assert "problem" not in levels(vs), vs
    assert any(v.topic == "MPI" and v.level == "ok" for v in vs)
    assert any(v.topic == "PMIx" and v.level == "ok" for v in vs)


def test_no_runtime_is_a_problem_with_install_fix() -> None:
    v = problem(verdicts(host(runtime=None, runtime_error="neither apptainer nor singularity "
                              "is on PATH")), "runtime")
    assert "install-apptainer.sh" in (v.fix or "")


def test_missing_slurm_tools_is_a_warning() -> None:
    vs = verdicts(host(slurm_tools={"sbatch": False, "srun": False, "squeue": False}))
    assert "slurm" in levels(vs)["warning"]


def test_mpi_flavour_mismatch() -> None:
    v = problem(verdicts(host(mpi_flavour="mpich", mpi_version="4.1.2"), image()), "MPI")
    assert "hybrid" in v.message


def test_mpi_major_mismatch_problem_minor_warning() -> None:
    problem(verdicts(host(mpi_version="5.0.3"), image()), "MPI")
    vs = verdicts(host(mpi_version="4.0.7"), image())
    assert "MPI" in levels(vs)["warning"] and "problem" not in levels(vs)


def test_pmix_mismatch_warns() -> None:
    vs = verdicts(host(pmix_plugins=["pmix_v3"]), image())
    assert "PMIx" in levels(vs)["warning"]


def test_profile_srun_mpi_not_offered() -> None:
    prof = ProfileFacts(name="x", srun_mpi="pmix", launcher="srun", nv=False, gpus_per_node=0)
    v = problem(verdicts(host(srun_mpi=["none", "pmi2"]), None, prof), "srun --mpi")
    assert "pmi2" in v.message


def test_pmi2_with_openmpi_image_warns() -> None:
    prof = ProfileFacts(name="x", srun_mpi="pmi2", launcher="srun", nv=False, gpus_per_node=0)
    vs = verdicts(host(), image(), prof)
    assert any(v.topic == "srun --mpi" and v.level == "warning" for v in vs)


def test_no_nv_possible_without_gpus() -> None:
    prof = ProfileFacts(name="sandbox", srun_mpi="pmix", launcher="srun", nv=True, gpus_per_node=4)
    vs = verdicts(host(), None, prof)
    assert "--nv" in levels(vs)["warning"]
    gpu_img = image(labels={"org.hpcdl.gpu": "true"}, torch_cuda="12.6")
    vs = verdicts(host(), gpu_img)
    assert "--nv" in levels(vs)["warning"]


def test_gpu_image_without_nccl_is_a_problem() -> None:
    gpu_img = image(labels={"org.hpcdl.gpu": "true"}, torch_cuda="12.6", nccl="2.22.3")
    v = problem(verdicts(host(gpus=["NVIDIA H100"], driver_version="550.54", driver_cuda="12.6"),
                         gpu_img), "horovod")
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in (v.fix or "")


def test_gpu_image_with_nccl_ok() -> None:
    ops = {"NCCL": True, "MPI": True, "Gloo": True}
    gpu_img = image(labels={"org.hpcdl.gpu": "true"}, torch_cuda="12.6", horovod_operations=ops)
    vs = verdicts(host(gpus=["NVIDIA H100"], driver_version="560.35", driver_cuda="12.6"), gpu_img)
    assert "problem" not in levels(vs), vs


def test_driver_too_old_for_image_cuda() -> None:
    ops = {"NCCL": True}
    gpu_img = image(labels={"org.hpcdl.gpu": "true"}, torch_cuda="12.6", horovod_operations=ops)
    v = problem(verdicts(host(gpus=["A100"], driver_version="535.1", driver_cuda="12.2"), gpu_img),
                "CUDA")
    assert "12.6" in v.message and "12.2" in v.message


def test_horovod_without_pytorch_or_controllers() -> None:
    img = image(horovod_frameworks={"PyTorch": False}, horovod_controllers={"MPI": False,
                                                                            "Gloo": False})
    vs = verdicts(host(), img)
    assert sum(v.topic == "horovod" and v.level == "problem" for v in vs) == 2


def test_missing_image_is_a_problem() -> None:
    problem(verdicts(host(), ImageFacts(path="nope.sif", exists=False)), "image")


def test_cpu_image_on_gpu_host_warns() -> None:
    vs = verdicts(host(gpus=["A100"], driver_version="550", driver_cuda="12.4"), image())
    assert "GPUs" in levels(vs)["warning"]


def test_shared_loop_devices_parsed_and_judged() -> None:
    conf = ("# SHARED LOOP DEVICES: [BOOL]\n# shared loop devices = yes\n"
            "shared loop devices = no\n")
    assert parse_shared_loop_devices(conf) is False
    assert parse_shared_loop_devices(conf.replace("= no", "= yes")) is True
    assert parse_shared_loop_devices("# nothing set\n") is False  # Apptainer's default
    warned = [v for v in verdicts(host(shared_loop_devices=False)) if v.topic == "image mounts"]
    assert [v.level for v in warned] == ["warning"]
    assert "shared loop devices = yes" in (warned[0].fix or "")
    ok = [v for v in verdicts(host(shared_loop_devices=True)) if v.topic == "image mounts"]
    assert [v.level for v in ok] == ["ok"]
    assert not [v for v in verdicts(host()) if v.topic == "image mounts"]  # unreadable: silent


def test_probe_script_ships_in_the_package_and_runs_only_as_main() -> None:
    source = probe_source()
    assert 'print("HPCDL_PROBE " + json.dumps(out))' in source
    compile(source, "probe.py", "exec")  # the image's python3 -c gets valid source
    ran: list[str] = []
    scope = {"__name__": "hpcdl.doctor.probe", "print": ran.append}
    exec(compile(source, "probe.py", "exec"), scope)  # noqa: S102 - our own package file
    assert ran == [] and callable(scope["main"])  # imported, it probes nothing


def test_apply_probe_fills_image_facts() -> None:
    facts = ImageFacts(path="i.sif")
    apply_probe(facts, {"python": "3.11.2", "torch": "2.13.0", "torch_cuda": "13.0",
                        "cuda_archs": ["sm_90", "bogus"], "nccl": "2.27.3",
                        "horovod": "0.28.1", "horovod_table": CB_CPU,
                        "mpi_library": "Open MPI v4.1.4, package: Debian\nmore"})
    assert (facts.python, facts.torch, facts.torch_cuda, facts.nccl, facts.horovod) == \
        ("3.11.2", "2.13.0", "13.0", "2.27.3", "0.28.1")
    assert facts.cuda_archs == ["sm_90"] and facts.gpu_image
    assert facts.horovod_table == CB_CPU and facts.horovod_frameworks["PyTorch"] is True
    assert facts.horovod_operations["NCCL"] is False
    assert facts.mpi_library == "Open MPI v4.1.4, package: Debian"
    assert (facts.mpi_flavour, facts.mpi_version) == ("openmpi", "4.1.4")
    bare = ImageFacts(path="cpu.sif")
    apply_probe(bare, {"python": "3.11.2", "torch_error": "ImportError()"})
    assert bare.torch is None and bare.horovod_table is None and not bare.gpu_image
