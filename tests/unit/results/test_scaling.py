"""The scaling table (hpcdl.results.table), the sweep grid (hpcdl.sweep.grid), the figure
(hpcdl.results.plot) and `hpcdl scale --dry-run` / `hpcdl results` on sweep directories
written as the real submission writes them (no Slurm needed: --no-refresh)."""

from __future__ import annotations

import csv
import io
import json
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcdl.cli import cli
from hpcdl.errors import ValidationError
from hpcdl.plan import JobRequest
from hpcdl.profiles import load_profile
from hpcdl.results.plot import X_LABEL, Y_LABELS, build_figure, write_png
from hpcdl.results.table import (
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
from hpcdl.sweep.grid import (
    SweepPoint,
    check_base,
    expand,
    parse_backends,
    parse_int_list,
    pin_partition,
    plan_points,
    point_entry,
    point_request,
    sweep_record,
    write_sweep,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _record(ips: float | None, ranks: int, *, state: str = "COMPLETED", sync: float = 0.1,
            exit_code: int = 0) -> dict:
    result = None if ips is None else {
        "images_per_sec": ips, "images_per_sec_per_rank": round(ips / ranks, 2),
        "world_size": ranks, "step_seconds": 0.5, "sync_seconds": 0.5 * sync,
        "sync_share": sync, "epoch_times": [3.0, 5.0]}
    return {"job_id": "1", "state": state, "exit_code": exit_code, "signal": None,
            "hpcdl_result": result, "ranks": [], "failed_ranks": [] if state == "COMPLETED" else [1]}


def _rows(spec: list[tuple[str, int, int, float | None, str]]) -> list[Row]:
    rows = []
    for backend, nodes, gpus, ips, state in spec:
        point = SweepPoint(backend, nodes, gpus)
        record = _record(ips, point.ranks, state=state, exit_code=0 if state == "COMPLETED" else 1)
        rows.append(row_from(point_entry(point), record, "UNKNOWN"))
    return with_scaling(rows)


def test_speedup_and_efficiency_against_the_one_rank_point_per_backend():
    rows = _rows([("horovod", 1, 1, 100.0, "COMPLETED"), ("horovod", 1, 2, 180.0, "COMPLETED"),
                  ("horovod", 2, 2, 300.0, "COMPLETED"), ("ddp", 1, 1, 50.0, "COMPLETED"),
                  ("ddp", 2, 1, 95.0, "COMPLETED")])
    by = {r.label: r for r in rows}
    assert by["horovod-n1-g2"].speedup == 1.8 and by["horovod-n1-g2"].efficiency == 0.9
    assert by["horovod-n2-g2"].speedup == 3.0 and by["horovod-n2-g2"].efficiency == 0.75
    assert by["ddp-n2-g1"].speedup == 1.9 and by["ddp-n2-g1"].efficiency == 0.95
    assert {r.baseline_ranks for r in rows} == {1}
    assert by["horovod-n1-g1"].epoch_seconds == 4.0
    assert by["horovod-n1-g1"].sync_share == 0.1


def test_a_failed_point_stays_in_the_table_with_its_state():
    rows = _rows([("horovod", 1, 1, 100.0, "COMPLETED"), ("horovod", 1, 2, None, "FAILED"),
                  ("horovod", 2, 2, 320.0, "COMPLETED")])
    assert [r.label for r in rows] == ["horovod-n1-g1", "horovod-n1-g2", "horovod-n2-g2"]
    failed = rows[1]
    assert failed.state == "FAILED" and failed.speedup is None and not failed.ok
    assert "exit code 1" in failed.note and "failed ranks 1" in failed.note
    text = format_table(rows)
    assert "horovod-n1-g2: FAILED (exit code 1, failed ranks 1)" in text.splitlines()
    assert rows[2].efficiency == 0.8


def test_completed_without_result_line_is_no_result_not_dropped():
    point = SweepPoint("ddp", 1, 1)
    row = row_from(point_entry(point), _record(None, 1), "UNKNOWN")
    assert row.state == NO_RESULT and "no hpcdl_result" in row.note


def test_a_point_never_submitted_or_still_queued_keeps_the_given_state():
    point = SweepPoint("ddp", 2, 1)
    row = row_from(point_entry(point), None, "PENDING", "job 7 (Dependency)")
    assert (row.state, row.note, row.images_per_sec) == ("PENDING", "job 7 (Dependency)", None)


def test_missing_one_rank_point_uses_the_smallest_and_says_so():
    rows = _rows([("horovod", 1, 1, None, "FAILED"), ("horovod", 1, 2, 200.0, "COMPLETED"),
                  ("horovod", 2, 2, 300.0, "COMPLETED")])
    assert rows[1].baseline_ranks == 2 and rows[1].speedup == 1.0
    assert rows[2].speedup == 1.5 and rows[2].efficiency == 0.75
    assert "baseline (horovod): 2 ranks (no completed 1-rank point)" in format_table(rows)


def test_csv_and_json_round_trip():
    rows = _rows([("horovod", 1, 1, 100.0, "COMPLETED"), ("horovod", 1, 2, None, "FAILED"),
                  ("ddp", 1, 1, 51.5, "COMPLETED"), ("ddp", 1, 2, 90.25, "COMPLETED")])
    assert rows_from_csv(to_csv(rows)) == rows
    assert rows_from_json(to_json(rows, {"sweep_id": "s"})) == rows
    # The CSV is plain: one header, one line per point, empty cells for missing values.
    parsed = list(csv.DictReader(io.StringIO(to_csv(rows))))
    assert len(parsed) == 4 and parsed[1]["speedup"] == "" and parsed[1]["state"] == "FAILED"


def test_reading_another_csv_or_json_is_a_clear_error():
    with pytest.raises(ValidationError, match="not an hpcdl results table"):
        rows_from_csv("a,b\n1,2\n", "x.csv")
    with pytest.raises(ValidationError, match="not an hpcdl results table"):
        rows_from_json('{"points": []}', "x.json")


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_MAGIC
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_plot_has_the_expected_axes_and_is_a_valid_png(tmp_path):
    rows = _rows([("horovod", 1, 1, 100.0, "COMPLETED"), ("horovod", 1, 2, 170.0, "COMPLETED"),
                  ("horovod", 2, 2, None, "FAILED"), ("ddp", 1, 1, 60.0, "COMPLETED"),
                  ("ddp", 2, 1, 100.0, "COMPLETED")])
    fig = build_figure(rows, title="sweep-x")
    axes = fig.get_axes()
    assert [ax.get_xlabel() for ax in axes] == [X_LABEL] * 3
    assert [ax.get_ylabel() for ax in axes] == list(Y_LABELS)
    labels = [line.get_label() for line in axes[0].get_lines()]
    assert "horovod, 1/node" in labels and "ddp, 1/node" in labels and "ideal" in labels
    assert any(label.startswith("failed / no result: horovod-n2-g2") for label in labels)
    speed = next(line for line in axes[0].get_lines() if line.get_label() == "horovod, 1/node")
    assert list(speed.get_xdata()) == [1] and list(speed.get_ydata()) == [1.0]
    two = next(line for line in axes[0].get_lines() if line.get_label() == "horovod, 2/node")
    assert list(two.get_xdata()) == [1, 2] and list(two.get_ydata()) == [1.0, 1.7]
    out = tmp_path / "scaling.png"
    write_png(fig, out)
    width, height = _png_size(out.read_bytes())
    assert width > 1000 and height > 300
    assert [p.name for p in tmp_path.iterdir()] == ["scaling.png"]  # no temp file left


# ----- the sweep grid ---------------------------------------------------------------

def test_list_options_parse_and_name_the_bad_item():
    assert parse_int_list("nodes", "1, 2,4,2") == (1, 2, 4)
    with pytest.raises(ValidationError, match="nodes: '0' in '0,1' is not a whole number >= 1"):
        parse_int_list("nodes", "0,1")
    with pytest.raises(ValidationError, match="empty item"):
        parse_int_list("gpus", "1,,2", minimum=0)
    assert parse_backends("ddp,horovod") == ("ddp", "horovod")
    with pytest.raises(ValidationError, match="backend: 'tf'"):
        parse_backends("horovod,tf")


def test_expand_orders_points_smallest_first_per_backend_and_batch():
    points = expand(("horovod", "ddp"), (1, 2), (2, 1), (64, 32))
    assert len(points) == 16
    first = [p.label for p in points[:4]]
    assert first == ["horovod-n1-g1-b64", "horovod-n1-g2-b64", "horovod-n2-g1-b64",
                     "horovod-n2-g2-b64"]
    assert points[4].batch_size == 32 and points[8].backend == "ddp"


def test_point_request_sets_the_points_values_and_batch_flag():
    base = JobRequest.of(synthetic=True, example_args=("--arch=resnet18",))
    req = point_request(base, SweepPoint("ddp", 2, 4, 64))
    assert (req.launch.backend, req.placement.nodes, req.placement.gpus) == ("ddp", 2, 4)
    assert req.launch.example_args == ("--arch=resnet18", "--batch-size=64")


def test_plan_points_names_the_point_over_the_limit():
    prof = load_profile("sandbox")
    points = expand(("horovod",), (1, 3), (1,), None)
    with pytest.raises(ValidationError, match=r"^point horovod-n3-g1 \(3 ranks\): nodes: 3"):
        plan_points(prof, JobRequest.of(synthetic=True), points)


def test_every_point_runs_on_the_partition_of_the_largest_point():
    # On taurus the smallest partition that fits differs per point (hpdlf for 1 GPU,
    # gpu2 for 4): a sweep must not mix them, or its speedups compare different GPUs.
    prof = load_profile("taurus")
    points = expand(("horovod",), (1, 2, 4), (1, 2, 4), None)
    assert plan_points(prof, JobRequest.of(synthetic=True), points[:1])[0][1].spec.partition.name == "hpdlf"
    base, why = pin_partition(prof, JobRequest.of(synthetic=True), points)
    assert base.placement.partition == "gpu2" and why.startswith("the largest point, horovod-n4-g4")
    assert {plan.spec.partition.name for _, plan in plan_points(prof, base, points)} == {"gpu2"}
    asked = JobRequest.of(synthetic=True, partition="alpha")
    assert pin_partition(prof, asked, points) == (asked, "requested with --partition")


def test_a_sweep_takes_no_command_and_no_batch_size_in_x():
    with pytest.raises(ValidationError, match="command"):
        check_base(JobRequest.of(command=("python3", "x.py")), sweeping_batch=False)
    with pytest.raises(ValidationError, match="--batch-size is set per point"):
        check_base(JobRequest.of(example_args=("--batch-size=8",)), sweeping_batch=True)
    check_base(JobRequest.of(example_args=("--batch-size=8",)), sweeping_batch=False)


# ----- the commands -----------------------------------------------------------------

def invoke(*args: str):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert "Traceback" not in result.output
    return result


def test_scale_dry_run_shows_every_point_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = invoke("scale", "-p", "sandbox", "-N", "1,2", "-G", "1,2", "--backend", "horovod,ddp",
                 "--synthetic", "--dry-run", "--json")
    assert res.exit_code == 0, res.output
    shown = json.loads(res.stdout)
    assert shown["partition"] == "debug"
    points = shown["points"]
    assert [p["ranks"] for p in points] == [1, 2, 2, 4] * 2
    assert all(p["plan"]["job_name"].startswith("hpcdl-scale-") for p in points)
    assert len({p["plan"]["job_name"] for p in points}) == 1
    assert points[3]["plan"]["nodes"] == 2 and points[3]["plan"]["tasks_per_node"] == 2
    assert list(tmp_path.iterdir()) == []


def test_scale_over_a_limit_is_exit_2_naming_the_point(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = invoke("scale", "-p", "sandbox", "-N", "1,2", "-G", "1,8", "--synthetic")
    assert res.exit_code == 2
    assert res.stderr.startswith("error: point horovod-n2-g8 (16 ranks): gpus: 8 GPUs per node")
    assert list(tmp_path.iterdir()) == []


def _sweep_dir(tmp_path: Path) -> Path:
    """A sweep directory as `hpcdl scale --wait` leaves it: sweep.json, run dirs with
    result.json for the ended points; one point failed, one never got a result."""
    sweep = tmp_path / "sweep-20261123-100000-abcd"
    sweep.mkdir()
    points = expand(("horovod",), (1, 2), (1, 2), None)
    outcomes = {"horovod-n1-g1": 100.0, "horovod-n1-g2": 190.0, "horovod-n2-g1": "FAILED",
                "horovod-n2-g2": 340.0}
    entries = []
    for i, point in enumerate(points):
        run_dir = sweep / f"{point.label}-20261123-100000-00{i}"
        run_dir.mkdir()
        entries.append(point_entry(point, run_dir, str(100 + i)))
        outcome = outcomes[point.label]
        record = (_record(None, point.ranks, state="FAILED", exit_code=1) if outcome == "FAILED"
                  else _record(outcome, point.ranks))
        (run_dir / "result.json").write_text(json.dumps(record))
    # The last point's job never wrote a result (it was cancelled before it ran).
    (sweep / entries[-1]["run_dir"] / "result.json").unlink()
    write_sweep(sweep, sweep_record(sweep.name, "sandbox", JobRequest.of(synthetic=True), False,
                                    entries))
    return sweep


def test_results_of_a_sweep_as_table_json_csv_and_plot(tmp_path):
    sweep = _sweep_dir(tmp_path)
    res = invoke("results", str(sweep), "--no-refresh")
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].split()[:6] == ["backend", "batch", "nodes", "gpus/node", "ranks", "state"]
    assert any(line.split()[:6] == ["horovod", "-", "1", "2", "2", "COMPLETED"]
               and "1.90" in line and "95.0%" in line for line in lines), res.stdout
    assert "horovod-n2-g1: FAILED (exit code 1, failed ranks 1), job 102" in res.stdout
    assert "horovod-n2-g2: UNKNOWN (no result.json yet; Slurm not asked (--no-refresh))" \
        in res.stdout

    as_json = invoke("results", str(sweep), "--no-refresh", "--json")
    data = json.loads(as_json.stdout)
    assert data["sweep_id"] == sweep.name
    assert [r["state"] for r in data["rows"]] == ["COMPLETED", "COMPLETED", "FAILED", "UNKNOWN"]

    as_csv = invoke("results", str(sweep), "--no-refresh", "--csv", "--plot",
                    str(tmp_path / "s.png"))
    saved = tmp_path / "table.csv"
    saved.write_text(as_csv.stdout)
    _png_size((tmp_path / "s.png").read_bytes())
    # A saved table reads back into the same table.
    again = invoke("results", str(saved), "--json")
    assert json.loads(again.stdout)["rows"] == data["rows"]


def test_results_of_a_single_run_directory(tmp_path):
    run_dir = tmp_path / "hpcdl-ddp-20261123-100000-abc"
    run_dir.mkdir()
    (run_dir / "plan.json").write_text(json.dumps(
        {"backend": "ddp", "nodes": 2, "gpus_per_node": 2, "ntasks": 4}))
    (run_dir / "job.json").write_text(json.dumps({"job_id": "42"}))
    (run_dir / "result.json").write_text(json.dumps(_record(80.0, 4)))
    res = invoke("results", str(run_dir), "--json")
    row = json.loads(res.stdout)["rows"][0]
    assert (row["ranks"], row["images_per_sec"], row["state"]) == (4, 80.0, "COMPLETED")


def test_results_of_something_else_is_exit_2(tmp_path):
    res = invoke("results", str(tmp_path))
    assert res.exit_code == 2 and "neither a sweep directory" in res.stderr
    (tmp_path / "x.txt").write_text("hi")
    res = invoke("results", str(tmp_path / "x.txt"))
    assert res.exit_code == 2 and "expected a sweep or run directory" in res.stderr
