"""The job lifecycle against the fake Slurm (tests/fakeslurm): submit, follow, the
report of a crashed rank, timeouts, cancellation, logs and sweeps, in milliseconds.
The same paths run against the real sandbox in tests/integration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcdl.cli import cli
from hpcdl.errors import ToolError
from hpcdl.jobs.follow import Backoff, FollowTimeout, Watcher, follow
from hpcdl.schedulers.base import JobStatus
from hpcdl.schedulers.slurm.adapter import SlurmScheduler
from tests.fakeslurm.fixture import FakeSlurm

RESULT = {"world_size": 4, "nodes": 2, "backend": "horovod", "images_per_sec": 123.5,
          "images_per_sec_per_rank": 30.9, "wall_time": 1.5}
GOOD_OUT = ("0: epoch 1/1 loss 2.3\n"
            + "".join(f"{r}: hpcdl_rank_checksum rank={r} host=n{1 + r // 2} checksum=abc123\n"
                      for r in range(4))
            + "0: " + json.dumps({"hpcdl_result": RESULT}) + "\n")
CRASH_ERR = ("3: Traceback (most recent call last):\n"
             "3:   File \"train.py\", line 9, in <module>\n"
             "3: RuntimeError: CUDA error: an illegal memory access\n"
             "srun: error: n2: task 3: Exited with exit code 1\n"
             "srun: error: n1: tasks 0-2: Killed\n")


def run_cli(*args: str):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert "Traceback (most recent call last):\n  File" not in result.output
    return result


@pytest.fixture
def fake(fake_slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeSlurm:
    monkeypatch.setenv("HPCDL_SKIP_LIVE_CHECK", "1")
    # submit refuses a relative script that does not exist where it is submitted from.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('never run: the fake Slurm runs nothing')\n")
    # Fast polling: the fake's clock is its squeue calls, not seconds.
    monkeypatch.setattr("hpcdl.jobs.follow.MIN_INTERVAL_S", 0.01)
    monkeypatch.setattr("hpcdl.jobs.follow.LOG_READ_S", 0.0)
    fake_slurm.scenario(
        default={"states": [["PENDING", 1], ["RUNNING", 2], ["COMPLETED", 0]],
                 "stdout": GOOD_OUT},
        jobs={"crash": {"states": [["RUNNING", 2], ["FAILED", 0]], "exit": "1:0",
                        "stdout": "0: epoch 1/1\n", "stderr": CRASH_ERR},
              "slow": {"states": [["RUNNING", 2], ["TIMEOUT", 0]], "exit": "0:0"},
              "forever": {"states": [["RUNNING", 10**6], ["COMPLETED", 0]]}},
        sacct_lag=2)
    return fake_slurm


def submit_wait(*extra: str):
    return run_cli("submit", "-p", "sandbox", "-N", "2", "-G", "2", "-c", "1", *extra,
                   "--wait", "--", "python3", "train.py")


def test_submit_wait_reports_the_result_and_writes_result_json(fake: FakeSlurm) -> None:
    res = submit_wait("-J", "good")
    assert res.exit_code == 0, res.output
    assert "job 100: COMPLETED (Slurm COMPLETED), exit code 0" in res.stdout
    assert "images/sec           123.5" in res.stdout
    assert "parameters identical on every rank" in res.stdout
    run_dir = Path(res.stdout.split("run directory: ")[1].strip())
    record = json.loads((run_dir / "result.json").read_text())
    assert record["state"] == "COMPLETED" and record["exit_code"] == 0
    assert record["hpcdl_result"] == RESULT
    assert [r["rank"] for r in record["ranks"]] == [0, 1, 2, 3]
    assert json.loads((run_dir / "job.json").read_text())["job_id"] == "100"


def test_a_crashed_rank_is_named_with_its_last_lines(fake: FakeSlurm) -> None:
    res = submit_wait("-J", "crash")
    assert res.exit_code == 1, res.output
    assert "job 100: FAILED (Slurm FAILED), exit code 1" in res.stdout
    assert "--- the job failed: rank 3 on n2: Exited with exit code 1 ---" in res.stdout
    assert "  RuntimeError: CUDA error: an illegal memory access" in res.stdout
    assert "ranks 0,1,2 stopped after that (srun --kill-on-bad-exit)" in res.stdout
    run_dir = Path(res.stdout.split("run directory: ")[1].strip())
    record = json.loads((run_dir / "result.json").read_text())
    assert record["failed_ranks"] == [3] and record["hpcdl_result"] is None


def test_a_job_over_its_time_limit_is_timeout_exit_124(fake: FakeSlurm) -> None:
    res = submit_wait("-J", "slow", "--json")
    assert res.exit_code == 124  # as timeout(1): "give it more time", not a crash
    out = json.loads(res.stdout)
    assert out["state"] == "TIMEOUT" and out["exit_status"] == 124
    # A custom COMMAND without --requeue may never record its steps: hpcdl cannot tell.
    assert out["steps_completed"] is None


def test_sbatch_refusal_is_one_line_and_recorded(fake: FakeSlurm) -> None:
    fake.scenario(refuse="Requested node configuration is not available")
    res = run_cli("submit", "-p", "sandbox", "-G", "2", "--", "true")
    assert res.exit_code == 1
    assert "sbatch refused the job: sbatch: error: Batch job submission failed: Requested " \
           "node configuration is not available" in res.stderr
    (run_dir,) = (Path(fake.root).parent / "runs").iterdir()
    assert json.loads((run_dir / "result.json").read_text())["state"] == "REFUSED"


def test_cancel_ends_a_running_job(fake: FakeSlurm) -> None:
    sub = run_cli("submit", "-p", "sandbox", "-G", "0", "-J", "forever", "--json", "--", "true")
    job_id = json.loads(sub.stdout)["job_id"]
    res = run_cli("cancel", job_id)
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() == f"job {job_id}: CANCELLED (Slurm CANCELLED)"
    again = run_cli("cancel", job_id)
    assert again.exit_code == 1 and "already ended (CANCELLED)" in again.stderr


def test_follow_gives_up_at_its_timeout_with_the_state(fake: FakeSlurm) -> None:
    sub = run_cli("submit", "-p", "sandbox", "-G", "0", "-J", "forever", "--json", "--", "true")
    job_id = json.loads(sub.stdout)["job_id"]
    now = [0.0]
    watcher = Watcher(SlurmScheduler(), clock=lambda: now[0],
                      sleep=lambda s: now.__setitem__(0, now[0] + s))
    with pytest.raises(FollowTimeout) as err:
        follow(job_id, scheduler=SlurmScheduler(), timeout=60, watcher=watcher)
    assert err.value.message == f"job {job_id}: still RUNNING after 60 s"
    assert err.value.hint == f"hpcdl status {job_id}; hpcdl cancel {job_id}"
    assert now[0] == pytest.approx(60)


def test_an_unknown_job_is_a_one_line_error(fake: FakeSlurm) -> None:
    with pytest.raises(ToolError, match="job 4242: unknown to the scheduler"):
        follow("4242", scheduler=SlurmScheduler())


def test_logs_follow_prints_everything_until_the_end(fake: FakeSlurm) -> None:
    sub = run_cli("submit", "-p", "sandbox", "-G", "0", "-J", "crash", "--json", "--", "true")
    job_id = json.loads(sub.stdout)["job_id"]
    res = run_cli("logs", "-f", job_id)
    assert res.exit_code == 0, res.output
    assert res.stdout == "0: epoch 1/1\n"
    assert res.stderr == CRASH_ERR


def test_one_batched_query_per_cycle_for_many_jobs(fake: FakeSlurm) -> None:
    for i in range(20):
        assert run_cli("submit", "-p", "sandbox", "-G", "0", "-J", f"many-{i}", "--",
                       "true").exit_code == 0
    ids = sorted(fake.jobs())
    fake.reset_calls()
    watcher = Watcher(SlurmScheduler(), sleep=lambda s: None)
    done = watcher.watch(ids)
    assert sorted(done) == ids and {s.state for s in done.values()} == {"COMPLETED"}
    assert all(s.exit_code == 0 for s in done.values())
    calls = fake.calls()
    counts = fake.counts()
    assert counts["squeue"] == watcher.cycles and set(counts) <= {"squeue", "sacct"}
    assert counts["sacct"] <= watcher.cycles
    assert all(call["argv"][call["argv"].index("-j") + 1] for call in calls)
    assert ",".join(ids) in calls[0]["argv"], "the first poll asks about all jobs at once"


def test_jobs_squeue_has_forgotten_are_answered_by_one_sacct(fake: FakeSlurm) -> None:
    # squeue forgets ended jobs at once and sacct shows its placeholder for 2 polls:
    # the watcher keeps asking (squeue + one sacct per cycle) until the real row.
    fake.scenario(default={"states": [["RUNNING", 1], ["FAILED", 0]], "exit": "3:0"},
                  min_job_age=-1, sacct_lag=2)  # -1: gone from squeue as it ends
    for i in range(3):
        run_cli("submit", "-p", "sandbox", "-G", "0", "-J", f"gone-{i}", "--", "true")
    ids = sorted(fake.jobs())
    fake.reset_calls()
    watcher = Watcher(SlurmScheduler(), sleep=lambda s: None)
    done = watcher.watch(ids)
    assert {(s.state, s.exit_code, s.source) for s in done.values()} == {("FAILED", 3, "sacct")}
    counts = fake.counts()
    assert counts["squeue"] == watcher.cycles and 1 <= counts["sacct"] <= watcher.cycles
    assert all(",".join(ids) in call["argv"] for call in fake.calls() if call["tool"] == "sacct")


def test_backoff_grows_while_quiet_and_resets_on_change() -> None:
    b = Backoff(minimum=0.5, maximum=4.0, factor=2.0)
    assert [b.next(False) for _ in range(5)] == [1.0, 2.0, 4.0, 4.0, 4.0]
    assert b.next(True) == 0.5


def test_watcher_reports_changes_and_waits_for_the_exit_code() -> None:
    # sacct lags: the first final status has no exit code; the watcher asks again.
    answers = [{"1": JobStatus("1", "j", "RUNNING", "RUNNING")},
               {"1": JobStatus("1", "j", "COMPLETED", "COMPLETED")},
               {"1": JobStatus("1", "j", "COMPLETED", "COMPLETED", exit_code=0, signal=0)}]

    class Scripted:
        def statuses(self, ids: list[str]) -> dict[str, JobStatus]:
            return answers.pop(0)

        def may_come_back(self, status: JobStatus) -> bool:
            return False

    sleeps: list[float] = []
    seen: list[tuple[str, int | None]] = []
    done = Watcher(Scripted(), sleep=sleeps.append).watch(  # type: ignore[arg-type]
        ["1"], on_change=lambda s: seen.append((s.state, s.exit_code)))
    assert done["1"].exit_code == 0
    assert seen == [("RUNNING", None), ("COMPLETED", None), ("COMPLETED", 0)]
    assert len(sleeps) == 2 and answers == []


def test_scale_wait_follows_every_point_and_writes_the_table(fake: FakeSlurm) -> None:
    res = run_cli("scale", "-p", "sandbox", "-N", "1,2", "-G", "1,2", "--synthetic", "-c", "1",
                  "--wait")
    assert res.exit_code == 0, res.output
    assert res.stderr.count("submitted horovod-n") == 4
    assert "[4/4] horovod-n2-g2: 123.5 img/s" in res.stderr
    table = res.stdout.splitlines()
    assert table[0].split()[:6] == ["backend", "batch", "nodes", "gpus/node", "ranks", "state"]
    assert sum(" COMPLETED " in line for line in table) == 4
    sweep_dir = Path(res.stdout.split("wrote ")[1].split(",")[0]).parent
    assert sorted(p.name for p in sweep_dir.iterdir() if p.is_file()) == [
        "results.csv", "results.json", "scaling.png", "sweep.json"]
    record = json.loads((sweep_dir / "sweep.json").read_text())
    jobs = fake.jobs()
    # One after another (singleton), each point's run directory as planned.
    assert all(job["dependency"] == "singleton" for job in jobs.values())
    for point in record["points"]:
        script = (sweep_dir / point["run_dir"] / "job.sbatch").read_text()
        plan = json.loads((sweep_dir / point["run_dir"] / "plan.json").read_text())
        assert plan["script"] == script and plan["run_dir"] == str(sweep_dir / point["run_dir"])
    # Following 4 jobs took no more than 2 Slurm queries per poll.
    counts = fake.counts()
    assert counts["sacct"] <= counts["squeue"]


def test_results_refresh_asks_once_for_all_points(fake: FakeSlurm) -> None:
    res = run_cli("scale", "-p", "sandbox", "-N", "1,2", "-G", "1", "--synthetic", "-c", "1",
                  "--json")
    sweep_dir = Path(json.loads(res.stdout)["sweep_dir"])
    fake.reset_calls()
    first = run_cli("results", str(sweep_dir), "--json")
    assert first.exit_code == 0, first.output
    assert fake.counts()["squeue"] == 1, fake.calls()
    states = [r["state"] for r in json.loads(first.stdout)["rows"]]
    assert states == ["RUNNING", "RUNNING"]  # the fake: pending for one poll


# --- requeue: attempts, following through requeues, chains -------------------------

def requeue_scenario(fake: FakeSlurm, states: list[list[object]], **job: object) -> None:
    fake.scenario(default={"states": states, "stdout": GOOD_OUT, **job}, sacct_lag=1)


def test_wait_follows_a_job_through_two_preemptions(fake: FakeSlurm, tmp_path: Path) -> None:
    requeue_scenario(fake, [["PENDING", 1], ["RUNNING", 2], ["PREEMPTED", 1], ["PENDING", 1],
                            ["RUNNING", 2], ["PREEMPTED", 1], ["PENDING", 1], ["RUNNING", 2],
                            ["COMPLETED", 0]])
    run = tmp_path / "runs" / "rq"
    # What the batch script writes when its step ends (templates/sbatch.sh.j2).
    res = submit_wait("--requeue", "--run-dir", str(run))
    assert res.exit_code == 0, res.output
    assert "3 attempts" in res.output
    lines = res.output.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("--- 3 attempts"))
    table = [ln.split() for ln in lines[at + 2:at + 5]]
    assert [(row[0], row[2]) for row in table] == [("0", "PREEMPTED"), ("1", "PREEMPTED"),
                                                   ("2", "COMPLETED")]
    saved = json.loads((run / "attempts.json").read_text())["attempts"]
    assert [a["reason"] for a in saved] == ["PREEMPTED", "PREEMPTED", "COMPLETED"]


def test_script_record_names_a_self_requeued_time_limit(fake: FakeSlurm, tmp_path: Path) -> None:
    requeue_scenario(fake, [["RUNNING", 2], ["REQUEUED", 1], ["PENDING", 1], ["RUNNING", 2],
                            ["COMPLETED", 0]])
    run = tmp_path / "runs" / "rq"
    submitted = run_cli("submit", "-p", "sandbox", "-N", "2", "-G", "2", "-c", "1", "--requeue",
                        "--run-dir", str(run), "--json", "--", "python3", "train.py")
    job = json.loads(submitted.output)["job_id"]
    # The batch script's own line for attempt 0: it stopped on the signal near the limit.
    (run / "attempts.tsv").write_text(f"{job}\t0\t100\t160\t85\tTIMEOUT\n")
    waited = run_cli("status", job, "--json")
    while json.loads(waited.output)["state"] != "COMPLETED":
        waited = run_cli("status", job, "--json")
    data = json.loads(waited.output)
    assert [(a["number"], a["reason"]) for a in data["attempts"]] == [(0, "TIMEOUT"),
                                                                     (1, "COMPLETED")]
    assert data["attempts"][0]["exit_code"] == 85
    text = run_cli("status", job).output
    assert "2 attempts (requeued):" in text and "TIMEOUT" in text


def test_a_node_failure_keeps_slurms_reason(fake: FakeSlurm, tmp_path: Path) -> None:
    requeue_scenario(fake, [["RUNNING", 1], ["NODE_FAIL", 1], ["PENDING", 1], ["RUNNING", 1],
                            ["FAILED", 0]], exit="85:0")
    res = submit_wait("--requeue", "--max-restarts", "1", "--json")
    data = json.loads(res.output.strip().splitlines()[-1])
    assert res.exit_code == 85
    assert [a["reason"] for a in data["attempts"]] == ["NODE_FAIL", "FAILED"]


def test_chain_submits_linked_jobs_into_one_run_dir(fake: FakeSlurm, tmp_path: Path) -> None:
    run = tmp_path / "runs" / "ch"
    res = submit_wait("--chain", "3", "--run-dir", str(run), "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output.strip().splitlines()[-1])
    first, second, third = data["chain"]
    jobs = fake.jobs()
    assert jobs[first]["dependency"] is None
    assert jobs[second]["dependency"] == f"afterany:{first}"
    assert jobs[third]["dependency"] == f"afterany:{second}"
    record = json.loads((run / "job.json").read_text())
    assert record["job_id"] == first and record["chain"] == [first, second, third]
    script = (run / "job.sbatch").read_text()
    assert "#SBATCH --signal=B:USR2@120" in script and "#SBATCH --requeue" not in script
    assert "scontrol requeue" not in script
    # `hpcdl results` counts the run once, whichever job of the chain it is asked about.
    from hpcdl.jobs.rundir import find_run
    assert find_run(third) == find_run(first)
