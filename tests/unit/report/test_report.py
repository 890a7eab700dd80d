"""Per-step metrics (writer and reader), the straggler verdict, and the report's HTML on
crafted run and sweep directories, including a run directory without metrics."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcdl.cli import cli
from hpcdl.jobside import steps
from hpcdl.report import write_run_report, write_sweep_report
from hpcdl.report.gather import attempt_spans, gather_run
from hpcdl.results.straggler import busy_seconds, verdict
from hpcdl.results.table import Row


def _write_rank(folder: Path, rank: int, host: str, busy: float, *, sync: float = 0.05,
                n: int = 12, attempt: int = 0, first: int = 1, flush_steps: int = 50,
                cpus: list[int] | None = None) -> None:
    # A core per rank unless a test says otherwise: this machine's own count (what the
    # writer records by default) must not decide the verdicts below.
    w = steps.StepWriter(folder, rank, world_size=4, host=host, attempt=attempt, job_id="7",
                         flush_steps=flush_steps, cpus=[rank] if cpus is None else cpus)
    for i in range(first, first + n):
        # Small jitter so medians are medians, not constants.
        w.step(i, epoch=0, step_s=busy - 0.01 + sync + (i % 3) * 0.001, data_s=0.01,
               sync_s=sync, images=8, loss=2.0 - 0.01 * i, lr=0.1)
    w.close()


def _run_dir(tmp_path: Path, **plan: object) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "plan.json").write_text(json.dumps({
        "nodes": 2, "gpus_per_node": 2, "ntasks": 4, "tasks_per_node": 2, "job_name": "t",
        "backend": "horovod", "profile": "sandbox", "partition": "debug", "launcher": "srun",
        "image": "/img/cpu.sif", "command": ["python3", "train.py", "--lr", "0.1"], **plan}))
    (run / "job.json").write_text(json.dumps({"job_id": "7", "argv": ["sbatch"],
                                              "submitted_at": "x"}))
    return run


# ---- the metrics file ------------------------------------------------------------------

def test_writer_buffers_then_writes_whole_lines_and_reader_reads_them_back(tmp_path: Path):
    w = steps.StepWriter(tmp_path, 3, world_size=4, host="n2", attempt=1, job_id="9",
                         flush_steps=5, flush_s=1e9)
    path = steps.rank_file(tmp_path, 3)
    assert path.name == "rank-00003.jsonl"
    for i in range(1, 5):
        w.step(i, epoch=0, step_s=0.2, data_s=0.05, sync_s=0.08, images=10, loss=1.5, lr=0.01)
    assert path.read_text() == ""  # buffered: nothing written before the 5th record
    w.step(5, epoch=0, step_s=0.2, data_s=0.05, sync_s=0.08, images=10, loss=float("nan"), lr=0.01)
    lines = path.read_text().splitlines()
    assert len(lines) == 6 and all(json.loads(ln) for ln in lines)  # start + 5 steps
    w.step(6, epoch=1, step_s=0.2, data_s=0.05, sync_s=0.08, images=10, loss=1.0, lr=0.01)
    w.close()
    got = steps.read_metrics(tmp_path)
    assert list(got) == [3] and got[3]["host"] == "n2" and got[3]["skipped"] == 0
    start = got[3]["starts"][0]
    assert (start["rank"], start["world_size"], start["attempt"], start["job_id"]) == (3, 4, 1, "9")
    rec = got[3]["steps"][-1]
    assert rec["step"] == 6 and rec["epoch"] == 1 and rec["attempt"] == 1
    assert rec["compute_s"] == pytest.approx(0.12) and rec["images_per_sec"] == pytest.approx(40)
    assert got[3]["steps"][4]["loss"] is None  # NaN is written as null: the line stays JSON


def test_disabled_writer_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    w = steps.StepWriter("", 0)
    w.step(1, epoch=0, step_s=1, data_s=0, sync_s=0, images=1, loss=1, lr=1)
    w.close()
    assert not w.enabled and list(tmp_path.iterdir()) == []


def test_default_dir_follows_the_job_scripts_variable():
    assert steps.default_dir({"HPCDL_RUN_DIR": "/runs/a"}) == "/runs/a/metrics"
    assert steps.default_dir({}) == ""
    assert steps.attempt_number({"SLURM_RESTART_COUNT": "2"}) == 2
    assert steps.attempt_number({"SLURM_RESTART_COUNT": "x"}) == 0


def test_reader_skips_a_line_cut_off_by_a_kill_and_keeps_the_last_record_of_a_step(tmp_path: Path):
    (tmp_path / "rank-00000.jsonl").write_text(
        '{"kind":"start","rank":0,"host":"n1","attempt":0}\n'
        '{"step":1,"attempt":0,"step_s":1.0}\n{"step":2,"attempt":0,"step_s":1.0}\n'
        '{"kind":"start","rank":0,"host":"n1","attempt":1}\n'
        '{"step":2,"attempt":1,"step_s":2.0}\n[1]\n{"step":3,"attempt":1,"st')
    (tmp_path / "rank-xx.jsonl").write_text("ignored")
    got = steps.read_metrics(tmp_path)
    assert list(got) == [0] and got[0]["skipped"] == 2
    assert [(r["step"], r["attempt"]) for r in got[0]["steps"]] == [(1, 0), (2, 1)]
    spans = attempt_spans(got)
    assert [(s["attempt"], s["first_step"], s["last_step"], s["redone"]) for s in spans] == [
        (0, 1, 2, 0), (1, 2, 2, 1)]
    assert steps.read_metrics(tmp_path / "absent") == {}


def test_the_job_side_module_is_standard_library_only():
    source = Path(steps.__file__).read_text()
    imports = set(re.findall(r"^(?:from|import) (\w+)", source, re.M))
    assert imports <= {"__future__", "atexit", "json", "os", "socket", "time", "pathlib",
                       "typing"}, imports


# ---- the verdict -----------------------------------------------------------------------

def test_a_slow_rank_is_named_with_its_node(tmp_path: Path):
    for rank, host, busy in ((0, "n1", 0.2), (1, "n1", 0.21), (2, "n2", 0.2), (3, "n2", 0.6)):
        _write_rank(tmp_path, rank, host, busy)
    v = verdict(steps.read_metrics(tmp_path))
    assert v["found"] and v["slow_nodes"] == []
    assert [(r["rank"], r["host"]) for r in v["slow_ranks"]] == [(3, "n2")]
    assert v["slow_ranks"][0]["ratio"] == pytest.approx(3.0, rel=0.05)
    assert v["message"].startswith("straggler: rank 3 on n2 is slow: ")
    assert [r["slow"] for r in v["ranks"]] == [False, False, False, True]


def test_a_node_whose_every_rank_is_slow_is_named_instead(tmp_path: Path):
    for rank, host, busy in ((0, "n1", 0.2), (1, "n1", 0.2), (2, "n2", 0.5), (3, "n2", 0.52)):
        _write_rank(tmp_path, rank, host, busy)
    v = verdict(steps.read_metrics(tmp_path))
    assert v["found"] and v["slow_ranks"] == []
    assert [(n["host"], n["ranks"]) for n in v["slow_nodes"]] == [("n2", [2, 3])]
    assert "node n2 is slow: all its ranks (2, 3)" in v["message"]


def test_ranks_outnumbering_the_cores_name_nobody_and_say_why(tmp_path: Path):
    # The demo's shape: 8 ranks on 2 nodes of one 2-core machine; rank 6 came out slow.
    for rank in range(8):
        _write_rank(tmp_path, rank, "n1" if rank < 4 else "n2", 0.6 if rank == 6 else 0.2,
                    cpus=[0, 1])
    v = verdict(steps.read_metrics(tmp_path))
    assert not v["found"] and v["slow_ranks"] == [] and v["slow_nodes"] == []
    assert v["oversubscribed"] == [{"host": "n1", "ranks": 4, "cores": 2},
                                   {"host": "n2", "ranks": 4, "cores": 2}]
    assert v["message"] == ("no straggler named: the ranks outnumber the cores (n1 runs 4 "
                            "ranks on 2 cores, n2 runs 4 ranks on 2 cores), so they take "
                            "turns on them and their step times measure that sharing, not a "
                            "slow rank or node")
    assert "rank 6" not in v["message"]
    # One node short of cores is enough: its ranks' times say nothing about the other.
    (tmp_path / "one").mkdir()
    for rank, host, cpus in ((0, "n1", [0]), (1, "n1", [0]), (2, "n2", [0]), (3, "n2", [1])):
        _write_rank(tmp_path / "one", rank, host, 0.6 if rank == 3 else 0.2, cpus=cpus)
    one = verdict(steps.read_metrics(tmp_path / "one"))
    assert one["oversubscribed"] == [{"host": "n1", "ranks": 2, "cores": 1}] and not one["found"]


def test_ranks_bound_to_their_own_cores_or_without_cpus_are_judged(tmp_path: Path):
    # Slurm's binding gives each rank one core: the node's cores are their union (4).
    for rank in range(4):
        _write_rank(tmp_path, rank, "n1", 0.6 if rank == 3 else 0.2, cpus=[rank])
    v = verdict(steps.read_metrics(tmp_path))
    assert v["oversubscribed"] == [] and [r["rank"] for r in v["slow_ranks"]] == [3]
    # Metrics written before ranks recorded their CPUs: judged as before.
    old = tmp_path / "old"
    for rank in range(4):
        _write_rank(old, rank, "n1", 0.6 if rank == 3 else 0.2)
        path = steps.rank_file(old, rank)
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        lines[0].pop("cpus")
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert steps.read_metrics(old)[0]["cpus"] is None
    assert [r["rank"] for r in verdict(steps.read_metrics(old))["slow_ranks"]] == [3]


def test_the_writer_records_the_cpus_this_process_may_run_on(tmp_path: Path):
    steps.StepWriter(tmp_path, 0, host="n1").close()
    assert steps.read_metrics(tmp_path)[0]["cpus"] == sorted(os.sched_getaffinity(0))


def test_balanced_ranks_name_nobody_and_tiny_gaps_are_noise(tmp_path: Path):
    for rank, busy in enumerate((0.2, 0.21, 0.22, 0.2)):
        _write_rank(tmp_path / "a", rank, f"n{rank // 2 + 1}", busy)
    v = verdict(steps.read_metrics(tmp_path / "a"))
    assert not v["found"] and v["message"].startswith("no straggler: every one of 4 ranks")
    # 2x on a 1 ms step is below the 2 ms floor: noise, not a straggler.
    for rank, busy in enumerate((0.0110, 0.0110, 0.0110, 0.0125)):
        _write_rank(tmp_path / "b", rank, "n1", busy)
    assert not verdict(steps.read_metrics(tmp_path / "b"))["found"]


def test_one_rank_or_none_has_nothing_to_compare(tmp_path: Path):
    _write_rank(tmp_path, 0, "n1", 0.2)
    one = verdict(steps.read_metrics(tmp_path))
    assert not one["found"] and "nothing to compare" in one["message"]
    assert not verdict({})["found"]


def test_busy_time_is_data_wait_plus_compute_and_warm_up_steps_are_left_out(tmp_path: Path):
    assert busy_seconds({"data_s": 0.1, "compute_s": 0.2}) == pytest.approx(0.3)
    assert busy_seconds({"step_s": 0.5, "sync_s": 0.2}) == pytest.approx(0.3)
    assert busy_seconds({"loss": 1}) is None
    # Rank 1's first step is a 10 s warm-up: the verdict leaves it out.
    for rank in (0, 1):
        w = steps.StepWriter(tmp_path, rank, host="n1", attempt=0)
        for i in range(1, 8):
            slow = 10.0 if (rank == 1 and i == 1) else 0.0
            w.step(i, epoch=0, step_s=0.2 + slow, data_s=0, sync_s=0, images=1, loss=1, lr=1)
        w.close()
    assert not verdict(steps.read_metrics(tmp_path))["found"]


# ---- the report ------------------------------------------------------------------------

CHARTS = ("chart-loss", "chart-throughput", "chart-ranks", "chart-split", "chart-attempts")


def test_run_report_has_identity_charts_and_names_the_straggler(tmp_path: Path):
    run = _run_dir(tmp_path)
    for rank, host, busy in ((0, "n1", 0.2), (1, "n1", 0.2), (2, "n2", 0.2), (3, "n2", 0.7)):
        _write_rank(run / "metrics", rank, host, busy)
    (run / "image.json").write_text(json.dumps({"path": "/img/cpu.sif", "content_hash": "abc123"}))
    (run / "result.json").write_text(json.dumps({
        "state": "COMPLETED", "exit_code": 0, "nodes": "n[1-2]", "elapsed": "00:01:00",
        "probe": {"nodes": ["n1", "n2"], "pairs": [{"nodes": ["n1", "n2"], "busbw_gbs": 1.5}],
                  "verdict": {"bad": False, "message": "no slow node"}}}))
    (run / "hang").mkdir()
    (run / "hang" / "diagnosis.json").write_text(json.dumps({
        "job_id": "7", "silent_s": 31, "summary": "rank 2 (n2, pid 4) is in slow_step",
        "places": [{"ranks": ["rank 2"], "where": "slow_step (x.py:3)", "in_collective": False}]}))
    out, facts = write_run_report(run)
    page = out.read_text()
    assert out == run / "report.html"
    for element in CHARTS + ("chart-probe",):
        assert f'<figure class="chart" id="{element}"><svg' in page, element
    assert page.count("<svg") == len(CHARTS) + 1
    assert "python3 train.py --lr 0.1" in page and "abc123" in page and "sandbox" in page
    assert "straggler: rank 3 on n2 is slow" in page
    assert '<section id="hang">' in page and "slow_step (x.py:3)" in page
    assert "no slow node" in page
    # Self-contained: no script, no external resource.
    assert "<script" not in page and not re.search(r'(src|href)="(https?:)?//', page)
    assert facts["straggler"]["slow_ranks"][0]["rank"] == 3 and facts["missing"] == []


def test_run_without_metrics_gets_a_report_that_says_what_is_missing(tmp_path: Path):
    run = _run_dir(tmp_path)
    out, facts = write_run_report(run, tmp_path / "r.html")
    page = out.read_text()
    assert "<svg" not in page and "chart-loss-absent" in page
    assert "metrics/: no per-step metrics" in page and "result.json: the job has not" in page
    assert "python3 train.py --lr 0.1" in page  # what exists is still shown
    assert facts["straggler"] is None and len(facts["missing"]) == 2


def test_a_rank_without_metrics_and_a_cut_line_are_listed(tmp_path: Path):
    run = _run_dir(tmp_path)
    for rank in (0, 1, 2):
        _write_rank(run / "metrics", rank, "n1", 0.2)
    with open(run / "metrics" / "rank-00000.jsonl", "a") as fh:
        fh.write('{"step": 99, "epo')
    facts = gather_run(run)
    assert any("3 of 4 ranks" in m and "rank 3" in m for m in facts["missing"])
    assert any("1 line(s) could not be read" in m for m in facts["missing"])


def test_requeued_run_shows_its_attempts_and_the_steps_done_again(tmp_path: Path):
    run = _run_dir(tmp_path)
    for rank in range(2):
        _write_rank(run / "metrics", rank, "n1", 0.2, n=10, attempt=0, first=1)
        _write_rank(run / "metrics", rank, "n1", 0.2, n=10, attempt=1, first=8)
    (run / "attempts.json").write_text(json.dumps({"attempts": [
        {"number": 0, "job_id": "7", "reason": "PREEMPTED", "start": "a", "end": "b",
         "exit_code": 85},
        {"number": 1, "job_id": "7", "reason": "COMPLETED", "start": "c", "end": "d",
         "exit_code": 0}]}))
    out, facts = write_run_report(run)
    assert [(s["first_step"], s["last_step"], s["redone"]) for s in facts["spans"]] == [
        (1, 10, 0), (8, 17, 3)]
    page = out.read_text()
    assert "PREEMPTED" in page and "attempt 1: steps 8-17 (3 done again)" in page


def test_a_run_with_spares_shows_its_node_failures(tmp_path: Path):
    run = _run_dir(tmp_path)
    for rank in range(2):
        _write_rank(run / "metrics", rank, "n1", 0.2, n=10, attempt=0, first=1)
    (run / "recoveries.tsv").write_text(
        "7\t0\t1\t1000\tn2\tn2: gate: no answer in 11 s\t1001\tn1,n3\t"
        "checkpoint-00000005.pt\n")
    out, facts = write_run_report(run)
    (rec,) = facts["recoveries"]
    assert rec["nodes"] == ["n2"] and rec["checkpoint"] == "checkpoint-00000005.pt"
    page = out.read_text()
    assert 'id="recovery-table"' in page and "n2: gate: no answer in 11 s" in page
    assert "n1, n3 from checkpoint-00000005.pt" in page
    assert "node failure (n2)" not in page  # detected long before these steps: off the axis
    # A failure during the steps: a band on the attempts chart, labelled with its node.
    span = facts["spans"][0]
    (run / "recoveries.tsv").write_text(
        f"7\t0\t1\t{span['start_t']}\tn2\tn2: gate: no answer in 11 s\t{span['end_t']}\tn1,n3\t"
        "checkpoint-00000005.pt\n")
    page = write_run_report(run)[0].read_text()
    assert "node failure (n2): " in page.split('id="chart-attempts"', 1)[1], page
    # Nodes left out before the first rank (the gate, the probe) are listed too.
    (run / "bad-nodes.tsv").write_text(
        "n2\tgate: no answer in 11 s\nn4\tprobe: slow: best link 0.024 GB/s, 3% <b>\n")
    out, facts = write_run_report(run)
    assert [n["node"] for n in facts["excluded_nodes"]] == ["n2", "n4"]
    page = out.read_text()
    assert '<ul id="excluded-nodes">' in page and "3% &lt;b&gt;" in page
    # A run without spares has no such table.
    (run / "recoveries.tsv").unlink()
    (run / "bad-nodes.tsv").unlink()
    page = write_run_report(run)[0].read_text()
    assert 'id="recovery-table"' not in page and "excluded-nodes" not in page


def test_sweep_report_has_the_scaling_chart_the_table_and_links_to_point_reports(tmp_path: Path):
    sweep = tmp_path / "sweep"
    (sweep / "p1").mkdir(parents=True)
    _write_rank(sweep / "p1" / "metrics", 0, "n1", 0.2)
    _write_rank(sweep / "p1" / "metrics", 1, "n2", 0.8)
    rows = [Row(label="horovod-1x1", backend="horovod", batch_size=8, nodes=1, gpus=1, ranks=1,
                state="COMPLETED", images_per_sec=10.0, speedup=1.0, efficiency=1.0,
                baseline_ranks=1, sync_share=0.0, run_dir=None),
            Row(label="horovod-2x1", backend="horovod", batch_size=8, nodes=2, gpus=1, ranks=2,
                state="COMPLETED", images_per_sec=15.0, speedup=1.5, efficiency=0.75,
                baseline_ranks=1, sync_share=0.2, run_dir="p1")]
    out, stragglers = write_sweep_report(sweep, rows, {"sweep_id": "sweep-x",
                                                       "sweep_dir": str(sweep)})
    page = out.read_text()
    assert '<figure class="chart" id="chart-scaling"><svg' in page and 'id="sweep-table"' in page
    assert '<a href="p1/report.html">horovod-2x1</a>' in page and (sweep / "p1" / "report.html").is_file()
    assert stragglers["horovod-1x1"] is None and stragglers["horovod-2x1"]["found"]
    assert "straggler in horovod-2x1" in page and "75.0%" in page


def test_report_command_json_and_bad_input(tmp_path: Path):
    run = _run_dir(tmp_path)
    _write_rank(run / "metrics", 0, "n1", 0.2)
    _write_rank(run / "metrics", 1, "n1", 0.9)
    res = CliRunner().invoke(cli, ["report", str(run), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output.strip().splitlines()[-1])
    assert data["report"] == str(run / "report.html") and data["straggler"]["found"]
    res = CliRunner().invoke(cli, ["report", str(run), "-o", str(tmp_path / "r.html")])
    assert res.exit_code == 0 and f"report: {tmp_path / 'r.html'}" in res.output
    assert "rank 1 on n1 is slow" in res.output
    res = CliRunner().invoke(cli, ["report", str(tmp_path / "run" / "metrics")])
    assert res.exit_code == 2 and "neither a run directory" in res.output
    res = CliRunner().invoke(cli, ["report", str(run), "--straggler-threshold", "0.9"])
    assert res.exit_code == 2 and "straggler-threshold: 0.9 must be above 1" in res.output
    res = CliRunner().invoke(cli, ["report", str(run), "-o", str(tmp_path / "no" / "r.html")])
    assert res.exit_code == 2 and "does not exist" in res.output


def test_results_json_carries_the_verdict_and_the_text_names_the_straggler(tmp_path: Path):
    run = _run_dir(tmp_path)
    _write_rank(run / "metrics", 0, "n1", 0.2)
    _write_rank(run / "metrics", 1, "n1", 0.9)
    res = CliRunner().invoke(cli, ["results", str(run), "--json", "--no-refresh"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["straggler"]["slow_ranks"][0]["rank"] == 1
    res = CliRunner().invoke(cli, ["results", str(run), "--no-refresh"])
    assert res.exit_code == 0 and "straggler: rank 1 on n1 is slow" in res.output
    # The only rank of its node: the node is named (nothing else on it to blame).
    _write_rank(run / "metrics", 1, "n2", 0.9)
    data = json.loads(CliRunner().invoke(cli, ["results", str(run), "--json",
                                               "--no-refresh"]).output)
    assert data["straggler"]["slow_nodes"][0]["host"] == "n2"


def test_the_cli_path_does_not_import_matplotlib_until_a_report_is_made():
    import subprocess

    code = ("import sys; from hpcdl.cli import cli; import hpcdl.cli.report, hpcdl.cli.results, hpcdl.cli.scale; "
            "print('matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == "False"
