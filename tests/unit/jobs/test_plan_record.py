"""plan.json read back as a typed PlanRecord (hpcdl.jobs.rundir owns the file): what
submit writes reads back; a broken file is a ValueError naming the file and the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcdl.jobs import rundir
from hpcdl.plan import JobRequest, build_plan
from hpcdl.profiles import load_profile


def test_what_submit_writes_reads_back(tmp_path: Path) -> None:
    plan = build_plan(load_profile("sandbox"), JobRequest.of(nodes=2, gpus=2, backend="ddp"))
    run = rundir.make_run_dir(tmp_path / "r")
    run.write_plan(plan.script, plan.to_dict())
    record = run.read_plan()
    assert (record.nodes, record.gpus_per_node, record.ntasks) == (2, 2, plan.spec.ntasks)
    assert (record.job_name, record.backend, record.profile, record.partition, record.image) \
        == (plan.spec.job_name, "ddp", "sandbox", plan.spec.partition.name, plan.container.image)
    assert record.data == json.loads(json.dumps(plan.to_dict()))  # the whole object kept
    assert record.data["script"] == plan.script


def test_an_older_minimal_plan_reads_with_defaults() -> None:
    record = rundir.PlanRecord.from_dict({"nodes": 1, "gpus_per_node": 0, "ntasks": 4})
    assert (record.job_name, record.backend, record.image) == ("", "", None)


@pytest.mark.parametrize("data, key", [
    ([1, 2], "not a plan record"),
    ({"gpus_per_node": 1, "ntasks": 1}, "nodes: None"),
    ({"nodes": "2", "gpus_per_node": 1, "ntasks": 1}, "nodes: '2'"),
    ({"nodes": True, "gpus_per_node": 1, "ntasks": 1}, "nodes: True"),
    ({"nodes": 1, "gpus_per_node": -1, "ntasks": 1}, "gpus_per_node: -1"),
    ({"nodes": 1, "gpus_per_node": 1, "ntasks": 1, "backend": 3}, "backend: 3"),
    ({"nodes": 1, "gpus_per_node": 1, "ntasks": 1, "image": ["x"]}, "image: ['x']"),
])
def test_a_broken_plan_names_the_key(tmp_path: Path, data: object, key: str) -> None:
    with pytest.raises(ValueError, match="^" + key.replace("[", r"\[").replace("]", r"\]")):
        rundir.PlanRecord.from_dict(data)
    run = rundir.make_run_dir(tmp_path / "r")
    run.plan_file.write_text(json.dumps(data))
    with pytest.raises(ValueError) as err:
        run.read_plan()
    assert str(err.value).startswith(f"{run.plan_file}: ")
