"""hpcdl.plan.request: a JobRequest is made of its parts; the facts one part takes from
another are set once, and the flat adapter (JobRequest.of, amended) routes each field to
its part and nothing else."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest

from hpcdl.plan import (
    ContainerRequest,
    DataRequest,
    JobRequest,
    LaunchRequest,
    PlacementRequest,
    ProbeRequest,
)
from hpcdl.plan.request import FLAT_FIELDS


def test_the_parts_are_the_plans_parts() -> None:
    assert [f.name for f in fields(JobRequest)] == [
        "placement", "container", "data", "launch", "resilience", "hang", "probe", "files"]


@pytest.mark.parametrize(("probe", "command", "reader"), [
    (ProbeRequest(), (), "example"),
    (ProbeRequest(), ("python3", "t.py"), "command"),
    (ProbeRequest(args=("--sizes", "4K")), (), "probe"),  # `hpcdl probe`: the probe is the job
    (ProbeRequest(args=("--sizes", "4K"), first=True), (), "example"),  # --probe-first
])
def test_the_cross_part_facts_are_set_from_the_probe_and_launch_parts(
        probe: ProbeRequest, command: tuple[str, ...], reader: str) -> None:
    req = JobRequest(placement=PlacementRequest(nodes=2), launch=LaunchRequest(command=command),
                     data=DataRequest(path="/d"), probe=probe)
    probe_only = reader == "probe"
    assert req.placement.measures is probe_only and req.launch.probe_only is probe_only
    assert req.data.reader == reader and req.data.path == "/d"
    assert req.placement.nodes == 2 and req.probe_only is probe_only
    # A part replaced later gets the facts again (dataclasses.replace makes a new request).
    back = replace(req, probe=ProbeRequest(), launch=LaunchRequest())
    assert (back.data.reader, back.placement.measures, back.launch.probe_only) == (
        "example", False, False)


def test_of_routes_every_flat_field_to_its_part() -> None:
    req = JobRequest.of(nodes=3, image="/i.sif", stage_image=True, data="/d", stage_data=True,
                        backend="ddp", hang_timeout=5.0, probe=("a",), probe_first=True,
                        run_dir="/r", spares=1)
    assert req.placement == PlacementRequest(nodes=3, spares=1)
    assert req.container == ContainerRequest(image="/i.sif", stage=True)
    assert (req.data.path, req.data.stage) == ("/d", True)
    assert req.launch.backend == "ddp" and req.hang.timeout == 5.0
    assert req.probe == ProbeRequest(args=("a",), first=True) and req.files.run_dir == "/r"
    assert JobRequest.of() == JobRequest()
    # Every flat field names a field its part has.
    for part, name in FLAT_FIELDS.values():
        assert name in {f.name for f in fields(getattr(JobRequest(), part))}


def test_amended_replaces_only_the_fields_named() -> None:
    req = JobRequest.of(nodes=2, gpus=4, image="/i.sif", command=("true",))
    got = req.amended(gpus=1, image=None)
    assert got.placement == PlacementRequest(nodes=2, gpus=1)
    assert got.container == ContainerRequest() and got.launch.command == ("true",)
    with pytest.raises(KeyError):
        JobRequest.of(nodez=2)
