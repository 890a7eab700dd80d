"""hpcdl/schedulers/slurm/commands.py: sbatch's argv, Slurm's refusals turned into one
line with a hint, an unreachable controller, log paths from `scontrol show job` whatever
the job's name, through a scripted executor (the module takes one: the Slurm boundary)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hpcdl.core.proc import Result
from hpcdl.errors import SubmitError, ToolError
from hpcdl.schedulers.base import SubmitOptions
from hpcdl.schedulers.executor import RemoteInputError
from hpcdl.schedulers.slurm.commands import (
    not_on_path,
    refusal_hint,
    sbatch,
    sbatch_argv,
    scancel,
    scontrol_log_paths,
    unreachable,
)


@dataclass
class Scripted:
    """An executor that answers each command with the next (returncode, stdout, stderr)
    or raises the next exception, and remembers the argv."""

    answers: list[object]
    remote: bool = False
    target: str = "localhost"
    calls: list[list[str]] = field(default_factory=list)

    def run(self, argv, *, timeout=None, check=True, **_: object) -> Result:
        self.calls.append(list(argv))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        code, out, err = answer  # type: ignore[misc]
        if check and code:
            raise ToolError(f"{argv[0]} failed", argv=list(argv), returncode=code, output=out + err)
        return Result(tuple(argv), code, out, err)


def test_sbatch_argv_carries_the_name_and_the_options():
    assert sbatch_argv("/r/job.sbatch", "my job") == [
        "sbatch", "--parsable", "--job-name=my job", "/r/job.sbatch"]
    argv = sbatch_argv(Path("j.sh"), "n", SubmitOptions(one_at_a_time=True, after="41",
                                                         array="0-5%2"))
    assert argv == ["sbatch", "--parsable", "--job-name=n", "--dependency=singleton",
                    "--dependency=afterany:41", "--array=0-5%2", "j.sh"]
    with pytest.raises(SubmitError, match=r"array: '0-5; rm' is not an --array spec"):
        sbatch_argv("j.sh", "n", SubmitOptions(array="0-5; rm"))


def test_sbatch_returns_the_job_id_or_slurms_refusal_with_a_hint():
    assert sbatch(["sbatch", "x"], ex=Scripted([(0, "4242;cluster\n", "")])) == "4242"
    with pytest.raises(SubmitError) as err:
        sbatch(["sbatch", "x"], ex=Scripted([(1, "", "sbatch: error: Batch job submission "
                                              "failed: Invalid account or account/partition "
                                              "combination specified\n")]))
    assert err.value.message == ("sbatch refused the job: sbatch: error: Batch job submission "
                                 "failed: Invalid account or account/partition combination "
                                 "specified")
    assert "scheduler.account" in (err.value.hint or "")
    with pytest.raises(SubmitError, match="sbatch refused the job: exit code 7"):
        sbatch(["sbatch", "x"], ex=Scripted([(7, "", "")]))
    with pytest.raises(SubmitError, match="sbatch printed no job id"):
        sbatch(["sbatch", "x"], ex=Scripted([(0, "Submitted batch job\n", "")]))
    # sbatch missing or timed out: a SubmitError too, with the tool's words.
    with pytest.raises(SubmitError, match="sbatch: not found"):
        sbatch(["sbatch", "x"], ex=Scripted([ToolError("sbatch: not found", hint="h")]))


@pytest.mark.parametrize(("message", "words"), [
    ("Requested node configuration is not available", "fewer GPUs/CPUs"),
    ("NODE COUNT SPECIFICATION INVALID", "MaxNodes"),
    ("Requested time limit is invalid (missing or exceeds some limit)", "MaxTime"),
    ("invalid partition specified: gpu9", "sinfo -s"),
    ("Invalid generic resource (gres) specification", "no such GRES"),
    ("Invalid qos specification", "scheduler.qos"),
    ("something new", "--dry-run"),
])
def test_each_refusal_has_its_hint(message, words):
    assert words in refusal_hint(message)


def test_an_unreachable_controller_says_so_and_how_to_start_the_sandbox():
    err = ToolError("squeue failed", output="slurm_load_jobs error: Unable to contact slurm "
                                            "controller (connect failure)")
    sandbox = unreachable(err, "sandbox")
    assert sandbox.message == "Slurm's controller is not reachable (profile sandbox): squeue failed"
    assert sandbox.hint == "start the local sandbox cluster: hpcdl sandbox up"
    assert "scontrol ping" in (unreachable(err, "site").hint or "")
    other = ToolError("squeue failed", output="Invalid user")
    assert unreachable(other, "sandbox") is other


def test_log_paths_come_after_a_job_name_that_holds_the_same_words():
    line = ("JobId=7 JobName=x StdOut=/evil StdErr=/evil UserId=u(1) JobState=RUNNING "
            "WorkDir=/w StdErr=/runs/a b/slurm-7.err StdIn=/dev/null "
            "StdOut=/runs/a b/slurm-7.out Power= TresPerNode=gres:gpu:1\n")
    assert scontrol_log_paths("7", Scripted([(0, line, "")])) == (
        Path("/runs/a b/slurm-7.out"), Path("/runs/a b/slurm-7.err"))
    one = "JobId=8 StdIn=/dev/null StdOut=/r/slurm-8.out Power=\n"
    assert scontrol_log_paths("8", Scripted([(0, one, "")])) == (Path("/r/slurm-8.out"),) * 2
    assert scontrol_log_paths("9", Scripted([(1, "", "Invalid job id specified")])) is None
    assert scontrol_log_paths("9", Scripted([(0, "JobId=9 JobState=PENDING\n", "")])) is None


def test_scancel_is_one_command_for_all_and_nothing_for_none():
    ex = Scripted([(0, "", "")])
    scancel(["1", "2_3"], ex=ex)
    scancel([], ex=ex)
    assert ex.calls == [["scancel", "1", "2_3"]]
    with pytest.raises(ToolError):
        scancel(["1"], ex=Scripted([(1, "", "scancel: error")]))
    scancel(["1"], check=False, ex=Scripted([(1, "", "scancel: error")]))


def test_slurm_missing_here_or_on_the_login_node():
    here = not_on_path(Scripted([]))
    assert type(here) is ToolError and "hpcdl sandbox up" in (here.hint or "")
    there = not_on_path(Scripted([], remote=True, target="me@login1"))
    assert isinstance(there, RemoteInputError)
    assert there.message.startswith("login node me@login1: Slurm's commands (sbatch, squeue")
