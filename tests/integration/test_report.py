"""`hpcdl report` on a real run: 2 nodes x 2 ranks of the bundled example in the CPU
image on the sandbox, rank 3 slowed on purpose (the example's testing flags
--slow-rank/--slow-ms). `submit --wait` names the straggler and writes report.html;
the report names the rank and its node, and opens in a real headless Chromium with
no network: no console error, no request leaving the file, every chart there, a
screenshot of a plausible size. The same run directory without its metrics (as an
old run, or a command that writes none) still gets a report that says so.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import pytest

from hpcdl.jobside.steps import read_metrics
from tests.browser import load
from tests.integration.conftest_slurm import hpcdl

pytestmark = [pytest.mark.slurm, pytest.mark.apptainer, pytest.mark.horovod]

# s: 4 ranks start torch + Horovod in the image on 2 shared cores, then 12 steps of
# ResNet-18 with one rank sleeping 1 s in each (~1 min alone); room for a queue.
RUN_TIMEOUT = 600
SLOW_RANK = 3
RUN_CHARTS = ("#chart-loss", "#chart-throughput", "#chart-ranks", "#chart-split",
              "#chart-attempts")


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) of a PNG, from its IHDR chunk."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def check_in_browser(report: Path, selectors: tuple[str, ...], shot: Path,
                     min_height: int) -> dict[str, str]:
    """Open ``report`` in Chromium; assert it is clean and complete; return the texts."""
    page = load(report, list(selectors), shot)
    assert page.console_errors == [], page.console_errors
    assert page.requests_refused == [], page.requests_refused
    for sel in selectors:
        assert page.found[sel] == 1, (sel, page.found)
        if sel.startswith("#chart-") and not sel.endswith("-absent"):
            width, height = page.svg_sizes[sel]
            assert width > 300 and height > 100, (sel, width, height)
    width, height = png_size(shot)
    assert width == 1280 and height >= min_height, (width, height)
    assert shot.stat().st_size > 20_000  # drawn, not a blank page
    return page.texts


@pytest.fixture(scope="module")
def slowed_run(sandbox_twin: object, cpu_image: Path, tmp_path_factory: pytest.TempPathFactory
               ) -> dict:
    runs = tmp_path_factory.mktemp("report") / "runs"
    res = hpcdl("submit", "-p", "sandbox", "-N", "2", "-G", "2", "--image", str(cpu_image),
                "--synthetic", "--job-name", "i25-straggler", "--wait",
                "-X", "--arch=resnet18", "-X", "--max-steps=12", "-X", "--checkpoint-dir=",
                "-X", f"--slow-rank={SLOW_RANK}", "-X", "--slow-ms=1000",
                env={"HPCDL_RUNS": str(runs)}, timeout=RUN_TIMEOUT)
    assert res.returncode == 0, f"{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
    run_dir = Path(re.search(r"^run directory: (.+)$", res.stdout, re.M).group(1))  # type: ignore[union-attr]
    return {"out": res.stdout, "run_dir": run_dir}


def test_submit_wait_names_the_slowed_rank_and_its_node_and_writes_the_report(slowed_run: dict):
    run_dir: Path = slowed_run["run_dir"]
    metrics = read_metrics(run_dir / "metrics")
    assert sorted(metrics) == [0, 1, 2, 3]
    for info in metrics.values():
        assert [r["step"] for r in info["steps"]] == list(range(1, 13))
        assert all(r["loss"] is not None and r["images_per_sec"] > 0 for r in info["steps"])
    node = metrics[SLOW_RANK]["host"]
    # The node Slurm ran rank 3 on, as the rank itself printed it (its checksum line).
    ranks = json.loads((run_dir / "result.json").read_text())["ranks"]
    assert {r["rank"]: r["host"] for r in ranks}[SLOW_RANK] == node
    out = slowed_run["out"]
    named = [ln for ln in out.splitlines() if ln.startswith("straggler: ")]
    assert len(named) == 1 and f"rank {SLOW_RANK} on {node} is slow" in named[0], out
    assert re.search(rf"^report: {re.escape(str(run_dir / 'report.html'))}$", out, re.M), out
    assert out.splitlines()[-1] == f"run directory: {run_dir}"
    # hpcdl results --json carries the same verdict (exit code unchanged: 0).
    res = hpcdl("results", str(run_dir), "--json")
    assert res.returncode == 0, res.stderr
    verdict = json.loads(res.stdout)["straggler"]
    assert [(r["rank"], r["host"]) for r in verdict["slow_ranks"]] == [(SLOW_RANK, node)]
    assert verdict["slow_ranks"][0]["ratio"] >= 1.25 and verdict["slow_nodes"] == []


def test_the_run_report_opens_clean_in_a_real_browser(slowed_run: dict, tmp_path: Path):
    run_dir: Path = slowed_run["run_dir"]
    node = read_metrics(run_dir / "metrics")[SLOW_RANK]["host"]
    texts = check_in_browser(run_dir / "report.html",
                             ("#identity-table", "#straggler-verdict", *RUN_CHARTS),
                             tmp_path / "run.png", min_height=2000)
    assert f"rank {SLOW_RANK} on {node} is slow" in texts["#straggler-verdict"]
    assert f"rank {SLOW_RANK} ({node})" in texts["#chart-ranks"]  # the heatmap's row label
    assert "content hash" in texts["#identity-table"]
    assert "--slow-rank=3" in texts["#identity-table"]


def test_a_run_without_metrics_gets_a_report_of_what_exists(slowed_run: dict, tmp_path: Path):
    old = tmp_path / "old-run"
    shutil.copytree(slowed_run["run_dir"], old, ignore=shutil.ignore_patterns("metrics",
                                                                               "report.html"))
    res = hpcdl("report", str(old))
    assert res.returncode == 0, res.stderr
    assert "missing: metrics/: no per-step metrics" in res.stderr
    assert res.stdout.strip() == f"report: {old / 'report.html'}"
    texts = check_in_browser(old / "report.html",
                             ("#identity-table", "#missing", "#chart-loss-absent",
                              "#chart-ranks-absent", "#straggler-verdict"),
                             tmp_path / "old.png", min_height=600)
    assert "no per-step metrics" in texts["#missing"]
    assert "COMPLETED" in texts["#identity-table"]
