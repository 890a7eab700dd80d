"""bench/bench_probe.py's summary of node ratios over repeated probes, and where a
threshold sits between healthy nodes and a slow one (the figures DEFAULT_SLOW_RATIO
is chosen from)."""

from __future__ import annotations

import pytest

from bench.bench_probe import ratio_summary, threshold_margins


def test_ratio_summary_per_node_over_probes() -> None:
    probes = [{"a": 1.0, "b": 0.5, "c": 1.0},
              {"a": 0.8, "b": 1.0, "c": 1.0},
              {"a": 1.0, "b": 0.7, "c": 0.9}]
    assert ratio_summary(probes) == {
        "a": {"n": 3, "min": 0.8, "median": 1.0, "max": 1.0},
        "b": {"n": 3, "min": 0.5, "median": 0.7, "max": 1.0},
        "c": {"n": 3, "min": 0.9, "median": 1.0, "max": 1.0}}


def test_ratio_summary_node_missing_from_a_probe_and_none() -> None:
    assert ratio_summary([{"a": 0.5}, {"a": 1.0, "b": 0.25}]) == {
        "a": {"n": 2, "min": 0.5, "median": 0.75, "max": 1.0},
        "b": {"n": 1, "min": 0.25, "median": 0.25, "max": 0.25}}
    assert ratio_summary([]) == {}


def test_threshold_margins_both_sides() -> None:
    m = threshold_margins(0.36, 0.04, 0.12)
    assert m["midpoint"] == pytest.approx(0.12)  # the same factor of 3 each side
    assert m["healthy_margin"] == pytest.approx(3.0)
    assert m["slow_margin"] == pytest.approx(3.0)
    # A threshold above a healthy node's ratio: a margin below 1, a wrong verdict seen.
    assert threshold_margins(0.39, 0.03, 0.5)["healthy_margin"] < 1


@pytest.mark.parametrize("args", [(0.0, 0.03, 0.2), (0.5, 0.0, 0.2), (0.5, 0.03, 0.0)])
def test_threshold_margins_refuse_zero(args: tuple[float, float, float]) -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        threshold_margins(*args)
