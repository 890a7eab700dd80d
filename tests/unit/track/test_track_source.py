"""hpcdl/track/source.py's pure parts: a training command's arguments (property), the
per-step series over ranks (property), parameter keys and values, the result's numbers,
and which directories are runs (real folders). (Whole runs to the trackers:
test_track.py.)"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcdl.errors import ValidationError
from hpcdl.track.source import (
    PARAM_VALUE_MAX,
    aggregate,
    command_args,
    find_runs,
    hparam_value,
    param_key,
    plan_params,
    result_metrics,
    run_id_of,
)

KEYS = st.from_regex(r"[a-z][a-z_-]{0,8}", fullmatch=True)
VALUES = st.from_regex(r"[A-Za-z0-9.,/=_-]{1,8}", fullmatch=True).filter(
    lambda v: not v.startswith("--"))


@given(st.lists(st.tuples(KEYS, st.none() | VALUES, st.booleans()), max_size=6))
def test_command_args_reads_what_argparse_would(items):
    command, want = ["python3", "train.py"], {}
    for key, value, joined in items:
        if value is None:
            command.append(f"--{key}")
            want[key] = "true"
        elif joined:
            command.append(f"--{key}={value}")
            want[key] = value
        else:
            command += [f"--{key}", value]
            want[key] = value
    assert command_args(command) == want


def test_command_args_edge_cases():
    assert command_args(["--", "--lr", "--x=", "-v", "3"]) == {"lr": "true", "x": ""}
    assert command_args(["--lr", "0.1", "--lr", "0.2"]) == {"lr": "0.2"}


def _metrics(per_rank: dict[int, list[dict]]) -> dict[int, dict]:
    return {rank: {"steps": steps} for rank, steps in per_rank.items()}


@given(st.integers(1, 4), st.integers(0, 6), st.data())
def test_aggregate_sums_throughput_takes_the_slowest_and_rank_zeros_loss(ranks, steps, data):
    per_rank = {}
    for rank in range(ranks):
        last = data.draw(st.integers(0, steps))
        per_rank[rank] = [{"step": s, "t": float(s), "loss": float(rank * 100 + s),
                           "images_per_sec": float(rank + 1), "step_s": float(rank + s),
                           "lr": 0.1} for s in range(1, last + 1)]
    points = aggregate(_metrics(per_rank), complete_only=False)
    for point in points:
        have = [r for r in per_rank if any(x["step"] == point.step for x in per_rank[r])]
        assert point.values["loss"] == min(have) * 100 + point.step
        assert point.values["images_per_sec"] == sum(r + 1 for r in have)
        assert point.values["step_s"] == max(have) + point.step
        assert point.wall_time == float(point.step)
    assert [p.step for p in points] == sorted({x["step"] for s in per_rank.values() for x in s})
    complete = aggregate(_metrics(per_rank), complete_only=True)
    fewest = min(len(s) for s in per_rank.values())
    assert [p.step for p in complete] == list(range(1, fewest + 1))


def test_aggregate_skips_what_is_no_number():
    points = aggregate(_metrics({0: [{"step": 1, "loss": float("nan"), "lr": True,
                                      "images_per_sec": "fast", "t": "later"}],
                                 1: [{"step": 1, "loss": 2.0, "images_per_sec": 5}]}),
                       complete_only=False)
    # rank 0's loss is NaN: no loss at all (rank 1's is not rank 0's).
    assert points[0].values == {"images_per_sec": 5.0} and points[0].wall_time is None
    assert aggregate({}, complete_only=True) == []


@pytest.mark.parametrize(("text", "value"), [("0.1", 0.1), ("64", 64.0), ("1e-3", 0.001),
                                             ("inf", "inf"), ("nan", "nan"), ("adam", "adam"),
                                             ("", "")])
def test_hparam_values_are_finite_numbers_or_text(text, value):
    assert hparam_value(text) == value


@given(st.text(max_size=300))
def test_param_keys_are_safe_and_short(name):
    key = param_key(name)
    assert len(key) <= 250 and all(c.isascii() and (c.isalnum() or c in "_-. /") for c in key)


def test_run_ids_and_plan_params(tmp_path):
    assert run_id_of(tmp_path / "n2 g4 (#1)") == "n2-g4-1"
    assert run_id_of(tmp_path / "$$$") == "run"
    plan = {"nodes": 2, "gpus_per_node": 4, "partition": "", "image": None, "requeue": True,
            "command": ["python3", "t.py", "--lr", "0.1", "--a b", "x" * 600], "other": 1}
    params = plan_params(plan)
    assert params["nodes"] == "2" and params["requeue"] == "True"
    assert "partition" not in params and "image" not in params and "other" not in params
    assert params["arg.lr"] == "0.1"
    assert params["arg.a b"].startswith("xxx") and len(params["arg.a b"]) == PARAM_VALUE_MAX
    assert params["command"].startswith("python3 t.py --lr 0.1 '--a b' xxx")
    assert params["command"].endswith("...") and len(params["command"]) == PARAM_VALUE_MAX


def test_result_metrics_keeps_the_numbers():
    record = {"hpcdl_result": {"img*s": 12, "ok": True, "loss": 0.5, "note": "x",
                               "bad": math.nan}}
    assert result_metrics(record) == {"img_s": 12.0, "loss": 0.5}
    assert result_metrics(None) == {} and result_metrics({"hpcdl_result": [1]}) == {}


def test_find_runs_takes_runs_sweeps_and_folders_of_runs(tmp_path):
    def run(path: Path, what: str = "plan") -> Path:
        path.mkdir(parents=True)
        if what == "plan":
            (path / "plan.json").write_text("{}")
        else:
            (path / "metrics").mkdir()
        return path

    one = run(tmp_path / "one")
    sweep = tmp_path / "sweep"
    a, b = run(sweep / "a"), run(sweep / "b", "metrics")
    (sweep / "sweep.json").write_text(json.dumps({"points": [
        {"run_dir": "b"}, {"run_dir": "a"}, {"run_dir": "gone"}, {"run_dir": None}]}))
    many = tmp_path / "many"
    c, d = run(many / "c"), run(many / "d", "metrics")
    (many / "not-a-run").mkdir()
    found = find_runs([one, sweep, many, one])
    assert found == [one.resolve(), b.resolve(), a.resolve(), c.resolve(), d.resolve()]
    with pytest.raises(ValidationError, match="neither a run directory"):
        find_runs([many / "not-a-run"])
    with pytest.raises(ValidationError, match="not a directory"):
        find_runs([one / "plan.json"])
