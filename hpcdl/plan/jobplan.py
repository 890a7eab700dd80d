"""The frozen result of planning: everything decided about one job, with the script
that gets submitted byte for byte (hpcdl.plan.build makes it; plan.json is its
to_dict)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcdl import __version__
from hpcdl.core.duration import format_time
from hpcdl.launch.staging import JOB_DIR_NAME, job_dir
from hpcdl.plan.data import DataPart
from hpcdl.profiles.schema import Backend, GpuBind, Launcher
from hpcdl.schedulers.base import Demand, JobSpec


@dataclass(frozen=True)
class LaunchPart:
    """What every rank runs and how the ranks start."""

    backend: Backend
    launcher: Launcher
    gpu_bind: GpuBind
    command: tuple[str, ...]
    # The profile's defaults for the bundled example that are on its command line
    # (those a -X did not replace); empty for a custom COMMAND.
    example_defaults: tuple[str, ...]
    env: tuple[tuple[str, str], ...]  # exported by the script: the profile's, then --env
    launch_line: str
    master_addr: str  # as the script sets it (a shell expression when derived)
    master_port: str
    # The command creates $HPCDL_PROGRESS_FILE after its first step (the bundled example;
    # any command under --requeue/--chain, by the contract): no file means no step.
    records_steps: bool


@dataclass(frozen=True)
class ContainerPart:
    """The image the ranks run in (None: natively), its binds, and what the script
    copies to every node before the ranks start."""

    image: str | None
    image_source: str | None  # "--image" or "profile default_image"
    binds: tuple[str, ...]
    mode: str | None  # RuntimeMode of an image run, when it was known
    # Staging (the image, a packed dataset): "sbcast" (each node's copy, read from there)
    # or "none"; staged_image is the copy's path as the script names it (holds the job id).
    stage: str = "none"
    staged_image: str | None = None
    staged_data: str | None = None  # --stage-data: each node's copy of the packed dataset


@dataclass(frozen=True)
class ProbePart:
    """The allreduce probe: the job itself (`hpcdl probe`) or, ``first``, a step before
    COMMAND (`submit --probe-first`)."""

    args: tuple[str, ...]  # the worker's arguments
    first: bool
    line: str | None  # the --probe-first step, as the script runs it


@dataclass(frozen=True)
class HangPart:
    """The hang watchdog of `submit --wait`: its silence limit and what it does then."""

    timeout: float  # seconds
    action: str  # cancel, leave or relaunch


@dataclass(frozen=True)
class FilesRequest:
    """The request's files part, as given: the job's name, its run directory (None:
    where sbatch runs), a --template to render instead of the dialect's, and the user's
    code directory (submit --code, copied into the run's code/ and the job started
    there: for a cluster reached over SSH)."""

    job_name: str | None = None
    run_dir: str | None = None
    template: str | None = None
    code_dir: str | None = None


@dataclass(frozen=True)
class FilesPart:
    """The run's files as the job sees them: logs, what is copied or written into
    RUN_DIR/job at submission, the user's code."""

    output: str
    error: str
    # Copied into RUN_DIR/job at submission (hpcdl.launch.staging), relative to it.
    job_files: tuple[str, ...] = ()
    # Rendered for this job and written into RUN_DIR/job at submission, executable:
    # (path relative to job/, text). The script runs them (the rank wrapper, the port pick).
    job_scripts: tuple[tuple[str, str], ...] = ()
    # --code: the local directory copied into RUN_DIR/code, and the directory the job
    # starts in (that copy, as the cluster sees it); None: where sbatch was run.
    code_dir: str | None = None
    workdir: str | None = None


# plan.json's keys in their order (what `submit --dry-run --json` prints; the run
# directory's copy is sorted): a flat record, whatever the parts' shape, so that readers
# (hpcdl.jobs.rundir.PlanRecord, hpcdl.track, scripts) see the file they always saw.
PLAN_JSON_KEYS = (
    "profile", "cluster_type", "partition", "partition_reason", "nodes", "gpus_per_node",
    "tasks_per_node", "ntasks", "cpus_per_task", "time", "job_name", "backend", "image",
    "env", "binds", "command", "launch_line", "output", "error", "run_dir", "script",
    "warnings", "example_defaults", "launcher", "gpu_bind", "image_source", "master_addr",
    "master_port", "requeue", "max_restarts", "signal", "chain", "probe", "probe_first",
    "probe_line", "hang_timeout", "hang_action", "job_files", "job_scripts",
    "container_mode", "records_steps", "stage", "staged_image", "staged_data", "code_dir",
    "workdir", "spares", "data", "hpcdl_version",
)


@dataclass(frozen=True)
class JobPlan:
    """Everything decided about one job, in parts; ``script`` is exactly what gets
    submitted. ``spec`` is what the scheduler is asked for (partition, nodes, tasks,
    CPUs, time, name, run directory, requeue, spares: hpcdl.schedulers.base.JobSpec)."""

    spec: JobSpec
    partition_reason: str
    launch: LaunchPart
    container: ContainerPart
    data: DataPart  # the dataset the job reads (plan.json's "data", one object)
    files: FilesPart
    script: str
    warnings: tuple[str, ...] = ()
    probe: ProbePart | None = None
    hang: HangPart | None = None
    hpcdl_version: str = __version__

    @property
    def time(self) -> str:
        """The time limit in hpcdl's duration syntax (D-HH:MM:SS or 'infinite'), as
        plan.json keeps it."""
        return format_time(self.spec.time_seconds)

    def demand(self) -> Demand:
        """What this job asks of its partition, for the scheduler's live check: the
        allocation (the training's nodes and the spares), per node GPUs and CPUs."""
        spec = self.spec
        return Demand(partition=spec.partition.name, nodes=spec.allocated_nodes,
                      gpus_per_node=spec.gpus_per_node,
                      cpus_per_node=spec.cpus_per_task * spec.tasks_per_node,
                      time_seconds=spec.time_seconds)

    def to_dict(self) -> dict[str, Any]:
        """plan.json: the parts flattened under the keys it has always had
        (PLAN_JSON_KEYS, in that order)."""
        spec, launch, container, files = self.spec, self.launch, self.container, self.files
        requeue, probe, hang = spec.requeue, self.probe, self.hang
        flat: dict[str, Any] = {
            "profile": spec.profile.name, "cluster_type": spec.profile.scheduler.type,
            "partition": spec.partition.name, "partition_reason": self.partition_reason,
            "nodes": spec.nodes, "gpus_per_node": spec.gpus_per_node,
            "tasks_per_node": spec.tasks_per_node, "ntasks": spec.ntasks,
            "cpus_per_task": spec.cpus_per_task,
            # "time" as text (readers: hpcdl.track.source, scripts): the seconds are the
            # plan's, the text is their display form.
            "time": self.time, "job_name": spec.job_name, "run_dir": spec.run_dir,
            "spares": spec.spares,
            "backend": launch.backend, "launcher": launch.launcher, "gpu_bind": launch.gpu_bind,
            "command": list(launch.command), "example_defaults": list(launch.example_defaults),
            "env": dict(launch.env), "launch_line": launch.launch_line,
            "master_addr": launch.master_addr, "master_port": launch.master_port,
            "records_steps": launch.records_steps,
            "image": container.image, "image_source": container.image_source,
            "binds": list(container.binds), "container_mode": container.mode,
            "stage": container.stage, "staged_image": container.staged_image,
            "staged_data": container.staged_data,
            "output": files.output, "error": files.error, "job_files": list(files.job_files),
            "job_scripts": dict(files.job_scripts), "code_dir": files.code_dir,
            "workdir": files.workdir,
            # requeue: the job requeues itself (a chain's jobs resume one another instead)
            "requeue": requeue is not None and requeue.chain == 1,
            "max_restarts": requeue.max_restarts if requeue else 0,
            "signal": f"{requeue.signal}@{requeue.lead}" if requeue else None,
            "chain": requeue.chain if requeue else 1,
            "probe": list(probe.args) if probe else None,
            "probe_first": probe.first if probe else False,
            "probe_line": probe.line if probe else None,
            "hang_timeout": hang.timeout if hang else None,
            "hang_action": hang.action if hang else None,
            "data": self.data.to_dict(),
            "script": self.script, "warnings": list(self.warnings),
            "hpcdl_version": self.hpcdl_version,
        }
        return {key: flat[key] for key in PLAN_JSON_KEYS}

    def job_script_paths(self) -> list[tuple[str, str]]:
        """(path as the script names it, text) of each of the files' ``job_scripts``: in
        the run directory's job/, or without one (a dry run's preview) in ./job/ beside
        the logs."""
        return [(job_script_path(self.spec.run_dir, rel), text)
                for rel, text in self.files.job_scripts]


def job_script_path(run_dir: str | None, rel: str) -> str:
    """Where the job finds its job-side file ``rel`` (relative to job/): in the run
    directory, or relative to where sbatch runs the script when the plan has none."""
    return f"{job_dir(run_dir) if run_dir else './' + JOB_DIR_NAME}/{rel}"
