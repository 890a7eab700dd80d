"""hpcdl/results/plot.py: the scaling figure's lines, read back from its axes: one line per
backend / batch / GPUs per node, each starting at its shared baseline, the ideal lines,
failed points as red crosses named in the legend, and the PNG written whole."""

from __future__ import annotations

from hpcdl.results.plot import X_LABEL, Y_LABELS, build_figure, write_png
from hpcdl.results.table import Row, with_scaling


def ok(gpus: int, nodes: int, ips: float, sync: float | None = None) -> Row:
    return Row(label=f"ddp-n{nodes}-g{gpus}", backend="ddp", batch_size=32, nodes=nodes,
               gpus=gpus, ranks=nodes * gpus, state="COMPLETED", images_per_sec=ips,
               sync_share=sync)


def lines(ax) -> dict[str, tuple[list[float], list[float]]]:
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
            for line in ax.get_lines()}


def test_each_series_starts_at_its_baseline_and_failures_are_named(tmp_path):
    rows = with_scaling([ok(1, 1, 100.0, 0.0), ok(2, 1, 190.0, 0.05), ok(2, 2, 360.0, 0.1),
                         ok(4, 1, 380.0, 0.08),
                         Row(label="ddp-n4-g4", backend="ddp", batch_size=32, nodes=4, gpus=4,
                             ranks=16, state="FAILED")])
    fig = build_figure(rows, title="ddp on sandbox")
    speed, eff, sync = fig.axes
    got = lines(speed)
    # The 2-GPU and 4-GPU lines begin at the 1-rank baseline they are measured against.
    assert got["ddp batch 32, 2/node"] == ([1, 2, 4], [1.0, 1.9, 3.6])
    assert got["ddp batch 32, 4/node"][0] == [1, 4]
    assert got["ideal"] == ([1, 16], [1, 16])
    crosses = [k for k in got if k.startswith("failed / no result")]
    assert crosses == ["failed / no result: ddp-n4-g4"] and got[crosses[0]] == ([16], [0])
    assert lines(eff)["ddp batch 32, 2/node"][1] == [100.0, 95.0, 90.0]
    assert lines(sync)["ddp batch 32, 2/node"] == ([2, 4], [5.0, 10.0])
    assert [ax.get_xlabel() for ax in fig.axes] == [X_LABEL] * 3
    assert tuple(ax.get_ylabel() for ax in fig.axes) == Y_LABELS
    assert list(speed.get_xticks()) == [1, 2, 4, 16]
    assert fig.get_suptitle() == "ddp on sandbox"
    write_png(fig, tmp_path / "scaling.png")
    data = (tmp_path / "scaling.png").read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and data.rstrip().endswith(b"IEND\xaeB`\x82")
    assert [p.name for p in tmp_path.iterdir()] == ["scaling.png"]


def test_a_table_without_results_still_draws_its_axes():
    fig = build_figure([Row(label="x", backend="ddp", batch_size=None, nodes=1, gpus=1, ranks=1,
                            state="PENDING")])
    assert set(lines(fig.axes[0])) == {"failed / no result: x", "ideal"}
