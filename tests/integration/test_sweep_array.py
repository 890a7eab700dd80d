"""`hpcdl sweep` on the real sandbox: a 6-point sweep of the bundled example in the image as
one job array with at most 2 tasks at a time (checked from sacct's own Start/End), its
table, the failed point alone resubmitted by --retry-failed; a user's script swept with
{NAME} placeholders whose transient failure a retry mends; `cancel` of an array; one
point more than the cluster's MaxArraySize refused before anything is written.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from hpcdl.core.resources import PACKAGE_DIR
from tests.integration.conftest_slurm import hpcdl

pytestmark = [pytest.mark.slurm, pytest.mark.apptainer]

SWEEP_TIMEOUT = 300  # s: 6 tiny ResNet-18 runs in the image, 2 at a time, on 2 cores
EXAMPLE = ("-X", "--arch=resnet18", "-X", "--image-size=32", "-X", "--max-steps=3",
           "-X", "--epochs=1", "-X", "--synthetic-size=64", "-X", "--num-classes=10",
           "-X", "--val-batches=1", "-X", "--checkpoint-dir=")


def sacct_tasks(array_id: str) -> dict[str, tuple[str, datetime | None, datetime | None]]:
    """The array's tasks as the accounting database has them: id -> (state, start, end)."""
    out = subprocess.run(["sacct", "-n", "-P", "-X", "-j", array_id, "-o", "JobID,State,Start,End"],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    tasks = {}
    for line in out.splitlines():
        job_id, state, start, end = line.split("|")
        stamp = [datetime.fromisoformat(t) if t[:1].isdigit() else None for t in (start, end)]
        tasks[job_id] = (state.split(" ")[0], stamp[0], stamp[1])
    return tasks


def settled_tasks(array_id: str, count: int) -> dict[str, tuple[str, datetime | None,
                                                                 datetime | None]]:
    """sacct_tasks once the database has all ``count`` tasks with their end (for a few
    seconds after a job ends sacct shows a placeholder row under the bare job number)."""
    deadline = time.monotonic() + 30
    while True:
        tasks = sacct_tasks(array_id)
        ended = [t for t, (_, _, end) in tasks.items() if "_" in t and end is not None]
        if len(ended) >= count or time.monotonic() > deadline:
            return tasks
        time.sleep(1)


def max_overlap(spans: list[tuple[datetime, datetime]]) -> int:
    """The most spans running at one instant (an end and a start in the same second do
    not overlap)."""
    return max(sum(1 for s, e in spans if s <= start < e) for start, _ in spans)


@pytest.fixture(scope="module")
def example_sweep(sandbox_twin: object, cpu_image: Path,
                  tmp_path_factory: pytest.TempPathFactory) -> dict:
    runs = tmp_path_factory.mktemp("sweep") / "runs"
    points = runs.parent / "points.yaml"
    # Six points; the last one's weight decay is a word the example's argparse refuses,
    # so that task fails at run time.
    points.write_text("".join(f"- {{lr: {lr}, wd: {wd}}}\n" for lr, wd in (
        (0.1, "1e-4"), (0.1, "5e-5"), (0.05, "1e-4"), (0.05, "5e-5"), (0.025, "1e-4"),
        (0.025, "oops"))))
    env = {"HPCDL_RUNS": str(runs)}
    res = hpcdl("sweep", "-p", "sandbox", "-N", "1", "-G", "1", "-c", "1", "--synthetic",
                "--image", str(cpu_image), *EXAMPLE, "--points", str(points),
                "--max-concurrent", "2", "--wait", "--json", env=env, timeout=SWEEP_TIMEOUT)
    assert res.returncode == 1, f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}"  # one failed
    data = json.loads(res.stdout)
    (sweep_dir,) = runs.glob("sweep-*")
    return {"rows": data["rows"], "dir": sweep_dir, "env": env,
            "record": json.loads((sweep_dir / "sweep.json").read_text())}


def test_one_array_at_most_two_tasks_at_once_every_point_in_the_table(example_sweep: dict) -> None:
    record = example_sweep["record"]
    (array,) = record["arrays"]  # one submission
    assert "--array=0-5%2" in array["argv"]
    tasks = settled_tasks(array["job_id"], 6)
    assert sorted(tasks) == [f"{array['job_id']}_{i}" for i in range(6)]
    spans = [(s, e) for _, s, e in tasks.values() if s is not None and e is not None]
    assert len(spans) == 6 and max_overlap(spans) <= 2, tasks
    rows = example_sweep["rows"]
    assert [r["point"] for r in rows] == list(range(6))
    assert [r["state"] for r in rows] == ["COMPLETED"] * 5 + ["FAILED"]
    for row in rows[:5]:
        assert row["final_loss"] is not None and row["images_per_sec"] > 0
    table = hpcdl("results", str(example_sweep["dir"]), "--sort", "final_loss",
                  env=example_sweep["env"])
    assert table.returncode == 0 and "6 points, 5 completed" in table.stdout, table.stderr
    report = hpcdl("report", str(example_sweep["dir"]), env=example_sweep["env"])
    assert report.returncode == 0, report.stderr
    page = (example_sweep["dir"] / "report.html").read_text()
    assert 'id="chart-curves"' in page and 'id="chart-loss-vs"' in page


def test_retry_failed_resubmits_the_failed_point_alone(example_sweep: dict) -> None:
    sweep_dir, env = example_sweep["dir"], example_sweep["env"]
    before = {p["index"]: p["job_id"] for p in example_sweep["record"]["points"]}
    res = hpcdl("sweep", "--retry-failed", str(sweep_dir), "--wait", "--json", env=env,
                timeout=SWEEP_TIMEOUT)
    assert res.returncode == 1, res.stderr  # its value is still one the example refuses
    record = json.loads((sweep_dir / "sweep.json").read_text())
    first, retry = record["arrays"]
    assert retry["indices"] == [5] and "--array=5" in retry["argv"]  # no throttle for one
    after = {p["index"]: p["job_id"] for p in record["points"]}
    assert after[5] == f"{retry['job_id']}_5"
    assert {i: j for i, j in after.items() if i != 5} == {i: j for i, j in before.items() if i != 5}
    assert list(settled_tasks(retry["job_id"], 1)) == [f"{retry['job_id']}_5"]
    assert (sweep_dir / "point-005" / f"result-{first['job_id']}_5.json").is_file()
    assert (sweep_dir / "point-005" / f"slurm-{retry['job_id']}_5.err").is_file()


def test_a_users_script_swept_by_placeholder_a_transient_failure_retried(
        sandbox_twin: object, tmp_path: Path) -> None:
    runs, flag = tmp_path / "runs", tmp_path / "failed-once"
    env = {"HPCDL_RUNS": str(runs)}
    # n=2 fails the first time only (it leaves the flag), as a node hiccup would.
    script = (f"echo n={{n}}; [ {{n}} != 2 ] || [ -e {flag} ] || {{ touch {flag}; exit 3; }}")
    res = hpcdl("sweep", "-p", "sandbox", "-N", "1", "-G", "1", "-c", "1", "--param", "n=1,2,3",
                "--wait", "--json", "--", "bash", "-c", script, env=env, timeout=120)
    assert res.returncode == 1, res.stderr
    assert [r["state"] for r in json.loads(res.stdout)["rows"]] == ["COMPLETED", "FAILED",
                                                                    "COMPLETED"]
    (sweep_dir,) = runs.glob("sweep-*")
    again = hpcdl("sweep", "--retry-failed", str(sweep_dir), "--wait", "--json", env=env,
                  timeout=120)
    assert again.returncode == 0, again.stderr
    assert [r["state"] for r in json.loads(again.stdout)["rows"]] == ["COMPLETED"] * 3
    task = json.loads((sweep_dir / "point-001" / "job.json").read_text())["job_id"]
    logs = hpcdl("logs", task, env=env)
    assert logs.returncode == 0 and "n=2" in logs.stdout, logs.stderr


def test_cancel_of_the_array_ends_every_task(sandbox_twin: object, tmp_path: Path) -> None:
    env = {"HPCDL_RUNS": str(tmp_path / "runs")}
    res = hpcdl("sweep", "-p", "sandbox", "-N", "1", "-G", "1", "-c", "1", "--param", "s=1,2,3",
                "--max-concurrent", "1", "--json", "--", "sleep", "30{s}", env=env)
    assert res.returncode == 0, res.stderr
    array_id = json.loads(res.stdout)["array_job_id"]
    status = hpcdl("status", array_id, "--json", env=env)
    assert json.loads(status.stdout)["state"] in ("PENDING", "RUNNING"), status.stdout
    cancel = hpcdl("cancel", array_id, env=env, timeout=90)
    assert cancel.returncode == 0 and "CANCELLED" in cancel.stdout, cancel.stdout + cancel.stderr
    final = json.loads(hpcdl("status", array_id, "--json", env=env).stdout)
    assert final["state"] == "CANCELLED" and "CANCELLED" in final["reason"], final


def test_one_point_more_than_the_clusters_max_array_size_is_refused(
        sandbox_twin: object, tmp_path: Path) -> None:
    # The sandbox's slurm.conf leaves MaxArraySize at Slurm's default (1001); read it as
    # the test's truth, and claim far more in the profile: the cluster's value decides.
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True,
                            timeout=30, check=True).stdout
    limit = int(re.search(r"^MaxArraySize\s*=\s*(\d+)", config, re.M).group(1))  # type: ignore[union-attr]
    profile = yaml.safe_load((PACKAGE_DIR / "profiles" / "bundled" / "sandbox.yaml").read_text())
    for part in profile["partitions"]:
        part["max_array_size"] = limit + 1000
    claims = tmp_path / "claims-more.yaml"
    claims.write_text(yaml.safe_dump(profile))
    runs = tmp_path / "runs"
    env = {"HPCDL_RUNS": str(runs)}
    base = ("sweep", "-p", str(claims), "-N", "1", "-G", "1", "-c", "1", "--no-image")
    res = hpcdl(*base, "--random", str(limit + 1), "--param", "n=lin:0:1", "--", "echo", "{n}",
                env=env)
    assert res.returncode == 2, res.stdout + res.stderr
    assert (f"error: points: {limit + 1} points, but the cluster allows {limit} "
            f"(MaxArraySize = {limit} in scontrol show config)") in res.stderr
    assert not runs.exists()  # nothing written, nothing submitted
    dry = hpcdl(*base, "--param", "n=1,2", "--dry-run", "--", "echo", "{n}", env=env)
    assert dry.returncode == 0 and f"# at most {limit} points: the cluster's MaxArraySize" \
        in dry.stderr, dry.stderr
