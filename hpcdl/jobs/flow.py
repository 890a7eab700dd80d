"""One job from its plan to its outcome: submit it, follow it to its end (reporting
what the job's own hang watchdog found when the plan has one), then record its result,
its attempts, its report.html and its exit status. No terminal output: the caller's
``on_poll`` and ``on_hang`` callbacks see the job while it runs, and a JobOutcome says
how it ended.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcdl.jobs.place import HERE, RunPlace
from hpcdl.jobs.submit import Submitted, attempts_of, exit_status, submit
from hpcdl.jobside.protocol import EXIT_BAD_INPUT
from hpcdl.launch.staging import JOB_DIR_NAME
from hpcdl.plan import JobPlan
from hpcdl.profiles.schema import Profile
from hpcdl.schedulers.base import JobStatus, Scheduler

# What only following a job needs (the follow loop, the hang watchdog, the result
# record, report.html) is imported where it is used: `hpcdl submit` without --wait
# never follows, and its start-up is most of hpcdl's own time before sbatch.
if TYPE_CHECKING:
    from hpcdl.hang.diagnosis import Diagnosis
    from hpcdl.jobs.attempts import Attempt
    from hpcdl.jobs.follow import OnLost, OnPoll, Reconnecting, Watcher
    from hpcdl.jobs.recoveries import Recovery
    from hpcdl.jobs.result import JobLogs, ResultRecord
    from hpcdl.jobs.watchdog import HangReport

OnHang = Callable[["Diagnosis"], None]
# Writes run directory PATH's report.html: (the file, the facts gathered for it, with
# the straggler verdict under "straggler"); hpcdl.report.write_run_report. The caller
# hands it in: the report reads the run directory these flows write, and sits above them.
WriteReport = Callable[[Path], tuple[Path, dict[str, Any]]]


@dataclass(frozen=True)
class SubmittedJob:
    """A submitted job and what following it needs: the py-spy a follower's fallback
    watchdog runs on the nodes (the run directory's copy, which the job's own watchdog
    uses), or None when the job has no watchdog or the follower cannot be its fallback
    (a run directory that is a copy of the cluster's)."""

    submitted: Submitted
    py_spy: str | None = None


@dataclass(frozen=True)
class JobOutcome:
    """How a followed job ended: its final status, its result record and logs, the
    process exit status that reflects it, a requeued or chained job's attempts, what
    the hang watchdog found, the HTML report (or why it was not written), the straggler
    verdict and whether a training step completed (None: cannot tell)."""

    final: JobStatus
    record: ResultRecord
    logs: JobLogs
    exit_status: int
    attempts: list[Attempt]
    hang: Diagnosis | None
    report: Path | None
    report_error: str | None
    straggler: dict[str, Any] | None
    steps: bool | None
    # The node failures a job with spares survived, or that ended it (hpcdl --spares).
    recoveries: list[Recovery] = field(default_factory=list)
    excluded: list[dict[str, str]] = field(default_factory=list)  # (bad-nodes.tsv)

    @property
    def probe_error(self) -> str | None:
        """Why a node refused the probe's input, when one did."""
        probe = self.record.get("probe") or {}
        return str(probe["error"]) if "error" in probe else None


def submit_job(profile: Profile, plan: JobPlan, *, scheduler: Scheduler,
               watch: bool, place: RunPlace = HERE) -> SubmittedJob:
    """Submit ``plan`` (planned with its run directory, see hpcdl.jobs.submit.plan_run).

    With a hang watchdog (``plan.hang``; the job runs it itself) py-spy is found before
    submitting (a watchdog that cannot look is none: ToolError) and copied into the run
    directory before it is shipped, since the nodes run it from there and not from this
    venv. ``watch``: the job will be followed. ``place``: where the cluster reads the run
    directory (hpcdl.jobs.place). Raises ValidationError, SubmitError, ToolError (see
    hpcdl.jobs.submit.submit, hpcdl.jobs.watchdog.find_py_spy).
    """
    tools: tuple[str, ...] = ()
    if plan.hang is not None:
        # Lazy: the watchdog's module only for a job with a hang timeout.
        from hpcdl.jobs.watchdog import find_py_spy

        tools = (find_py_spy(),)
    sub = submit(profile, plan, scheduler=scheduler, place=place, tools=tools)
    py_spy = None
    if tools and watch and place is HERE:
        py_spy = str(sub.run.path / JOB_DIR_NAME / "bin" / Path(tools[0]).name)
    return SubmittedJob(sub, py_spy)


def follow_job(profile: Profile, job: SubmittedJob, *, scheduler: Scheduler,
               on_poll: OnPoll | None = None, on_hang: OnHang | None = None,
               timeout: float | None = None, probe: bool = False,
               on_lost: OnLost | None = None, write_report: WriteReport) -> JobOutcome:
    """Follow ``job`` to its end and gather its outcome.

    A requeued job keeps its id: following it follows every attempt; a chain is
    followed to its last job (the earlier ones end as it starts). ``on_poll`` runs
    after each poll, ``on_hang(diagnosis)`` when the job's hang watchdog has written a
    diagnosis (or, for a job that cannot watch itself, this follower's fires). The result
    record (result.json), attempts.json and report.html (by ``write_report``) are written
    to the run directory. ``probe``: a probe job, whose exit status is 2 when a node refused its
    input. For a cluster elsewhere the run directory is pulled back first, and a login
    node out of reach is tried again (``on_lost`` hears of it) until RECONNECT_S.
    Raises ToolError, FollowTimeout (see hpcdl.jobs.follow.follow).
    """
    # Lazy: what following needs, not submitting (see the note at the top).
    from hpcdl.jobs import recoveries
    from hpcdl.jobs.follow import Reconnecting, follow
    from hpcdl.jobs.result import record_result
    from hpcdl.jobs.timelimit import run_steps_seen

    sub = job.submitted
    plan = sub.plan
    watched = sub.last_job_id
    link = Reconnecting(on_lost=on_lost, hint=(
        f"the job goes on: `hpcdl status {watched}` or `hpcdl logs -f {watched}` find it "
        f"again from {sub.run_dir}"))
    polled, watcher, report = _hang_watch(profile, plan, sub, scheduler, watched,
                                          job.py_spy, on_poll, on_hang, link)
    final = follow(watched, scheduler=scheduler, on_poll=polled, timeout=timeout,
                   watcher=watcher)
    link.call(lambda: sub.place.fetch(sub.run))
    hang = report.finish() if report is not None else None
    record, logs = record_result(sub.run, final)
    code = exit_status(final)
    if probe:
        code = probe_exit(record, code)
    tried = (attempts_of(sub.run, list(sub.chain or (sub.job_id,)), scheduler)
             if plan.spec.requeue is not None else [])
    html, straggler, why = _report(sub.run_dir, write_report)
    return JobOutcome(final=final, record=record, logs=logs, exit_status=code,
                      attempts=tried, hang=hang,
                      report=html, report_error=why, straggler=straggler,
                      steps=run_steps_seen(sub.run),
                      recoveries=recoveries.read(sub.run_dir) if plan.spec.spares else [],
                      excluded=recoveries.excluded(sub.run_dir) if plan.spec.spares else [])


def probe_exit(record: ResultRecord, job_code: int) -> int:
    """The exit status of a probe job: 2 when a rank refused its input (its line says
    why), else the job's (0 healthy, 1 a slow node or link)."""
    report = record.get("probe") or {}
    if "error" in report:
        return EXIT_BAD_INPUT
    return job_code


def _report(run_dir: Path, write_report: WriteReport
            ) -> tuple[Path | None, dict[str, Any] | None, str | None]:
    """The run's report.html (as `hpcdl report` writes it: no browser, a second or two
    of matplotlib) and its straggler verdict, or why it could not be written (the job's
    outcome stands either way)."""
    try:
        html, facts = write_report(run_dir)
    except (OSError, ValueError) as exc:
        return None, None, str(exc)
    return html, facts["straggler"], None


def _hang_watch(profile: Profile, plan: JobPlan, sub: Submitted, scheduler: Scheduler,
                job_id: str, py_spy: str | None, on_poll: OnPoll | None,
                on_hang: OnHang | None, link: Reconnecting) -> tuple[OnPoll | None, Watcher,
                                                                     HangReport | None]:
    """The follow loop's callback, watcher and hang report: ``on_poll`` alone, or (with
    a hang timeout) ``on_poll`` and the report of what the job's watchdog wrote (a
    HangReport, whose fallback watches from here a job that cannot watch itself, given
    ``py_spy``), with a watcher that polls at least every tenth of the timeout."""
    # Lazy: as in follow_job.
    from hpcdl.jobs.follow import MAX_INTERVAL_S, Backoff, Watcher
    from hpcdl.jobs.watchdog import HangReport, HangWatchdog, collect

    hang = plan.hang
    if hang is None:
        return on_poll, Watcher(scheduler, link=link), None

    def fallback() -> HangWatchdog | None:
        if py_spy is None or hang is None:
            return None
        return HangWatchdog(
            sub.run, job_id, timeout=hang.timeout, action=hang.action,
            scheduler=scheduler, on_hang=on_hang,
            collector=lambda job, pids: collect(
                scheduler, job, pids, py_spy=py_spy, image=plan.container.image,
                runtime=profile.container.binary or profile.container.runtime))

    report = HangReport(sub.run, on_hang=on_hang, fallback=fallback)

    def both(pending: dict[str, JobStatus], elapsed: float) -> None:
        if on_poll is not None:
            on_poll(pending, elapsed)
        report(pending, elapsed)

    # A hang is shown soon after the job diagnosed it: the files are read locally at
    # every poll, and the scheduler is asked at most once a second.
    watcher = Watcher(scheduler, link=link, backoff=Backoff(
        maximum=max(1.0, min(MAX_INTERVAL_S, hang.timeout / 10))))
    return both, watcher, report
