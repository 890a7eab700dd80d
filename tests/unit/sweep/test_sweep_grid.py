"""hpcdl/sweep/grid.py as properties: list options parse to what was written (order kept,
duplicates dropped), the grid holds every combination once with each group's smallest
point first, labels are distinct file names, and sweep.json reads back. (The examples
and the partition pinning: tests/unit/results/test_scaling.py.)"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcdl.errors import ValidationError
from hpcdl.plan import BACKENDS, JobRequest
from hpcdl.sweep.grid import (
    SweepPoint,
    default_job_name,
    expand,
    new_sweep_id,
    parse_backends,
    parse_int_list,
    point_entry,
    read_sweep,
    sweep_record,
    write_sweep,
)

SMALL = st.lists(st.integers(1, 64), min_size=1, max_size=5)


@given(SMALL, st.sampled_from([",", ", ", " ,"]))
def test_an_int_list_keeps_the_first_of_each_value_in_order(values, sep):
    assert parse_int_list("nodes", sep.join(map(str, values))) == tuple(dict.fromkeys(values))


@given(st.text(max_size=8).filter(lambda t: not re.fullmatch(r"[0-9]+", t.strip())))
def test_an_item_that_is_no_whole_number_is_named(item):
    with pytest.raises(ValidationError) as err:
        parse_int_list("gpus", f"1,{item}", minimum=0)
    assert err.value.message.startswith("gpus: ")
    assert "is not a whole number >= 0" in err.value.message or "empty item" in err.value.message


def test_the_minimum_and_backends():
    assert parse_int_list("gpus", "0,1", minimum=0) == (0, 1)
    with pytest.raises(ValidationError, match="'0' in '0' is not a whole number >= 1"):
        parse_int_list("nodes", "0")
    assert parse_backends(",".join([*BACKENDS, *BACKENDS])) == tuple(BACKENDS)


@given(st.lists(st.sampled_from(BACKENDS), min_size=1, unique=True).map(tuple),
       st.lists(st.integers(1, 8), min_size=1, max_size=3, unique=True).map(tuple),
       st.lists(st.integers(0, 8), min_size=1, max_size=3, unique=True).map(tuple),
       st.none() | st.lists(st.integers(1, 512), min_size=1, max_size=3, unique=True).map(tuple))
def test_the_grid_is_every_combination_smallest_first(backends, nodes, gpus, batches):
    points = expand(backends, nodes, gpus, batches)
    sizes = batches or (None,)
    assert sorted(points) == sorted(SweepPoint(b, n, g, s) for b, n, g, s in
                                    itertools.product(backends, nodes, gpus, sizes))
    assert len({p.label for p in points}) == len(points)
    assert all(re.fullmatch(r"[a-z]+-n\d+-g\d+(-b\d+)?", p.label) for p in points)
    for (_, _), group in itertools.groupby(points, key=lambda p: (p.backend, p.batch_size)):
        ranks = [p.ranks for p in group]
        assert ranks == sorted(ranks)  # the baseline (fewest ranks) runs first
    # Groups come in the order the options named them.
    order = [(p.backend, p.batch_size) for p in points]
    assert order == sorted(order, key=lambda k: (backends.index(k[0]), sizes.index(k[1])))


def test_a_point_counts_one_rank_per_gpu_or_per_node():
    assert SweepPoint("ddp", 3, 4).ranks == 12 and SweepPoint("ddp", 3, 0).ranks == 3
    assert SweepPoint("horovod", 2, 0, 64).label == "horovod-n2-g0-b64"


def test_the_record_reads_back_and_a_foreign_file_is_refused(tmp_path: Path):
    sweep_id = new_sweep_id()
    assert re.fullmatch(r"sweep-\d{8}-\d{6}-[0-9a-f]{4}", sweep_id)
    assert default_job_name(sweep_id) == f"hpcdl-scale-{sweep_id[-4:]}"
    base = JobRequest.of(synthetic=True, partition="gpu", example_args=("--arch=resnet18",))
    points = [point_entry(SweepPoint("ddp", 1, 1)),
              point_entry(SweepPoint("ddp", 2, 1, 8), tmp_path / "ddp-n2-g1-b8-x", "17")]
    record = sweep_record(sweep_id, "sandbox", base, False, points)
    write_sweep(tmp_path, record)
    back = read_sweep(tmp_path)
    assert back == record
    assert back["points"][1]["run_dir"] == "ddp-n2-g1-b8-x" and back["points"][1]["ranks"] == 2
    assert back["partition"] == "gpu" and back["example_args"] == ["--arch=resnet18"]
    assert read_sweep(tmp_path / "nothing") is None
    (tmp_path / "sweep.json").write_text("{")
    with pytest.raises(ValidationError, match="sweep.json: not valid JSON"):
        read_sweep(tmp_path)
    (tmp_path / "sweep.json").write_text('{"points": 3}')
    with pytest.raises(ValidationError, match="has no 'points' list; not written by hpcdl scale"):
        read_sweep(tmp_path)
