"""The Slurm dialect of a job script: #SBATCH lines, the srun (or mpirun, horovodrun)
launcher, slurm-%j.out logs, the requeue block's options, image staging with sbcast,
and the shell expressions for the job id and the first node. templates/sbatch.sh.j2
renders it (the requeue block lives there). Pure: values in, text out; raises
ValidationError for a value an #SBATCH line cannot carry.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from hpcdl.core.templating import shell_join
from hpcdl.core.tokens import CONTROL
from hpcdl.errors import ValidationError
from hpcdl.profiles.schema import Launcher, Partition, Profile
from hpcdl.schedulers.base import Allocation, Feature, JobSpec, RunFiles
from hpcdl.schedulers.launchers import launcher_for
from hpcdl.schedulers.slurm import releases

# A run directory's script (what sbatch is given) and the job's logs, as --output and
# --error name them (slurm-%j.out: Slurm puts the job id for %j).
RUN_FILES = RunFiles("job.sbatch", "slurm-{job_id}.out", "slurm-{job_id}.err")

# Values Slurm's #SBATCH parser takes as they are; others go in double quotes.
_PLAIN_SBATCH = re.compile(r"[A-Za-z0-9_.,:@%+=/\-]+")


def slurm_time(seconds: int | None) -> str:
    """Seconds as Slurm's --time: D-HH:MM:SS (the day only when there is one), or
    'infinite' for None (unlimited)."""
    if seconds is None:
        return "infinite"
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock


def scheduler_options(profile: Profile, part: Partition, *, nodes: int, gpus: int,
                      tasks_per_node: int, cpus_per_task: int,
                      time_seconds: int | None) -> list[str]:
    """The Slurm options shared by sbatch (#SBATCH lines) and salloc (argv), in order."""
    behaviour = releases.profile_behaviour(profile.scheduler.release)
    if gpus and behaviour.gpus_exclusive:
        other = "gpus-per-node" if profile.scheduler.gpu_request == "gres" else "gres"
        if other in profile.scheduler.extra_options or "gpus" in profile.scheduler.extra_options:
            raise ValidationError(
                f"scheduler.extra_options: --{other} with scheduler.gpu_request "
                f"{profile.scheduler.gpu_request!r}: Slurm {behaviour.release} refuses both "
                f"in one job (from 26.05); drop one")
    options = [
        f"--partition={part.name}",
        f"--nodes={nodes}",
        f"--ntasks-per-node={tasks_per_node}",
    ]
    if gpus:
        options.append(
            f"--gres=gpu:{gpus}" if profile.scheduler.gpu_request == "gres"
            else f"--gpus-per-node={gpus}"
        )
    options += [f"--cpus-per-task={cpus_per_task}", f"--time={slurm_time(time_seconds)}"]
    if profile.scheduler.account:
        options.append(f"--account={profile.scheduler.account}")
    if profile.scheduler.qos:
        options.append(f"--qos={profile.scheduler.qos}")
    options += [f"--{k}={v}" for k, v in profile.scheduler.extra_options.items()]
    return options


def requeue_options(spec: JobSpec) -> list[str]:
    """The sbatch options of a requeueable job: the signal goes to the batch shell
    (B:), which forwards it to the ranks and requeues; --open-mode=append keeps every
    attempt's output in one log (Slurm truncates it on a requeue otherwise). A chain's
    jobs are separate jobs with their own logs and are not requeued."""
    if spec.requeue is None:
        return []
    options = [f"--signal=B:{spec.requeue.signal}@{spec.requeue.lead}"]
    if spec.requeue.chain == 1:
        # --requeue=expedite (25.11 on, where slurm.conf enables it): the requeued job
        # starts again first, before the queue's others.
        options += ["--requeue=expedite" if expedites(spec) else "--requeue",
                    "--open-mode=append"]
    return options


def expedites(spec: JobSpec) -> bool:
    """Whether the job asks for ``--requeue=expedite``: a requeued job (not a chain's) on a
    release that has it, whose cluster enables it (scheduler.requeue_expedite)."""
    return (spec.requeue is not None and spec.requeue.chain == 1
            and spec.profile.scheduler.requeue_expedite
            and releases.profile_behaviour(spec.profile.scheduler.release).requeue_expedite)


def sbatch_job_name(name: str) -> str:
    """The job name as #SBATCH can carry it (the exact one goes on sbatch's argv)."""
    return sbatch_value(name.replace('"', "'"))


def sbatch_value(value: str) -> str:
    """``value`` as one argument of an ``#SBATCH`` line.

    sbatch's #SBATCH parser splits at whitespace and understands double quotes (no
    escapes), not shell quoting; a value with a double quote or a control character
    cannot be carried (the profile schema and check_request refuse them first).
    Raises ValidationError.
    """
    if '"' in value or CONTROL.search(value):
        raise ValidationError(f"#SBATCH value {value!r}: a double quote or control character "
                              f"cannot be carried in an #SBATCH line")
    return value if _PLAIN_SBATCH.fullmatch(value) else f'"{value}"'


def sbatch_option(option: str) -> str:
    """``--key=value`` for an ``#SBATCH`` line: the value quoted as sbatch parses it."""
    key, sep, value = option.partition("=")
    return f"{key}{sep}{sbatch_value(value)}" if sep else option


class SlurmDialect:
    """hpcdl.schedulers.base.ScriptDialect for Slurm."""

    name = "slurm"
    template = "sbatch.sh.j2"
    submits = True
    job_id_word = '"$SLURM_JOB_ID"'
    job_id_arith = "SLURM_JOB_ID"
    first_node = '"$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"'
    submit_dir = '"$SLURM_SUBMIT_DIR"'

    def unsupported(self, profile: Profile, feature: Feature) -> str | None:
        return None

    def alloc(self, spec: JobSpec, command: Sequence[str]) -> Allocation:
        """salloc with the same options as the #SBATCH lines; srun inside the allocation
        is told the CPUs per task (Slurm >= 22.05 does not pass --cpus-per-task on)."""
        argv = ("salloc", f"--job-name={spec.job_name}",
                *scheduler_options(spec.profile, spec.partition, nodes=spec.nodes,
                                   gpus=spec.gpus_per_node, tasks_per_node=spec.tasks_per_node,
                                   cpus_per_task=spec.cpus_per_task,
                                   time_seconds=spec.time_seconds),
                *command)
        cpus_env = releases.profile_behaviour(spec.profile.scheduler.release).cpus_per_task_env
        return Allocation(argv, ((cpus_env, str(spec.cpus_per_task)),), "salloc.sh.j2")

    def log_paths(self, spec: JobSpec) -> tuple[str, str]:
        log_dir = spec.run_dir or "."
        out, err = RUN_FILES.logs("%j")
        return f"{log_dir}/{out}", f"{log_dir}/{err}"

    def launcher_tokens(self, spec: JobSpec, launcher: Launcher, *,
                        every_healthy_node: bool = False) -> list[str]:
        """The launcher's own command (hpcdl.schedulers.launchers): srun, one torchrun
        agent per node through srun, mpirun, horovodrun."""
        return launcher_for(launcher).tokens(spec, every_healthy_node=every_healthy_node)

    def header(self, spec: JobSpec) -> dict[str, Any]:
        output, error = self.log_paths(spec)
        options = scheduler_options(
            spec.profile, spec.partition, nodes=spec.allocated_nodes, gpus=spec.gpus_per_node,
            tasks_per_node=spec.tasks_per_node, cpus_per_task=spec.cpus_per_task,
            time_seconds=spec.time_seconds)
        return {
            # The variable srun reads the CPUs per task from: the release's.
            "cpus_env": releases.profile_behaviour(
                spec.profile.scheduler.release).cpus_per_task_env,
            "slurm_release": spec.profile.scheduler.release,
            # The job script's last word on a job it does not requeue (the template's
            # hpcdl_final): Slurm must not requeue it either.
            "requeue_expedite": expedites(spec),
            "job_name": sbatch_job_name(spec.job_name),
            "options": [*(sbatch_option(o) for o in options),
                        *(sbatch_option(o) for o in requeue_options(spec)),
                        # A failed node does not end the job: the node guard replaces it.
                        *(["--no-kill"] if spec.spares else []),
                        f"--output={sbatch_value(output)}",
                        f"--error={sbatch_value(error)}"],
        }

    def stage_file(self, spec: JobSpec, local: str, name: str, what: str) -> dict[str, str]:
        """sbcast's copy on every node: its name holds the job id, so two jobs on one
        node never share, overwrite or remove each other's copy."""
        head, tail = f"{local.rstrip('/')}/hpcdl-", f"-{name}"
        shown = f"{head}$SLURM_JOB_ID{tail}"
        return {"local_q": shell_join([local]),
                "dest": shell_join([head]) + self.job_id_word + shell_join([tail]),
                "shown": shown,
                "note": f"{what} staged: each node's copy {shown} (sbcast, below), removed at "
                        f"the end."}

    def warnings(self, profile: Profile) -> list[str]:
        return []
