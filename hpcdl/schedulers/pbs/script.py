"""PBS Pro job scripts for profiles with ``scheduler.type: pbs`` (ALCF Polaris).

Pure functions: the ``#PBS`` directives, the ``mpiexec`` launcher, the log paths and
the shell expressions that templates/pbs.sh.j2 renders (``PbsDialect``, the
hpcdl.schedulers.base.ScriptDialect for PBS). hpcdl has no PBS adapter: these scripts are for
``--dry-run`` (read, then ``qsub`` them yourself) and are untested against a live PBS
server; submitting through hpcdl is refused with one line (``refusal``).

PBS directives are not shell, so every value written into one is checked against a
plain-token pattern (re.fullmatch) instead of being quoted: PBS would keep the quotes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from hpcdl.core.templating import Raw
from hpcdl.errors import UserInputError, ValidationError
from hpcdl.profiles.schema import Launcher, Partition, Profile
from hpcdl.schedulers.base import Allocation, Feature, JobSpec

_TOKEN = re.compile(r"[A-Za-z0-9_.+\-]+")
_PATH = re.compile(r"/?[A-Za-z0-9_.+\-]+(?:/[A-Za-z0-9_.+\-]+)*/?")
_NAME_BAD = re.compile(r"[^A-Za-z0-9_.+\-]")


def job_name(name: str) -> str:
    """A PBS job name: no blanks or special characters (replaced by '_'), starts with a letter."""
    cleaned = _NAME_BAD.sub("_", name)[:200]
    return cleaned if cleaned[:1].isalpha() else f"j{cleaned}"


def walltime(seconds: int | None) -> str:
    """Seconds -> PBS walltime HH:MM:SS (hours past 24, no days); None (unlimited) is
    refused: raises ValidationError."""
    if seconds is None:
        raise ValidationError("time: PBS needs a finite walltime (got an unlimited time)")
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}"


def _token(field: str, value: str, pattern: re.Pattern[str] = _TOKEN) -> str:
    if not pattern.fullmatch(value):
        raise ValidationError(
            f"{field}: {value!r} cannot go into a #PBS directive (letters, digits, '_', '.', '+', "
            f"'-'{', /' if pattern is _PATH else ''} only)")
    return value


def directives(profile: Profile, part: Partition, *, nodes: int, gpus: int, tasks_per_node: int,
               cpus_per_task: int, time_seconds: int | None,
               run_dir: str | None) -> list[str]:
    """The ``#PBS`` lines (without '#PBS ') in order. Raises ValidationError for a value
    that cannot be written into a directive."""
    chunk = f"select={nodes}:ncpus={tasks_per_node * cpus_per_task}"
    if gpus:
        chunk += f":ngpus={gpus}"
    out = [f"-l {chunk}",
           # One chunk per node: without it PBS may pack several chunks onto one host.
           "-l place=scatter",
           f"-l walltime={walltime(time_seconds)}",
           f"-q {_token('partition', part.name)}"]
    if profile.scheduler.account:
        out.append(f"-A {_token('scheduler.account', profile.scheduler.account)}")
    if profile.scheduler.filesystems:
        names = [_token("scheduler.filesystems", fs) for fs in profile.scheduler.filesystems]
        out.append(f"-l filesystems={':'.join(names)}")
    if run_dir:
        folder = _token("run-dir", run_dir.rstrip("/") + "/", _PATH)
        out += [f"-o {folder}", f"-e {folder}"]
    return out


def mpiexec_tokens(*, ntasks: int, tasks_per_node: int, cpus_per_task: int) -> list[str]:
    """PBS's ``mpiexec`` (Cray PALS / MPICH) in the place of Slurm's launcher: it starts
    every rank; what follows (the container, the rank-env wrapper, the command) is the
    same as under Slurm."""
    return [Raw("mpiexec"), Raw("-n"), Raw(str(ntasks)), Raw("--ppn"), Raw(str(tasks_per_node)),
            Raw("--depth"), Raw(str(cpus_per_task)), Raw("--cpu-bind"), Raw("depth")]


def warnings(profile: Profile) -> list[str]:
    """What a PBS script of ``profile`` leaves out, and that it is not submitted."""
    out = [f"profile {profile.name} uses PBS Pro: hpcdl renders the qsub script for reading "
           f"(untested against a live PBS server) and does not submit it"]
    if profile.scheduler.qos or profile.scheduler.extra_options:
        out.append("scheduler.qos and scheduler.extra_options are Slurm options: not in the PBS script")
    return out


# The commands whose dry run prints no PBS script (a sweep is one Slurm job array, an
# allocation is salloc): refused dry run or not, with what to do instead. Every other
# command's refusal offers --dry-run, which prints the script to qsub.
NO_SCRIPT = {
    "alloc": "on PBS an interactive job is `qsub -I`",
    "sweep": "a sweep is one Slurm job array; `hpcdl submit --dry-run` prints one point's "
             "PBS script",
}


def refusal(profile: Profile, command: str) -> UserInputError:
    """The one-line refusal of ``command`` for PBS profile ``profile``."""
    hint = NO_SCRIPT.get(command, "use --dry-run to print the PBS script, then qsub it yourself")
    return UserInputError(
        f"scheduler: profile {profile.name} uses {profile.scheduler.type}; hpcdl {command} "
        f"works with Slurm only ({hint})")


class PbsDialect:
    """hpcdl.schedulers.base.ScriptDialect for PBS Pro: scripts for reading, not submitted."""

    name = "pbs"
    template = "pbs.sh.j2"
    submits = False
    # PBS names the job with its server ("123.server"); the number alone in arithmetic.
    job_id_word = '"${PBS_JOBID%%.*}"'
    job_id_arith = "${PBS_JOBID%%.*}"
    first_node = '"$(head -n 1 "$PBS_NODEFILE")"'
    submit_dir = '"$PBS_O_WORKDIR"'

    def unsupported(self, profile: Profile, feature: Feature) -> str | None:
        if feature == "probe":
            return (f"probe: the probe starts its ranks with srun; profile {profile.name} is "
                    f"{profile.scheduler.type}")
        if feature == "stage":
            return (f"stage-image: staging uses Slurm's sbcast; profile {profile.name} is "
                    f"{profile.scheduler.type}")
        if feature == "stage-data":
            return (f"stage-data: staging uses Slurm's sbcast; profile {profile.name} is "
                    f"{profile.scheduler.type}")
        if feature == "spares":
            return (f"spares: spare nodes are replaced inside a Slurm job (sbatch --no-kill, "
                    f"srun --nodelist); profile {profile.name} is {profile.scheduler.type}")
        return ("launcher: torchrun starts one agent per node through srun; a PBS "
                "profile launches every rank with mpiexec (use --launcher mpirun)")

    def alloc(self, spec: JobSpec, command: Sequence[str]) -> Allocation:
        """Refused (``refusal``): hpcdl allocates interactively with Slurm only."""
        raise refusal(spec.profile, "alloc")

    def log_paths(self, spec: JobSpec) -> tuple[str, str]:
        """PBS's own names: ``-o``/``-e`` name the run directory (else the directory
        qsub ran in), where PBS writes JOBNAME.o<sequence number> and .e<...>."""
        folder, name = spec.run_dir or ".", job_name(spec.job_name)
        return f"{folder}/{name}.o<sequence number>", f"{folder}/{name}.e<sequence number>"

    def launcher_tokens(self, spec: JobSpec, launcher: Launcher, *,
                        every_healthy_node: bool = False) -> list[str]:
        # (no spares on PBS: unsupported() refuses them, so no guard step either)
        return mpiexec_tokens(ntasks=spec.ntasks, tasks_per_node=spec.tasks_per_node,
                              cpus_per_task=spec.cpus_per_task)

    def header(self, spec: JobSpec) -> dict[str, Any]:
        return {"pbs_job_name": job_name(spec.job_name),
                "pbs_directives": directives(
                    spec.profile, spec.partition, nodes=spec.nodes, gpus=spec.gpus_per_node,
                    tasks_per_node=spec.tasks_per_node, cpus_per_task=spec.cpus_per_task,
                    time_seconds=spec.time_seconds, run_dir=spec.run_dir)}

    def stage_file(self, spec: JobSpec, local: str, name: str, what: str) -> dict[str, str]:
        raise ValidationError(self.unsupported(spec.profile, "stage") or "stage-image")

    def warnings(self, profile: Profile) -> list[str]:
        return warnings(profile)
