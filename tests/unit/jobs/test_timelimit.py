"""A job that ran out of time: the one line `submit --wait` and `status` print, the
time limit in the status table, and submit --wait's exit code for it."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from hpcdl.cli import cli, display
from hpcdl.jobs.result import JobLogs
from hpcdl.jobs.submit import exit_status
from hpcdl.jobs.timelimit import (
    EXIT_TIMEOUT,
    clock_text,
    ran_out_of_time,
    run_steps_seen,
    steps_seen,
    timeout_message,
)
from hpcdl.schedulers.base import JobStatus
from hpcdl.schedulers.slurm.adapter import SlurmScheduler
from hpcdl.schedulers.slurm.parse import parse_sacct, parse_squeue

SLURM = SlurmScheduler()
STDERR_TIMEOUT = ("slurmstepd: error: *** JOB 42 ON n1 CANCELLED AT 2026-11-23T18:01:07 "
                  "DUE TO TIME LIMIT ***\n")


def status(state: str = "TIMEOUT", slurm: str = "TIMEOUT", limit: str = "00:01:00",
           elapsed: str = "00:01:27", partition: str = "debug", code: int | None = 0,
           sig: int | None = 15) -> JobStatus:
    return JobStatus("42", "hpcdl-horovod", state, slurm, code, sig, "n[1-2]", elapsed, limit,
                     partition, "", "sacct")


@pytest.mark.parametrize("raw, text", [
    ("00:01:00", "00:01:00"), ("1:00", "00:01:00"), ("10:00", "00:10:00"),
    ("1:00:00", "01:00:00"), ("1-00:00:00", "1-00:00:00"), ("UNLIMITED", "infinite"),
    ("1:25", "00:01:25"), ("0:00", "0:00"), ("Partition_Limit", "Partition_Limit"), ("", ""),
])
def test_clock_text_reads_squeue_and_sacct_forms(raw, text):
    assert clock_text(raw) == text


def test_timeout_line_names_the_limit_and_the_fixes():
    line = timeout_message(status(), max_time="00:30:00", scheduler=SLURM)
    assert line == (
        "job 42 hit its time limit of 00:01:00 after 00:01:27 (Slurm TIMEOUT): give it more "
        "with --time (partition debug allows up to 00:30:00), or make it shorter (fewer "
        "steps: -X --max-steps=N, -X --epochs=N), or let it continue: --requeue (checkpoint, "
        "requeue, resume) or --chain N where requeue is off")
    assert "\n" not in line


def test_squeue_limit_form_and_no_partition_limit_known():
    line = timeout_message(status(limit="10:00", elapsed="10:00"), scheduler=SLURM)
    assert line is not None
    assert line.startswith("job 42 hit its time limit of 00:10:00 after 00:10:00 (Slurm TIMEOUT): "
                           "give it more with --time, or make it shorter")


def test_at_the_partitions_maximum_it_says_so():
    line = timeout_message(status(limit="00:30:00"), max_time="00:30:00", scheduler=SLURM)
    assert line is not None
    assert "(already partition debug's maximum: choose a partition with a longer one)" in line
    unlimited = timeout_message(status(limit="02:00:00"), max_time="infinite", scheduler=SLURM)
    assert unlimited is not None and "allows up to infinite" in unlimited


def test_deadline_and_cancelled_due_to_time_limit():
    line = timeout_message(status(slurm="DEADLINE"), scheduler=SLURM)
    assert line is not None
    assert line.startswith("job 42 reached its deadline after 00:01:27 (Slurm DEADLINE): "
                           "set a later one, or make it shorter")
    # The state read while slurmctld was still ending the job; its stderr already says why.
    early = status(state="CANCELLED", slurm="CANCELLED")
    assert ran_out_of_time(early, STDERR_TIMEOUT, scheduler=SLURM)
    assert timeout_message(early, STDERR_TIMEOUT, scheduler=SLURM) is not None
    assert "its time limit of 00:01:00" in (timeout_message(early, STDERR_TIMEOUT, scheduler=SLURM) or "")


@pytest.mark.parametrize("state, slurm", [("COMPLETED", "COMPLETED"), ("FAILED", "FAILED"),
                                          ("CANCELLED", "CANCELLED by 0"),
                                          ("RUNNING", "RUNNING")])
def test_other_jobs_get_no_line(state, slurm):
    assert timeout_message(status(state=state, slurm=slurm), "some error\n", scheduler=SLURM) is None


def test_submit_wait_exit_code_for_a_timeout_is_124():
    assert EXIT_TIMEOUT == 124
    assert exit_status(status()) == 124
    assert exit_status(status(code=None, sig=None)) == 124
    # Not a timeout: the job's own code, as before.
    assert exit_status(status(state="CANCELLED", slurm="CANCELLED", code=0, sig=15)) == 143
    assert exit_status(status(state="FAILED", slurm="FAILED", code=3, sig=0)) == 3


def test_submit_help_documents_the_timeout_exit_code():
    res = CliRunner().invoke(cli, ["submit", "--help"])
    assert "124 when it hit its time limit" in " ".join(res.output.split())


def test_submit_wait_report_ends_with_the_timeout_line(tmp_path, monkeypatch):
    err = STDERR_TIMEOUT + "srun: error: n1: task 0: Terminated\n"
    logs = JobLogs(tmp_path / "o", tmp_path / "e", " 0: epoch 1/90 ...\n", err)
    lines: list[str] = []
    monkeypatch.setattr(display, "echo", lambda m="", **_: lines.append(m))
    display.print_job_end(status(), tmp_path, logs, {"hpcdl_result": None}, max_time="00:30:00")
    assert lines[0].startswith("job 42: TIMEOUT (Slurm TIMEOUT)")
    assert lines[-2].startswith("job 42 hit its time limit of 00:01:00 after 00:01:27")
    assert "partition debug allows up to 00:30:00" in lines[-2]
    assert lines[-1] == f"run directory: {tmp_path}"
    # Slurm terminated the ranks: not reported as a crash; stderr's tail says why.
    assert not any("the job failed" in line for line in lines)
    assert any("DUE TO TIME LIMIT" in line for line in lines)
    assert sum("hit its time limit" in line for line in lines) == 1
    done: list[str] = []
    monkeypatch.setattr(display, "echo", lambda m="", **_: done.append(m))
    display.print_job_end(status(state="COMPLETED", slurm="COMPLETED", sig=0), tmp_path, logs,
                   {"hpcdl_result": None})
    assert not any("time limit" in line for line in done)


def test_status_table_shows_the_limit_and_the_timeout_line(monkeypatch):
    from hpcdl.schedulers.slurm import query

    row = parse_sacct("42|TIMEOUT|0:15|n[1-2]|00:01:27|00:01:00|debug|hpcdl-horovod\n")[0]
    monkeypatch.setattr(query, "job_status", lambda job_id, settle_s=0, ex=None: row)
    res = CliRunner().invoke(cli, ["status", "42"])
    assert res.exit_code == 0, res.output
    header, line, hint = res.output.splitlines()
    assert "TIMELIMIT" in header.split()
    assert line.split()[:8] == ["42", "TIMEOUT", "TIMEOUT", "0/sig15", "debug", "n[1-2]",
                                "00:01:27", "00:01:00"]
    assert hint.startswith("job 42 hit its time limit of 00:01:00 after 00:01:27")


def test_status_list_shows_each_jobs_limit(monkeypatch):
    from hpcdl.schedulers.slurm import query

    rows = parse_squeue("7|RUNNING|None|n1|0:05|10:00|debug|a\n"
                        "8|PENDING|Priority||0:00|1-00:00:00|gpu|b\n")
    monkeypatch.setattr(query, "list_jobs", lambda since, all_users, ex=None: rows)
    res = CliRunner().invoke(cli, ["status"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert "TIMELIMIT" in lines[0]
    assert "00:10:00" in lines[1].split() and "1-00:00:00" in lines[2].split()
    assert len(lines) == 3  # no timeout line for jobs that did not time out


# ---- a job that never completed a step: it looks hung, not short of time ----------

def test_no_step_before_the_limit_looks_hung_not_short_of_time():
    line = timeout_message(status(limit="00:10:00", elapsed="00:10:04"), max_time="01:00:00",
                           steps=False, nodes=2, scheduler=SLURM)
    assert line == (
        "job 42 hit its time limit of 00:10:00 after 00:10:04 (Slurm TIMEOUT) without "
        "completing a single training step: it looks hung, not short of time; rerun with "
        "--hang-timeout SECONDS to get every rank's stack when it stops making "
        "progress and `hpcdl probe -N 2` to test the nodes' links")
    one_node = timeout_message(status(), steps=False, scheduler=SLURM)
    assert one_node is not None and "--hang-timeout SECONDS" in one_node
    assert "hpcdl probe" not in one_node and "--time" not in one_node
    deadline = timeout_message(status(slurm="DEADLINE"), steps=False, scheduler=SLURM)
    assert deadline is not None and deadline.startswith("job 42 hit its deadline after 00:01:27")


@pytest.mark.parametrize("steps", [True, None])
def test_steps_done_or_unknown_keep_the_time_line(steps):
    line = timeout_message(status(), max_time="00:30:00", steps=steps, nodes=2, scheduler=SLURM)
    assert line is not None and "give it more with --time" in line and "hung" not in line


def test_steps_seen_claims_no_step_only_for_a_command_that_records_them():
    assert steps_seen(records_steps=True, progress_exists=True) is True
    assert steps_seen(records_steps=False, progress_exists=True) is True
    assert steps_seen(records_steps=True, progress_exists=False) is False
    assert steps_seen(records_steps=False, progress_exists=False) is None  # cannot tell


def _run_dir(tmp_path, records_steps, progress):
    import json

    from hpcdl.jobs.rundir import RunDir

    run = RunDir(tmp_path)
    (tmp_path / "plan.json").write_text(json.dumps(
        {"nodes": 2, "gpus_per_node": 1, "ntasks": 2, "records_steps": records_steps}))
    if progress:
        run.progress.write_text('{"attempt": 0, "step": 1}\n')
    return run


@pytest.mark.parametrize("records, progress, seen", [
    (True, False, False), (True, True, True), (False, False, None), (False, True, True)])
def test_run_dir_reads_steps_from_plan_and_progress(tmp_path, records, progress, seen):
    assert run_steps_seen(_run_dir(tmp_path, records, progress)) is seen


def test_run_dir_without_a_plan_cannot_tell(tmp_path):
    from hpcdl.jobs.rundir import RunDir

    assert run_steps_seen(RunDir(tmp_path)) is None


def test_submit_wait_report_says_hung_when_no_step(tmp_path, monkeypatch):
    logs = JobLogs(tmp_path / "o", tmp_path / "e", "", STDERR_TIMEOUT)
    lines: list[str] = []
    monkeypatch.setattr(display, "echo", lambda m="", **_: lines.append(m))
    display.print_job_end(status(), tmp_path, logs, {"hpcdl_result": None}, max_time="00:30:00",
                   steps=False, nodes=2)
    assert lines[-2].startswith("job 42 hit its time limit of 00:01:00 after 00:01:27 "
                                "(Slurm TIMEOUT) without completing a single training step")
    assert not any("give it more" in line for line in lines)


def test_status_says_hung_from_the_run_directory(tmp_path, monkeypatch):
    from hpcdl.jobs import rundir
    from hpcdl.schedulers.slurm import query

    row = parse_sacct("42|TIMEOUT|0:15|n[1-2]|00:01:27|00:01:00|debug|hpcdl-horovod\n")[0]
    monkeypatch.setattr(query, "job_status", lambda job_id, settle_s=0, ex=None: row)
    monkeypatch.setattr(query, "history", lambda job_id, ex=None: [])
    run = _run_dir(tmp_path, True, False)
    monkeypatch.setattr(rundir, "find_run", lambda job_id, root=None: run)
    res = CliRunner().invoke(cli, ["status", "42"])
    assert res.exit_code == 0, res.output
    hint = res.output.splitlines()[2]
    assert "without completing a single training step: it looks hung" in hint
    assert "hpcdl probe -N 2" in hint
    assert json.loads(CliRunner().invoke(cli, ["status", "42", "--json"]).output)[
        "steps_completed"] is False
    run.progress.write_text("")  # a custom script may only touch it
    res = CliRunner().invoke(cli, ["status", "42"])
    assert "give it more with --time" in res.output.splitlines()[2]
    assert json.loads(CliRunner().invoke(cli, ["status", "42", "--json"]).output)[
        "steps_completed"] is True
