"""hpcdl/jobside/steps.py on real files: what StepWriter writes reads back through
read_metrics (property), buffering and flushing, a line cut off by a kill, a step
recorded twice across attempts, and the heartbeat's rate limit."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcdl.jobside import steps
from hpcdl.jobside.steps import (
    StepWriter,
    attempt_number,
    beat,
    beat_reset,
    default_dir,
    parse_lines,
    rank_file,
    read_metrics,
)

STEP = st.tuples(st.floats(0, 10), st.floats(0, 10), st.floats(0, 10), st.integers(0, 512),
                 st.none() | st.floats(allow_nan=True, allow_infinity=False, width=32),
                 st.none() | st.floats(0, 1))


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(STEP, max_size=12), flush_steps=st.integers(1, 5))
def test_what_the_writer_writes_reads_back(tmp_path_factory, records, flush_steps):
    folder = tmp_path_factory.mktemp("m")
    w = StepWriter(folder, 3, world_size=4, local_rank=1, host="n2", attempt=1, job_id="42",
                   flush_steps=flush_steps, flush_s=1e9, cpus=[3, 1])
    for i, (step_s, data_s, sync_s, images, loss, lr) in enumerate(records):
        w.step(i, epoch=0, step_s=step_s, data_s=data_s, sync_s=sync_s, images=images,
               loss=loss, lr=lr)
    w.close()
    info = read_metrics(folder)[3]
    assert (info["host"], info["cpus"], info["skipped"]) == ("n2", [1, 3], 0)
    assert info["starts"][0]["job_id"] == "42" and info["starts"][0]["world_size"] == 4
    assert [r["step"] for r in info["steps"]] == list(range(len(records)))
    for rec, (step_s, data_s, sync_s, images, loss, lr) in zip(info["steps"], records, strict=True):
        assert rec["attempt"] == 1
        assert rec["step_s"] == pytest.approx(step_s, abs=1e-6)
        assert rec["compute_s"] == pytest.approx(max(0.0, step_s - sync_s), abs=2e-6)
        busy = step_s + data_s
        if busy > 0:
            assert rec["images_per_sec"] == pytest.approx(images / busy, abs=1e-3)
        else:
            assert rec["images_per_sec"] is None
        if loss is None or math.isnan(loss):
            assert rec["loss"] is None  # NaN is written as null: the line stays JSON
        else:
            assert rec["loss"] == pytest.approx(loss, abs=1e-6, rel=1e-9)
        assert rec["lr"] == (None if lr is None else pytest.approx(lr, abs=1e-8))


def test_lines_are_buffered_until_the_flush_threshold(tmp_path):
    w = StepWriter(tmp_path, 0, host="h", attempt=0, flush_steps=3, flush_s=1e9, cpus=[0])
    path = rank_file(tmp_path, 0)
    assert path.name == "rank-00000.jsonl" and path.read_text() == ""
    for i in range(2):
        w.step(i, epoch=0, step_s=0.1, data_s=0.0, sync_s=0.0, images=8, loss=1.0, lr=0.1)
    assert path.read_text() == ""  # two steps: still buffered
    w.step(2, epoch=0, step_s=0.1, data_s=0.0, sync_s=0.0, images=8, loss=1.0, lr=0.1)
    lines = path.read_text().splitlines()
    assert len(lines) == 4 and json.loads(lines[0])["kind"] == "start"
    assert list(json.loads(lines[1])) == list(steps.STEP_FIELDS)
    w.close()
    w.close()  # twice (atexit after an explicit close): harmless


def test_a_writer_without_a_directory_records_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    w = StepWriter("", 0)
    w.step(0, epoch=0, step_s=1, data_s=0, sync_s=0, images=1, loss=None, lr=None)
    w.close()
    assert not w.enabled and w.path is None and list(tmp_path.iterdir()) == []


def test_a_cut_line_and_garbage_are_skipped_and_the_last_attempt_wins(tmp_path):
    rank_file(tmp_path, 1).write_text(
        '{"kind":"start","rank":1,"host":"a","cpus":[0,1]}\n'
        '{"step":1,"loss":3.0,"attempt":0}\n{"step":2,"loss":2.0,"attempt":0}\n'
        '{"kind":"start","rank":1,"host":"b","cpus":[true]}\n'
        '{"step":2,"loss":2.5,"attempt":1}\n[1,2]\n{"step":true}\n\n{"step":3,"lo')
    (tmp_path / "rank-x.jsonl").write_text("{}")
    (tmp_path / "notes.txt").write_text("ignored")
    info = read_metrics(tmp_path)
    assert list(info) == [1]
    one = info[1]
    assert [(r["step"], r["loss"]) for r in one["steps"]] == [(1, 3.0), (2, 2.5)]
    assert len(one["all_steps"]) == 3 and one["skipped"] == 3
    assert one["host"] == "b" and one["cpus"] == [0, 1]  # the last start's, if well-formed
    assert read_metrics(tmp_path / "none") == {}
    assert parse_lines('{"kind":"start"}\n{"step":0}\nnot json\n') == (
        [{"kind": "start"}], [{"step": 0}], 1)


def test_the_environment_names_the_folder_and_the_attempt(tmp_path):
    assert default_dir({"HPCDL_RUN_DIR": "/r/run1"}) == "/r/run1/metrics"
    assert default_dir({}) == ""
    assert attempt_number({"SLURM_RESTART_COUNT": "2"}) == 2
    assert attempt_number({"SLURM_RESTART_COUNT": "x"}) == 0 and attempt_number({}) == 0


def test_beat_writes_at_most_once_a_second_and_never_without_a_watchdog(tmp_path, monkeypatch):
    beat_reset()
    monkeypatch.delenv(steps.HEARTBEAT_ENV, raising=False)
    assert beat(1, now=0.0) is False and beat(2, now=100.0) is False  # no watchdog: never
    beat_reset()
    monkeypatch.setenv(steps.HEARTBEAT_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "5")
    try:
        assert beat(7, now=10.0) is True
        assert (tmp_path / "rank-5").read_text() == "7\n"
        assert beat(8, now=10.5) is False and (tmp_path / "rank-5").read_text() == "7\n"
        assert beat(None, now=11.0) is True and (tmp_path / "rank-5").read_text() == "\n"
        beat_reset()
        # A folder that is gone (or unwritable): no exception, the training goes on.
        monkeypatch.setenv(steps.HEARTBEAT_ENV, str(tmp_path / "gone"))
        assert beat(9, now=20.0) is False
    finally:
        beat_reset()
