"""hpcdl/results/read.py on real run and sweep directories: the straggler verdict of a
run or of each point, and a probe run's report."""

from __future__ import annotations

import json
from pathlib import Path

from hpcdl.jobside.steps import StepWriter, metrics_dir
from hpcdl.results.read import probe_report, straggler_of, stragglers
from hpcdl.results.table import Row


def run_with_metrics(path: Path, busy: list[float]) -> Path:
    for rank, seconds in enumerate(busy):
        w = StepWriter(metrics_dir(path), rank, host="n1", attempt=0, cpus=[rank])
        for step in range(4):
            w.step(step, epoch=0, step_s=seconds, data_s=0.0, sync_s=0.0, images=8, loss=1.0,
                   lr=0.1)
        w.close()
    return path


def row(label: str, run_dir: str | None) -> Row:
    return Row(label=label, backend="ddp", batch_size=None, nodes=1, gpus=1, ranks=1,
               state="COMPLETED", run_dir=run_dir)


def test_the_verdict_of_a_run_and_of_each_point(tmp_path):
    run = run_with_metrics(tmp_path / "run", [1.0, 1.0, 3.0])
    assert straggler_of(run)["slow_ranks"][0]["rank"] == 2
    assert straggler_of(tmp_path) is None  # no metrics
    assert stragglers(run, [], {})["straggler"]["found"] is True
    sweep = tmp_path / "sweep"
    run_with_metrics(sweep / "a", [1.0, 1.0])
    (sweep / "b").mkdir(parents=True)
    got = stragglers(sweep, [row("a", "a"), row("b", "b"), row("c", None)], {"sweep_id": "s"})
    assert got["stragglers"]["a"]["found"] is False
    assert got["stragglers"]["b"] is None and got["stragglers"]["c"] is None
    assert stragglers(tmp_path / "table.csv", [], {}) == {}


def test_a_probe_runs_report(tmp_path):
    def result(record: object) -> Path:
        d = tmp_path / f"r{len(list(tmp_path.iterdir()))}"
        d.mkdir()
        (d / "result.json").write_text(json.dumps(record))
        return d

    assert probe_report(result({"state": "COMPLETED", "probe": {"slow_nodes": ["n2"]}})) == \
        {"slow_nodes": ["n2"]}
    # A --probe-first job whose training printed its result keeps its scaling row.
    assert probe_report(result({"probe": {"x": 1}, "hpcdl_result": {"images_per_sec": 3}})) is None
    assert probe_report(result({"probe": "text"})) is None
    assert probe_report(result([1, 2])) is None  # not a record
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "result.json").write_text("{")
    assert probe_report(bad) is None
    assert probe_report(tmp_path / "none") is None
