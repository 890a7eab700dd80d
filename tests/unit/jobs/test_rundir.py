"""hpcdl/jobs/rundir.py on real folders: safe and unique run directory names (property),
plan.json and job.json read back or refused naming the key, result.json, and finding a
run (a chain's later job, a sweep point, an array's tasks) by its job id."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcdl.jobs.rundir import (
    JobRecord,
    PlanRecord,
    RunDir,
    create_run_dir,
    find_array_runs,
    find_run,
    make_run_dir,
    new_run_path,
    runs_root,
    safe_name,
)


@given(st.text(max_size=80))
def test_any_job_name_gives_a_safe_short_file_name(name):
    safe = safe_name(name)
    assert 1 <= len(safe) <= 48 and "/" not in safe and safe not in (".", "..")
    assert not safe.startswith(("-", ".")) or safe == "job"


def test_names_and_paths(tmp_path, monkeypatch):
    assert safe_name("resnet50 n2/g4") == "resnet50-n2-g4"
    assert safe_name("...") == "job"
    monkeypatch.setenv("HPCDL_RUNS", str(tmp_path / "r"))
    assert runs_root() == tmp_path / "r"
    path = new_run_path("my job")
    assert path.parent == (tmp_path / "r").resolve()
    assert re.fullmatch(r"my-job-\d{8}-\d{6}-[0-9a-f]{6}", path.name)
    monkeypatch.delenv("HPCDL_RUNS")
    assert runs_root().as_posix() == "runs"


def test_a_run_directory_is_made_once(tmp_path):
    runs = {create_run_dir("j", tmp_path).path for _ in range(20)}
    assert len(runs) == 20 and all(p.is_dir() for p in runs)
    with pytest.raises(FileExistsError):
        make_run_dir(next(iter(runs)))


def test_the_plan_record_reads_back_or_names_the_key():
    data = {"nodes": 2, "gpus_per_node": 4, "ntasks": 8, "job_name": "j", "image": None,
            "run_dir": None, "extra": [1]}
    rec = PlanRecord.from_dict(data)
    assert (rec.nodes, rec.ntasks, rec.image, rec.run_dir, rec.data["extra"]) == (2, 8, None, "", [1])
    for bad, message in (({**data, "nodes": True}, "nodes: True is not a count"),
                         ({**data, "ntasks": -1}, "ntasks: -1 is not a count"),
                         ({**data, "gpus_per_node": "4"}, "gpus_per_node: '4' is not a count"),
                         ({**data, "backend": 3}, "backend: 3 is not a string"),
                         ({**data, "image": ["a"]}, "image: ['a'] is not a string"),
                         ([data], "not a plan record")):
        with pytest.raises(ValueError, match=re.escape(message)):
            PlanRecord.from_dict(bad)


def test_records_on_disk(tmp_path):
    run = make_run_dir(tmp_path / "r1")
    assert run.read_job() is None and run.read_result() is None
    script = run.write_plan("#!/bin/bash\necho hi\n", {"nodes": 1, "gpus_per_node": 0, "ntasks": 1})
    assert script == run.script and script.stat().st_mode & 0o111
    assert run.read_plan().ntasks == 1
    run.plan_file.write_text('{"nodes": "x"}')
    with pytest.raises(ValueError, match=r"plan.json: nodes: 'x' is not a count"):
        run.read_plan()
    run.write_job(JobRecord("7", ["sbatch", "x"], "t"))
    assert json.loads(run.job_file.read_text()) == {"job_id": "7", "argv": ["sbatch", "x"],
                                                    "submitted_at": "t"}
    run.write_job(JobRecord.now("8", ["sbatch"], chain=("8", "9")))
    assert run.read_job().chain == ("8", "9")
    run.job_file.write_text("{}")
    assert run.read_job() is None
    run.result_file.write_text("[1]")
    with pytest.raises(ValueError, match="not a JSON object"):
        run.read_result()
    run.write_result({"state": "COMPLETED"})
    assert run.read_result() == {"state": "COMPLETED"}


def test_a_run_is_found_by_any_of_its_job_ids(tmp_path):
    def run(rel: str, job: str, chain: tuple[str, ...] = ()) -> RunDir:
        r = make_run_dir(tmp_path / rel)
        r.write_job(JobRecord(job, [], "", chain))
        return r

    single = run("a", "10")
    chained = run("b", "20", ("20", "21", "22"))
    tasks = [run(f"sweep/p{i}", f"30_{i}") for i in range(3)]
    run("sweep/deeper/x", "40")  # two levels down: not a point
    assert find_run("10", tmp_path).path == single.path
    assert find_run("22", tmp_path).path == chained.path
    assert find_run("30_1", tmp_path).path == tasks[1].path
    assert find_run("40", tmp_path) is None and find_run("10", tmp_path / "none") is None
    assert sorted(r.path for r in find_array_runs("30", tmp_path)) == [t.path for t in tasks]
    assert find_array_runs("3", tmp_path) == [] and find_array_runs("30_1", tmp_path) == []
