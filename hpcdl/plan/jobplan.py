"""The frozen result of planning: everything decided about one job, with the script
that gets submitted byte for byte (hpcdl.plan.build makes it; plan.json is its
to_dict)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from hpcdl import __version__
from hpcdl.core.duration import format_time
from hpcdl.launch.staging import JOB_DIR_NAME, job_dir
from hpcdl.profiles.schema import Backend, GpuBind, Launcher, SchedulerType
from hpcdl.schedulers.base import Demand


@dataclass(frozen=True)
class JobPlan:
    """Everything decided about one job; ``script`` is exactly what gets submitted."""

    profile: str
    cluster_type: SchedulerType
    partition: str
    partition_reason: str
    nodes: int
    gpus_per_node: int
    tasks_per_node: int
    ntasks: int
    cpus_per_task: int
    time_seconds: int | None  # the time limit; None: unlimited
    job_name: str
    backend: Backend
    image: str | None
    env: tuple[tuple[str, str], ...]
    binds: tuple[str, ...]
    command: tuple[str, ...]
    launch_line: str
    output: str
    error: str
    run_dir: str | None
    script: str
    warnings: tuple[str, ...] = field(default=())
    # The profile's defaults for the bundled example that are on its command line
    # (those a -X did not replace); empty for a custom COMMAND.
    example_defaults: tuple[str, ...] = field(default=())
    launcher: Launcher = "srun"
    gpu_bind: GpuBind = "none"
    image_source: str | None = None  # "--image" or "profile default_image"
    master_addr: str = ""  # as the script sets it (a shell expression when derived)
    master_port: str = ""
    # Requeue: the job checkpoints on ``signal`` (SIG@LEAD) and requeues itself
    # up to ``max_restarts`` times; ``chain`` > 1: that many jobs resume one another.
    requeue: bool = False
    max_restarts: int = 0
    signal: str | None = None
    chain: int = 1
    probe: tuple[str, ...] | None = None
    probe_first: bool = False
    probe_line: str | None = None  # the --probe-first step, as the script runs it
    hang_timeout: float | None = None  # the watchdog's silence limit (s); None: no watchdog
    hang_action: str | None = None  # cancel, leave or relaunch
    # Files copied into RUN_DIR/job at submission (hpcdl.launch.staging), relative to it.
    job_files: tuple[str, ...] = ()
    # Files rendered for this job and written into RUN_DIR/job at submission, executable:
    # (path relative to job/, text). The script runs them (the rank wrapper, the port pick).
    job_scripts: tuple[tuple[str, str], ...] = ()
    container_mode: str | None = None  # RuntimeMode of an image run, when it was known
    # The command creates $HPCDL_PROGRESS_FILE after its first step (the bundled example;
    # any command under --requeue/--chain, by the contract): no file means no step.
    records_steps: bool = False
    # Staging (the image, a packed dataset): "sbcast" (each node's copy, read from there) or "none";
    # staged_image is the copy's path as the script names it (holds $SLURM_JOB_ID).
    stage: str = "none"
    staged_image: str | None = None
    # --stage-data: each node's copy of the packed dataset, as the script names it.
    staged_data: str | None = None
    # --code: the local directory copied into RUN_DIR/code, and the directory the job
    # starts in (that copy, as the cluster sees it); None: where sbatch was run.
    code_dir: str | None = None
    workdir: str | None = None
    # Spare nodes: the allocation has nodes + spares, the ranks run on ``nodes`` healthy
    # ones, a failed node is replaced inside the job (hpcdl.launch.nodes).
    spares: int = 0
    hpcdl_version: str = __version__

    @property
    def time(self) -> str:
        """The time limit in hpcdl's duration syntax (D-HH:MM:SS or 'infinite'), as
        plan.json keeps it."""
        return format_time(self.time_seconds)

    def demand(self) -> Demand:
        """What this job asks of its partition, for the scheduler's live check: the
        allocation (the training's nodes and the spares), per node GPUs and CPUs."""
        return Demand(partition=self.partition, nodes=self.nodes + self.spares,
                      gpus_per_node=self.gpus_per_node,
                      cpus_per_node=self.cpus_per_task * self.tasks_per_node,
                      time_seconds=self.time_seconds)

    def to_dict(self) -> dict[str, Any]:
        # plan.json keeps "time" as text in its place (readers: hpcdl.track.source,
        # scripts): the seconds are the plan's, the text is their display form.
        data = {("time" if k == "time_seconds" else k): (self.time if k == "time_seconds" else v)
                for k, v in asdict(self).items()}
        data["env"] = dict(self.env)
        data["binds"] = list(self.binds)
        data["command"] = list(self.command)
        data["warnings"] = list(self.warnings)
        data["example_defaults"] = list(self.example_defaults)
        data["probe"] = None if self.probe is None else list(self.probe)
        data["job_files"] = list(self.job_files)
        data["job_scripts"] = dict(self.job_scripts)
        return data

    def job_script_paths(self) -> list[tuple[str, str]]:
        """(path as the script names it, text) of each of ``job_scripts``: in the run
        directory's job/, or without one (a dry run's preview) in ./job/ beside the logs."""
        return [(job_script_path(self.run_dir, rel), text) for rel, text in self.job_scripts]


def job_script_path(run_dir: str | None, rel: str) -> str:
    """Where the job finds its job-side file ``rel`` (relative to job/): in the run
    directory, or relative to where sbatch runs the script when the plan has none."""
    return f"{job_dir(run_dir) if run_dir else './' + JOB_DIR_NAME}/{rel}"
