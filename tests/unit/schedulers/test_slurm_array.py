"""hpcdl/schedulers/slurm/array.py: the --array spec holds exactly the indices given and
its throttle (property), task ids, the #SBATCH lines the points share, and the array's
batch script run in bash."""

from __future__ import annotations

import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcdl.errors import ValidationError
from hpcdl.schedulers.slurm.array import (
    ARRAY_SPEC,
    array_script,
    array_spec,
    shared_header,
    split_task_id,
    task_id,
)


def indices_of(spec: str) -> tuple[set[int], int | None]:
    body, _, throttle = spec.partition("%")
    out: set[int] = set()
    for item in body.split(","):
        lo, _, hi = item.partition("-")
        out |= set(range(int(lo), int(hi or lo) + 1))
    return out, int(throttle) if throttle else None


@given(st.lists(st.integers(0, 300), min_size=1, max_size=20), st.none() | st.integers(1, 30))
def test_the_spec_holds_the_indices_and_a_throttle_below_their_number(indices, most):
    spec = array_spec(indices, most)
    assert ARRAY_SPEC.fullmatch(spec)
    got, throttle = indices_of(spec)
    assert got == set(indices)
    assert throttle == (most if most is not None and most < len(set(indices)) else None)


def test_spec_forms_and_refusals():
    assert array_spec([3, 1, 2, 0], None) == "0-3"
    assert array_spec([5], 4) == "5"
    assert array_spec([1, 3, 5], 2) == "1,3,5%2"
    with pytest.raises(ValidationError, match="array: no task to submit"):
        array_spec([], None)
    with pytest.raises(ValidationError, match="max-concurrent: 0 must be 1 or more"):
        array_spec([1, 2], 0)


def test_task_ids():
    assert task_id("123", 4) == "123_4"
    assert split_task_id("123_4") == ("123", 4)
    assert split_task_id("123") is None and split_task_id("123_4_5") is None


def script(*lines: str) -> str:
    return "\n".join(["#!/bin/bash", *lines, "echo run"]) + "\n"


def test_the_shared_header_is_every_points_and_a_different_shape_is_named():
    a = script("#SBATCH --nodes=2", "#SBATCH --output=/r/a/o", "#SBATCH --error=/r/a/e")
    b = script("#SBATCH --nodes=2", "#SBATCH --output=/r/b/o", "#SBATCH --error=/r/b/e")
    assert shared_header([a, b]) == ["#SBATCH --nodes=2"]
    c = script("#SBATCH --nodes=4")
    with pytest.raises(ValidationError, match=r"point 2: its job differs from point 0's "
                                              r"\(#SBATCH --nodes=2; #SBATCH --nodes=4\)"):
        shared_header([a, b, c])


def test_the_array_script_runs_the_tasks_point_in_bash(tmp_path):
    points = []
    for i in range(2):
        p = tmp_path / f"point {i}" / "job.sbatch"
        p.parent.mkdir()
        p.write_text(f"#SBATCH --nodes=1\necho point-{i} $SLURM_ARRAY_TASK_ID\n")
        points.append(str(p))
    text = array_script([script("#SBATCH --nodes=1")] * 2, points, ["lr=0.1", "lr=0.2"],
                        log_dir_pattern=str(tmp_path / "point-%1a"))
    assert f"#SBATCH --output={tmp_path}/point-%1a/slurm-%A_%a.out" in text
    (tmp_path / "array.sbatch").write_text(text)

    def task(index: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(tmp_path / "array.sbatch")], capture_output=True,
                              text=True, env={"SLURM_ARRAY_TASK_ID": index, "PATH": "/usr/bin:/bin"},
                              timeout=30, check=False)

    assert task("1").stdout == "point-1 1\n"
    bad = task("7")
    assert bad.returncode == 2 and "array task 7 is not a point of this sweep" in bad.stderr
    with pytest.raises(ValidationError, match="point 1: its description is not one line"):
        array_script([script()] * 2, points, ["a", "b\nc"], log_dir_pattern="/r/p-%1a")
