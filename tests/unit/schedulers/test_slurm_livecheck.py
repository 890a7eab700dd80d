"""hpcdl/schedulers/slurm/livecheck.py: scontrol/sinfo text to partitions, the profile's
claims against the cluster (errors for what breaks the request, warnings for the rest),
MaxArraySize, and `profiles diff`'s differences, on profiles and outputs built here.
(On captured outputs of real clusters: test_slurm_detect.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from hpcdl.errors import ValidationError
from hpcdl.profiles.schema import Profile
from hpcdl.schedulers.base import Demand
from hpcdl.schedulers.slurm.livecheck import (
    ClusterPartition,
    check_demand,
    compare,
    differences,
    max_array_size,
    parse_partitions,
)

SCONTROL = (
    "PartitionName=gpu AllowGroups=ALL Default=YES MaxNodes=2 MaxTime=02:00:00 "
    "TotalNodes=4 State=UP\n"
    "PartitionName=cpu MaxNodes=UNLIMITED MaxTime=UNLIMITED TotalNodes=8 State=UP\n"
    "garbage line\n")
SINFO = ("gpu*|gpu:a100:4|32|2\ngpu*|gpu:a100:2(S:0-1)|16+|2\ncpu|(null)|64|8\n"
         "broken|line\n")


def test_sinfo_groups_give_the_smallest_node_and_scontrol_the_limits():
    parts = parse_partitions(SCONTROL, SINFO)
    assert parts == {
        "gpu": ClusterPartition("gpu", 2, 7200, 4, 2, 16),
        "cpu": ClusterPartition("cpu", None, None, 8, 0, 64),
    }
    assert parse_partitions("", "") == {}


@pytest.mark.parametrize(("config", "size"), [({"MaxArraySize": "1001"}, 1001),
                                              ({"MaxArraySize": "0"}, 0),
                                              ({"MaxArraySize": "lots"}, None), ({}, None)])
def test_max_array_size(config, size):
    assert max_array_size(config) == size


def profile(**partition: Any) -> Profile:
    base = {"name": "gpu", "nodes": 4, "gpus_per_node": 4, "cpus_per_node": 32,
            "max_time": "04:00:00", "default": True}
    return Profile.model_validate({"name": "site", "partitions": [{**base, **partition}]})


CLUSTER = {"gpu": ClusterPartition("gpu", max_nodes=2, max_seconds=7200, total_nodes=4,
                                   gpus_per_node=2, cpus_per_node=16)}


def test_overclaims_are_warnings_until_the_request_needs_them():
    errors, warnings = compare(profile(), CLUSTER)
    assert errors == []
    assert warnings == [
        "GPUs per node: profile site partition gpu claims 4, the cluster has 2",
        "CPUs per node: profile site partition gpu claims 32, the cluster has 16",
        "nodes per job: profile site partition gpu claims 4, the cluster has 2",
        "max time: profile site partition gpu claims 04:00:00, the cluster's limit is 02:00:00",
    ]
    need = Demand("gpu", nodes=3, gpus_per_node=2, cpus_per_node=8, time_seconds=3 * 3600)
    errors, warnings = compare(profile(), CLUSTER, need)
    assert errors == [
        "nodes per job: profile site partition gpu claims 4, the cluster has 2 (the request needs 3)",
        "max time: profile site partition gpu claims 04:00:00, the cluster's limit is 02:00:00 "
        "(the request needs 03:00:00)",
    ]
    assert len(warnings) == 2  # GPUs and CPUs: claimed too many, but enough for this job


def test_a_partition_the_cluster_lacks():
    errors, warnings = compare(profile(name="big"), CLUSTER)
    assert warnings == ["partition: profile site partition big does not exist on the cluster "
                        "(cluster partitions: gpu)"]
    with pytest.raises(ValidationError) as err:
        check_demand(profile(name="big"), Demand("big", 1, 1, 1, None), CLUSTER)
    assert err.value.message.startswith("live check: partition: profile site partition big")
    assert "hpcdl profiles show site" in (err.value.hint or "")


def test_check_demand_returns_warnings_when_the_job_fits():
    honest = profile(gpus_per_node=2, cpus_per_node=16, max_nodes_per_job=2,
                     max_time="02:00:00")
    assert check_demand(honest, Demand("gpu", 2, 2, 16, 7200), CLUSTER) == []
    assert len(check_demand(profile(), Demand("gpu", 1, 1, 1, 60), CLUSTER)) == 4
    # An unlimited request on a limited cluster is an error when the profile claims more.
    with pytest.raises(ValidationError, match="the request needs"):
        check_demand(profile(), Demand("gpu", 1, 1, 1, 3 * 3600), CLUSTER)


def test_differences_report_under_and_overclaims_both_ways():
    detected = profile(gpus_per_node=8, cpus_per_node=32, nodes=6, max_time="infinite",
                       gpu_type="h100", default=False)
    claims = profile(gpus_per_node=4, gpu_type="a100", max_time="04:00:00")
    out = differences(claims, detected, mpi_offered=("pmi2",))
    assert "GPUs per node: partition gpu: profile says 4, the cluster has 8 (hpcdl refuses " \
           "requests the cluster accepts)" in out
    assert "max time: partition gpu: profile says 04:00:00, the cluster's limit is infinite" in out
    assert "nodes: partition gpu: profile says 4 nodes, the cluster has 6" in out
    assert "GPU type: partition gpu: profile says a100, the cluster's nodes have h100" in out
    assert "default: partition gpu: profile says default=true, Slurm says false" in out
    assert "mpi.srun_mpi: profile says pmix, srun --mpi=list offers pmi2" in out
    assert differences(detected, detected) == []


def test_differences_name_missing_partitions_release_and_runtime():
    detected = Profile.model_validate({
        "name": "live", "scheduler": {"release": "24.11", "requeue_expedite": False},
        "container": {"runtime": "singularity"},
        "partitions": [{"name": "gpu", "nodes": 4, "gpus_per_node": 4, "cpus_per_node": 32,
                        "max_time": "04:00:00", "default": True},
                       {"name": "debug", "nodes": 1, "gpus_per_node": 0, "cpus_per_node": 4,
                        "max_time": "00:30:00"}]})
    out = differences(profile(), detected)
    assert "partitions: the cluster has debug, the profile does not" in out
    assert ("scheduler.release: profile says nothing (22.05 scripts), the cluster runs "
            "Slurm 24.11 (the job scripts follow the profile)") in out
    assert "container.runtime: profile says apptainer, this node has singularity" in out
    assert not any(line.startswith("container.") for line in
                   differences(profile(), detected, runtime_found=False))
    told = profile().model_copy(update={"scheduler": detected.scheduler,
                                        "container": detected.container})
    assert differences(told, detected) == ["partitions: the cluster has debug, the profile does not"]
