"""The seam between hpcdl's job lifecycle and a batch scheduler.

The job lifecycle (hpcdl.jobs.submit, hpcdl.jobs.follow, hpcdl.sweep.run) is handed a
``Scheduler`` and talks to nothing else; each adapter (hpcdl.schedulers.slurm,
hpcdl.schedulers.pbs) owns everything its scheduler spells its own way: the
submission command, the state table, the words of its refusals. The adapter runs its
commands through the ``Executor`` it is given (hpcdl.schedulers.executor), so the
same adapter can later run through another connection without changing.

The job script has the same seam: the planning layer (hpcdl.plan) decides the job in
hpcdl's words, a ``JobSpec``, and the scheduler's ``ScriptDialect`` spells it: the
header (#SBATCH / #PBS lines, the job name), the launcher that starts the ranks, the
log paths, the shell expressions for the job id and the first node, the template that
holds the requeue block.

Nothing here imports an adapter or names a scheduler. Also here: hpcdl's own job
states (``JobState``), which every adapter maps its scheduler's states onto (with an
UNKNOWN fallback), and the JobStatus value they all return.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from hpcdl.profiles.schema import Launcher, Partition, Profile

if TYPE_CHECKING:
    from hpcdl.core.proc import Result


class JobState(StrEnum):
    """hpcdl's job states; a scheduler's own states map onto these. A StrEnum: a state
    prints, compares and serialises as its name, as the records have always held it."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    UNKNOWN = "UNKNOWN"


FINAL_STATES = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED,
                          JobState.TIMEOUT})


def is_final(state: str) -> bool:
    """True for hpcdl states after which a job never changes again."""
    return state in FINAL_STATES


# The key under which records (result.json) and `--json` output carry the scheduler's
# own state word: the name they were first written with, kept so every record already
# written, and every script reading them, stays valid.
NATIVE_STATE_KEY = "slurm_state"


@dataclass(frozen=True)
class JobStatus:
    """One job as hpcdl reports it: ``state`` is hpcdl's, ``native_state`` the
    scheduler's own word for it (with its decorations, e.g. "CANCELLED by 0")."""

    job_id: str
    name: str
    state: JobState
    native_state: str
    exit_code: int | None = None
    signal: int | None = None
    nodes: str = ""
    elapsed: str = ""
    time_limit: str = ""
    partition: str = ""
    reason: str = ""
    source: str = ""
    # When this attempt started and ended (filled by Scheduler.history()).
    start: str = ""
    end: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The record's keys, in field order (``native_state`` as NATIVE_STATE_KEY)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[NATIVE_STATE_KEY if f.name == "native_state" else f.name] = (
                str(value) if isinstance(value, JobState) else value)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobStatus:
        """A status from a record (to_dict's keys; ``native_state`` is read too)."""
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        values.setdefault("native_state", str(data.get(NATIVE_STATE_KEY, "")))
        state = str(values.get("state", JobState.UNKNOWN))
        values["state"] = JobState(state) if state in JobState.__members__ else JobState.UNKNOWN
        return cls(**values)


@dataclass(frozen=True)
class SubmitOptions:
    """What a submission asks of the scheduler beyond the job itself, in hpcdl's words;
    each adapter spells them on its submission command."""

    # Start no job of this name while another runs (a serial sweep's points).
    one_at_a_time: bool = False
    # Start once this job has ended, however it ended (a chain's next link).
    after: str | None = None
    # A job array: the task indices and throttle in Slurm's --array syntax ("0-5%2");
    # each adapter checks it before it reaches a command line.
    array: str | None = None


@dataclass(frozen=True)
class RunFiles:
    """The names a scheduler's job script gives the files of a run directory: the script
    it submits, and the job's stdout and stderr with ``{job_id}`` for the job's id."""

    script: str
    stdout: str
    stderr: str

    def logs(self, job_id: str) -> tuple[str, str]:
        """(stdout, stderr) file names of job ``job_id``."""
        return self.stdout.format(job_id=job_id), self.stderr.format(job_id=job_id)


# How a job ran out of time, as the scheduler's words tell: its time limit, or a
# deadline it was given.
TimeRanOut = Literal["limit", "deadline"]


@dataclass(frozen=True)
class Demand:
    """What one job asks of its partition, as a live check compares it with the
    cluster: the nodes it allocates (spares included), GPUs and CPUs per node, and its
    time limit (None: unlimited)."""

    partition: str
    nodes: int
    gpus_per_node: int
    cpus_per_node: int
    time_seconds: int | None


class Scheduler(Protocol):
    """What the job lifecycle needs from a batch scheduler. Implementations talk to
    the scheduler only: they return values and raise hpcdl errors, never print."""

    name: str  # the profile's scheduler.type
    label: str  # how messages name it
    # The run directory's script and log names, as the scheduler's job script writes them.
    run_files: RunFiles
    # How the lines the scheduler's own tools write into a job's stderr begin: they
    # report that something failed (a step, a task), not what it was.
    stderr_noise: tuple[str, ...]

    def available(self) -> bool:
        """True when the scheduler's client tools can be used from here."""
        ...

    def require(self) -> None:
        """Raise ToolError, in the scheduler's words, when ``available()`` is False."""
        ...

    def check(self, profile: Profile, demands: Mapping[str, Demand]) -> list[str]:
        """Compare what the jobs ask (by a label that names each in errors) with the
        live cluster, one read for all; return warnings.

        Raises ValidationError when the cluster cannot run a job the profile allows,
        ToolError when the cluster cannot be asked.
        """
        ...

    def max_array_size(self) -> int | None:
        """How many tasks one job array may have, as the scheduler itself says (Slurm's
        MaxArraySize: task ids 0 to this minus 1; 0 when arrays are off); asked once and
        remembered. None when the scheduler does not say. Raises ToolError when it
        cannot be asked."""
        ...

    def submit_argv(self, script: str | Path, job_name: str,
                    options: SubmitOptions | None = None) -> list[str]:
        """The command that submits ``script`` as ``job_name``; pure (what a dry run
        shows and the run directory records is what ``submit`` runs)."""
        ...

    def submit(self, argv: list[str]) -> str:
        """Run the submission command ``argv`` (from submit_argv); return the job id.

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

    def may_come_back(self, status: JobStatus) -> bool:
        """True when a job that looks ended may still return to the queue under the
        same id (a requeue on preemption or a node failure): its end is accepted only
        once it stayed away a while."""
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

    def attempt_reason(self, native_state: str, *, last: bool,
                       script_cause: str | None) -> str:
        """Why one attempt of a requeued job ended, in hpcdl's words (COMPLETED, TIMEOUT,
        PREEMPTED, NODE_FAIL, FAILED, CANCELLED; RUNNING, PENDING or REQUEUED while it
        lasts), from the scheduler's accounting state of the attempt and the cause its
        batch script recorded (None: it recorded none). ``last``: the job's newest
        attempt. The script's cause wins unless the scheduler saw what the script
        could not (a node failure)."""
        ...

    def time_ran_out(self, status: JobStatus, stderr: str = "") -> TimeRanOut | None:
        """How the job ran out of time (its state, or for a state read while it ended,
        the scheduler's note in its ``stderr``); None when it did not."""
        ...

    def run_in_job(self, job_id: str, node: str, argv: Sequence[str], *,
                   timeout: float) -> Result:
        """Run ``argv`` once on ``node`` inside the running job, beside its own steps
        (the hang watchdog's stack collection); return its output and exit code,
        whatever the code. Raises ToolError when it cannot be started or outlives
        ``timeout`` seconds."""
        ...


@dataclass(frozen=True)
class RequeueSpec:
    """A job that checkpoints on a signal: requeued by its own script (``chain`` 1, up
    to ``max_restarts`` times), or one of a chain of ``chain`` jobs that resume one
    another."""

    signal: str  # the signal's name (USR2)
    lead: int  # seconds before the time limit it comes
    max_restarts: int
    chain: int = 1


@dataclass(frozen=True)
class JobSpec:
    """One job in hpcdl's words, decided and checked: what a ScriptDialect spells."""

    profile: Profile
    partition: Partition
    nodes: int
    gpus_per_node: int
    tasks_per_node: int
    cpus_per_task: int
    time_seconds: int | None  # the time limit; None: unlimited (each dialect spells it)
    job_name: str
    run_dir: str | None
    requeue: RequeueSpec | None = None
    # Nodes allocated beyond ``nodes`` that replace a failed one inside the job; the
    # ranks run on ``nodes`` of them, named in $HPCDL_NODELIST (hpcdl.launch.nodes).
    spares: int = 0

    @property
    def ntasks(self) -> int:
        return self.nodes * self.tasks_per_node

    @property
    def allocated_nodes(self) -> int:
        return self.nodes + self.spares


@dataclass(frozen=True)
class Allocation:
    """An interactive allocation as a scheduler's dialect spells it: the command (run in
    the foreground, it owns the terminal), the environment it needs, and the template
    that shows it (``cpus_per_task`` for it)."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    template: str


# What a scheduler may not do for a job: start the probe's ranks, copy an image (or a
# packed dataset: stage-data) to the nodes before they start, start one torchrun agent
# per node, run on some nodes of its allocation and replace a failed one.
Feature = Literal["probe", "stage", "stage-data", "torchrun", "spares"]


class ScriptDialect(Protocol):
    """How one scheduler's job script spells a JobSpec. Pure: values in, text out."""

    name: str  # the profile's scheduler.type
    template: str  # the script's template (templates/)
    # Whether hpcdl submits and follows these jobs (a requeue's script, the progress
    # file, attempt records only make sense then).
    submits: bool
    # Shell expressions the script evaluates: the job's id, as a quoted word and bare in
    # $((arithmetic)); the allocation's first node; where the job was submitted from.
    job_id_word: str
    job_id_arith: str
    first_node: str
    submit_dir: str

    def unsupported(self, profile: Profile, feature: Feature) -> str | None:
        """The one-line refusal when this scheduler cannot do ``feature``, else None."""
        ...

    def alloc(self, spec: JobSpec, command: Sequence[str]) -> Allocation:
        """The interactive allocation of ``spec``'s nodes that runs ``command`` there (a
        shell without one). Raises UserInputError (the one-line refusal) where hpcdl
        cannot allocate interactively on this scheduler, ValidationError."""
        ...

    def log_paths(self, spec: JobSpec) -> tuple[str, str]:
        """(stdout, stderr) of the job as the scheduler names them (with its job-id
        placeholder)."""
        ...

    def launcher_tokens(self, spec: JobSpec, launcher: Launcher, *,
                        every_healthy_node: bool = False) -> list[str]:
        """The command that starts every rank (or one torchrun agent per node), up to
        the container and the rank-env wrapper. ``every_healthy_node``: a step of a job
        with spares over all the nodes its guard found healthy (the --probe-first step),
        not the training's N. Raises ValidationError."""
        ...

    def header(self, spec: JobSpec) -> dict[str, Any]:
        """The template's header values: the job name and the directive lines.
        Raises ValidationError for a value the directives cannot carry."""
        ...

    def stage_file(self, spec: JobSpec, local: str, name: str, what: str) -> dict[str, str]:
        """How the script copies a file (the image, a packed dataset: ``what``) into the
        nodes' ``local`` scratch under a name ending in ``name`` (the template's ``stage``
        items: local_q, dest, shown, and the launch note that says so)."""
        ...

    def warnings(self, profile: Profile) -> list[str]:
        """What a script of ``profile`` leaves out."""
        ...
