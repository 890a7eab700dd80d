"""hpcdl/results/straggler.py: the busy time of a step, the warm-up step left out, a slow
rank named, a slow node named instead of its ranks, nobody named where ranks share cores
or are all alike (property), on metrics built here in read_metrics' shape."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hpcdl.results.straggler import busy_seconds, oversubscribed, rank_medians, verdict


def rank(host: str, busy: float, *, steps: int = 5, cpus: list[int] | None = None,
         warmup: float = 50.0, sync: float = 0.1) -> dict:
    """A rank's metrics: a slow first step (warm-up), then ``busy`` s of work a step."""
    recs = [{"step": i, "attempt": 0, "data_s": 0.0, "step_s": (warmup if i == 0 else busy) + sync,
             "sync_s": sync} for i in range(steps)]
    return {"host": host, "cpus": cpus if cpus is not None else [0, 1, 2, 3], "steps": recs}


def test_busy_time_is_data_wait_plus_compute():
    assert busy_seconds({"data_s": 0.5, "compute_s": 1.0}) == 1.5
    assert busy_seconds({"data_s": 0.5, "step_s": 1.0, "sync_s": 0.25}) == 1.25
    assert busy_seconds({"step_s": 0.1, "sync_s": 0.3}) == 0.0  # never negative
    assert busy_seconds({"data_s": 0.5}) is None
    assert busy_seconds({"compute_s": True}) is None


def test_the_first_step_of_each_attempt_is_warm_up():
    metrics = {0: {"host": "a", "steps": [
        {"step": 0, "attempt": 0, "compute_s": 9.0}, {"step": 1, "attempt": 0, "compute_s": 1.0},
        {"step": 2, "attempt": 1, "compute_s": 9.0}, {"step": 3, "attempt": 1, "compute_s": 2.0}]},
        1: {"host": "a", "steps": [{"step": 0, "compute_s": 3.0}]}}
    rows = rank_medians(metrics)
    assert [(r["rank"], r["steps"], r["busy_s"]) for r in rows] == [(0, 2, 1.5), (1, 1, 3.0)]


def test_a_slow_rank_is_named_with_its_ratio():
    out = verdict({0: rank("a", 1.0), 1: rank("a", 1.0), 2: rank("b", 1.0), 3: rank("b", 2.0)})
    assert out["found"] and out["slow_nodes"] == []
    assert out["slow_ranks"] == [{"rank": 3, "host": "b", "busy_s": 2.0, "others_s": 1.0,
                                  "ratio": 2.0}]
    assert out["message"].startswith("straggler: rank 3 on b is slow: 2.000 s per step, "
                                     "2.00x the other ranks' 1.000 s")


def test_a_node_whose_ranks_are_all_slow_is_named_instead_of_them():
    out = verdict({0: rank("a", 1.0), 1: rank("a", 1.0), 2: rank("b", 3.0), 3: rank("b", 3.0),
                   4: rank("c", 1.0), 5: rank("c", 1.0)})
    assert out["slow_ranks"] == []
    assert out["slow_nodes"] == [{"host": "b", "ranks": [2, 3], "busy_s": 3.0, "others_s": 1.0,
                                  "ratio": 3.0}]
    assert "node b is slow: all its ranks (2, 3)" in out["message"]


def test_tiny_gaps_and_a_threshold_not_reached_name_nobody():
    assert not verdict({0: rank("a", 0.001), 1: rank("a", 0.0019)})["found"]  # < 2 ms more
    out = verdict({0: rank("a", 1.0), 1: rank("b", 1.2)})
    assert not out["found"] and out["message"] == (
        "no straggler: every one of 2 ranks is within 1.25x of the others' median busy "
        "time per step")
    assert verdict({0: rank("a", 1.0), 1: rank("b", 1.2)}, threshold=1.1)["found"]


def test_ranks_outnumbering_their_cores_name_nobody():
    metrics = {i: rank("n1", 1.0 + 3 * (i == 0), cpus=[0, 1]) for i in range(4)}
    assert oversubscribed(metrics) == [{"host": "n1", "ranks": 4, "cores": 2}]
    out = verdict(metrics)
    assert not out["found"] and "n1 runs 4 ranks on 2 cores" in out["message"]
    # A rank that did not record its CPUs: the node is not judged oversubscribed.
    metrics[3]["cpus"] = None
    assert oversubscribed(metrics) == []


def test_fewer_than_two_ranks_say_so():
    assert verdict({})["message"] == "no per-step metrics: nothing to compare"
    assert verdict({0: rank("a", 1.0)})["message"] == \
        "one rank with metrics: nothing to compare it with"


@given(st.integers(2, 8), st.floats(0.001, 100), st.integers(1, 3))
def test_identical_ranks_name_nobody(n, busy, nodes):
    metrics = {i: rank(f"n{i % nodes}", busy, cpus=list(range(8 * i, 8 * i + 8)))
               for i in range(n)}
    out = verdict(metrics)
    assert not out["found"] and out["slow_ranks"] == out["slow_nodes"] == []
    assert all(r["ratio"] == 1.0 for r in out["ranks"])
