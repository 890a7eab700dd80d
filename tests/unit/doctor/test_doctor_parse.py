"""hpcdl/doctor/parse.py on tool output as the tools print it: MPI flavours and versions,
horovodrun -cb, CUDA architecture lists, Apptainer's shared loop devices."""

from __future__ import annotations

import pytest

from hpcdl.doctor.parse import (
    parse_cuda_archs,
    parse_horovod_cb,
    parse_mpi_version,
    parse_shared_loop_devices,
)


@pytest.mark.parametrize(("text", "want"), [
    ("mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/\n",
     ("openmpi", "4.1.4")),
    ("Open MPI v5.0.3, package: Open MPI root@x Distribution, ident: 5.0.3", ("openmpi", "5.0.3")),
    ("Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619", ("intelmpi", "2021.10")),
    ("MVAPICH2 Version      :\t2.3.7\nMVAPICH2 Release date :\tWed March 02 22:00:00 EST 2022",
     ("mvapich2", "2.3.7")),
    ("MVAPICH2 Version      :\t2.3b\n", ("mvapich2", "2.3b")),
    ("HYDRA build details:\n    Version:                                 4.0.2\n", ("mpich", "4.0.2")),
    ("MPICH Version:\t3.4.1\nMPICH Release date:\tFri Jan 22 2021", ("mpich", "3.4.1")),
    ("bash: mpirun: command not found", (None, None)),
])
def test_mpi_flavour_and_version(text, want):
    assert parse_mpi_version(text) == want


def test_horovod_build_check():
    text = """Horovod v0.28.1:

Available Frameworks:
    [X] TensorFlow
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
    got = parse_horovod_cb(text)
    assert got["frameworks"] == {"TensorFlow": True, "PyTorch": True, "MXNet": False}
    assert got["controllers"] == {"MPI": True, "Gloo": True}
    assert got["operations"]["NCCL"] is False and got["operations"]["Gloo"] is True
    assert parse_horovod_cb("[X] PyTorch\n") == {"frameworks": {}, "controllers": {},
                                                 "operations": {}}


@pytest.mark.parametrize(("value", "want"), [
    ("sm_80 sm_90 compute_90", ["sm_80", "sm_90", "compute_90"]),
    (["sm_90a", "sm_100f", "sm_x", 7, "compute_75"], ["sm_90a", "sm_100f", "compute_75"]),
    ("sm_80;rm -rf /", []),
    (None, []), (80, []),
])
def test_cuda_archs_keep_only_well_formed_names(value, want):
    assert parse_cuda_archs(value) == want


@pytest.mark.parametrize(("conf", "want"), [
    ("# shared loop devices = yes\nshared loop devices = no\n", False),
    ("shared loop devices = no\nSHARED LOOP DEVICES = YES\n", True),  # the last line wins
    ("max loop devices = 256\n", False),
    ("", False),
])
def test_shared_loop_devices(conf, want):
    assert parse_shared_loop_devices(conf) is want
