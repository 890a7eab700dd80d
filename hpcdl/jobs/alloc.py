"""`hpcdl alloc`: an interactive allocation (salloc), checked like a batch job.

Users on Neuron type `salloc --partition=amd_a100nv_8 -J debug --nodes=2
--time=2:00:00 --gres=gpu:4 --comment=horovod` by hand (KISTI's Neuron guide); this
builds the same command from the profile after the same limit checks as `submit`,
with the Slurm dialect's options (salloc is Slurm's).
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcdl.core import proc
from hpcdl.core.templating import render_template, shell_join
from hpcdl.plan import (
    JobRequest,
    check_request,
    choose_partition,
    default_cpus_per_task,
    job_time,
    tasks_per_node,
)
from hpcdl.profiles.schema import Profile
from hpcdl.schedulers.slurm.script import scheduler_options


@dataclass(frozen=True)
class AllocPlan:
    profile: str
    partition: str
    partition_reason: str
    argv: tuple[str, ...]
    script: str


def build_alloc(profile: Profile, req: JobRequest) -> AllocPlan:
    """Validate ``req`` and build the salloc argv. Raises ValidationError, RenderError."""
    check_request(req)
    part, reason = choose_partition(profile, req)
    cpus = req.cpus_per_task or default_cpus_per_task(part, req.gpus)
    argv = [
        "salloc",
        f"--job-name={req.job_name or 'interactive'}",
        *scheduler_options(profile, part, nodes=req.nodes, gpus=req.gpus,
                           tasks_per_node=tasks_per_node(req.gpus), cpus_per_task=cpus,
                           time=job_time(profile, part, req)),
        *req.command,
    ]
    script = render_template(
        "salloc.sh.j2",
        {"profile": profile, "modules": profile.modules, "salloc_line": shell_join(argv),
         "cpus_per_task": cpus},
        template_file=req.template,
        template_dirs=[profile.template_dir] if profile.template_dir else (),
    )
    return AllocPlan(profile.name, part.name, reason, tuple(argv), script)


def run_alloc(plan: AllocPlan) -> int:
    """Run salloc in the foreground (it owns the terminal). Returns its exit code."""
    return proc.interactive(
        list(plan.argv), env={"SRUN_CPUS_PER_TASK": _cpus_of(plan.argv)}
    )


def _cpus_of(argv: tuple[str, ...]) -> str:
    for arg in argv:
        if arg.startswith("--cpus-per-task="):
            return arg.split("=", 1)[1]
    return "1"
