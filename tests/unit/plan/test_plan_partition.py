"""hpcdl/plan/partition.py: the partition a request runs on is one it fits, the smallest
such (property), the one asked for or a one-line refusal naming the limit broken and
the partitions that fit; CPUs per task, spares and the job's time. Profiles built here."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcdl.errors import ValidationError
from hpcdl.plan.partition import (
    PlacementRequest,
    choose_partition,
    default_cpus_per_task,
    job_spares,
    job_time,
    tasks_per_node,
)
from hpcdl.profiles.schema import Profile

PARTS = [
    {"name": "cpu", "nodes": 8, "gpus_per_node": 0, "cpus_per_node": 16, "max_time": "1-00:00:00"},
    {"name": "small", "nodes": 2, "gpus_per_node": 2, "cpus_per_node": 16, "max_time": "01:00:00",
     "default": True},
    {"name": "big", "nodes": 4, "gpus_per_node": 4, "cpus_per_node": 32, "max_time": "08:00:00",
     "max_nodes_per_job": 3, "max_gpus_per_user": 8},
]


def profile(parts: list[dict[str, Any]] = PARTS, **scheduler: Any) -> Profile:
    return Profile.model_validate({"name": "site", "partitions": parts,
                                   "scheduler": {"default_time": "02:00:00", **scheduler}})


def test_the_smallest_partition_that_fits():
    prof = profile()
    assert choose_partition(prof, PlacementRequest(nodes=1, gpus=0))[0].name == "cpu"
    part, why = choose_partition(prof, PlacementRequest(nodes=2, gpus=1))
    assert part.name == "small" and why == "smallest partition that fits (candidates: small, big)"
    assert choose_partition(prof, PlacementRequest(nodes=1, gpus=1, time="02:00:00"))[0].name == "big"
    assert choose_partition(prof, PlacementRequest(nodes=3, gpus=2))[0].name == "big"


@pytest.mark.parametrize(("req", "message"), [
    (PlacementRequest(gpus=8), "gpus: 8 GPUs per node exceeds the largest nodes of profile site, "
                               "4 GPUs per node (partition big)"),
    (PlacementRequest(nodes=4, gpus=3, partition="big"),
     "nodes: 4 exceeds partition big's limit of 3 nodes per job (partitions that fit: none)"),
    (PlacementRequest(nodes=3, gpus=4, partition="big"),
     "gpus: 3 nodes x 4 GPUs = 12 exceeds partition big's per-user limit of 8 GPUs"),
    (PlacementRequest(gpus=1, time="infinite"), "time: infinite exceeds partition"),
    (PlacementRequest(gpus=2, cpus_per_task=10, partition="small"), "cpus-per-task: 10 x 2 tasks per node = 20 "
                                                 "exceeds partition small's 16 CPUs per node (partitions that fit: big)"),
    (PlacementRequest(partition="gpu"), "partition: 'gpu' is not a partition of profile site "
                                        "(partitions: cpu, small, big)"),
    (PlacementRequest(partition="small", gpus=1, nodes=2, spares=1),
     "nodes: 2 + 1 spares = 3 exceeds partition small's limit of 2 nodes per job "
     "(partitions that fit: big)"),
])
def test_a_request_no_partition_takes_is_one_line_naming_the_limit(req, message):
    with pytest.raises(ValidationError) as err:
        choose_partition(profile(), req)
    assert err.value.message.startswith(message), err.value.message


@given(nodes=st.integers(1, 5), gpus=st.integers(0, 5), spares=st.none() | st.integers(0, 2),
       cpus=st.none() | st.integers(1, 40),
       time=st.sampled_from([None, "00:30:00", "03:00:00", "2-00:00:00", "infinite"]))
def test_the_choice_fits_and_nothing_smaller_does(nodes, gpus, spares, cpus, time):
    prof = profile(spares=1)
    req = PlacementRequest(nodes=nodes, gpus=gpus, spares=spares, cpus_per_task=cpus, time=time)

    def fits(name: str) -> bool:
        try:
            choose_partition(prof, PlacementRequest(nodes=nodes, gpus=gpus, spares=spares,
                                                    cpus_per_task=cpus, time=time,
                                                    partition=name))
        except ValidationError:
            return False
        return True

    fitting = [p for p in prof.partitions if fits(p.name)]
    try:
        part, _ = choose_partition(prof, req)
    except ValidationError:
        assert fitting == []
        return
    assert part in fitting
    assert all((part.gpus_per_node, part.cpus_per_node) <= (p.gpus_per_node, p.cpus_per_node)
               for p in fitting)
    total = nodes + (1 if spares is None else spares)
    assert total <= part.node_limit and gpus <= part.gpus_per_node


def test_cpus_per_task_share_the_node_between_its_gpus():
    big, cpu = profile().partition("big"), profile().partition("cpu")
    assert [tasks_per_node(g) for g in (0, 1, 4)] == [1, 1, 4]
    assert default_cpus_per_task(big, 4) == 8 and default_cpus_per_task(big, 1) == 8
    assert default_cpus_per_task(cpu, 0) == 16
    tiny = profile([{"name": "t", "nodes": 1, "gpus_per_node": 8, "cpus_per_node": 4,
                     "max_time": "01:00:00"}]).partition("t")
    assert default_cpus_per_task(tiny, 8) == 1  # never 0


def test_spares_come_from_the_request_else_the_profile_except_for_a_probe():
    prof = profile(spares=2)
    assert job_spares(prof, PlacementRequest()) == 2
    assert job_spares(prof, PlacementRequest(spares=0)) == 0
    assert job_spares(prof, PlacementRequest(measures=True)) == 0


def test_the_jobs_time_is_asked_or_the_default_capped_at_the_partition():
    prof = profile()
    small, big = prof.partition("small"), prof.partition("big")
    assert job_time(prof, big, PlacementRequest()) == 7200
    assert job_time(prof, small, PlacementRequest()) == 3600  # capped at max_time
    assert job_time(prof, big, PlacementRequest(time="00:05:00")) == 300
    assert job_time(prof, big, PlacementRequest(time="infinite")) is None
    assert PlacementRequest(time="UNLIMITED").time_seconds == math.inf
    assert PlacementRequest().time_seconds is None
