"""The scaling figure: speedup, parallel efficiency and synchronisation share against
the number of ranks, one line per backend / batch size / GPUs per node, with the
ideal lines, like the figures of ZIH's Horovod scaling study on Taurus.

matplotlib is imported here only (``hpcdl results --plot``), with the Agg backend:
no display is needed on a login node.
"""

from __future__ import annotations

import io
from collections import defaultdict
from pathlib import Path
from typing import Any

from hpcdl.core.atomic import write_atomic
from hpcdl.results.table import Row

X_LABEL = "ranks (GPUs)"
Y_LABELS = ("speedup (vs baseline)", "parallel efficiency (%)", "gradient sync share of step (%)")


def _series(rows: list[Row]) -> dict[str, list[Row]]:
    groups: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        batch = f" batch {row.batch_size}" if row.batch_size is not None else ""
        groups[f"{row.backend}{batch}, {row.gpus}/node"].append(row)
    return {k: sorted(v, key=lambda r: r.ranks) for k, v in sorted(groups.items())}


def build_figure(rows: list[Row], title: str = "") -> Any:
    """A matplotlib Figure with three panels (see the module doc). Points that did
    not complete are drawn as red crosses on the x axis and named in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 4.2), layout="constrained")
    axes = fig.subplots(1, 3)
    speed, eff, sync = axes
    baselines = {(r.backend, r.batch_size): r for r in rows
                 if r.speedup is not None and r.ranks == r.baseline_ranks}
    for name, series in _series(rows).items():
        done = [r for r in series if r.speedup is not None]
        base = baselines.get((series[0].backend, series[0].batch_size))
        if done and base is not None and base not in done:
            done.insert(0, base)  # every line of a backend starts at its shared baseline
        if done:
            line = speed.plot([r.ranks for r in done], [r.speedup for r in done], "o-",
                              label=name)[0]
            eff.plot([r.ranks for r in done], [100 * (r.efficiency or 0) for r in done], "o-",
                     color=line.get_color(), label=name)
        shares = [r for r in series if r.sync_share is not None]
        if shares:
            sync.plot([r.ranks for r in shares], [100 * (r.sync_share or 0) for r in shares],
                      "o-", label=name)
    failed = [r for r in rows if not r.ok]
    for ax in axes:
        if failed:
            ax.plot([r.ranks for r in failed], [0] * len(failed), "x", color="red", ms=10,
                    mew=2, label="failed / no result: " + ", ".join(r.label for r in failed))
        ax.set_xlabel(X_LABEL)
        ax.grid(True, alpha=0.3)
    ticks = sorted({r.ranks for r in rows} | {1})
    for ax in axes:
        ax.set_xticks(ticks)
    top = ticks[-1]
    speed.plot([1, top], [1, top], "k--", lw=1, label="ideal")
    eff.axhline(100, color="k", ls="--", lw=1, label="ideal")
    for ax, label in zip(axes, Y_LABELS, strict=True):
        ax.set_ylabel(label)
    speed.legend(fontsize=7)
    eff.set_ylim(bottom=0)
    sync.set_ylim(bottom=0)
    if title:
        fig.suptitle(title)
    return fig


def write_png(fig: Any, path: Path) -> None:
    """Render ``fig`` to PNG and write it atomically (a reader never sees half a file)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    write_atomic(path, buf.getvalue())
