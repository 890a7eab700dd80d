"""`hpcdl track`: run directories made by hpcdl itself (submit/scale against the fake
Slurm: plan.json, job.json, result.json as hpcdl writes them) with per-step metrics
written by the real writer (hpcdl.jobside.steps.StepWriter, as the job does), exported
to TensorBoard (read back with tensorboard's own reader) and to a real MLflow tracking
server started here (read back with MLflow's own client); tracked twice, nothing
duplicated. Bad input is one line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from hpcdl.cli import cli
from hpcdl.jobside import steps
from hpcdl.track.source import aggregate, command_args, read_run
from tests.fakeslurm.fixture import FakeSlurm
from tests.unit.jobs.test_lifecycle import GOOD_OUT, RESULT

STEPS = 30
RANKS = 2


def run_cli(*args: str):  # type: ignore[no-untyped-def]
    res = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert "Traceback (most recent call last)" not in res.output
    return res


def write_metrics(run_dir: Path, ranks: int = RANKS, n: int = STEPS, first: int = 1) -> None:
    """Per-step metrics as the job writes them (the real writer, flushed in batches)."""
    for rank in range(ranks):
        w = steps.StepWriter(steps.metrics_dir(run_dir), rank, world_size=ranks,
                             host=f"n{1 + rank}", attempt=0, job_id="100", flush_steps=7)
        for i in range(first, first + n):
            w.step(i, epoch=0, step_s=0.1 + 0.01 * rank, data_s=0.01, sync_s=0.02,
                   images=8, loss=2.0 - 0.01 * i + rank, lr=0.1)
        w.close()


@pytest.fixture
def fake(fake_slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeSlurm:
    monkeypatch.setenv("HPCDL_SKIP_LIVE_CHECK", "1")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('never run: the fake Slurm runs nothing')\n")
    monkeypatch.setattr("hpcdl.jobs.follow.MIN_INTERVAL_S", 0.01)
    monkeypatch.setattr("hpcdl.jobs.follow.LOG_READ_S", 0.0)
    fake_slurm.scenario(default={"states": [["PENDING", 1], ["RUNNING", 2], ["COMPLETED", 0]],
                                 "stdout": GOOD_OUT}, sacct_lag=1)
    return fake_slurm


def finished_run(*extra: str) -> Path:
    """A run directory of a job followed to its end by `submit --wait`, with metrics."""
    res = run_cli("submit", "-p", "sandbox", "-N", "1", "-G", "2", "-c", "1", "-J", "good",
                  "--wait", *extra, "--", "python3", "train.py", "--lr", "0.05",
                  "--batch-size=16", "--amp")
    assert res.exit_code == 0, res.output
    run_dir = Path(res.stdout.split("run directory: ")[1].strip())
    write_metrics(run_dir)
    return run_dir


def finished_sweep() -> tuple[Path, list[Path]]:
    res = run_cli("scale", "-p", "sandbox", "-N", "1,2", "-G", "1", "--synthetic", "-c", "1",
                  "--wait")
    assert res.exit_code == 0, res.output
    sweep_dir = Path(res.stdout.split("wrote ")[1].split(",")[0]).parent
    points = json.loads((sweep_dir / "sweep.json").read_text())["points"]
    runs = [sweep_dir / p["run_dir"] for p in points]
    for i, run in enumerate(runs):
        write_metrics(run, ranks=i + 1)
    return sweep_dir, runs


# ---- the series: pure --------------------------------------------------------------------

def test_series_takes_rank_zeros_loss_sums_throughput_and_the_slowest_step(tmp_path: Path):
    write_metrics(tmp_path, ranks=2, n=3)
    metrics = steps.read_metrics(steps.metrics_dir(tmp_path))
    points = aggregate(metrics, complete_only=False)
    assert [p.step for p in points] == [1, 2, 3]
    v = points[0].values
    assert v["loss"] == pytest.approx(1.99) and v["lr"] == pytest.approx(0.1)
    assert v["images_per_sec"] == pytest.approx(8 / 0.11 + 8 / 0.12, rel=1e-3)
    assert v["step_s"] == pytest.approx(0.11)


def test_a_running_job_logs_only_the_steps_every_rank_has_written(tmp_path: Path):
    write_metrics(tmp_path, ranks=1, n=10)
    w = steps.StepWriter(steps.metrics_dir(tmp_path), 1, world_size=2, host="n2", attempt=0)
    for i in range(1, 5):
        w.step(i, epoch=0, step_s=0.1, data_s=0.0, sync_s=0.0, images=8, loss=1.0, lr=0.1)
    w.close()
    metrics = steps.read_metrics(steps.metrics_dir(tmp_path))
    assert [p.step for p in aggregate(metrics, complete_only=True)] == [1, 2, 3, 4]
    assert len(aggregate(metrics, complete_only=False)) == 10


def test_command_arguments_become_parameters():
    assert command_args(["python3", "train.py", "--lr", "0.1", "--batch-size=32", "--amp",
                         "--epochs", "2", "--lr", "0.2"]) == {
        "lr": "0.2", "batch-size": "32", "amp": "true", "epochs": "2"}


# ---- TensorBoard ---------------------------------------------------------------------------

def tb_counts(run_dir: Path) -> dict[str, int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
    acc.Reload()
    return {tag: len(acc.Tensors(tag)) for tag in acc.Tags()["tensors"]}


def test_a_sweep_goes_to_tensorboard_once(fake: FakeSlurm, tmp_path: Path):
    pytest.importorskip("tensorboard")
    sweep_dir, runs = finished_sweep()
    tb = tmp_path / "tb"
    res = run_cli("track", str(sweep_dir), "--tensorboard", str(tb), "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)["runs"]
    assert [r["run"] for r in out] == [r.name for r in runs]
    assert [r["tensorboard"]["steps_written"] for r in out] == [STEPS, STEPS]
    for run in runs:
        counts = tb_counts(tb / run.name)
        assert counts["train/loss"] == STEPS and counts["train/images_per_sec"] == STEPS
        assert counts["result/images_per_sec"] == 1
    again = run_cli("track", str(sweep_dir), "--tensorboard", str(tb), "--json")
    assert [r["tensorboard"]["steps_written"] for r in json.loads(again.stdout)["runs"]] == [0, 0]
    assert tb_counts(tb / runs[0].name)["train/loss"] == STEPS
    # More steps (a resumed run appends): only those are added.
    write_metrics(runs[0], ranks=1, n=5, first=STEPS + 1)
    third = run_cli("track", str(runs[0]), "--tensorboard", str(tb), "--json")
    assert json.loads(third.stdout)["runs"][0]["tensorboard"]["steps_written"] == 5
    assert tb_counts(tb / runs[0].name)["train/loss"] == STEPS + 5


def point_out(loss: float) -> str:
    return "0: " + json.dumps({"hpcdl_result": {**RESULT, "final_loss": loss}}) + "\n"


def hparams_sessions(tb: Path) -> dict[str, dict[str, Any]]:
    """Per run directory under ``tb``: the hparams plugin's session start (its hparams as
    Python values) and end (its status name), as tensorboard's reader and the plugin's
    own parsers see them, and how many of each there are."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import api_pb2, metadata

    out = {}
    for run in sorted(p for p in tb.iterdir() if p.is_dir()):
        acc = EventAccumulator(str(run), size_guidance={"tensors": 0})
        acc.Reload()
        content = acc.PluginTagToContent(metadata.PLUGIN_NAME)
        start = metadata.parse_session_start_info_plugin_data(
            content[metadata.SESSION_START_INFO_TAG])
        values = {k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind"))
                  for k, v in start.hparams.items()}
        end = (api_pb2.Status.Name(metadata.parse_session_end_info_plugin_data(
            content[metadata.SESSION_END_INFO_TAG]).status)
            if metadata.SESSION_END_INFO_TAG in content else None)
        counts = {tag: len(acc.Tensors(tag)) for tag in (metadata.SESSION_START_INFO_TAG,
                                                          metadata.SESSION_END_INFO_TAG)
                  if tag in acc.Tags()["tensors"]}
        out[run.name] = {"hparams": values, "end": end, "counts": counts,
                         "group": start.group_name}
    return out


def test_a_parameter_sweep_fills_tensorboards_hparams_tab_once(
        fake: FakeSlurm, tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.plugins.hparams import metadata

    from hpcdl.track import to_tensorboard

    assert (to_tensorboard.SESSION_START_TAG, to_tensorboard.SESSION_END_TAG) == (
        metadata.SESSION_START_INFO_TAG, metadata.SESSION_END_INFO_TAG)
    fake.scenario(default={"states": [["RUNNING", 1], ["COMPLETED", 0]],
                           "stdout": point_out(1.5)},
                  task_specs={"100_0": {"stdout": point_out(0.7)},
                              "100_3": {"states": [["RUNNING", 1], ["FAILED", 0]],
                                        "exit": "1:0", "stdout": "0: Traceback\n"}},
                  sacct_lag=1)
    res = run_cli("sweep", "-p", "sandbox", "-N", "1", "-G", "1", "-c", "1", "--param",
                  "lr=0.1,0.05", "--param", "opt=sgd,adam", "--wait", "--json", "--",
                  "python3", "train.py", "--lr", "{lr}", "--opt", "{opt}")
    assert res.exit_code == 1, res.output  # point 3 failed
    (sweep_dir,) = (tmp_path / "runs").glob("sweep-*")
    runs = sorted(p for p in sweep_dir.iterdir() if p.is_dir())
    for run in runs:
        write_metrics(run, ranks=1, n=5)
    tb = tmp_path / "tb"
    dry = run_cli("track", str(sweep_dir), "--tensorboard", str(tb), "--dry-run", "--json")
    assert [r["tensorboard"]["hparams_written"] for r in json.loads(dry.stdout)["runs"]] == [
        True] * 4 and not tb.exists()
    first = run_cli("track", str(sweep_dir), "--tensorboard", str(tb))
    assert first.exit_code == 0 and "5 new steps, the hparams" in first.stdout, first.output
    sessions = hparams_sessions(tb)
    assert list(sessions) == [r.name for r in runs]
    # Each point's own values, numbers as numbers (the tab sorts and plots them so).
    assert [s["hparams"] for s in sessions.values()] == [
        {"lr": 0.1, "opt": "sgd"}, {"lr": 0.1, "opt": "adam"}, {"lr": 0.05, "opt": "sgd"},
        {"lr": 0.05, "opt": "adam"}]
    assert [s["end"] for s in sessions.values()] == ["STATUS_SUCCESS"] * 3 + ["STATUS_FAILURE"]
    assert len({s["group"] for s in sessions.values()}) == 4  # one session group a point
    # MLflow's parameters carry each point's values under their own names too.
    from hpcdl.track.source import read_run
    assert [{k: v for k, v in read_run(r).params.items() if k in ("point.lr", "point.opt")}
            for r in runs] == [{"point.lr": "0.1", "point.opt": "sgd"},
                               {"point.lr": "0.1", "point.opt": "adam"},
                               {"point.lr": "0.05", "point.opt": "sgd"},
                               {"point.lr": "0.05", "point.opt": "adam"}]
    # What the HPARAMS tab shows, asked of the plugin's own handlers: the sweep's
    # parameters as columns, each point a row with its final loss (the failed point none).
    names, rows = hparams_tab(tb, ["lr", "opt"], "result/final_loss")
    assert names[0] == ["lr", "opt"] and "result/final_loss" in names[1]
    assert rows == {runs[0].name: ({"lr": 0.1, "opt": "sgd"}, 0.7, "STATUS_SUCCESS"),
                    runs[1].name: ({"lr": 0.1, "opt": "adam"}, 1.5, "STATUS_SUCCESS"),
                    runs[2].name: ({"lr": 0.05, "opt": "sgd"}, 1.5, "STATUS_SUCCESS"),
                    runs[3].name: ({"lr": 0.05, "opt": "adam"}, None, "STATUS_FAILURE")}
    again = run_cli("track", str(sweep_dir), "--tensorboard", str(tb), "--json")
    assert [r["tensorboard"]["hparams_written"] for r in json.loads(again.stdout)["runs"]] == [
        False] * 4
    assert all(s["counts"] == {metadata.SESSION_START_INFO_TAG: 1,
                               metadata.SESSION_END_INFO_TAG: 1}
               for s in hparams_sessions(tb).values())


def hparams_tab(logdir: Path, hparams: list[str], metric: str) -> tuple[
        tuple[list[str], list[str]], dict[str, tuple[dict[str, Any], float | None, str]]]:
    """What TensorBoard's HPARAMS tab gets for ``logdir`` (the plugin's /experiment and
    /session_groups handlers over tensorboard's own data provider): (the hparams' and
    metrics' names, {session group: (hparams, the metric's value, status)})."""
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider
    from tensorboard.backend.event_processing import plugin_event_multiplexer as pem
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.hparams import (
        api_pb2,
        backend_context,
        get_experiment,
        list_session_groups,
    )

    mux = pem.EventMultiplexer()
    mux.AddRunsFromDirectory(str(logdir))
    mux.Reload()
    backend = backend_context.Context(base_plugin.TBContext(
        logdir=str(logdir), multiplexer=mux,
        data_provider=data_provider.MultiplexerDataProvider(mux, str(logdir))))
    request = context.RequestContext()
    experiment = get_experiment.Handler(request, backend, "",
                                        api_pb2.GetExperimentRequest()).run()
    names = ([h.name for h in experiment.hparam_infos],
             [m.name.tag for m in experiment.metric_infos])
    listing = list_session_groups.Handler(request, backend, "", api_pb2.ListSessionGroupsRequest(
        start_index=0, slice_size=100, allowed_statuses=list(api_pb2.Status.values()),
        col_params=[*(api_pb2.ColParams(hparam=h) for h in hparams),
                    api_pb2.ColParams(metric=api_pb2.MetricName(tag=metric))])).run()
    rows = {}
    for group in listing.session_groups:
        values = {k: getattr(v, v.WhichOneof("kind")) for k, v in group.hparams.items()}
        found = [round(m.value, 4) for m in group.metric_values if m.name.tag == metric]
        rows[group.name] = (values, found[0] if found else None,
                            api_pb2.Status.Name(group.sessions[0].status))
    return names, rows


def test_follow_logs_while_the_job_runs_and_stops_when_it_ended(fake: FakeSlurm, tmp_path: Path):
    pytest.importorskip("tensorboard")
    sub = run_cli("submit", "-p", "sandbox", "-N", "1", "-G", "2", "-c", "1", "--json", "--",
                  "python3", "train.py")
    run_dir = Path(json.loads(sub.stdout)["run_dir"])
    write_metrics(run_dir)
    assert not (run_dir / "result.json").exists()
    tb = tmp_path / "tb"
    res = run_cli("track", str(run_dir), "--tensorboard", str(tb), "--follow",
                  "--interval", "0.01", "--json")
    assert res.exit_code == 0, res.output
    (entry,) = json.loads(res.stdout)["runs"]
    assert entry["state"] == "COMPLETED" and entry["tensorboard"]["steps_written"] == STEPS
    assert json.loads((run_dir / "result.json").read_text())["hpcdl_result"] == RESULT
    assert tb_counts(tb / run_dir.name)["result/images_per_sec"] == 1


def test_dry_run_writes_nothing(fake: FakeSlurm, tmp_path: Path):
    pytest.importorskip("tensorboard")
    run_dir = finished_run()
    tb = tmp_path / "tb"
    res = run_cli("track", str(run_dir), "--tensorboard", str(tb), "--dry-run")
    assert res.exit_code == 0, res.output
    assert f"would write {STEPS} new steps" in res.stdout and not tb.exists()


# ---- bad input -------------------------------------------------------------------------------

def test_bad_input_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    plain = tmp_path / "plain"
    plain.mkdir()
    for args, code, words in (
            ([str(plain), "--tensorboard", str(tmp_path / "tb")], 2, "neither a run directory"),
            ([str(tmp_path / "nope"), "--tensorboard", str(tmp_path / "tb")], 2,
             "not a directory"),
            ([str(plain)], 2, "neither --tensorboard DIR nor --mlflow URI")):
        res = run_cli("track", *args)
        assert res.exit_code == code, res.output
        assert res.stderr.startswith("error: ") and words in res.stderr
        assert len(res.stderr.splitlines()) <= 2  # error + hint
    write_metrics(plain, ranks=1, n=2)
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if it were not installed
    res = run_cli("track", str(plain), "--mlflow", "http://127.0.0.1:1")
    assert res.exit_code == 2 and "pip install 'hpcdl[mlflow]'" in res.stderr
    monkeypatch.setitem(sys.modules, "tensorboard.summary", None)
    res = run_cli("track", str(plain), "--tensorboard", str(tmp_path / "tb"))
    assert res.exit_code == 2 and "pip install 'hpcdl[tensorboard]'" in res.stderr


def test_an_unreachable_server_is_one_line_exit_1(tmp_path: Path):
    pytest.importorskip("mlflow")
    write_metrics(tmp_path / "run", ranks=1, n=2)
    port = free_port()  # nothing listens there
    start = time.monotonic()
    res = run_cli("track", str(tmp_path / "run"), "--mlflow", f"http://127.0.0.1:{port}")
    assert res.exit_code == 1, res.output
    assert res.stderr.splitlines()[0].startswith(
        f"error: mlflow tracking server http://127.0.0.1:{port}: not reachable")
    assert time.monotonic() - start < 15


# ---- MLflow: a real tracking server ------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def mlflow_server(tmp_path: Path) -> Iterator[str]:
    pytest.importorskip("mlflow.server")
    port = free_port()
    store = tmp_path / "mlflow"
    store.mkdir()
    log = (store / "server.log").open("w")
    argv = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
            f"sqlite:///{store}/mlflow.db", "--artifacts-destination", str(store / "artifacts"),
            "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=store,
                              start_new_session=True, env={**os.environ, "PYTHONPATH": ""})
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(uri + "/health", timeout=2).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("mlflow server did not start: "
                                + (store / "server.log").read_text()[-2000:])
                time.sleep(0.3)
        yield uri
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)
        log.close()


@pytest.mark.slow
def test_runs_go_to_a_real_mlflow_server_once(fake: FakeSlurm, mlflow_server: str,
                                              tmp_path: Path):
    from mlflow.tracking import MlflowClient

    run_dir = finished_run()
    sweep_dir, sweep_runs = finished_sweep()
    res = run_cli("track", str(run_dir), str(sweep_dir), "--mlflow", mlflow_server,
                  "--experiment", "t", "--json")
    assert res.exit_code == 0, res.output
    tracked = json.loads(res.stdout)["runs"]
    assert [t["mlflow"]["created"] for t in tracked] == [True, True, True]
    client = MlflowClient(tracking_uri=mlflow_server)
    exp = client.get_experiment_by_name("t")
    found = client.search_runs([exp.experiment_id])
    assert len(found) == 3
    (run,) = [r for r in found if r.data.tags["hpcdl.run_id"] == run_dir.name]
    params = run.data.params
    assert params["nodes"] == "1" and params["gpus_per_node"] == "2"
    assert params["backend"] and params["arg.lr"] == "0.05" and params["arg.batch-size"] == "16"
    assert params["arg.amp"] == "true" and "train.py" in params["command"]
    assert run.data.tags["hpcdl.job_id"] == "100" and run.info.status == "FINISHED"
    for key in ("loss", "images_per_sec", "lr", "step_s"):
        assert len(client.get_metric_history(run.info.run_id, key)) == STEPS, key
    assert run.data.metrics["result.images_per_sec"] == RESULT["images_per_sec"]
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["report.html"]
    assert sweep_runs[0].name in {r.data.tags["hpcdl.run_id"] for r in found}
    # Tracked again: no new run, no new point, nothing uploaded.
    again = run_cli("track", str(run_dir), str(sweep_dir), "--mlflow", mlflow_server,
                    "--experiment", "t", "--json")
    assert again.exit_code == 0, again.output
    second = json.loads(again.stdout)["runs"]
    assert [(t["mlflow"]["created"], t["mlflow"]["steps_logged"], t["mlflow"]["params"],
             t["mlflow"]["report"]) for t in second] == [(False, 0, 0, False)] * 3
    assert len(client.search_runs([exp.experiment_id])) == 3
    assert len(client.get_metric_history(run.info.run_id, "loss")) == STEPS
    assert len(client.get_metric_history(run.info.run_id, "result.images_per_sec")) == 1


def test_read_run_names_the_run_by_its_directory(fake: FakeSlurm):
    run_dir = finished_run()
    source = read_run(run_dir)
    assert source.run_id == run_dir.name and source.state == "COMPLETED"
    assert source.ranks == RANKS and len(source.points) == STEPS
    assert source.result["images_per_sec"] == RESULT["images_per_sec"]


def test_a_sqlite_store_keeps_its_artifacts_beside_the_database(tmp_path: Path) -> None:
    from hpcdl.track.to_mlflow import local_artifact_root

    assert local_artifact_root(f"sqlite:///{tmp_path}/m.db") == (tmp_path / "mlruns").as_uri()
    # three slashes: a path relative to where track runs, made absolute once
    assert local_artifact_root("sqlite:///m.db") == (Path.cwd() / "mlruns").as_uri()
    assert local_artifact_root("http://127.0.0.1:5000") is None
    assert local_artifact_root(f"file://{tmp_path}/store") is None
