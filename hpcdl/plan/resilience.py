"""How the job survives what ends a job: the request's resilience part (--requeue,
--max-restarts, --signal, --chain) planned into the scheduler's RequeueSpec, and the
hang part (--hang-timeout, --hang-action) into the plan's HangPart; the template
blocks they fill (requeue, the progress file; the node guard of a job with spares is
the placement's, hpcdl.plan.partition) and what the watchdog needs exported. Pure; raises ValidationError. The rules that tie
these to other parts (spares, the probe, the chain) are hpcdl.plan.rules's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcdl.core.duration import format_time
from hpcdl.core.templating import shell_join
from hpcdl.hang.actions import UNWATCHED_NAME, WATCHDOG_PYTHON
from hpcdl.jobside.requeue import (
    CHECKPOINT_ENV,
    EXIT_REQUEUE,
    FLAG_ENV,
    FLAG_NAME,
    LEAD_SLACK_S,
    PROGRESS_ENV,
    PROGRESS_NAME,
    wait_seconds,
)
from hpcdl.jobside.steps import HEARTBEAT_DIR, HEARTBEAT_ENV
from hpcdl.launch.nodes import guard_calls_text
from hpcdl.launch.staging import WATCHDOG_MODULE, job_dir
from hpcdl.plan.jobplan import HangPart
from hpcdl.profiles.schema import Profile
from hpcdl.schedulers.base import RequeueSpec, ScriptDialect


@dataclass(frozen=True)
class ResilienceRequest:
    """The request's resilience part, as given: checkpoint on a signal and requeue
    (None: the profile's scheduler.requeue), or a chain of N jobs (--dependency=afterany)
    for clusters that do not requeue."""

    requeue: bool | None = None
    max_restarts: int | None = None  # None: the profile's scheduler.max_restarts
    signal: str | None = None  # SIG@LEAD; None: the profile's scheduler.requeue_signal
    chain: int = 1


@dataclass(frozen=True)
class HangRequest:
    """The request's hang part: the job's own watchdog (hpcdl.jobside.hangwatch, started
    by the job script), seconds without progress before it collects stacks, and what it
    does then."""

    timeout: float | None = None
    action: str | None = None


def requeue_spec(profile: Profile, req: ResilienceRequest,
                 dialect: ScriptDialect) -> RequeueSpec | None:
    """How the job checkpoints on a signal: --requeue (or the profile's default, where
    hpcdl submits the job) or a --chain of jobs; None when it does not."""
    wanted = profile.scheduler.requeue if req.requeue is None else req.requeue
    if not (req.chain > 1 or (wanted and dialect.submits)):
        return None
    name, lead = (req.signal or profile.scheduler.requeue_signal).split("@")
    return RequeueSpec(signal=name, lead=int(lead), chain=req.chain,
                       max_restarts=max_restarts(profile, req) if req.chain == 1 else 0)


def max_restarts(profile: Profile, req: ResilienceRequest) -> int:
    """How often the job starts again: requeues, or a job with spares' relaunches."""
    return profile.scheduler.max_restarts if req.max_restarts is None else req.max_restarts


def requeue_block(requeue: RequeueSpec | None, run_dir: str | None,
                  dialect: ScriptDialect) -> dict[str, Any] | None:
    """What the template's requeue block needs (None when the job does not requeue)."""
    if requeue is None:
        return None
    return {
        "signal": requeue.signal, "lead": requeue.lead, "wait_s": wait_seconds(requeue.lead),
        "lead_slack": LEAD_SLACK_S,
        "run_dir": shell_join([run_dir]) if run_dir else dialect.submit_dir,
        "flag_env": FLAG_ENV, "flag_name": FLAG_NAME,
        "checkpoint_env": CHECKPOINT_ENV, "exit_requeue": EXIT_REQUEUE,
        "progress_env": PROGRESS_ENV,
        "max_restarts": requeue.max_restarts, "chain": requeue.chain,
        # hpcdl_slurm and hpcdl_time_left, from hpcdl-nodes (a job with spares sources it)
        "guard_calls": guard_calls_text(),
    }


def progress_block(run_dir: str | None, requeue: RequeueSpec | None,
                   dialect: ScriptDialect) -> dict[str, str] | None:
    """Where the job records that an attempt completed its first step
    ($HPCDL_PROGRESS_FILE, hpcdl/jobside/requeue.py): in the run directory (beside
    attempts.tsv when a requeued job has none). Only for jobs hpcdl submits (not a PBS
    script)."""
    if not dialect.submits:
        return None
    if run_dir:
        path = shell_join([f"{run_dir}/{PROGRESS_NAME}"])
    elif requeue is not None:
        path = f"{dialect.submit_dir}/{PROGRESS_NAME}"
    else:
        return None
    return {"env": PROGRESS_ENV, "path": path}


def hang_part(req: HangRequest, action: str) -> HangPart | None:
    """The watchdog's part (--hang-timeout), with its ``action`` (rules.hang_action:
    --hang-action, else what the job's spares make it)."""
    if req.timeout is None:
        return None
    return HangPart(timeout=req.timeout, action=action)


def hang_exports(req: HangRequest, env: tuple[tuple[str, str], ...],
                 log_dir: str) -> list[tuple[str, str]]:
    """With --hang-timeout: where the rank wrapper records the ranks' pids, where the
    ranks write their heartbeats (hpcdl.jobside.steps.beat), and PYTHONUNBUFFERED (a
    Python rank's prints must reach the log as they happen: for a script without
    heartbeats, the log growing is progress)."""
    if req.timeout is None:
        return []
    exports = [("HPCDL_PID_DIR", f"{log_dir}/pids"),
               (HEARTBEAT_ENV, f"{log_dir}/{HEARTBEAT_DIR}")]
    if "PYTHONUNBUFFERED" not in dict(env):
        exports.append(("PYTHONUNBUFFERED", "1"))
    return exports


def hang_block(profile: Profile, run_dir: str | None, hang: HangPart | None,
               image: str | None) -> dict[str, Any] | None:
    """What the script's hang watchdog block needs (templates/sbatch.sh.j2): the
    watchdog's arguments but the job id (the script's $SLURM_JOB_ID), quoted, and where
    its modules are (RUN_DIR/job, as the batch host sees it). None without one."""
    if hang is None:
        return None
    run_dir = run_dir or "."
    args = ["--run-dir", run_dir, "--timeout", f"{hang.timeout:g}", "--action", hang.action]
    if image:  # py-spy runs in the ranks' image (hpcdl.jobside.hangdiag.node_command)
        args += ["--runtime", profile.container.binary or profile.container.runtime,
                 "--image", image]
    return {"timeout": f"{hang.timeout:g}", "action": hang.action,
            "module": WATCHDOG_MODULE, "min_python": ".".join(map(str, WATCHDOG_PYTHON)),
            "min_python_tuple": ", ".join(map(str, WATCHDOG_PYTHON)),
            "args_q": shell_join(args), "job_dir_q": shell_join([job_dir(run_dir)]),
            "unwatched_q": shell_join([f"{run_dir}/{UNWATCHED_NAME}"])}


def hang_warnings(req: HangRequest, limit: int | None) -> list[str]:
    """A warning when the job's time limit comes before the watchdog could fire."""
    if req.timeout is None or limit is None or req.timeout < limit:
        return []
    return [f"hang-timeout: {req.timeout:g} s is not shorter than the job's "
            f"time limit {format_time(limit)}: the watchdog cannot fire before it"]
