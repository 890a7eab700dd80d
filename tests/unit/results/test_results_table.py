"""hpcdl/results/table.py: any rows read back from their CSV and JSON forms (property),
speedup and efficiency against the smallest completed point of each (backend, batch)
(property), a point's row from its record, and the people's table. (Sweeps end to end:
test_scaling.py.)"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcdl.errors import ValidationError
from hpcdl.results.table import (
    COMPLETED,
    NO_RESULT,
    Row,
    format_table,
    row_from,
    rows_from_csv,
    rows_from_json,
    to_csv,
    to_json,
    with_scaling,
)

FLOATS = st.none() | st.floats(allow_nan=False, allow_infinity=False)
INTS = st.integers(0, 10**6)
TEXT = st.text(max_size=20)
rows = st.builds(
    Row, label=TEXT, backend=TEXT, batch_size=st.none() | INTS, nodes=INTS, gpus=INTS,
    ranks=INTS, state=TEXT, job_id=st.none() | TEXT.filter(bool), images_per_sec=FLOATS,
    images_per_sec_per_rank=FLOATS, speedup=FLOATS, efficiency=FLOATS,
    baseline_ranks=st.none() | INTS, step_seconds=FLOATS, sync_seconds=FLOATS,
    sync_share=FLOATS, epoch_seconds=FLOATS, note=TEXT, run_dir=st.none() | TEXT.filter(bool))


@given(st.lists(rows, max_size=4))
def test_rows_read_back_from_csv_and_json(table):
    assert rows_from_csv(to_csv(table)) == table
    assert rows_from_json(to_json(table, {"sweep": "s"})) == table


def test_a_csv_no_reader_can_read_is_one_line():
    header = to_csv([]).rstrip("\n")
    with pytest.raises(ValidationError, match=r"t.csv: line \d+: new-line character seen"):
        rows_from_csv(header + "\n,,,1,1,1,x,,,,,,,,,,,a\rb,\n", "t.csv")


def _ok(backend: str, batch: int | None, ranks: int, ips: float) -> Row:
    return Row(label=f"{backend}-{ranks}", backend=backend, batch_size=batch, nodes=1,
               gpus=ranks, ranks=ranks, state=COMPLETED, images_per_sec=ips)


@given(st.lists(st.tuples(st.sampled_from(["horovod", "ddp"]), st.sampled_from([None, 32]),
                          st.integers(1, 64), st.floats(0.5, 1e5),
                          st.sampled_from([COMPLETED, "FAILED"])), max_size=8))
def test_scaling_is_against_the_smallest_completed_point_of_its_group(points):
    table = [_ok(b, batch, ranks, ips) if state == COMPLETED else
             Row(label="x", backend=b, batch_size=batch, nodes=1, gpus=ranks, ranks=ranks,
                 state=state) for b, batch, ranks, ips, state in points]
    for row in with_scaling(table):
        if not row.ok:
            assert (row.speedup, row.efficiency, row.baseline_ranks) == (None, None, None)
            continue
        group = [r for r in table if r.ok and (r.backend, r.batch_size) == (row.backend, row.batch_size)]
        base = min(group, key=lambda r: r.ranks)
        assert row.baseline_ranks == base.ranks
        assert math.isclose(row.speedup, row.images_per_sec / base.images_per_sec,
                            rel_tol=1e-3, abs_tol=1e-4)
        assert math.isclose(row.efficiency, row.speedup / (row.ranks / base.ranks),
                            rel_tol=1e-3, abs_tol=1e-4)


POINT = {"label": "horovod-n2-g2", "backend": "horovod", "batch_size": 64, "nodes": 2,
         "gpus": 2, "ranks": 4, "job_id": "17", "run_dir": "p1"}


def test_a_row_from_a_point_and_its_record():
    record = {"state": COMPLETED, "hpcdl_result": {
        "images_per_sec": 400, "images_per_sec_per_rank": 100, "step_seconds": 0.5,
        "sync_share": 0.25, "epoch_times": [10, 12, "x"], "world_size": 2}}
    row = row_from(POINT, record, "UNKNOWN")
    assert (row.state, row.images_per_sec, row.sync_share, row.epoch_seconds) == \
        (COMPLETED, 400.0, 0.25, 11.0)
    assert row.note == "ran 2 ranks, not 4" and row.job_id == "17" and row.ok
    failed = row_from(POINT, {"state": "FAILED", "exit_code": 1, "signal": 9,
                              "failed_ranks": [0, 3], "message": "OOM"}, "UNKNOWN")
    assert (failed.state, failed.note) == ("FAILED", "exit code 1, signal 9, failed ranks 0,3, OOM")
    silent = row_from(POINT, {"state": COMPLETED, "hpcdl_result": {"images_per_sec": True}}, "X")
    assert silent.state == NO_RESULT and not silent.ok
    queued = row_from(POINT, None, "PENDING", "still queued")
    assert (queued.state, queued.note, queued.images_per_sec) == ("PENDING", "still queued", None)


def test_the_table_for_people_explains_every_point_that_needs_it():
    table = with_scaling([
        _ok("horovod", 64, 2, 100.0), _ok("horovod", 64, 4, 180.0),
        Row(label="horovod-8", backend="horovod", batch_size=64, nodes=2, gpus=4, ranks=8,
            state="FAILED", note="exit code 1", job_id="9")])
    text = format_table(table).splitlines()
    assert text[0].split() == ["backend", "batch", "nodes", "gpus/node", "ranks", "state",
                               "img/s", "img/s/rank", "speedup", "efficiency", "step", "s",
                               "sync", "epoch", "s"]
    assert text[2].split()[5:10] == ["COMPLETED", "180.00", "-", "1.80", "90.0%"]
    assert text[4] == "baseline (horovod, batch 64): 2 ranks (no completed 1-rank point)"
    assert text[5] == "horovod-8: FAILED (exit code 1), job 9"
