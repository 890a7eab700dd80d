"""hpcdl/report/gather.py on real run directories: the attempts' spans from rank 0's
metrics (steps redone after a resume), and what an empty or partial run directory is
missing, each in a sentence."""

from __future__ import annotations

import json

from hpcdl.jobs.rundir import JobRecord, make_run_dir
from hpcdl.jobside.steps import StepWriter, metrics_dir, rank_file
from hpcdl.report.gather import attempt_spans, gather_run


def test_spans_count_the_steps_an_attempt_did_again():
    metrics = {0: {"starts": [{"attempt": 0, "t": 10.0, "job_id": "5"},
                              {"attempt": 1, "t": 50.0, "job_id": "5"}],
                   "all_steps": [{"step": s, "t": 10.0 + s, "attempt": 0} for s in range(1, 31)]
                   + [{"step": s, "t": 60.0 + s, "attempt": 1} for s in range(21, 41)]},
               3: {"starts": [], "all_steps": [{"step": 999, "t": 1.0, "attempt": 7}]}}
    first, second = attempt_spans(metrics)
    assert (first["first_step"], first["last_step"], first["steps"], first["redone"]) == (1, 30, 30, 0)
    assert (second["first_step"], second["last_step"], second["redone"]) == (21, 40, 10)
    assert (second["start_t"], second["end_t"], second["job_id"]) == (50.0, 100.0, "5")
    assert attempt_spans({}) == []


def test_an_empty_directory_says_what_it_lacks(tmp_path):
    got = gather_run(tmp_path)
    assert got["kind"] == "run" and got["plan"] == {} and got["straggler"] is None
    assert [m.split(":")[0] for m in got["missing"]] == ["plan.json", "job.json", "result.json",
                                                         "metrics/"]


def test_a_run_with_some_ranks_and_a_cut_line(tmp_path):
    run = make_run_dir(tmp_path / "r")
    run.write_plan("#!/bin/bash\n", {"nodes": 1, "gpus_per_node": 4, "ntasks": 4,
                                     "command": ["python3", "t.py", "--name", "a b"]})
    run.write_job(JobRecord("9", ["sbatch"], "t"))
    run.write_result({"state": "COMPLETED", "probe": {"slow_nodes": []}})
    for rank in (0, 2):
        w = StepWriter(metrics_dir(run.path), rank, host="n1", attempt=0, cpus=[rank])
        w.step(0, epoch=0, step_s=1.0, data_s=0.0, sync_s=0.0, images=8, loss=1.0, lr=0.1)
        w.close()
    with rank_file(metrics_dir(run.path), 2).open("a") as fh:
        fh.write('{"step": 1, "lo')
    (run.path / "attempts.json").write_text(json.dumps({"attempts": [{"attempt": 0}]}))
    got = gather_run(run.path)
    assert got["command"] == "python3 t.py --name 'a b'"
    assert got["job"]["job_id"] == "9" and got["probe"] == {"slow_nodes": []}
    assert got["attempts"] == [{"attempt": 0}] and sorted(got["metrics"]) == [0, 2]
    assert got["missing"] == [
        "metrics/: 2 of 4 ranks wrote per-step metrics; none from ranks 1, 3",
        "metrics/: 1 line(s) could not be read (a rank killed mid-write) and were left out"]
    assert got["straggler"]["found"] is False
