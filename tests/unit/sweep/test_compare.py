"""hpcdl.sweep.compare: the comparison table of a parameter sweep (`hpcdl results` of an
`hpcdl sweep` directory), built from sweep.json entries and result.json records."""

from __future__ import annotations

import csv
import io
import json

import pytest

from hpcdl.errors import ValidationError
from hpcdl.sweep import compare


@pytest.mark.parametrize("text, seconds", [
    ("0:00", 0.0), ("3:04", 184.0), ("02:03:04", 7384.0), ("1-02:03:04", 93784.0),
    (" 00:00:59 ", 59.0), ("12", 12.0),
])
def test_elapsed_reads_slurms_forms(text, seconds):
    assert compare.elapsed_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "Unknown", "1:2:3:4", "x-01:00", "1:-2", "1.5:00"])
def test_elapsed_is_none_for_anything_else(text):
    assert compare.elapsed_seconds(text) is None


ENTRY = {"index": 3, "params": {"lr": "0.1", "arch": "resnet18"}, "job_id": "77_3",
         "run_dir": "/scratch/s/p3"}


def test_a_row_takes_the_record_over_the_schedulers_word():
    record = {"state": "COMPLETED", "elapsed": "00:01:40",
              "hpcdl_result": {"final_loss": 0.5, "top1": 0.25, "images_per_sec": 123,
                               "wall_time": 99.0}}
    row = compare.param_row(ENTRY, record, "RUNNING", note="ignored with a record")
    assert row == {"point": 3, "lr": "0.1", "arch": "resnet18", "state": "COMPLETED",
                   "final_loss": 0.5, "top1": 0.25, "images_per_sec": 123.0,
                   "run_time_s": 100.0,  # Slurm's Elapsed first
                   "job_id": "77_3", "run_dir": "/scratch/s/p3", "note": ""}


def test_a_row_without_a_record_keeps_the_state_and_the_note():
    row = compare.param_row(ENTRY, None, "PENDING", note="not started")
    assert (row["state"], row["note"], row["final_loss"], row["run_time_s"]) == \
        ("PENDING", "not started", None, None)


def test_run_time_falls_back_to_wall_time_and_non_numbers_are_dropped():
    record = {"state": "FAILED", "elapsed": "Unknown",
              "hpcdl_result": {"wall_time": 42, "final_loss": "nan?", "top1": True}}
    row = compare.param_row(ENTRY, record, "RUNNING")
    assert (row["run_time_s"], row["final_loss"], row["top1"]) == (42.0, None, None)


def _rows() -> list[dict]:
    return [{"point": 0, "lr": "0.1", "state": "COMPLETED", "top1": 0.5},
            {"point": 1, "lr": "1e-3", "state": "FAILED", "top1": None},
            {"point": 2, "lr": "big", "state": "COMPLETED", "top1": 0.75},
            {"point": 3, "lr": "", "state": "PENDING", "top1": 0.125}]


def test_sort_orders_numbers_by_value_then_words_and_keeps_empty_cells_last():
    assert [r["point"] for r in compare.sort_rows(_rows(), "lr", ["lr"])] == [1, 0, 2, 3]
    assert [r["point"] for r in compare.sort_rows(_rows(), "-lr", ["lr"])] == [2, 0, 1, 3]
    assert [r["point"] for r in compare.sort_rows(_rows(), "-top1", ["lr"])] == [2, 0, 3, 1]


def test_sort_by_an_unknown_column_names_the_columns():
    with pytest.raises(ValidationError) as err:
        compare.sort_rows(_rows(), "loss", ["lr"])
    assert err.value.message == ("sort: no column 'loss'; columns: point, lr, state, "
                                 "final_loss, top1, images_per_sec, run_time_s, job_id")


def test_the_text_table_aligns_formats_and_counts():
    rows = [compare.param_row({"index": 0, "params": {"lr": "0.1"}, "job_id": "9_0"},
                              {"state": "COMPLETED", "elapsed": "0:10",
                               "hpcdl_result": {"final_loss": 1.23456, "top1": 0.5,
                                                "images_per_sec": 1000.04}}, "?"),
            compare.param_row({"index": 1, "params": {"lr": "0.05"}, "job_id": "9_1"},
                              None, "PENDING", note="queued: Priority")]
    assert compare.format_table(rows, ["lr"]).splitlines() == [
        "POINT  LR    STATE      FINAL_LOSS  TOP1   IMAGES_PER_SEC  RUN_TIME_S  JOB_ID",
        "0      0.1   COMPLETED  1.235       50.0%  1000.0          10.0        9_0",
        "1      0.05  PENDING    -           -      -               -           9_1",
        "    queued: Priority",
        "2 points, 1 completed",
    ]


def test_csv_and_json_carry_every_column():
    rows = [compare.param_row(ENTRY, None, "PENDING", note="a, \"quoted\" note")]
    parsed = list(csv.DictReader(io.StringIO(compare.to_csv(rows, ["lr", "arch"]))))
    assert list(parsed[0]) == [*compare.columns(["lr", "arch"]), "run_dir", "note"]
    assert parsed[0]["note"] == 'a, "quoted" note' and parsed[0]["final_loss"] == ""
    assert json.loads(compare.to_json(rows, {"params": ["lr", "arch"]})) == \
        {"params": ["lr", "arch"], "rows": rows}
