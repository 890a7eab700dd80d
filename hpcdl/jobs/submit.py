"""Submitting a planned job and what follows on the application side: the run
directory, the live check, the scheduler's submit, the result record of an ended
job, its log files, cancelling it. No terminal output: values are returned and
hpcdl errors raised; hpcdl.cli prints.

The job path reads one way: request -> ``plan_run`` (plan.py's build_plan, once,
with the run directory decided) -> ``submit`` (writes exactly ``plan.script``) ->
hpcdl.jobs.follow -> hpcdl.jobs.result.record_result (result.json).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpcdl.core.gpuarch import ImageArchFacts
from hpcdl.errors import HpcdlError, SubmitError, ToolError
from hpcdl.jobs import rundir
from hpcdl.jobs.attempts import Attempt, from_script, join, read_script_attempts, write_attempts
from hpcdl.jobs.place import HERE, RunPlace
from hpcdl.jobs.result import refused_record
from hpcdl.jobs.rundir import JobRecord, RunDir
from hpcdl.jobs.timelimit import EXIT_TIMEOUT
from hpcdl.jobside.steps import HEARTBEAT_DIR
from hpcdl.launch.code import scan_code, stage_code
from hpcdl.launch.staging import stage, stage_tool
from hpcdl.plan import JobPlan, JobRequest, RuntimeMode, build_plan
from hpcdl.profiles.schema import Profile
from hpcdl.schedulers.base import JobState, JobStatus, Scheduler, SubmitOptions, is_final

SKIP_LIVE_CHECK_ENV = "HPCDL_SKIP_LIVE_CHECK"
CANCEL_WAIT_S = 30.0


@dataclasses.dataclass(frozen=True)
class Submitted:
    job_id: str
    run: RunDir
    plan: JobPlan
    warnings: tuple[str, ...] = ()
    # --chain N: every job id, first to last (job_id is the first); else empty.
    chain: tuple[str, ...] = ()
    # Where the cluster reads the run directory (run is the local copy when it is
    # elsewhere), and the bytes its copy there moved.
    place: RunPlace = HERE
    moved: int = 0

    @property
    def last_job_id(self) -> str:
        """The job whose end is the run's end (the chain's last one)."""
        return self.chain[-1] if self.chain else self.job_id

    @property
    def run_dir(self) -> Path:
        return self.run.path


def plan_run(profile: Profile, request: JobRequest, *, runs_under: Path | None = None,
             run_name: str | None = None, image_facts: ImageArchFacts | None = None,
             runtime_mode: RuntimeMode | None = None, place: RunPlace = HERE) -> JobPlan:
    """The plan that gets submitted: ``request`` with its run directory decided first.

    Unless ``request.files.run_dir`` is set, the run directory's path is chosen (not
    created) under ``runs_under`` (default: runs_root()), named after ``run_name``
    (default: the job name), so the script's log paths, the checkpoint directory
    and the container's binds point into it; ``submit`` then writes exactly
    ``plan.script``. The plan names the directory as the cluster sees it (``place``: a
    copy on a login node's side for a cluster reached over SSH). ``image_facts``,
    ``runtime_mode``: as for build_plan. Raises ValidationError, RenderError (see
    build_plan).
    """
    if request.files.run_dir is None:
        name = run_name or request.files.job_name or f"hpcdl-{request.launch.backend}"
        local = rundir.new_run_path(name, runs_under)
    else:
        local = Path(request.files.run_dir)
    request = dataclasses.replace(
        request, files=dataclasses.replace(request.files, run_dir=place.cluster_path(local)))
    return build_plan(profile, request, image_facts, runtime_mode)


def live_check_wanted(live_check: bool | None) -> bool:
    """``live_check``, or unless $HPCDL_SKIP_LIVE_CHECK says no: True."""
    if live_check is not None:
        return live_check
    return os.environ.get(SKIP_LIVE_CHECK_ENV, "") not in ("1", "true", "yes")


def submit(profile: Profile, plan: JobPlan, *, scheduler: Scheduler,
           live_check: bool | None = None, one_at_a_time: bool = False,
           place: RunPlace = HERE, tools: Sequence[str] = ()) -> Submitted:
    """Live check, run directory, submission: submits ``plan`` exactly as planned.

    ``plan.run_dir`` (see plan_run) is created here and must not exist yet;
    job.sbatch is ``plan.script`` byte for byte. For a cluster elsewhere (``place``)
    the directory is written here, then copied there whole before sbatch sees it; a
    copy that fails leaves neither side behind. ``one_at_a_time``: no job of the
    same name runs beside it (a serial sweep's points). ``tools``: host executables
    copied into the run's job/bin before it is shipped (the hang watchdog's py-spy). Raises
    ValidationError (live check, a --code directory over its limit), SubmitError (no
    run directory in the plan, it exists already, or the scheduler refused),
    ToolError (scheduler or login node unreachable).
    """
    if plan.spec.run_dir is None:
        raise SubmitError("the plan has no run directory: plan it with plan_run()")
    scheduler.require()
    warnings = (scheduler.check(profile, {plan.spec.job_name: plan.demand()})
                if live_check_wanted(live_check) else [])
    local = place.local_path(plan.spec.run_dir)
    code = code_of(profile, plan, local)
    place.prepare()
    run = write_run(profile, plan, local, code=code, tools=tools)
    moved = ship_or_undo(place, run)
    script = place.cluster_path(run.script)
    argv = scheduler.submit_argv(script, plan.spec.job_name, SubmitOptions(one_at_a_time))
    try:
        job_id = scheduler.submit(argv)
    except ToolError as err:  # refused, or the controller went away: say so in the run dir
        run.write_result(dict(refused_record(err.message, argv)))
        raise
    chain = [job_id]
    links = plan.spec.requeue.chain if plan.spec.requeue else 1
    for _ in range(links - 1):  # each resumes from the one before (afterany: any end)
        link = scheduler.submit_argv(script, plan.spec.job_name,
                                     SubmitOptions(one_at_a_time, after=chain[-1]))
        try:
            chain.append(scheduler.submit(link))
        except ToolError:  # what is queued stays queued; the record says which jobs exist
            run.write_job(JobRecord.now(job_id, argv, tuple(chain)))
            raise
    run.write_job(JobRecord.now(job_id, argv, tuple(chain) if links > 1 else ()))
    return Submitted(job_id, run, plan, tuple(warnings), tuple(chain) if links > 1 else (),
                     place, moved)


def code_of(profile: Profile, plan: JobPlan, local: Path) -> Any:
    """The files of ``plan.code_dir`` that go with the run directory ``local`` (a
    scan_code result; None without a code directory), leaving out the runs root and
    ``local``'s parent. Raises ValidationError for a code directory over its limit."""
    if not plan.files.code_dir:
        return None
    return scan_code(Path(plan.files.code_dir), limit_bytes=profile.code_limit_bytes,
                     skip=(rundir.runs_root(), local.parent))


def ship_or_undo(place: RunPlace, run: RunDir) -> int:
    """Copy the directory ``run`` (a run directory, or a sweep directory of them) to
    where the cluster reads it (``place``); returns the bytes moved. A copy that fails
    leaves neither side behind (the cluster's copy and the local one are removed)."""
    try:
        return place.ship(run)
    except HpcdlError:
        place.discard(run)
        shutil.rmtree(run.path, ignore_errors=True)
        raise


def write_run(profile: Profile, plan: JobPlan, local: Path, *, code: Any = None,
              extra: dict[str, Any] | None = None, tools: Sequence[str] = ()) -> RunDir:
    """The run directory ``local`` with everything the job reads: its staged files and
    ``tools`` (host executables, into job/bin), the code (``code``: a scan_code result),
    job.sbatch (``plan.script``) and plan.json (``plan.to_dict()`` plus ``extra``: a
    sweep point's values). Raises SubmitError when it exists already."""
    try:
        run = rundir.make_run_dir(local)
    except FileExistsError as exc:
        raise SubmitError(f"run directory {local} already exists",
                          hint="give a new --run-dir, or leave it out for a fresh one") from exc
    if plan.hang is not None:  # the rank wrapper records the ranks' pids here, the
        run.pids.mkdir()       # ranks their heartbeats (hpcdl.jobside.steps.beat) there
        (run.path / HEARTBEAT_DIR).mkdir()
    files = plan.files
    if files.job_files or files.job_scripts:  # the nodes need not see the submitting hpcdl
        stage(run.path, files.job_files, files.job_scripts)
    for tool in tools:
        stage_tool(run.path, tool)
    if code is not None:
        stage_code(run.path, code.root, code.files)
    run.write_plan(plan.script, {**plan.to_dict(), **(extra or {})})
    run.record_inputs(profile.model_dump(mode="json"), plan.container.image)
    return run


def attempts_of(sub_or_run: RunDir, job_ids: list[str], scheduler: Scheduler) -> list[Attempt]:
    """Every attempt of the run's job(s): the scheduler's accounting joined with the
    batch script's own record (attempts.tsv); from the script's record alone when the
    scheduler has no history. Written to the run directory's attempts.json."""
    script = read_script_attempts(sub_or_run)
    found: list[Attempt] = []
    for job_id in job_ids:
        history = scheduler.history(job_id)
        mine = [s for s in script if s.job_id == job_id]
        found += join(history, mine, scheduler=scheduler) if history else from_script(mine)
    found = [dataclasses.replace(a, number=i) for i, a in enumerate(found)] if len(job_ids) > 1 else found
    if found:
        write_attempts(sub_or_run, found)
    return found


def exit_status(status: JobStatus) -> int:
    """The process exit code that reflects a finished job: EXIT_TIMEOUT (124, as
    timeout(1)) when it hit its time limit, else its own (shell convention for signals)."""
    if status.state == JobState.TIMEOUT:
        return EXIT_TIMEOUT
    if status.exit_code:
        return status.exit_code
    if status.signal:
        return 128 + status.signal
    return 0 if status.state == JobState.COMPLETED else 1


def log_files(job_id: str, scheduler: Scheduler) -> tuple[Path, Path]:
    """(stdout, stderr) paths of a job: from its run directory, else from the scheduler.

    Raises ToolError when neither knows the job.
    """
    run = rundir.find_run(job_id)
    if run is not None:
        return run.logs(job_id)
    paths = scheduler.log_paths(job_id)
    if paths is not None:
        return paths
    raise ToolError(f"job {job_id}: no run directory under {rundir.runs_root()} and "
                    f"{scheduler.label} no longer knows its log paths",
                    hint="run from the directory you submitted from, or set HPCDL_RUNS")


def cancel(job_id: str, scheduler: Scheduler) -> JobStatus:
    """Cancel the job; return its status once it ended (or, after CANCEL_WAIT_S, what
    the scheduler says then). Raises ToolError for an unknown or already finished
    job (scancel itself says nothing in that case).
    """
    before = scheduler.status(job_id)
    if is_final(before.state):
        raise ToolError(f"job {job_id} already ended ({before.state}); nothing to cancel")
    scheduler.cancel([job_id])
    deadline = time.monotonic() + CANCEL_WAIT_S
    status = scheduler.status(job_id)
    while not is_final(status.state) and time.monotonic() < deadline:
        time.sleep(0.5)
        status = scheduler.status(job_id)
    if is_final(status.state):
        return scheduler.status(job_id, settle_s=10)
    return status  # still ending: the caller reports what the scheduler says
