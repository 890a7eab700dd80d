"""hpcdl.doctor.verdicts' pieces: the table of image checks and the topic checks on
their own (the doctor's whole output is tested in test_container_doctor.py)."""

from __future__ import annotations

from hpcdl.doctor import verdicts as v
from hpcdl.doctor.host import HostFacts
from hpcdl.doctor.image import ImageFacts
from hpcdl.doctor.profile import ProfileFacts

HOST = HostFacts(runtime="apptainer", runtime_version="1.3.4", runtime_path="/usr/bin/apptainer",
                 mpi_flavour="openmpi", mpi_version="4.1.5")


def _levels(out: list[v.Verdict]) -> list[tuple[str, str]]:
    return [(x.level, x.topic) for x in out]


def test_image_checks_run_in_the_order_doctor_prints_them():
    assert [c.__name__ for c in v.IMAGE_CHECKS] == [
        "_torch_verdicts", "_horovod_verdicts", "_mpi_verdicts", "_pmix_verdicts",
        "_gpu_verdicts"]
    image = ImageFacts(path="/x.sif", python="3.11", torch="2.3.0", mpi_flavour="openmpi",
                       mpi_version="4.1.2")
    topics = [x.topic for x in v.verdicts(HOST, image)]
    assert topics[topics.index("image"):] == ["image", "horovod", "MPI"]


def test_mpi_matching_host_and_image_by_major_and_minor():
    def judge(image_mpi: str | None, version: str | None = None) -> list[tuple[str, str]]:
        image = ImageFacts(path="/x.sif", mpi_flavour=image_mpi, mpi_version=version)
        return _levels(v._mpi_verdicts(HOST, image, None))

    assert judge("openmpi", "4.1.2") == [("ok", "MPI")]
    assert judge("openmpi", "4.0.7") == [("warning", "MPI")]
    assert judge("openmpi", "5.0.1") == [("problem", "MPI")]
    assert judge("mpich", "4.1.5") == [("problem", "MPI")]
    assert judge(None) == [("warning", "MPI")]
    # No MPI on the host: nothing to match against an image that has one.
    image = ImageFacts(path="/x.sif", mpi_flavour="openmpi", mpi_version="4.1.2")
    assert v._mpi_verdicts(HostFacts(), image, None) == []


def test_gpu_checks_name_the_first_mismatch_only():
    gpu_host = HostFacts(gpus=["H100"], gpu_compute_cap="9.0", driver_version="550",
                         driver_cuda="12.4")
    cuda13 = ImageFacts(path="/x.sif", torch_cuda="13.0",
                        cuda_archs=["sm_80", "sm_90"])
    assert _levels(v._gpu_verdicts(gpu_host, cuda13, None)) == [("problem", "CUDA")]
    old_arch = ImageFacts(path="/x.sif", torch_cuda="13.0", cuda_archs=["sm_100"])
    assert _levels(v._gpu_verdicts(gpu_host, old_arch, None)) == [("problem", "GPU architecture")]
    assert _levels(v._gpu_verdicts(HostFacts(), cuda13, None)) == [("warning", "--nv")]
    cpu = ImageFacts(path="/x.sif")
    assert _levels(v._gpu_verdicts(gpu_host, cpu, None)) == [("warning", "GPUs")]
    assert v._gpu_verdicts(HostFacts(), cpu, None) == []


def test_pmix_and_pmi2_warnings():
    host = HostFacts(pmix_plugins=["pmix_v4"])
    image = ImageFacts(path="/x.sif", labels={"org.hpcdl.pmix.version": "5.0.2"},
                       mpi_flavour="openmpi")
    pmi2 = ProfileFacts(name="p", srun_mpi="pmi2", launcher="srun", nv=False, gpus_per_node=0)
    out = v._pmix_verdicts(host, image, pmi2)
    assert _levels(out) == [("warning", "PMIx"), ("warning", "srun --mpi")]
    assert "build the image against PMIx 4.x" in (out[0].fix or "")


def test_unusable_image_stops_before_the_image_checks():
    missing = ImageFacts(path="/gone.sif", exists=False)
    assert v._unusable_image(HOST, missing) == v.Verdict(
        "problem", "image", "/gone.sif does not exist", "build it: hpcdl build SPEC -o /gone.sif")
    broken = ImageFacts(path="/x.sif", error="FATAL: bad SIF")
    out = v._unusable_image(HOST, broken)
    assert out is not None and out.fix is not None and "apptainer sif list /x.sif" in out.fix
    assert v._unusable_image(HOST, ImageFacts(path="/x.sif")) is None
    topics = [x.topic for x in v.verdicts(HOST, missing)]
    assert topics[-1] == "image" and "horovod" not in topics


def test_mounts_verdict_without_apptainer_conf_is_none():
    assert v._mounts_verdict(HostFacts()) is None
    assert v._mounts_verdict(HostFacts(shared_loop_devices=False)).level == "warning"  # type: ignore[union-attr]
