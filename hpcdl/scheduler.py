"""The seam between hpcdl's job lifecycle and a batch scheduler.

The application layer (hpcdl.submit, hpcdl.follow, hpcdl.sweep.run) is handed a
``Scheduler`` and talks to nothing else; hpcdl.slurm.scheduler.SlurmScheduler is
the one implementation today, and the CLI (hpcdl.cli.scheduler) is where it is
chosen. Another scheduler (PBS, a local executor) implements the same few methods
and the lifecycle code does not change. Nothing here imports an adapter. Also here: hpcdl's own job states, which
every adapter maps its scheduler's states onto (with an UNKNOWN fallback), and the
JobStatus value they all return.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from hpcdl.plan import JobPlan
    from hpcdl.proc import Result
    from hpcdl.profiles.schema import Profile

PENDING = "PENDING"
RUNNING = "RUNNING"
SUSPENDED = "SUSPENDED"
COMPLETED = "COMPLETED"
FAILED = "FAILED"
CANCELLED = "CANCELLED"
TIMEOUT = "TIMEOUT"
UNKNOWN = "UNKNOWN"

HPCDL_STATES = (PENDING, RUNNING, SUSPENDED, COMPLETED, FAILED, CANCELLED, TIMEOUT, UNKNOWN)
FINAL_STATES = frozenset({COMPLETED, FAILED, CANCELLED, TIMEOUT})


def is_final(state: str) -> bool:
    """True for hpcdl states after which a job never changes again."""
    return state in FINAL_STATES


@dataclass(frozen=True)
class JobStatus:
    """One job as hpcdl reports it. ``slurm_state`` is the scheduler's own word for
    the state (the name stays for the records already written), ``state`` hpcdl's."""

    job_id: str
    name: str
    state: str
    slurm_state: str
    exit_code: int | None = None
    signal: int | None = None
    nodes: str = ""
    elapsed: str = ""
    time_limit: str = ""
    partition: str = ""
    reason: str = ""
    source: str = ""
    # When this attempt started and ended (sacct's Start/End; filled by history()).
    start: str = ""
    end: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Scheduler(Protocol):
    """What the job lifecycle needs from a batch scheduler. Implementations talk to
    the scheduler only: they return values and raise hpcdl errors, never print."""

    name: str

    def available(self) -> bool:
        """True when the scheduler's client tools can be used from here."""
        ...

    def check(self, profile: Profile, plans: Mapping[str, JobPlan]) -> list[str]:
        """Compare the plans (by a label that names them in errors) with the live
        cluster, one read for all; return warnings.

        Raises ValidationError when the cluster cannot run a plan the profile allows,
        ToolError when the cluster cannot be asked.
        """
        ...

    def submit(self, argv: list[str]) -> str:
        """Run the submission command ``argv`` (JobPlan.sbatch_argv); return the job id.

        Raises SubmitError (refused, with the scheduler's message) or ToolError.
        """
        ...

    def statuses(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        """The status of every job in ``job_ids`` it knows, from as few queries as it
        can (a watcher calls this once per poll for all the jobs it follows). A
        finished job may come without its exit code while the scheduler settles;
        ``status(job_id, settle_s=...)`` then waits for it."""
        ...

    def status(self, job_id: str, *, settle_s: float = 0.0) -> JobStatus:
        """One job's status; a finished one's exit code is waited for up to
        ``settle_s`` seconds. Raises ToolError when the job is unknown."""
        ...

    def cancel(self, job_ids: Sequence[str]) -> None:
        """Ask the scheduler to cancel the jobs. Raises ToolError when it refuses."""
        ...

    def log_paths(self, job_id: str) -> tuple[Path, Path] | None:
        """(stdout, stderr) as the scheduler knows them, or None once it forgot."""
        ...

    def list_jobs(self, *, since: str, all_users: bool) -> list[JobStatus]:
        """The user's (or everyone's) live jobs and those finished since ``since``."""
        ...

    def history(self, job_id: str) -> list[JobStatus]:
        """Every attempt of a job, oldest first: a requeued job's earlier runs (their
        state, start, end, reason) and the current one. Empty when unknown."""
        ...

    def run_in_job(self, job_id: str, node: str, argv: Sequence[str], *,
                   timeout: float) -> Result:
        """Run ``argv`` once on ``node`` inside the running job, beside its own steps
        (the hang watchdog's stack collection); return its output and exit code,
        whatever the code. Raises ToolError when it cannot be started or outlives
        ``timeout`` seconds."""
        ...

