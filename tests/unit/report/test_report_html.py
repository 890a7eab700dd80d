"""hpcdl/report/html.py: whatever text a run directory holds (a command, a job's message,
a probe error, a point's label or note) reaches the page escaped, so the report stays one
file with no script (property); the sections and charts a run and a sweep have."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcdl.jobs.rundir import JobRecord, make_run_dir
from hpcdl.jobside.steps import StepWriter, metrics_dir
from hpcdl.report.gather import gather_run
from hpcdl.report.html import render_run, render_sweep
from hpcdl.results.table import Row, with_scaling

# Between markers no markup holds, so finding one raw in the page means it was not escaped.
HOSTILE = st.one_of(st.sampled_from(['<script>alert(1)</script>', '"><img src=x onerror=y>',
                                     "</td></tr></table><script>", "&lt;script&gt;", "']]>"]),
                    st.text(alphabet="<>&\"'/= abcscript", max_size=30)).map(lambda t: f"Zq{t}qZ")


def escaped_everywhere(page: str, text: str) -> bool:
    """``text`` holding a '<' never appears raw: in HTML and in the inline SVG alike, a
    '<' of the run's text is written as &lt; (only then can it open no tag)."""
    return "<" not in text or text not in page


def run_dir(root: Path, word: str) -> Path:
    run = make_run_dir(root)
    run.write_plan("#!/bin/bash\n", {"nodes": 1, "gpus_per_node": 0, "ntasks": 2,
                                     "job_name": word, "command": ["python3", "t.py", word]})
    run.write_job(JobRecord("7", ["sbatch", word], "t"))
    run.write_result({"state": "FAILED", "message": word,
                      "probe": {"node": word, "error": word}})
    (run.path / "bad-nodes.tsv").write_text(f"n1\t{word}\n")
    for rank, busy in ((0, 1.0), (1, 1.0)):
        w = StepWriter(metrics_dir(run.path), rank, host="n1", attempt=0, cpus=[rank])
        for step in range(3):
            w.step(step, epoch=0, step_s=busy, data_s=0.0, sync_s=0.0, images=8, loss=1.0,
                   lr=0.1)
        w.close()
    return run.path


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(word=HOSTILE)
def test_a_run_report_escapes_what_the_run_directory_holds(tmp_path_factory, word):
    page = render_run(gather_run(run_dir(tmp_path_factory.mktemp("r") / "run", word)))
    assert "<script" not in page.lower()
    assert escaped_everywhere(page, word)
    assert re.search(r'<section id="identity">', page) and 'id="chart-loss"' in page


@settings(deadline=None)  # the first example pays for matplotlib's import
@given(label=HOSTILE, note=HOSTILE)
def test_a_sweep_report_escapes_labels_notes_and_links(label, note):
    rows = with_scaling([
        Row(label=label, backend="ddp", batch_size=None, nodes=1, gpus=1, ranks=1,
            state="COMPLETED", images_per_sec=10.0, note=note),
        Row(label="b", backend="ddp", batch_size=None, nodes=2, gpus=1, ranks=2,
            state="FAILED", note=note)])
    page = render_sweep(rows, {"sweep_id": label, "sweep_dir": "/s"}, {label: None, "b": None},
                        link=lambda row: f"{row.label}/report.html")
    assert "<script" not in page.lower()
    assert escaped_everywhere(page, label) and escaped_everywhere(page, note)
    assert 'id="sweep-table"' in page and page.count("/report.html\">") == 2  # both points linked


def test_a_run_without_metrics_says_so_in_each_chart(tmp_path):
    page = render_run(gather_run(tmp_path))
    assert page.count("no per-step metrics in this run directory") >= 3
    assert '<section id="missing">' in page and "plan.json: not a run directory" in page
