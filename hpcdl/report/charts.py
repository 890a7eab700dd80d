"""The report's charts as static SVG (matplotlib, Agg): inlined in the HTML they need
no JavaScript and no network to view, print and archive the same everywhere, and
matplotlib is already hpcdl's plotting dependency (``results --plot``). Text stays
text (``svg.fonttype: none``): the straggler's label is searchable in the page.

Each function takes gathered data (hpcdl.report.gather) and returns an SVG string,
or None when there is nothing to draw. matplotlib is imported here only, when a
report is made.
"""

from __future__ import annotations

import io
import statistics
from collections.abc import Sequence
from typing import Any

from hpcdl.results.straggler import busy_seconds

WIDE = (10.0, 3.4)


def _figure(size: tuple[float, float] = WIDE) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    return Figure(figsize=size, layout="constrained")


def to_svg(fig: Any, salt: str) -> str:
    """``fig`` as an inline ``<svg>`` element. ``salt`` keeps the ids of the clip paths
    of several charts on one page apart (and the output reproducible)."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": salt, "svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    start = text.find("<svg")
    return text[start:].strip() if start >= 0 else text


def rank0_steps(metrics: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    return list(metrics[min(metrics)].get("steps", [])) if metrics else []


def loss_chart(metrics: dict[int, dict[str, Any]], spans: list[dict[str, Any]]) -> str | None:
    """Loss over steps (the lowest rank's, the loss of its last sub-batch), with the
    attempts' first steps marked."""
    steps = [r for r in rank0_steps(metrics) if isinstance(r.get("loss"), (int, float))]
    if not steps:
        return None
    fig = _figure()
    ax = fig.subplots()
    ax.plot([r["step"] for r in steps], [r["loss"] for r in steps], "-", color="C0", lw=1.2,
            label=f"loss (rank {min(metrics)})")
    _mark_attempts(ax, spans)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return to_svg(fig, "loss")


def _mark_attempts(ax: Any, spans: list[dict[str, Any]]) -> None:
    for span in spans[1:]:
        if span.get("first_step") is not None:
            ax.axvline(span["first_step"], color="C3", ls="--", lw=1)
            ax.annotate(f"attempt {span['attempt']}", (span["first_step"], 1),
                        xycoords=("data", "axes fraction"), fontsize=8, color="C3",
                        va="top", ha="left")


def throughput_chart(metrics: dict[int, dict[str, Any]],
                     spans: list[dict[str, Any]]) -> str | None:
    """Images/s over steps: every rank's summed (the job's), each step."""
    per_step: dict[int, float] = {}
    for info in metrics.values():
        for rec in info.get("steps", []):
            ips = rec.get("images_per_sec")
            if isinstance(ips, (int, float)):
                per_step[rec["step"]] = per_step.get(rec["step"], 0.0) + float(ips)
    if not per_step:
        return None
    xs = sorted(per_step)
    fig = _figure()
    ax = fig.subplots()
    ax.plot(xs, [per_step[x] for x in xs], "-", color="C2", lw=1.2,
            label=f"images/s, {len(metrics)} ranks summed")
    _mark_attempts(ax, spans)
    ax.set_xlabel("step")
    ax.set_ylabel("images / s")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return to_svg(fig, "throughput")


def _rank_label(rank: int, host: Any) -> str:
    return f"rank {rank} ({host})" if host else f"rank {rank}"


def rank_heatmap(metrics: dict[int, dict[str, Any]], slow: set[int]) -> str | None:
    """Busy time (data wait + forward/backward) per rank (rows) and step (columns):
    a straggler is a bright row; ``slow`` ranks' labels are red."""
    ranks = sorted(metrics)
    steps = sorted({r["step"] for info in metrics.values() for r in info.get("steps", [])})
    if not ranks or not steps:
        return None
    col = {s: i for i, s in enumerate(steps)}
    grid = [[float("nan")] * len(steps) for _ in ranks]
    for i, rank in enumerate(ranks):
        for rec in metrics[rank].get("steps", []):
            busy = busy_seconds(rec)
            if busy is not None:
                grid[i][col[rec["step"]]] = busy * 1000
    # The colour scale leaves out each attempt's first step (warm-up, often several times
    # a normal step), which would otherwise wash every other step out to one colour.
    firsts = {min((r["step"] for r in info.get("steps", []) if r.get("attempt") == a),
                  default=None)
              for info in metrics.values() for a in {r.get("attempt") for r in info["steps"]}}
    usual = [v for row in grid for s, v in zip(steps, row, strict=True)
             if s not in firsts and v == v]
    fig = _figure((10.0, max(2.2, 0.9 + 0.32 * len(ranks))))
    ax = fig.subplots()
    image = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="viridis",
                      vmin=min(usual) if usual else None, vmax=max(usual) if usual else None,
                      extent=(steps[0] - 0.5, steps[-1] + 0.5, len(ranks) - 0.5, -0.5))
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([_rank_label(r, metrics[r].get("host")) for r in ranks], fontsize=8)
    for label, rank in zip(ax.get_yticklabels(), ranks, strict=True):
        if rank in slow:
            label.set_color("red")
            label.set_fontweight("bold")
    ax.set_xlabel("step")
    fig.colorbar(image, ax=ax, label="busy ms / step")
    return to_svg(fig, "ranks")


def split_chart(medians: list[dict[str, Any]], metrics: dict[int, dict[str, Any]],
                slow: set[int]) -> str | None:
    """Per rank, the median step split into data wait, forward/backward and
    gradient-sync wait (stacked bars): the slow rank computes, the others wait."""
    rows = []
    for row in medians:
        steps = metrics[row["rank"]].get("steps", [])[1:] or metrics[row["rank"]].get("steps", [])

        def med(key: str, steps: list[dict[str, Any]] = steps) -> float:
            vals = [float(r[key]) for r in steps if isinstance(r.get(key), (int, float))]
            return statistics.median(vals) * 1000 if vals else 0.0

        rows.append((row["rank"], row.get("host"), med("data_s"), med("compute_s"),
                     med("sync_s")))
    if not rows:
        return None
    fig = _figure((10.0, max(2.2, 0.9 + 0.32 * len(rows))))
    ax = fig.subplots()
    ys = list(range(len(rows)))
    data = [r[2] for r in rows]
    compute = [r[3] for r in rows]
    sync = [r[4] for r in rows]
    ax.barh(ys, data, color="C7", label="data wait")
    ax.barh(ys, compute, left=data, color="C0", label="forward/backward")
    ax.barh(ys, sync, left=[a + b for a, b in zip(data, compute, strict=True)], color="C1",
            label="gradient sync wait")
    ax.set_yticks(ys)
    ax.set_yticklabels([_rank_label(r[0], r[1]) for r in rows], fontsize=8)
    for label, r in zip(ax.get_yticklabels(), rows, strict=True):
        if r[0] in slow:
            label.set_color("red")
            label.set_fontweight("bold")
    ax.invert_yaxis()
    ax.set_xlabel("median ms per step")
    ax.grid(True, axis="x", alpha=0.3)
    fig.legend(fontsize=8, loc="outside upper right", ncol=3)
    return to_svg(fig, "split")


def attempts_chart(spans: list[dict[str, Any]],
                   recoveries: Sequence[dict[str, Any]] = ()) -> str | None:
    """Steps done over wall time, one colour per attempt: a requeue shows as a gap, and
    steps done again after a resume as a line starting below the previous one's end. A
    node failure survived inside the job (hpcdl.jobs.recoveries) is a shaded band from
    its detection to the first training step after the relaunch."""
    drawn = [s for s in spans if s.get("first_step") is not None and s.get("start_t")]
    if not drawn:
        return None
    t0 = min(float(s["start_t"]) for s in drawn)
    fig = _figure((10.0, 2.8))
    ax = fig.subplots()
    for s in drawn:
        start, end = float(s["start_t"]) - t0, float(s.get("end_t") or s["start_t"]) - t0
        ax.plot([start, end], [s["first_step"], s["last_step"]], "o-", lw=2,
                color=f"C{s['attempt'] % 10}",
                label=f"attempt {s['attempt']}: steps {s['first_step']}-{s['last_step']}"
                      + (f" ({s['redone']} done again)" if s.get("redone") else ""))
    t_end = max(float(s.get("end_t") or s["start_t"]) for s in drawn)
    for r in recoveries:
        if not t0 <= float(r["detected_at"]) <= t_end:
            continue  # not during the steps drawn (records of another clock or attempt)
        detected = float(r["detected_at"]) - t0
        back = r.get("first_step_at") or r.get("relaunched_at")
        end = float(back) - t0 if back is not None else detected
        took = (f"back to training after {r['seconds_to_train']:g} s"
                if r.get("seconds_to_train") is not None else "not relaunched")
        # At least a sliver wide, so a recovery faster than the axis' resolution shows.
        ax.axvspan(detected, max(end, detected + 0.002 * max(end, 1.0)), color="red",
                   alpha=0.2, label=f"node failure ({', '.join(r['nodes'])}): {took}")
    ax.set_xlabel("seconds since the first attempt started")
    ax.set_ylabel("step")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return to_svg(fig, "attempts")


def probe_matrix(probe: dict[str, Any]) -> str | None:
    """The probe's node-pair bus bandwidth as a matrix (GB/s), slow nodes in red."""
    nodes = [str(n) for n in probe.get("nodes", [])]
    pairs = [p for p in probe.get("pairs", []) if len(p.get("nodes", [])) == 2]
    if len(nodes) < 2 or not pairs:
        return None
    index = {n: i for i, n in enumerate(nodes)}
    grid = [[float("nan")] * len(nodes) for _ in nodes]
    for p in pairs:
        a, b = (index.get(str(n)) for n in p["nodes"])
        if a is not None and b is not None:
            grid[a][b] = grid[b][a] = float(p.get("busbw_gbs") or 0)
    fig = _figure((5.5, max(2.6, 1.2 + 0.45 * len(nodes))))
    ax = fig.subplots()
    image = ax.imshow(grid, cmap="viridis", interpolation="nearest")
    for i in range(len(nodes)):
        for j in range(len(nodes)):
            if grid[i][j] == grid[i][j]:
                ax.text(j, i, f"{grid[i][j]:.3g}", ha="center", va="center", fontsize=8,
                        color="white")
    ax.set_xticks(range(len(nodes)))
    ax.set_yticks(range(len(nodes)))
    ax.set_xticklabels(nodes, fontsize=8)
    ax.set_yticklabels(nodes, fontsize=8)
    slow = set((probe.get("verdict") or {}).get("slow_nodes") or [])
    for label in [*ax.get_xticklabels(), *ax.get_yticklabels()]:
        if label.get_text() in slow:
            label.set_color("red")
    fig.colorbar(image, ax=ax, label="busbw GB/s")
    return to_svg(fig, "probe")


def scaling_chart(rows: list[Any], title: str) -> str | None:
    """A sweep's speedup, efficiency and sync share (hpcdl.results.plot's figure) as SVG."""
    if not rows:
        return None
    from hpcdl.results.plot import build_figure

    return to_svg(build_figure(rows, title=title), "scaling")


def curves_chart(series: dict[str, list[tuple[int, float]]]) -> str | None:
    """A parameter sweep's loss curves on one axis, one line per point (``series``:
    label -> (step, loss) of its lowest rank)."""
    drawn = {label: pts for label, pts in series.items() if pts}
    if not drawn:
        return None
    fig = _figure()
    ax = fig.subplots()
    for i, (label, pts) in enumerate(drawn.items()):
        ax.plot([s for s, _ in pts], [v for _, v in pts], "-", lw=1.0, color=f"C{i % 10}",
                label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    if len(drawn) <= 12:  # a legend of more lines hides the curves
        ax.legend(fontsize="x-small")
    return to_svg(fig, "curves")


def metric_vs_param_chart(rows: list[dict[str, Any]], params: list[str],
                          metric: str = "final_loss") -> str | None:
    """The final ``metric`` of each completed point against each parameter (one panel
    per parameter; a logarithmic axis when its values are positive numbers spanning
    more than a factor of 10; words as categories)."""
    done = [r for r in rows if isinstance(r.get(metric), (int, float))]
    if not done or not params:
        return None
    fig = _figure((WIDE[0], 3.0))
    axes = fig.subplots(1, len(params), squeeze=False)[0]
    for ax, name in zip(axes, params, strict=True):
        values = [r.get(name) for r in done]
        try:
            xs: list[Any] = [float(v) for v in values]  # type: ignore[arg-type]
        except (TypeError, ValueError):
            cats = sorted({str(v) for v in values})
            xs = [cats.index(str(v)) for v in values]
            ax.set_xticks(range(len(cats)), cats)
        else:
            if min(xs) > 0 and max(xs) / min(xs) > 10:
                ax.set_xscale("log")
        ax.plot(xs, [r[metric] for r in done], "o", color="C0")
        ax.set_xlabel(name)
        ax.set_ylabel(metric.replace("_", " "))
    return to_svg(fig, f"vs-{metric}")
