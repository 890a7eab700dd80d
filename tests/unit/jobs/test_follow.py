"""hpcdl/jobs/follow.py with a scripted scheduler (Watcher takes the scheduler, the clock
and the sleep as arguments) and real log files: back-off, reconnecting to a login node,
a job that vanishes, one that may come back after a preemption, one whose exit code lags,
the deadline, and `logs -f`'s chunks. (Against the fake Slurm: test_lifecycle.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcdl.errors import ToolError
from hpcdl.jobs import follow as fl
from hpcdl.jobs.follow import Backoff, FollowTimeout, Reconnecting, Watcher, follow, log_chunks
from hpcdl.remote.ssh import ConnectionLost
from hpcdl.schedulers.base import JobState, JobStatus


def st_(job: str, state: str, exit_code: int | None = None) -> JobStatus:
    return JobStatus(job, "j", JobState(state), state, exit_code=exit_code)


class Clock:
    """A clock that moves only when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class Scripted:
    """Answers each poll with the next of ``answers`` (the last one repeats)."""

    def __init__(self, answers: list[dict[str, JobStatus]], comes_back: bool = False) -> None:
        self.answers = answers
        self.comes_back = comes_back
        self.asked: list[list[str]] = []

    def statuses(self, ids: list[str]) -> dict[str, JobStatus]:
        self.asked.append(list(ids))
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return {k: v for k, v in answer.items() if k in ids}

    def may_come_back(self, status: JobStatus) -> bool:
        return self.comes_back and status.state == JobState.CANCELLED


@given(st.lists(st.booleans(), max_size=30))
def test_backoff_stays_between_its_bounds_and_resets_on_change(changes):
    b = Backoff()
    assert (b.minimum, b.maximum, b.factor) == (fl.MIN_INTERVAL_S, fl.MAX_INTERVAL_S, fl.FACTOR)
    previous = b.current
    for changed in changes:
        wait = b.next(changed)
        assert fl.MIN_INTERVAL_S <= wait <= fl.MAX_INTERVAL_S
        assert wait == (fl.MIN_INTERVAL_S if changed else min(previous * fl.FACTOR,
                                                              fl.MAX_INTERVAL_S))
        previous = wait


def test_reconnecting_retries_a_lost_login_node_then_gives_up():
    clock = Clock()
    heard: list[float] = []
    tries = iter([ConnectionLost("ssh: gone"), ConnectionLost("ssh: gone"), "answer"])

    def call() -> str:
        item = next(tries)
        if isinstance(item, Exception):
            raise item
        return item

    link = Reconnecting(on_lost=lambda err, away: heard.append(away), clock=clock,
                        sleep=clock.sleep, limit_s=60)
    assert link.call(call) == "answer"
    assert heard == [0.0, fl.RETRY_S] and clock.sleeps == [fl.RETRY_S] * 2 and link.lost == 1

    def never() -> str:
        raise ConnectionLost("ssh: no route to host")

    give_up = Reconnecting(clock=clock, sleep=clock.sleep, limit_s=12, hint="hpcdl logs -f 7")
    with pytest.raises(ConnectionLost) as err:
        give_up.call(never)
    assert err.value.message == "ssh: no route to host; gave up after 15 s"
    assert err.value.hint == "hpcdl logs -f 7" and give_up.lost == 0


def test_a_job_the_scheduler_forgets_ends_unknown_after_three_polls():
    clock = Clock()
    sched = Scripted([{"1": st_("1", "RUNNING"), "2": st_("2", "RUNNING")},
                      {"1": st_("1", "COMPLETED", 0)}])
    done = Watcher(sched, clock=clock, sleep=clock.sleep).watch(["1", "2", "1"])
    assert done["1"].exit_code == 0
    assert (done["2"].state, done["2"].source) == (JobState.UNKNOWN, "missing")
    assert sched.asked[0] == ["1", "2"]  # a job named twice is asked about once
    assert len(sched.asked) == 1 + fl.MISSING_CYCLES
    with pytest.raises(ToolError, match="job 9: unknown to the scheduler"):
        follow("9", scheduler=Scripted([{}]), watcher=Watcher(Scripted([{}]), clock=clock,
                                                               sleep=clock.sleep))


def test_an_ended_job_without_exit_code_is_taken_after_the_settle_time():
    clock = Clock()
    sched = Scripted([{"1": st_("1", "FAILED")}])
    done = Watcher(sched, clock=clock, sleep=clock.sleep, settle_s=3).watch(["1"])
    assert done["1"].state == JobState.FAILED and done["1"].exit_code is None
    assert 3 <= clock.now < 3 + 2 * fl.MAX_INTERVAL_S
    # While it settles the watcher polls at the shortest interval.
    assert set(clock.sleeps) == {fl.MIN_INTERVAL_S}


def test_a_job_that_may_come_back_is_waited_for_and_followed_through_its_requeue():
    clock = Clock()
    seen: list[str] = []
    answers = [{"1": st_("1", "RUNNING")}, {"1": st_("1", "CANCELLED", 0)},
               {"1": st_("1", "PENDING")}, {"1": st_("1", "RUNNING")},
               {"1": st_("1", "COMPLETED", 0)}]
    done = Watcher(Scripted(answers, comes_back=True), clock=clock, sleep=clock.sleep).watch(
        ["1"], on_change=lambda s: seen.append(s.state))
    assert done["1"].state == JobState.COMPLETED
    assert seen == ["RUNNING", "CANCELLED", "PENDING", "RUNNING", "COMPLETED"]
    # One that stays away is taken as ended after REQUEUE_SETTLE_S.
    clock = Clock()
    done = Watcher(Scripted([{"1": st_("1", "CANCELLED", 0)}], comes_back=True), clock=clock,
                   sleep=clock.sleep).watch(["1"])
    assert done["1"].state == JobState.CANCELLED and clock.now >= fl.REQUEUE_SETTLE_S


def test_the_deadline_raises_with_the_pending_jobs_and_polls_are_reported():
    clock = Clock()
    polls: list[tuple[list[str], float]] = []
    watcher = Watcher(Scripted([{"1": st_("1", "RUNNING"), "2": st_("2", "COMPLETED", 0)}]),
                      clock=clock, sleep=clock.sleep)
    with pytest.raises(FollowTimeout) as err:
        watcher.watch(["1", "2"], timeout=30,
                      on_poll=lambda pending, elapsed: polls.append((sorted(pending), elapsed)))
    assert err.value.message == "1 jobs still unfinished after 30 s"
    assert list(err.value.pending) == ["1"]
    assert clock.now == pytest.approx(30)  # the last wait is cut at the deadline
    assert all(p == ["1"] for p, _ in polls) and polls[-1][1] == pytest.approx(30)
    assert max(clock.sleeps) <= fl.MAX_INTERVAL_S


def test_log_chunks_reads_what_is_there_and_what_comes_after_the_end(tmp_path: Path):
    out, err = tmp_path / "job.out", tmp_path / "job.err"
    out.write_text("epoch 1\n")
    now = list(log_chunks("1", out, err, scheduler=Scripted([{}]), follow_job=False))
    assert [(c.path, c.text, c.stderr) for c in now] == [(out, "epoch 1\n", False)]

    writes = iter(["epoch 2\n", "done\n"])

    def sleep(_: float) -> None:  # the job writes while `logs -f` waits
        text = next(writes, None)
        if text is not None:
            with out.open("a") as fh:
                fh.write(text)

    err.write_bytes(b"warn \xff\n")
    synced: list[int] = []
    chunks = list(log_chunks("1", out, err, scheduler=Scripted([{"1": st_("1", "COMPLETED", 0)}]),
                             follow_job=True, sleep=sleep, sync=lambda: synced.append(1)))
    assert "".join(c.text for c in chunks if not c.stderr) == "epoch 1\nepoch 2\ndone\n"
    assert [c.text for c in chunks if c.stderr] == ["warn \ufffd\n"]
    assert len(synced) >= 2  # before the first read and after the job ended
    # stdout and stderr in one file: each byte once, none marked stderr.
    both = list(log_chunks("1", out, out, scheduler=Scripted([{}]), follow_job=False))
    assert [c.stderr for c in both] == [False] and both[0].text == out.read_text()
