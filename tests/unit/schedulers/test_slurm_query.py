"""hpcdl/schedulers/slurm/query.py through a scripted executor (the module takes one: the
Slurm boundary), answering with squeue/sacct/scontrol lines in the formats it asks for:
one squeue and at most one sacct for many jobs, array tasks asked by their array,
sacct's placeholder row not trusted, squeue + scontrol for a job that just ended."""

from __future__ import annotations

import pytest

from hpcdl.errors import ToolError
from hpcdl.schedulers.base import JobState
from hpcdl.schedulers.slurm.query import job_status, list_jobs, slurm_available, statuses
from tests.unit.schedulers.scripted import Slurm


def sq(job: str, task: str, state: str, code: str = "0", name: str = "train") -> str:
    """A squeue -O line (ArrayJobID|ArrayTaskID|State|Reason|Nodes|Used|Limit|Part|exit|Name)."""
    return f"{job}|{task}|{state}|None|n1|0:10|10:00|debug|{code}|{name}\n"


def sa(job: str, state: str, exit_code: str = "0:0", name: str = "train") -> str:
    return f"{job}|{state}|{exit_code}|n1|00:00:10|00:10:00|debug|{name}\n"


def test_many_jobs_cost_one_squeue_and_one_sacct():
    slurm = Slurm({"squeue": (0, sq("1", "N/A", "RUNNING") + sq("2", "N/A", "COMPLETED", "768")
                              + sq("3", "N/A", "COMPLETED", "N/A")),
                   "sacct": (0, sa("3", "COMPLETED", "0:0") + sa("4", "FAILED", "2:0"))})
    got = statuses(["1", "2", "3", "4", "5", "1"], ex=slurm)
    assert slurm.tools() == ["squeue", "sacct"]
    assert slurm.calls[0][slurm.calls[0].index("-j") + 1] == "1,2,3,4,5"
    assert slurm.calls[1][slurm.calls[1].index("-j") + 1] == "3,4,5"  # no exit code from squeue
    assert (got["1"].state, got["1"].exit_code) == (JobState.RUNNING, None)
    assert (got["2"].exit_code, got["2"].source) == (3, "squeue")  # wait status 768: exit 3
    assert (got["3"].exit_code, got["3"].source) == (0, "sacct")
    assert (got["4"].state, got["4"].exit_code) == (JobState.FAILED, 2)
    assert "5" not in got  # neither knows it
    assert statuses([], ex=slurm) == {} and len(slurm.calls) == 2


def test_array_tasks_are_asked_by_their_array():
    slurm = Slurm({"squeue": (0, sq("7", "0", "RUNNING") + sq("7", "1", "PENDING")
                              + sq("8", "N/A", "RUNNING"))})
    got = statuses(["7_0", "7_1", "8"], ex=slurm)
    assert slurm.calls[0][slurm.calls[0].index("-j") + 1] == "7,8"
    assert (got["7_0"].state, got["7_1"].state) == (JobState.RUNNING, JobState.PENDING)
    assert slurm.tools() == ["squeue"]


def test_sacct_placeholder_rows_are_not_trusted():
    # squeue: ended, no exit code yet; sacct: the "allocation" placeholder row.
    slurm = Slurm({"squeue": (0, sq("9", "N/A", "FAILED", "N/A")),
                   "sacct": (0, sa("9", "PENDING", "0:0", name="allocation"))})
    got = statuses(["9"], ex=slurm)["9"]
    assert (got.state, got.exit_code, got.source) == (JobState.FAILED, None, "squeue")


def test_squeue_forgetting_a_job_is_not_an_error():
    slurm = Slurm({"squeue": (1, "slurm_load_jobs error: Invalid job id specified\n"),
                   "sacct": (0, sa("5", "TIMEOUT", "0:15"))})
    got = statuses(["5"], ex=slurm)["5"]
    assert (got.state, got.exit_code, got.signal) == (JobState.TIMEOUT, 0, 15)


def test_job_status_uses_scontrol_for_a_job_that_just_ended():
    squeue = "11|COMPLETED|None|n1|0:10|10:00|debug|train\n"
    scontrol = "JobId=11 JobName=a JobState=COMPLETED Reason=None ExitCode=4:0 RunTime=00:00:10\n"
    slurm = Slurm({"squeue": (0, squeue), "scontrol": (0, scontrol),
                   "sacct": (0, sa("11", "PENDING", name="allocation"))})
    got = job_status("11", ex=slurm)
    assert (got.exit_code, got.source) == (4, "squeue+scontrol")
    assert slurm.tools() == ["squeue", "scontrol"]
    with pytest.raises(ToolError, match="job 12: unknown to squeue and sacct"):
        job_status("12", ex=Slurm({"squeue": (0, ""), "sacct": (0, "")}))


def test_list_jobs_prefers_squeue_while_running_and_sacct_once_ended():
    slurm = Slurm({"squeue": (0, "1|RUNNING|None|n1|0:10|10:00|debug|a\n"
                                 "2|COMPLETED|None|n1|0:10|10:00|debug|b\n"
                                 "10_3|PENDING|None||0:00|10:00|debug|c\n"),
                   "sacct": (0, sa("1", "PENDING", name="allocation") + sa("2", "COMPLETED", "1:0")
                             + sa("3", "CANCELLED by 0"))})
    jobs = list_jobs(ex=slurm)
    assert [j.job_id for j in jobs] == ["1", "2", "3", "10_3"]
    assert jobs[0].source == "squeue" and (jobs[1].source, jobs[1].exit_code) == ("sacct", 1)
    assert "-u" in slurm.calls[0] and "-a" not in slurm.calls[1]
    everyone = Slurm({"squeue": (0, ""), "sacct": (0, "")})
    list_jobs(all_users=True, ex=everyone)
    assert "-u" not in everyone.calls[0] and "-a" in everyone.calls[1]


def test_slurm_available_needs_all_four_tools():
    assert slurm_available(Slurm({t: (0, "") for t in ("sbatch", "squeue", "sacct", "scontrol")}))
    assert not slurm_available(Slurm({"sbatch": (0, ""), "squeue": (0, "")}))
