"""hpcdl.report.charts on small crafted data: each chart is an inline SVG whose text
(labels, legends) stays searchable text, the same bytes for the same data, and None
when there is nothing to draw (the report then says what is missing)."""

from __future__ import annotations

import re

import pytest

from hpcdl.report import charts

pytest.importorskip("matplotlib")


def _steps(n: int, *, attempt: int = 0, loss0: float = 2.0, busy: float = 0.1) -> list[dict]:
    return [{"step": s, "attempt": attempt, "loss": loss0 / (s + 1), "images_per_sec": 50.0,
             "data_s": 0.01, "compute_s": busy, "sync_s": 0.02} for s in range(1, n + 1)]


METRICS = {0: {"host": "n1", "steps": _steps(6)},
           1: {"host": "n2", "steps": _steps(6, busy=0.5)}}


def _texts(svg: str) -> list[str]:
    """The words the SVG shows (svg.fonttype none keeps them as <text>)."""
    return [t.strip() for t in re.findall(r"<text[^>]*>([^<]*)</text>", svg)]


def test_nothing_to_draw_is_none():
    assert charts.loss_chart({}, []) is None
    assert charts.loss_chart({0: {"steps": [{"step": 1, "loss": None}]}}, []) is None
    assert charts.throughput_chart({0: {"steps": [{"step": 1}]}}, []) is None
    assert charts.rank_heatmap({}, set()) is None
    assert charts.split_chart([], METRICS, set()) is None
    assert charts.attempts_chart([{"attempt": 0, "first_step": None, "start_t": 1.0}]) is None
    assert charts.probe_matrix({"nodes": ["n1"], "pairs": []}) is None
    assert charts.scaling_chart([], "t") is None
    assert charts.curves_chart({"lr=0.1": []}) is None
    assert charts.metric_vs_param_chart([{"final_loss": None}], ["lr"]) is None


def test_rank0_steps_is_the_lowest_ranks():
    assert charts.rank0_steps({3: {"steps": [1]}, 1: {"steps": [2]}}) == [2]
    assert charts.rank0_steps({}) == []


def test_loss_chart_is_svg_with_its_legend_and_the_attempts_marked():
    spans = [{"attempt": 0, "first_step": 1}, {"attempt": 1, "first_step": 4}]
    svg = charts.loss_chart(METRICS, spans)
    assert svg is not None and svg.startswith("<svg") and svg.endswith("</svg>")
    words = _texts(svg)
    assert "loss (rank 0)" in words and "attempt 1" in words and "training loss" in words
    # Reproducible: the same data gives the same bytes (no date, fixed hash salt).
    assert charts.loss_chart(METRICS, spans) == svg


def test_throughput_sums_every_rank():
    words = _texts(charts.throughput_chart(METRICS, []) or "")
    assert "images/s, 2 ranks summed" in words


def test_rank_heatmap_and_split_label_ranks_with_their_nodes_and_the_slow_one_red():
    heat = charts.rank_heatmap(METRICS, {1})
    assert heat is not None and {"rank 0 (n1)", "rank 1 (n2)"} <= set(_texts(heat))
    medians = [{"rank": 0, "host": "n1"}, {"rank": 1, "host": "n2"}]
    split = charts.split_chart(medians, METRICS, {1})
    assert split is not None
    assert {"data wait", "forward/backward", "gradient sync wait"} <= set(_texts(split))
    # The slow rank's label, and only it, is drawn red.
    assert re.search(r'fill: #ff0000[^>]*>\s*rank 1 \(n2\)', split)
    assert not re.search(r'fill: #ff0000[^>]*>\s*rank 0 \(n1\)', split)


def test_attempts_chart_names_steps_done_again_and_a_node_failure():
    spans = [{"attempt": 0, "first_step": 1, "last_step": 40, "start_t": 100.0, "end_t": 160.0},
             {"attempt": 1, "first_step": 31, "last_step": 60, "start_t": 200.0,
              "end_t": 230.0, "redone": 10}]
    recoveries = [{"detected_at": 150.0, "first_step_at": 170.0, "seconds_to_train": 20,
                   "nodes": ["n2"]},
                  {"detected_at": 10.0, "nodes": ["n9"]}]  # before the steps: not drawn
    words = _texts(charts.attempts_chart(spans, recoveries) or "")
    assert "attempt 0: steps 1-40" in words
    assert "attempt 1: steps 31-60 (10 done again)" in words
    assert "node failure (n2): back to training after 20 s" in words
    assert not any("n9" in w for w in words)


def test_probe_matrix_writes_each_pairs_bandwidth():
    probe = {"nodes": ["n1", "n2", "n3"],
             "pairs": [{"nodes": ["n1", "n2"], "busbw_gbs": 9.5},
                       {"nodes": ["n2", "n3"], "busbw_gbs": 0.25}],
             "verdict": {"slow_nodes": ["n3"]}}
    words = _texts(charts.probe_matrix(probe) or "")
    assert words.count("9.5") == 2 and words.count("0.25") == 2  # both halves of the matrix


def test_curves_and_metric_vs_param():
    curves = charts.curves_chart({"lr=0.1": [(1, 2.0), (2, 1.5)], "lr=0.01": [(1, 2.1)]})
    assert {"lr=0.1", "lr=0.01"} <= set(_texts(curves or ""))
    rows = [{"lr": 0.001, "opt": "sgd", "final_loss": 1.0},
            {"lr": 0.1, "opt": "adam", "final_loss": 0.5}]
    svg = charts.metric_vs_param_chart(rows, ["lr", "opt"])
    words = _texts(svg or "")
    assert "final loss" in words and {"adam", "sgd"} <= set(words)  # words as categories
