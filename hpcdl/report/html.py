"""The report as one self-contained HTML file: inline CSS, inline SVG charts
(hpcdl.report.charts), no script and no external resource, so it opens offline and
from a mail attachment alike. Every chart is a ``<figure class="chart" id="chart-...">``
and every section a ``<section id="...">`` (the browser test finds them by id).

Pure apart from the charts' rendering: gathered data in, a string out.
"""

from __future__ import annotations

import dataclasses
import html
import time
from collections.abc import Callable
from typing import Any

from hpcdl import __version__
from hpcdl.report import charts

CSS = """
body { font-family: "DejaVu Sans", Arial, sans-serif; margin: 1.5em auto; max-width: 1100px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; margin-bottom: .2em; } h2 { font-size: 1.15em; margin-top: 1.6em;
     border-bottom: 1px solid #ccc; padding-bottom: .2em; }
table { border-collapse: collapse; font-size: .9em; }
td, th { border: 1px solid #ddd; padding: .25em .6em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
code, .mono { font-family: "DejaVu Sans Mono", monospace; font-size: .9em; }
.verdict { padding: .6em .8em; border-radius: 4px; margin: .6em 0; }
.bad { background: #fde8e8; border: 1px solid #e0a0a0; }
.good { background: #e8f6e8; border: 1px solid #a0d0a0; }
.missing { background: #fff6dd; border: 1px solid #e6cf80; }
figure.chart { margin: .8em 0; } figure.chart svg { max-width: 100%; height: auto; }
figcaption { font-size: .85em; color: #555; }
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _page(title: str, body: list[str]) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %z")
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title>",
        f"<style>{CSS}</style></head><body>",
        *body,
        f'<footer><p class="mono">written by hpcdl {_e(__version__)} report at {_e(stamp)}'
        "</p></footer>",
        "</body></html>", ""])


def _table(rows: list[tuple[str, Any]], table_id: str) -> str:
    cells = "".join(f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table id="{table_id}">{cells}</table>'


def _chart(chart_id: str, svg: str | None, caption: str, absent: str) -> str:
    if svg is None:
        return f'<p class="verdict missing" id="{chart_id}-absent">{_e(absent)}</p>'
    return (f'<figure class="chart" id="{chart_id}">{svg}'
            f"<figcaption>{_e(caption)}</figcaption></figure>")


def _identity(facts: dict[str, Any]) -> list[tuple[str, Any]]:
    plan, result, job = facts["plan"], facts["result"], facts.get("job") or {}
    image = facts.get("image") or {}
    ids = [str(job.get("job_id"))] if job.get("job_id") else []
    ids += [j for j in job.get("chain") or [] if j not in ids]
    attempts = facts.get("attempts") or []
    rows: list[tuple[str, Any]] = [
        ("run directory", f'<span class="mono">{_e(facts["path"])}</span>'),
        ("command", f'<code>{_e(facts.get("command") or "?")}</code>'),
        ("profile", _e(plan.get("profile") or "?")
         + (f" (partition {_e(plan['partition'])})" if plan.get("partition") else "")),
        ("shape", _e(f"{plan.get('nodes', '?')} nodes x {plan.get('tasks_per_node', '?')} ranks"
                     f" = {plan.get('ntasks', '?')} ranks, backend {plan.get('backend') or '?'}"
                     f", launcher {plan.get('launcher') or '?'}")),
        ("nodes", _e(result.get("nodes") or "?")),
        ("image", _e(plan.get("image") or "none (native)")
         + (f'<br><span class="mono">content hash {_e(image["content_hash"])}</span>'
            if image.get("content_hash") else "")),
        ("Slurm job ids", _e(", ".join(ids) or "not submitted")),
        ("attempts", _e(len(attempts)) if attempts else "1 (no requeue recorded)"),
        ("state", _e(f"{result.get('state', '?')}, exit code {result.get('exit_code', '?')}"
                     f", elapsed {result.get('elapsed', '?')}") if result else "unknown"),
    ]
    return rows


def _straggler_block(verdict: dict[str, Any] | None) -> str:
    if verdict is None:
        return ('<p class="verdict missing" id="straggler-verdict">no straggler verdict: '
                "this run has no per-step metrics</p>")
    cls = "bad" if verdict["found"] else "good"
    rows = "".join(
        f"<tr><td>{r['rank']}</td><td>{_e(r.get('host'))}</td><td>{r['busy_s'] * 1000:.1f}</td>"
        f"<td>{(r.get('sync_s') or 0) * 1000:.1f}</td><td>{_e(r.get('ratio'))}</td>"
        f"<td>{'yes' if r.get('slow') else ''}</td></tr>" for r in verdict["ranks"])
    return (f'<p class="verdict {cls}" id="straggler-verdict">{_e(verdict["message"])}</p>'
            f'<table id="rank-table"><tr><th>rank</th><th>node</th><th>busy ms/step</th>'
            f"<th>sync wait ms/step</th><th>x others</th><th>slow</th></tr>{rows}</table>"
            f"<p>Measure: {_e(verdict['measure'])}.</p>")


def _hang_block(hang: dict[str, Any]) -> str:
    places = "".join(
        f"<li>{_e(', '.join(p.get('ranks', [])))}: <code>{_e(p.get('where'))}</code>"
        + (f" (called from <code>{_e(p['called_from'])}</code>)" if p.get("called_from") else "")
        + (" [in a collective]" if p.get("in_collective") else "") + "</li>"
        for p in hang.get("places", []))
    return (f'<section id="hang"><h2>Hang diagnosis</h2>'
            f'<p class="verdict bad">job {_e(hang.get("job_id"))}: no progress for '
            f'{_e(round(float(hang.get("silent_s") or 0)))} s: {_e(hang.get("summary"))}</p>'
            f"<ul>{places}</ul></section>")


def _attempts_table(attempts: list[dict[str, Any]], spans: list[dict[str, Any]]) -> str:
    by_number = {s["attempt"]: s for s in spans}
    numbers = sorted({int(a["number"]) for a in attempts if isinstance(a.get("number"), int)}
                     | set(by_number))
    slurm = {a.get("number"): a for a in attempts}
    rows = []
    for n in numbers:
        a, s = slurm.get(n, {}), by_number.get(n, {})
        steps = (f"{s['first_step']}-{s['last_step']}" if s.get("first_step") is not None
                 else "")
        rows.append(f"<tr><td>{n}</td><td>{_e(a.get('job_id') or s.get('job_id'))}</td>"
                    f"<td>{_e(a.get('reason'))}</td><td>{_e(a.get('start'))}</td>"
                    f"<td>{_e(a.get('end'))}</td><td>{_e(a.get('exit_code'))}</td>"
                    f"<td>{_e(steps)}</td><td>{_e(s.get('redone', ''))}</td></tr>")
    return ('<table id="attempt-table"><tr><th>attempt</th><th>job</th><th>reason</th>'
            "<th>start</th><th>end</th><th>exit</th><th>steps</th><th>steps done again</th>"
            f"</tr>{''.join(rows)}</table>")


def _excluded_list(nodes: list[dict[str, str]]) -> str:
    """Every node the guard left out (the gate, the probe, a failure), or nothing."""
    if not nodes:
        return ""
    items = "".join(f"<li><b>{_e(n.get('node'))}</b>: {_e(n.get('why'))}</li>" for n in nodes)
    return f'<h3>Nodes excluded (--spares)</h3><ul id="excluded-nodes">{items}</ul>'


def _recoveries_table(recoveries: list[dict[str, Any]]) -> str:
    """One row per node failure inside the job (hpcdl.jobs.recoveries), or nothing."""
    if not recoveries:
        return ""
    rows = []
    for r in recoveries:
        back = r.get("seconds_to_train")
        where = ("not relaunched" if r.get("relaunched_at") is None
                 else f"{', '.join(r.get('active') or [])} from {r.get('checkpoint') or 'the start'}")
        rows.append(f"<tr><td>{_e(r.get('attempt'))}</td><td>{_e(r.get('relaunch'))}</td>"
                    f"<td>{_e(', '.join(r.get('nodes') or []))}</td><td>{_e(r.get('how'))}</td>"
                    f"<td>{_e(where)}</td><td>{_e(r.get('steps_lost'))}</td>"
                    f"<td>{_e('' if back is None else f'{back:g} s')}</td></tr>")
    return ('<h3>Node failures inside the job (--spares)</h3><table id="recovery-table">'
            "<tr><th>attempt</th><th>relaunch</th><th>node</th><th>how it was found</th>"
            "<th>relaunched on</th><th>steps lost</th><th>detection to first step</th></tr>"
            f"{''.join(rows)}</table>")


def render_run(facts: dict[str, Any]) -> str:
    """The run report (gathered by hpcdl.report.gather.gather_run) as HTML."""
    metrics, spans = facts["metrics"], facts["spans"]
    verdict = facts.get("straggler")
    slow = ({r["rank"] for r in verdict["ranks"] if r.get("slow")} if verdict else set())
    no_metrics = "no per-step metrics in this run directory (see what is missing above)"
    body = [f"<h1>hpcdl run {_e(facts['name'])}</h1>",
            '<section id="identity"><h2>Run</h2>',
            _table(_identity(facts), "identity-table"), "</section>"]
    if facts["missing"]:
        items = "".join(f"<li>{_e(m)}</li>" for m in facts["missing"])
        body.append(f'<section id="missing"><h2>Not in this run directory</h2>'
                    f'<ul class="verdict missing">{items}</ul></section>')
    body += ['<section id="straggler"><h2>Straggler</h2>', _straggler_block(verdict),
             "</section>",
             '<section id="training"><h2>Loss and throughput</h2>',
             _chart("chart-loss", charts.loss_chart(metrics, spans) if metrics else None,
                    "training loss per step (dashed: where an attempt began)", no_metrics),
             _chart("chart-throughput",
                    charts.throughput_chart(metrics, spans) if metrics else None,
                    "images per second per step, all ranks", no_metrics),
             "</section>",
             '<section id="ranks"><h2>Step time per rank</h2>',
             _chart("chart-ranks", charts.rank_heatmap(metrics, slow) if metrics else None,
                    "busy time (data wait + forward/backward) per rank and step; a slow rank "
                    "is a bright row (its label in red)", no_metrics),
             _chart("chart-split",
                    charts.split_chart(verdict["ranks"], metrics, slow) if verdict else None,
                    "median step split per rank: the others wait in the gradient sync for "
                    "the slow one", no_metrics),
             "</section>",
             '<section id="attempts"><h2>Attempts</h2>',
             _chart("chart-attempts",
                    charts.attempts_chart(spans, facts.get("recoveries") or [])
                    if spans else None,
                    "steps over wall time per attempt (requeue, chain or resume) and the "
                    "node failures survived inside the job",
                    "no attempt timeline: no per-step metrics"),
             _attempts_table(facts["attempts"], spans),
             _recoveries_table(facts.get("recoveries") or []),
             _excluded_list(facts.get("excluded_nodes") or []), "</section>"]
    probe = facts.get("probe")
    if probe and "error" not in probe:
        judged = probe.get("verdict") or {}
        body += ['<section id="probe"><h2>Probe: node pairs</h2>',
                 f'<p class="verdict {"bad" if judged.get("bad") else "good"}">'
                 f"{_e(judged.get('message', ''))}</p>",
                 _chart("chart-probe", charts.probe_matrix(probe),
                        "allreduce bus bandwidth between the first ranks of two nodes",
                        "the probe measured no node pair"), "</section>"]
    elif probe:
        body.append(f'<section id="probe"><h2>Probe</h2><p class="verdict bad">probe error on '
                    f"node {_e(probe.get('node'))}: {_e(probe.get('error'))}</p></section>")
    if facts.get("hang"):
        body.append(_hang_block(facts["hang"]))
    return _page(f"hpcdl run {facts['name']}", body)


_SWEEP_COLUMNS = (("point", "label"), ("ranks", "ranks"), ("state", "state"),
                  ("img/s", "images_per_sec"), ("speedup", "speedup"),
                  ("efficiency", "efficiency"), ("step s", "step_seconds"),
                  ("sync share", "sync_share"), ("note", "note"))


def _cell(name: str, value: Any) -> str:
    if value is None:
        return "-"
    if name in ("efficiency", "sync_share"):
        return f"{100 * value:.1f}%"
    if isinstance(value, float):
        return f"{value:.2f}" if name != "step_seconds" else f"{value:.4f}"
    return _e(value)


def render_sweep(rows: list[Any], meta: dict[str, Any],
                 stragglers: dict[str, dict[str, Any] | None],
                 link: Callable[[Any], str | None] | None = None) -> str:
    """The sweep report: the scaling charts, the table, and each point's straggler
    verdict (``stragglers``: label -> verdict, None without metrics). ``link(row)``
    gives a point's own report's relative address, if it has one."""
    title = str(meta.get("sweep_id") or meta.get("sweep_dir") or "sweep")
    head = "".join(f"<th>{_e(h)}</th>" for h, _ in _SWEEP_COLUMNS)
    lines = []
    for row in rows:
        data = dataclasses.asdict(row)
        cells = []
        for _, key in _SWEEP_COLUMNS:
            text = _cell(key, data.get(key))
            href = link(row) if link and key == "label" else None
            cells.append(f'<td><a href="{_e(href)}">{text}</a></td>' if href else f"<td>{text}</td>")
        lines.append(f"<tr>{''.join(cells)}</tr>")
    verdicts = "".join(
        f"<li>{_e(label)}: {_e(v['message'] if v else 'no per-step metrics')}</li>"
        for label, v in stragglers.items())
    found = [label for label, v in stragglers.items() if v and v["found"]]
    body = [f"<h1>hpcdl sweep {_e(title)}</h1>",
            '<section id="identity"><h2>Sweep</h2>',
            _table([("sweep directory", f'<span class="mono">{_e(meta.get("sweep_dir"))}</span>'),
                    ("points", _e(len(rows))),
                    ("completed", _e(sum(1 for r in rows if r.ok)))], "identity-table"),
            "</section>",
            '<section id="scaling"><h2>Scaling</h2>',
            _chart("chart-scaling", charts.scaling_chart(rows, title),
                   "speedup and parallel efficiency against the 1-rank point of the same "
                   "backend and batch size, and the gradient-sync share of the step",
                   "no point to draw"),
            f'<table id="sweep-table"><tr>{head}</tr>{"".join(lines)}</table>',
            "</section>",
            '<section id="straggler"><h2>Stragglers per point</h2>',
            f'<p class="verdict {"bad" if found else "good"}" id="straggler-verdict">'
            + (_e(f"straggler in {', '.join(found)}") if found else
               "no straggler in any point with per-step metrics") + "</p>",
            f"<ul>{verdicts}</ul></section>"]
    return _page(f"hpcdl sweep {title}", body)


def render_param_sweep(rows: list[dict[str, Any]], params: list[str], meta: dict[str, Any],
                       series: dict[str, list[tuple[int, float]]],
                       link: Callable[[dict[str, Any]], str | None] | None = None) -> str:
    """A parameter sweep's report: the points' loss curves together, the final loss
    (and top-1 when the points have it) against each parameter, and the comparison
    table (``rows``: hpcdl.sweep.compare's); ``link(row)``: a point's own report."""
    from hpcdl.sweep.compare import cell_text as cell
    from hpcdl.sweep.compare import columns

    title = str(meta.get("sweep_id") or meta.get("sweep_dir") or "sweep")
    names = columns(params)
    head = "".join(f"<th>{_e(n)}</th>" for n in names)
    lines = []
    for row in rows:
        cells = []
        for n in names:
            text = _e(cell(n, row.get(n)))
            href = link(row) if link and n == "point" else None
            cells.append(f'<td><a href="{_e(href)}">{text}</a></td>' if href else f"<td>{text}</td>")
        lines.append(f"<tr>{''.join(cells)}</tr>")
    has_top1 = any(isinstance(r.get("top1"), (int, float)) for r in rows)
    body = [f"<h1>hpcdl sweep {_e(title)}</h1>",
            '<section id="identity"><h2>Sweep</h2>',
            _table([("sweep directory", f'<span class="mono">{_e(meta.get("sweep_dir"))}</span>'),
                    ("parameters", _e(", ".join(params))), ("points", _e(len(rows))),
                    ("completed", _e(sum(1 for r in rows if r["state"] == "COMPLETED")))],
                   "identity-table"),
            "</section>",
            '<section id="curves"><h2>Loss curves</h2>',
            _chart("chart-curves", charts.curves_chart(series),
                   "training loss over steps, one line per point (its lowest rank)",
                   "no point has per-step metrics yet"),
            "</section>",
            '<section id="versus"><h2>Final metric against each parameter</h2>',
            _chart("chart-loss-vs", charts.metric_vs_param_chart(rows, params, "final_loss"),
                   "final training loss of each completed point", "no point has a final loss"),
            *([_chart("chart-top1-vs", charts.metric_vs_param_chart(rows, params, "top1"),
                      "top-1 accuracy of each completed point", "")] if has_top1 else []),
            "</section>",
            '<section id="table"><h2>Points</h2>',
            f'<table id="sweep-table"><tr>{head}</tr>{"".join(lines)}</table>',
            "</section>"]
    return _page(f"hpcdl sweep {title}", body)
