"""`hpcdl sweep` against the fake Slurm (tests/fakeslurm): one sbatch --array for all
points, a run directory per point, following every task with one squeue per poll,
--retry-failed, status/cancel/logs of an array and of a task, and the bad input that
is refused before anything is written. The pure parts (the points, the array spec and
script) without any tool. The same paths run on the real sandbox in
tests/integration/test_sweep_array.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from hpcdl.cli import cli
from hpcdl.core.resources import PACKAGE_DIR
from hpcdl.errors import ValidationError
from hpcdl.plan import JobRequest
from hpcdl.profiles import load_profile
from hpcdl.schedulers.slurm.adapter import SlurmScheduler
from hpcdl.schedulers.slurm.array import array_script, array_spec, split_task_id
from hpcdl.sweep import arrays, params
from tests.fakeslurm.fixture import FakeSlurm


def out_for(loss: float) -> str:
    result = {"world_size": 1, "images_per_sec": 50.0, "final_loss": loss, "top1": 0.25,
              "wall_time": 2.0}
    return "0: " + json.dumps({"hpcdl_result": result}) + "\n"


GRID = ("--param", "lr=0.1,0.05,0.025", "--param", "wd=1e-4,5e-5")


def run_cli(*args: str) -> Any:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert "Traceback (most recent call last)" not in result.output
    return result


def sweep(*extra: str) -> Any:
    return run_cli("sweep", "-p", "sandbox", "-N", "1", "-G", "1", "-c", "1", "--synthetic",
                   "--no-image", *extra)


@pytest.fixture
def fake(fake_slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeSlurm:
    monkeypatch.setenv("HPCDL_SKIP_LIVE_CHECK", "1")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("hpcdl.jobs.follow.MIN_INTERVAL_S", 0.01)
    monkeypatch.setattr("hpcdl.jobs.follow.LOG_READ_S", 0.0)
    fake_slurm.scenario(
        default={"states": [["PENDING", 1], ["RUNNING", 2], ["COMPLETED", 0]],
                 "stdout": out_for(1.5)},
        task_specs={"100_3": {"states": [["RUNNING", 1], ["FAILED", 0]], "exit": "1:0",
                              "stdout": "0: Traceback\n", "stderr": "0: ValueError: bad wd\n"}},
        sacct_lag=1)
    return fake_slurm


def sweep_dir_of(tmp_path: Path) -> Path:
    (found,) = (tmp_path / "runs").glob("sweep-*")
    return found


def test_one_sbatch_submits_every_point_each_with_its_own_run_directory(
        fake: FakeSlurm, tmp_path: Path) -> None:
    res = sweep(*GRID, "--max-concurrent", "2", "--json")
    assert res.exit_code == 0, res.output
    assert fake.counts()["sbatch"] == 1
    (call,) = [c for c in fake.calls() if c["tool"] == "sbatch"]
    assert "--array=0-5%2" in call["argv"]
    data = json.loads(res.stdout)
    assert data["array_job_id"] == "100" and data["points"] == 6
    sweep_dir = Path(data["sweep_dir"])
    record = json.loads((sweep_dir / "sweep.json").read_text())
    assert record["kind"] == "params" and record["params"] == ["lr", "wd"]
    assert [p["params"] for p in record["points"]][:2] == [{"lr": "0.1", "wd": "1e-4"},
                                                         {"lr": "0.1", "wd": "5e-5"}]
    for i, point in enumerate(record["points"]):
        run = sweep_dir / f"point-{i:03d}"
        assert point["run_dir"] == run.name and point["job_id"] == f"100_{i}"
        plan = json.loads((run / "plan.json").read_text())
        assert plan["sweep_point"] == {"index": i, "params": point["params"]}
        assert f"--lr={point['params']['lr']}" in (run / "job.sbatch").read_text()
        assert json.loads((run / "job.json").read_text())["job_id"] == f"100_{i}"
    script = (sweep_dir / "array.sbatch").read_text()
    assert f"#SBATCH --output={sweep_dir}/point-%3a/slurm-%A_%a.out" in script
    assert f"  5) exec bash {sweep_dir}/point-005/job.sbatch ;;  # lr=0.025 wd=5e-5" in script


def test_wait_follows_every_task_with_one_squeue_per_poll_and_prints_the_table(
        fake: FakeSlurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    per_poll: list[tuple[int, int]] = []
    real = SlurmScheduler.statuses

    def counted(self: SlurmScheduler, job_ids: Any) -> Any:
        before = fake.counts()
        try:
            return real(self, job_ids)
        finally:
            after = fake.counts()
            per_poll.append((after["squeue"] - before["squeue"], after["sacct"] - before["sacct"]))

    monkeypatch.setattr(SlurmScheduler, "statuses", counted)
    fake.scenario(default={"states": [["PENDING", 1], ["RUNNING", 2], ["COMPLETED", 0]],
                           "stdout": out_for(1.5)}, sacct_lag=1)
    res = sweep(*GRID, "--max-concurrent", "2", "--wait")
    assert res.exit_code == 0, res.output
    assert len(per_poll) >= 3 and all(squeue == 1 for squeue, _ in per_poll), per_poll
    assert sum(sacct for _, sacct in per_poll) == 0, per_poll
    # every squeue asked for the array, never for each task
    assert {tuple(c["argv"][c["argv"].index("-j") + 1:][:1]) for c in fake.calls()
            if c["tool"] == "squeue"} == {("100",)}
    table = res.stdout
    assert table.splitlines()[0].split()[:4] == ["POINT", "LR", "WD", "STATE"]
    assert "6 points, 6 completed" in table and "1.5" in table and "25.0%" in table


def test_retry_failed_resubmits_only_the_failed_point(fake: FakeSlurm, tmp_path: Path) -> None:
    first = sweep(*GRID, "--wait")
    assert first.exit_code == 1
    assert "6 points, 5 completed" in first.stdout
    sweep_dir = sweep_dir_of(tmp_path)
    fake.reset_calls()
    again = run_cli("sweep", "--retry-failed", str(sweep_dir), "--wait")
    assert again.exit_code == 0, again.output
    (call,) = [c for c in fake.calls() if c["tool"] == "sbatch"]
    assert "--array=3" in call["argv"] and call["argv"][-1] == str(sweep_dir / "array.sbatch")
    assert "6 points, 6 completed" in again.stdout
    point = sweep_dir / "point-003"
    assert json.loads((point / "job.json").read_text())["job_id"] == "101_3"
    assert json.loads((point / "result-100_3.json").read_text())["state"] == "FAILED"
    assert json.loads((point / "result.json").read_text())["state"] == "COMPLETED"
    record = json.loads((sweep_dir / "sweep.json").read_text())
    assert [a["indices"] for a in record["arrays"]] == [[0, 1, 2, 3, 4, 5], [3]]
    nothing = run_cli("sweep", "--retry-failed", str(sweep_dir))
    assert nothing.exit_code == 0 and "no failed point" in nothing.stdout


def test_results_sorts_by_a_parameter_or_a_column_and_json(fake: FakeSlurm, tmp_path: Path) -> None:
    sweep(*GRID, "--wait")
    sweep_dir = sweep_dir_of(tmp_path)
    res = run_cli("results", str(sweep_dir), "--sort", "-lr", "--json")
    rows = json.loads(res.stdout)["rows"]
    assert [r["lr"] for r in rows] == ["0.1", "0.1", "0.05", "0.05", "0.025", "0.025"]
    assert rows[0]["final_loss"] == 1.5 and rows[0]["images_per_sec"] == 50.0
    by_state = run_cli("results", str(sweep_dir), "--sort", "state", "--csv").stdout
    assert by_state.splitlines()[1].split(",")[3] == "COMPLETED"
    assert by_state.splitlines()[-1].split(",")[3] == "FAILED"
    bad = run_cli("results", str(sweep_dir), "--sort", "loss")
    assert bad.exit_code == 2 and "columns: point, lr, wd, state" in bad.output


def test_status_cancel_and_logs_take_the_array_and_one_task(fake: FakeSlurm,
                                                            tmp_path: Path) -> None:
    fake.scenario(default={"states": [["RUNNING", 10**6], ["COMPLETED", 0]]})
    assert sweep("--param", "lr=0.1,0.2,0.3").exit_code == 0
    whole = json.loads(run_cli("status", "100", "--json").stdout)
    assert whole["state"] == "RUNNING" and whole["reason"] == "array of 3 tasks: 3 RUNNING"
    one = json.loads(run_cli("status", "100_2", "--json").stdout)
    assert one["job_id"] == "100_2" and one["state"] == "RUNNING"
    logs = run_cli("logs", "100")
    assert logs.exit_code == 2 and "an array of 3 tasks" in logs.output
    assert "hpcdl logs 100_0" in logs.output
    assert run_cli("cancel", "100_1").stdout.startswith("job 100_1: CANCELLED")
    res = run_cli("cancel", "100")
    assert res.exit_code == 0 and res.stdout.startswith("job 100: CANCELLED"), res.output
    states = {j["id"]: j.get("cancelled_at") is not None for j in fake.jobs().values()}
    assert states == {"100_0": True, "100_1": True, "100_2": True}


@pytest.mark.parametrize(("args", "words"), [
    (("--param", "momentun=0.9"), "'momentun' is not an option of the bundled example"),
    (("--param", "lr="), "param lr: empty list of values"),
    (("--param", "lr=0.1,,0.2"), "an empty value"),
    (("--param", "lr=0.1;reboot"), "is not one plain token"),
    (("--param", "data=/x"), "--data is set by hpcdl"),
    (("--param", "lr=0.1", "--param", "lr=0.2"), "'lr' given twice"),
    (("--param", "lr=1,2,3,4,5", "-p", "LIMITED"), "5 points, but partition debug allows 4 "
                                                   "(max_array_size"),
    (("--param", "lr=1,2", "--max-concurrent", "0"), "max-concurrent: 0 must be 1 or more"),
    # What one job has and an array's tasks cannot: not offered by sweep (issue 45).
    (("--param", "lr=1,2", "--chain", "3"), "No such option '--chain'"),
    (("--param", "lr=1,2", "--hang-timeout", "60"), "No such option '--hang-timeout'"),
    (("--param", "lr=1,2", "--requeue", "--signal", "USR2"), "signal"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_submitted(
        fake: FakeSlurm, tmp_path: Path, args: tuple[str, ...], words: str) -> None:
    limited = tmp_path / "limited.yaml"
    profile = yaml.safe_load((PACKAGE_DIR / "profiles" / "bundled" / "sandbox.yaml").read_text())
    profile["name"] = "limited"
    for part in profile["partitions"]:
        part["max_array_size"] = 4
    limited.write_text(yaml.safe_dump(profile))
    args = tuple(str(limited) if a == "LIMITED" else a for a in args)
    res = sweep(*args)
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and words in lines[0], res.output
    assert fake.counts()["sbatch"] == 0
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())


def limited_profile(tmp_path: Path, max_array_size: int) -> str:
    """The bundled sandbox profile with every partition's max_array_size set."""
    path = tmp_path / f"limited-{max_array_size}.yaml"
    profile = yaml.safe_load((PACKAGE_DIR / "profiles" / "bundled" / "sandbox.yaml").read_text())
    profile["name"] = "limited"
    for part in profile["partitions"]:
        part["max_array_size"] = max_array_size
    path.write_text(yaml.safe_dump(profile))
    return str(path)


@pytest.mark.parametrize("dry_run", [False, True])
def test_the_clusters_max_array_size_refuses_too_many_points_before_anything(
        fake: FakeSlurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dry_run: bool) -> None:
    # The live check on: MaxArraySize comes from the (fake) cluster's scontrol show config.
    monkeypatch.delenv("HPCDL_SKIP_LIVE_CHECK")
    fake.scenario(max_array_size=4)
    res = sweep("--param", "lr=1,2,3,4,5", *(["--dry-run"] if dry_run else []))
    assert res.exit_code == 2, res.output
    (line,) = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert ("5 points, but the cluster allows 4 (MaxArraySize = 4 in scontrol show config)"
            in line), res.output
    assert fake.counts()["sbatch"] == 0
    assert not (tmp_path / "runs").exists()
    # A profile that claims more than the cluster allows changes nothing.
    res = sweep("--param", "lr=1,2,3,4,5", "-p", limited_profile(tmp_path, 5000),
                *(["--dry-run"] if dry_run else []))
    assert res.exit_code == 2 and "MaxArraySize = 4 in scontrol" in res.output, res.output


def test_the_clusters_limit_is_read_once_and_a_stricter_profile_still_counts(
        fake: FakeSlurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HPCDL_SKIP_LIVE_CHECK")
    fake.scenario(max_array_size=4, default={"states": [["COMPLETED", 0]]})
    res = sweep("--param", "lr=1,2,3,4", "--json")  # 4 points: task ids 0-3 fit
    assert res.exit_code == 0, res.output
    configs = [c for c in fake.calls() if c["tool"] == "scontrol" and "config" in c["argv"]]
    assert len(configs) == 1 and fake.counts()["sbatch"] == 1  # planned and checked: one read
    dry = sweep("--param", "lr=1,2", "--dry-run", "--json")
    assert json.loads(dry.stdout)["size_limit"] == "at most 4 points: the cluster's MaxArraySize"
    # The profile stricter than the cluster: its limit refuses (the field named).
    res = sweep("--param", "lr=1,2,3", "-p", limited_profile(tmp_path, 2))
    assert res.exit_code == 2 and "3 points, but partition debug allows 2 (max_array_size in " \
        "profile limited" in res.output, res.output


def test_without_the_live_check_the_profile_is_the_only_limit(
        fake: FakeSlurm, tmp_path: Path) -> None:
    # No cluster to ask (a laptop's dry run; $HPCDL_SKIP_LIVE_CHECK): the profile's value.
    fake.scenario(max_array_size=2)
    dry = sweep("--param", "lr=1,2,3", "--dry-run", "--json")
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.stdout)["size_limit"] is None  # the bundled profile sets none
    assert not [c for c in fake.calls() if c["tool"] == "scontrol"]
    res = sweep("--param", "lr=1,2,3", "-p", limited_profile(tmp_path, 2), "--dry-run")
    assert res.exit_code == 2 and "allows 2 (max_array_size in profile limited" in res.output
    ok = sweep("--param", "lr=1,2", "-p", limited_profile(tmp_path, 2), "--dry-run")
    assert "# at most 2 points: the profile's max_array_size" in ok.output, ok.output


def test_submit_array_checks_the_clusters_limit_in_its_live_check(
        fake: FakeSlurm, tmp_path: Path) -> None:
    # A plan made without asking the cluster (the library's callers): the live check of
    # submit_array asks, and refuses before the sweep directory exists.
    fake.scenario(max_array_size=2)
    profile = load_profile("sandbox")
    points = params.grid([params.parse_param("n=1,2,3", known=None)])
    plan = arrays.plan_array(profile, JobRequest.of(nodes=1, gpus=1, cpus_per_task=1,
                                                 command=("echo", "{n}"), no_image=True),
                             points, sweep_dir=tmp_path / "runs" / "sweep-x")
    with pytest.raises(ValidationError, match=r"3 points, but the cluster allows 2 "
                                              r"\(MaxArraySize = 2 in scontrol show config\)"):
        arrays.submit_array(profile, plan, scheduler=SlurmScheduler("sandbox"), live_check=True)
    assert not plan.sweep_dir.exists() and fake.counts()["sbatch"] == 0


def test_a_command_sweep_fills_its_placeholders_and_appends_the_rest(fake: FakeSlurm) -> None:
    res = sweep("--param", "lr=0.1,0.2", "--param", "seed=1", "--dry-run", "--json", "--",
                "python3", "train.py", "--learning-rate={lr}")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["array"] == "0-1"
    assert data["points"][1]["launch_line"].endswith("train.py --learning-rate=0.2 --seed=1")
    assert fake.counts()["sbatch"] == 0


def test_the_points_a_grid_a_file_and_random_draws(tmp_path: Path) -> None:
    known = params.example_options()
    assert {"lr", "wd", "momentum", "arch", "max-steps"} <= known
    points = params.grid([params.parse_param("lr=0.1,0.05", known=known),
                          params.parse_param("--wd=1e-4", known=known)])
    assert [p.describe() for p in points] == ["lr=0.1 wd=1e-4", "lr=0.05 wd=1e-4"]
    drawn = params.sample(["lr=log:1e-4:1e-1", "arch=resnet18,resnet50"], 5, 7, known=known)
    assert drawn == params.sample(["lr=log:1e-4:1e-1", "arch=resnet18,resnet50"], 5, 7,
                                  known=known)
    assert all(1e-4 <= float(p.params["lr"]) <= 1e-1 for p in drawn)
    listed = tmp_path / "points.yaml"
    listed.write_text("- {lr: 0.1, wd: 0.0001}\n- {lr: 0.2, wd: 0.001}\n")
    assert [p.params for p in params.load_points(listed, known=known)] == [
        {"lr": "0.1", "wd": "0.0001"}, {"lr": "0.2", "wd": "0.001"}]
    listed.write_text("- {lr: 0.1}\n- {wd: 0.2}\n")
    with pytest.raises(ValidationError, match="point 1 names"):
        params.load_points(listed, known=known)
    with pytest.raises(ValidationError, match="LOW < HIGH"):
        params.sample(["lr=log:1:0.1"], 2, 0, known=known)


def test_the_array_spec_and_script() -> None:
    assert array_spec([0, 1, 2, 3], 2) == "0-3%2"
    assert array_spec([0, 1, 2], 5) == "0-2"
    assert array_spec([5, 3], None) == "3,5"
    assert split_task_id("123_4") == ("123", 4) and split_task_id("123") is None
    header = "#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --output=/r/p0/slurm-%j.out\n"
    other = header.replace("p0", "p1")
    text = array_script([header, other], ["/r/p 0/job.sbatch", "/r/p1/job.sbatch"],
                        ["lr=1", "lr=2"], log_dir_pattern="/r/point-%3a")
    assert "  0) exec bash '/r/p 0/job.sbatch' ;;  # lr=1" in text
    assert "#SBATCH --output=/r/point-%3a/slurm-%A_%a.out" in text
    with pytest.raises(ValidationError, match="point 1: its job differs"):
        array_script([header, other.replace("nodes=1", "nodes=2")], ["a", "b"], ["x", "y"],
                     log_dir_pattern="/r/p-%3a")


def test_requeue_and_spares_apply_per_task_and_the_dry_run_shows_them(
        fake: FakeSlurm, tmp_path: Path) -> None:
    """Each task runs its point's job.sbatch, where the requeue block and the node guard
    live: the array carries their #SBATCH lines, and each point's script names the task
    by its own id (tests/unit/jobside/test_requeue_contract.py runs that block as an array task).
    The real requeue of one task: tests/integration/test_sweep_requeue.py."""
    args = ("--param", "lr=0.1,0.05", "--requeue", "--max-restarts", "2", "--spares", "1")
    dry = sweep(*args, "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "# requeue: each task on SIGUSR2@120 checkpoints and requeues itself alone" \
        in dry.stderr and "at most 2 times" in dry.stderr
    assert "# spares: each task allocates 1 + 1 nodes" in dry.stderr
    assert "point-000/job.sbatch (point 0's job script" in dry.stderr
    # Point 0's script, shown whole: with spares its requeue goes through the node guard.
    assert "hpcdl_exclude_and_requeue && hpcdl_requeued=1 && sleep 300" in dry.stderr
    assert "hpcdl_job=${SLURM_ARRAY_JOB_ID:+" in dry.stderr
    as_json = json.loads(sweep(*args, "--dry-run", "--json").stdout)
    assert (as_json["requeue"], as_json["max_restarts"], as_json["spares"]) == (True, 2, 1)
    assert "hpcdl_supervise" in as_json["points"][1]["job_script"]
    res = sweep(*args, "--json")
    assert res.exit_code == 0, res.output
    assert fake.counts()["sbatch"] == 1
    sweep_dir = Path(json.loads(res.stdout)["sweep_dir"])
    array = (sweep_dir / "array.sbatch").read_text()
    for line in ("#SBATCH --nodes=2", "#SBATCH --signal=B:USR2@120", "#SBATCH --requeue",
                 "#SBATCH --open-mode=append", "#SBATCH --no-kill"):
        assert line in array.splitlines(), array
    for index in (0, 1):
        point = sweep_dir / f"point-00{index}"
        script = (point / "job.sbatch").read_text()
        assert 'hpcdl_job=${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_' in script
        assert f"{point}/checkpoints" in script and "--resume" in script
        plan = json.loads((point / "plan.json").read_text())
        assert (plan["requeue"], plan["max_restarts"], plan["spares"]) == (True, 2, 1)
    assert (sweep_dir / "point-001" / "job" / "bin" / "hpcdl-nodes").is_file()


def test_retry_failed_takes_no_requeue_options_of_its_own(fake: FakeSlurm,
                                                           tmp_path: Path) -> None:
    assert sweep(*GRID, "--wait").exit_code == 1
    fake.reset_calls()
    res = run_cli("sweep", "--retry-failed", str(sweep_dir_of(tmp_path)), "--requeue")
    assert res.exit_code == 2 and "--requeue and --spares included, are the sweep's" \
        in res.output and fake.counts()["sbatch"] == 0


def test_retry_failed_checks_the_failed_indices_against_max_array_size_again(
        fake: FakeSlurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The failed point keeps its index (task 3): a cluster whose MaxArraySize went down
    to 3 since the sweep takes tasks 0-2 only: refused before anything moves."""
    first = sweep(*GRID, "--wait")
    assert first.exit_code == 1 and "6 points, 5 completed" in first.stdout
    sweep_dir = sweep_dir_of(tmp_path)
    monkeypatch.delenv("HPCDL_SKIP_LIVE_CHECK")
    fake.scenario(max_array_size=3, default={"states": [["COMPLETED", 0]],
                                             "stdout": out_for(1.0)})
    fake.reset_calls()
    res = run_cli("sweep", "--retry-failed", str(sweep_dir))
    assert res.exit_code == 2, res.output
    (line,) = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert line == ("error: retry-failed: point 3 is array task 3, but the cluster allows "
                    "tasks 0-2 (MaxArraySize = 3 in scontrol show config); nothing resubmitted")
    assert fake.counts()["sbatch"] == 0
    point = sweep_dir / "point-003"
    assert (point / "result.json").is_file() and not list(point.glob("result-*.json"))
    assert json.loads((point / "job.json").read_text())["job_id"] == "100_3"
    fake.scenario(max_array_size=4, default={"states": [["COMPLETED", 0]],
                                             "stdout": out_for(1.0)})
    again = run_cli("sweep", "--retry-failed", str(sweep_dir), "--wait")
    assert again.exit_code == 0 and "6 points, 6 completed" in again.stdout, again.output
    assert [c for c in fake.calls() if c["tool"] == "scontrol" and "config" in c["argv"]]
