"""A requeued job's attempts as the batch script records them (attempts.tsv) and the
one line for a last attempt that completed no training step (hpcdl/jobs/attempts.py)."""

from __future__ import annotations

import pytest

from hpcdl.jobs.attempts import (
    Attempt,
    ScriptAttempt,
    from_script,
    join,
    no_step_message,
    stderr_cause,
)
from hpcdl.schedulers.base import JobStatus
from hpcdl.schedulers.slurm.adapter import SlurmScheduler

# What a job whose container could not start leaves in its stderr (srun --label).
STDERR = ("0: FATAL:   could not open image /images/gone.sif: failed to retrieve path for "
          "/images/gone.sif: lstat /images/gone.sif: no such file or directory\n"
          "srun: error: n1: task 0: Exited with exit code 255\n"
          "hpcdl: attempt 0 failed before its first step: exit 255 (STARTUP); not requeued "
          "(another attempt would fail the same way; the cause is above)\n")
SLURM = SlurmScheduler()


def attempt(reason: str, code: int | None = 255, number: int = 0) -> Attempt:
    return Attempt(number, "42", "FAILED", reason, "t0", "t1", code)


@pytest.mark.parametrize("cause", ["STARTUP", "STALLED", "FAILED", "PREEMPTED"])
def test_script_lines_carry_every_cause(cause):
    line = f"42\t0\t100\t104\t255\t{cause}\n"
    parsed = ScriptAttempt.parse(line)
    assert parsed == ScriptAttempt("42", 0, 100, 104, 255, cause)
    row = JobStatus("42", "j", "FAILED", "FAILED", 255, 0, "n1", "00:00:04", "00:10:00",
                    "debug", "", "sacct")
    assert join([row], [parsed], scheduler=SLURM)[0].reason == cause  # the script's word wins
    assert from_script([parsed])[0].reason == cause


def test_stderr_cause_is_the_last_line_that_says_what_went_wrong():
    assert stderr_cause(STDERR, scheduler=SLURM) == ("FATAL:   could not open image /images/gone.sif: failed "
                                    "to retrieve path for /images/gone.sif: lstat "
                                    "/images/gone.sif: no such file or directory")
    assert stderr_cause("1: ModuleNotFoundError: No module named 'horovod'\n\n", scheduler=SLURM) == (
        "ModuleNotFoundError: No module named 'horovod'")
    assert stderr_cause("srun: error: n1: task 0: Exited with exit code 1\n", scheduler=SLURM) is None
    # A rank's own hpcdl line is a cause; the batch shell's (no rank label) is not.
    assert stderr_cause("0: hpcdl: command not found: trian.py (rank 0 on n1)\n"
                        "srun: error: n1: task 0: Exited with exit code 127\n"
                        "hpcdl: attempt 0 failed before its first step: exit 127\n", scheduler=SLURM) == (
        "hpcdl: command not found: trian.py (rank 0 on n1)")
    assert stderr_cause("0: slurmstepd-n1: error: *** STEP 3.0 ON n1 CANCELLED ***\n", scheduler=SLURM) is None
    assert stderr_cause("", scheduler=SLURM) is None


def test_a_start_up_failure_is_one_line_with_its_cause():
    line = no_step_message([attempt("STARTUP")], STDERR, scheduler=SLURM)
    assert line == ("attempt 0 failed before its first step (exit 255): not requeued; the "
                    "cause is in the job's stderr: FATAL:   could not open image "
                    "/images/gone.sif: failed to retrieve path for /images/gone.sif: lstat "
                    "/images/gone.sif: no such file or directory")
    silent = no_step_message([attempt("STARTUP", code=1)], "", scheduler=SLURM)
    assert silent == ("attempt 0 failed before its first step (exit 1): not requeued; the "
                      "job's stderr names no cause (hpcdl logs 42 shows it all)")


def test_a_stalled_attempt_looks_hung():
    line = no_step_message([attempt("PREEMPTED", 85), attempt("STALLED", 143, number=1)],
                           STDERR, nodes=2, scheduler=SLURM)
    assert line is not None and "\n" not in line
    assert line.startswith("attempt 1 completed no training step before its time limit "
                           "(exit 143): not requeued; it looks hung: rerun with "
                           "--hang-timeout SECONDS")
    assert line.endswith("`hpcdl probe -N 2` to test the nodes' links")


@pytest.mark.parametrize("reasons", [[], ["FAILED"], ["STARTUP", "COMPLETED"],
                                     ["TIMEOUT"], ["PREEMPTED"]])
def test_other_jobs_get_no_line(reasons):
    tried = [attempt(r, number=i) for i, r in enumerate(reasons)]
    assert no_step_message(tried, STDERR, scheduler=SLURM) is None


def test_submit_wait_report_carries_the_line(tmp_path, monkeypatch):
    from hpcdl.cli import display
    from hpcdl.jobs.result import JobLogs

    final = JobStatus("42", "j", "FAILED", "FAILED", 255, 0, "n1", "00:00:04", "00:10:00",
                      "debug", "", "sacct")
    lines: list[str] = []
    monkeypatch.setattr(display, "echo", lambda m="", **_: lines.append(m))
    display.print_job_end(final, tmp_path, JobLogs(tmp_path / "o", tmp_path / "e", "", STDERR),
                   {"hpcdl_result": None}, attempts=[attempt("STARTUP")])
    said = [ln for ln in lines if "failed before its first step (exit 255): not requeued" in ln]
    assert len(said) == 1 and said[0].endswith("no such file or directory")
    assert not any("time limit" in ln for ln in lines)
