"""hpcdl.cli.display's job-end sections, each a pure function of the job's facts (the
whole print_job_end is exercised in tests/unit/jobs/test_timelimit.py and
test_attempts.py)."""

from __future__ import annotations

from pathlib import Path

from hpcdl.cli import display
from hpcdl.jobs.attempts import Attempt
from hpcdl.jobs.result import JobLogs
from hpcdl.jobs.rundir import RunDir
from hpcdl.jobside.hangdiag import Diagnosis
from hpcdl.jobside.protocol import probe_line
from hpcdl.schedulers.base import JobStatus
from hpcdl.schedulers.registry import scheduler_for


def _status(state: str = "FAILED", code: int | None = 1, sig: int | None = None) -> JobStatus:
    return JobStatus("42", "hpcdl-x", state, state, code, sig, "n[1-2]", "00:01:27", "00:10:00",
                     "debug", "", "sacct")


LOGS = JobLogs(Path("/r/o.log"), Path("/r/e.log"), "a\nb\nc\n", "x\ny\n")


def test_status_line_names_the_schedulers_word_and_an_unknown_exit_code():
    slurm = scheduler_for("slurm")
    assert display.status_line(_status(), slurm) == (
        "job 42: FAILED (Slurm FAILED), exit code 1, elapsed 00:01:27")
    assert display.status_line(_status("CANCELLED", None, 9), slurm) == (
        "job 42: CANCELLED (Slurm CANCELLED), exit code ?, signal 9, elapsed 00:01:27")


def test_log_tails_show_stderr_only_for_an_untraced_failure():
    both = display.log_tail_lines(_status(), LOGS, 2, crashed=[], probe=False)
    assert both == ["--- last 2 lines of stdout (/r/o.log) ---", "b", "c",
                    "--- last 2 lines of stderr (/r/e.log) ---", "x", "y"]
    traced = display.log_tail_lines(_status(), LOGS, 2, crashed=["rank 0"], probe=False)
    assert traced == both[:3]
    done = display.log_tail_lines(_status("COMPLETED", 0), LOGS, 20, crashed=[], probe=False)
    assert done == ["--- last 3 lines of stdout (/r/o.log) ---", "a", "b", "c"]


def test_log_tails_leave_out_the_probes_json_line():
    logs = JobLogs(Path("/o"), Path("/e"), probe_line({"node": "n1"}) + "\nok\n", "")
    assert display.log_tail_lines(_status("COMPLETED", 0), logs, 20, crashed=[], probe=True) == [
        "--- last 1 lines of stdout (/o) ---", "ok"]


def test_crash_lines():
    assert display.crash_lines(_status(), LOGS, []) == []
    assert display.crash_lines(_status(), LOGS, ["rank 1 on n2: RuntimeError", "  boom"]) == [
        "--- the job failed: rank 1 on n2: RuntimeError ---", "  boom",
        "full logs: hpcdl logs 42 (or /r/e.log)"]


def test_outcome_lines_say_why_a_probe_stopped_the_job(tmp_path: Path):
    run = RunDir(tmp_path)
    assert display.outcome_lines(_status(), run, {"hpcdl_result": None}, False) == []
    probe = {"verdict": {"bad": True, "message": "slow node n2"}, "nodes": ["n1", "n2"],
             "allreduce": [], "pairs": []}
    out = display.outcome_lines(_status(), run, {"hpcdl_result": None, "probe": probe}, True)
    assert out[0] == f"--- probe ({run.result_file}: probe) ---"
    assert out[-1] == "--- the probe found a slow node or link: the job stopped (exit 1) ---"


def test_history_lines_in_order(tmp_path: Path):
    run = RunDir(tmp_path)
    hang = Diagnosis("42", 60.0, 30.0, "rank 1 is stuck in allreduce", (), (), cancelled=True)
    attempts = [Attempt(0, "42", "NODE_FAIL", "", "s", "e", None)]
    out = display.history_lines(run, hang, attempts, [], [{"node": "n3", "why": "slow"}])
    assert out[:2] == [f"--- stopped by the hang watchdog ({run.hang_text}) ---",
                       "rank 1 is stuck in allreduce"]
    assert out[2] == f"--- 1 attempt ({run.attempts_file}) ---"
    assert out[-1] == display.excluded_line([{"node": "n3", "why": "slow"}])
    assert display.history_lines(run, None, [], [], None) == []
