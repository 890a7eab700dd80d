"""`hpcdl scale` on the real sandbox: 1 and 2 nodes x 1 and 2 ranks per node, both
backends, in the real image (8 jobs, run one after another through Slurm's singleton
dependency), followed to the end; then `hpcdl results` on the sweep directory.
"""

from __future__ import annotations

import json
import struct
from datetime import datetime
from pathlib import Path

import pytest

from tests.integration.conftest_slurm import hpcdl

pytestmark = [pytest.mark.slurm, pytest.mark.apptainer, pytest.mark.horovod]

SWEEP_TIMEOUT = 900  # s: 8 jobs of 1-4 ranks, each starting torch in the image on 2 cores
EXAMPLE = ("-X", "--arch=resnet18", "-X", "--image-size=32", "-X", "--max-steps=6",
           "-X", "--epochs=1", "-X", "--synthetic-size=256", "-X", "--num-classes=10",
           "-X", "--val-batches=1", "-X", "--checkpoint-dir=")


def _sacct_span(job_id: str) -> tuple[datetime, datetime]:
    import subprocess

    out = subprocess.run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "Start,End"],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    start, end = out.strip().splitlines()[-1].split("|")
    return datetime.fromisoformat(start), datetime.fromisoformat(end)


@pytest.fixture(scope="module")
def sweep(sandbox_twin: object, cpu_image: Path, tmp_path_factory: pytest.TempPathFactory
          ) -> dict:
    runs = tmp_path_factory.mktemp("scale") / "runs"
    res = hpcdl("scale", "--profile", "sandbox", "--nodes", "1,2", "--gpus", "1,2",
                "--backend", "horovod,ddp", "--batch-size", "8", "--synthetic",
                "--image", str(cpu_image), "--cpus-per-task", "1", *EXAMPLE, "--wait", "--json",
                env={"HPCDL_RUNS": str(runs)}, timeout=SWEEP_TIMEOUT)
    assert res.returncode == 0, f"{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
    data = json.loads(res.stdout)
    data["stderr"] = res.stderr
    data["runs"] = runs
    return data


def test_every_point_completes_with_speedup_efficiency_and_sync_share(sweep: dict) -> None:
    rows = sweep["rows"]
    assert [(r["backend"], r["nodes"], r["gpus"], r["ranks"]) for r in rows] == [
        ("horovod", 1, 1, 1), ("horovod", 1, 2, 2), ("horovod", 2, 1, 2), ("horovod", 2, 2, 4),
        ("ddp", 1, 1, 1), ("ddp", 1, 2, 2), ("ddp", 2, 1, 2), ("ddp", 2, 2, 4)]
    for row in rows:
        assert row["state"] == "COMPLETED", row
        assert row["batch_size"] == 8 and row["baseline_ranks"] == 1
        assert row["images_per_sec"] > 0 and row["efficiency"] > 0
        assert row["images_per_sec_per_rank"] == pytest.approx(
            row["images_per_sec"] / row["ranks"], rel=0.01)
        assert row["speedup"] == pytest.approx(row["efficiency"] * row["ranks"], rel=0.01)
        assert 0 <= row["sync_share"] < 1 and row["step_seconds"] > 0
    for row in (rows[0], rows[4]):
        assert row["speedup"] == 1.0 and row["efficiency"] == 1.0
    # Progress went to stderr, one line per finished point (not a terminal here).
    assert sweep["stderr"].count("] horovod-") == 4 and sweep["stderr"].count("] ddp-") == 4


def test_points_ran_one_after_another_on_the_nodes_they_asked_for(sweep: dict) -> None:
    sweep_dir = Path(sweep["sweep_dir"])
    assert sweep_dir.parent == sweep["runs"].resolve()
    record = json.loads((sweep_dir / "sweep.json").read_text())
    spans = []
    for point in record["points"]:
        run = json.loads((sweep_dir / point["run_dir"] / "result.json").read_text())
        assert run["hpcdl_result"]["world_size"] == point["ranks"]
        assert len({r["host"] for r in run["ranks"]}) == point["nodes"]
        argv = json.loads((sweep_dir / point["run_dir"] / "job.json").read_text())["argv"]
        assert "--dependency=singleton" in argv
        spans.append(_sacct_span(point["job_id"]))
    spans.sort()
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert start >= end, spans  # singleton: no two points overlapped


def test_results_reads_the_sweep_back_as_table_csv_and_plot(sweep: dict, tmp_path: Path) -> None:
    sweep_dir = Path(sweep["sweep_dir"])
    for name in ("results.json", "results.csv", "scaling.png"):
        assert (sweep_dir / name).is_file(), name
    as_json = hpcdl("results", str(sweep_dir), "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["rows"] == sweep["rows"]
    as_csv = hpcdl("results", str(sweep_dir), "--csv")
    assert as_csv.stdout == (sweep_dir / "results.csv").read_text()
    table = hpcdl("results", str(sweep_dir), "--plot", str(tmp_path / "p.png"))
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].split()[:3] == ["backend", "batch", "nodes"]
    assert "baseline (horovod, batch 8): 1 rank" in table.stdout
    png = (tmp_path / "p.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert width > 1000 and height > 300


def test_results_follows_a_sweep_submitted_without_wait(sandbox_twin: object, cpu_image: Path,
                                                        runs_dir: Path) -> None:
    import time

    res = hpcdl("scale", "--profile", "sandbox", "--nodes", "1", "--gpus", "1",
                "--backend", "horovod,ddp", "--synthetic", "--image", str(cpu_image),
                "--cpus-per-task", "1", *EXAMPLE, "--json")
    assert res.returncode == 0, res.stderr
    submitted = json.loads(res.stdout)
    sweep_dir = Path(submitted["sweep_dir"])
    # In submission order: job ids as numbers (a fresh twin's 9 and 10 sort "10" < "9").
    ids = [int(p["job_id"]) for p in submitted["points"]]
    assert ids == sorted(ids), submitted["points"]
    first = json.loads(hpcdl("results", str(sweep_dir), "--json").stdout)["rows"]
    # The second point waits for the first (singleton) while the first is queued or running.
    assert first[1]["state"] in ("PENDING", "RUNNING", "COMPLETING", "COMPLETED"), first
    deadline = time.monotonic() + 300
    while True:
        rows = json.loads(hpcdl("results", str(sweep_dir), "--json").stdout)["rows"]
        if all(r["state"] == "COMPLETED" for r in rows) or time.monotonic() > deadline:
            break
        time.sleep(3)
    assert [r["state"] for r in rows] == ["COMPLETED", "COMPLETED"], rows
    for point in submitted["points"]:
        record = json.loads((sweep_dir / point["run_dir"] / "result.json").read_text())
        assert record["hpcdl_result"]["backend"] == point["backend"]


def test_the_sweep_report_opens_clean_in_a_real_browser(sweep: dict, tmp_path: Path) -> None:
    from tests.integration.test_report import check_in_browser

    sweep_dir = Path(sweep["sweep_dir"])
    res = hpcdl("report", str(sweep_dir), "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["report"] == str(sweep_dir / "report.html")
    # Every point wrote per-step metrics (its job script exported HPCDL_RUN_DIR); the
    # 1-rank points have nobody to compare with.
    assert set(data["stragglers"]) == {r["label"] for r in sweep["rows"]}
    for row in sweep["rows"]:
        verdict = data["stragglers"][row["label"]]
        assert verdict is not None and len(verdict["ranks"]) == row["ranks"], row["label"]
        assert (sweep_dir / row["run_dir"] / "report.html").is_file()
    texts = check_in_browser(sweep_dir / "report.html",
                             ("#identity-table", "#chart-scaling", "#sweep-table",
                              "#straggler-verdict"), tmp_path / "sweep.png", min_height=900)
    for row in sweep["rows"]:
        assert row["label"] in texts["#sweep-table"]
    assert "parallel efficiency (%)" in texts["#chart-scaling"]
