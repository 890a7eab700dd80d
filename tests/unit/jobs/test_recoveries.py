"""hpcdl/jobs/recoveries.py on real run directories: recoveries.tsv's lines joined with
rank 0's steps (the step a failure cut, the steps lost since the checkpoint, the seconds
back to training), malformed lines left out, bad-nodes.tsv, and the terminal table."""

from __future__ import annotations

import json

import pytest

from hpcdl.jobs.recoveries import Recovery, excluded, excluded_line, lines, parse, read
from hpcdl.jobside.steps import metrics_dir, rank_file
from hpcdl.launch.nodes import BAD_NODES_NAME, RECOVERIES_NAME

LINE = "42\t0\t1\t1000.0\tn2\theartbeat\t1010.0\tn1,n3\tcheckpoint-000120.pt"


def test_a_line_and_what_it_says():
    (rec,) = parse(LINE + "\n")
    assert rec == Recovery("42", 0, 1, 1000.0, ("n2",), "heartbeat", 1010.0, ("n1", "n3"),
                           "checkpoint-000120.pt")
    assert rec.checkpoint_step == 120 and rec.steps_lost is None and rec.seconds_to_train is None


@pytest.mark.parametrize("bad", [
    "42\t0\t1\t1000\tn2\thb\t-\t-",  # 8 columns
    "42\tzero\t1\t1000\tn2\thb\t-\t-\t-",
    "42\t0\t1\tsoon\tn2\thb\t-\t-\t-",
    "",
])
def test_malformed_lines_are_left_out(bad):
    assert parse(f"{bad}\n{LINE}\n")[0].job_id == "42" and len(parse(bad)) == 0


def test_a_failure_not_relaunched():
    (rec,) = parse("42\t0\t1\t1000\t-\tprobe\t-\t-\t-\n")
    assert (rec.nodes, rec.relaunched_at, rec.active, rec.checkpoint) == ((), None, (), None)
    assert rec.checkpoint_step is None
    assert "not relaunched" in lines([rec])[1] and lines([rec])[1].split()[1] == "?"


def test_read_joins_rank_zeros_steps(tmp_path):
    (tmp_path / RECOVERIES_NAME).write_text(
        LINE + "\n43\t1\t1\t5000\tn1\tsrun\t-\t-\t-\n")
    folder = metrics_dir(tmp_path)
    folder.mkdir()
    steps = [(s, 900.0 + 10 * (s - 125)) for s in range(125, 131)] + [(121, 1012.5), (122, 1013.0)]
    rank_file(folder, 0).write_text("".join(json.dumps({"step": s, "t": t}) + "\n"
                                            for s, t in steps))
    rank_file(folder, 1).write_text(json.dumps({"step": 999, "t": 999.0}) + "\n")  # not rank 0
    (rec,) = read(tmp_path, "42")
    assert rec.failed_step == 130 and rec.steps_lost == 10  # 121..130 again from step 120
    assert rec.first_step_at == 1012.5 and rec.seconds_to_train == 12.5
    assert rec.to_dict()["nodes"] == ["n2"] and rec.to_dict()["steps_lost"] == 10
    assert [r.job_id for r in read(tmp_path)] == ["42", "43"]
    assert read(tmp_path, "44") == [] and read(tmp_path / "none") == []
    row = lines([rec])[1].split()
    assert row[:2] == ["1", "n2"] and row[3:5] == ["10", "12.5"]
    assert "-> n1,n3 from checkpoint-000120.pt" in lines([rec])[1]


def test_excluded_nodes_and_their_line(tmp_path):
    assert excluded(tmp_path) == []
    (tmp_path / BAD_NODES_NAME).write_text("n2\tgate: no GPU\nn4\tprobe: slow\n\tno node\nn5\t\n")
    nodes = excluded(tmp_path)
    assert nodes == [{"node": "n2", "why": "gate: no GPU"}, {"node": "n4", "why": "probe: slow"}]
    assert excluded_line(nodes) == "nodes excluded: n2 (gate: no GPU); n4 (probe: slow)"
