"""`hpcdl alloc`: an interactive allocation (salloc on Slurm), checked like a batch job.

Users on Neuron type `salloc --partition=amd_a100nv_8 -J debug --nodes=2
--time=2:00:00 --gres=gpu:4 --comment=horovod` by hand (KISTI's Neuron guide); this
builds the same command from the profile after the same limit checks as `submit`: the
profile's scheduler dialect spells it (ScriptDialect.alloc), with the same options as
its job script, or refuses in one line where hpcdl has no interactive allocation.
What a dry run shows is what runs: salloc with its environment (``prepare_alloc``).
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcdl.core import proc
from hpcdl.core.templating import render_template, shell_join
from hpcdl.jobs.cluster import Cluster
from hpcdl.plan import (
    JobRequest,
    check_request,
    choose_partition,
    default_cpus_per_task,
    job_time,
    tasks_per_node,
)
from hpcdl.profiles.schema import Profile
from hpcdl.schedulers.base import JobSpec
from hpcdl.schedulers.dialects import dialect_for
from hpcdl.schedulers.executor import LOCAL, Executor


@dataclass(frozen=True)
class AllocPlan:
    profile: str
    partition: str
    partition_reason: str
    argv: tuple[str, ...]
    script: str
    # What the command needs in its environment (the dialect's).
    env: tuple[tuple[str, str], ...] = ()


def build_alloc(profile: Profile, req: JobRequest) -> AllocPlan:
    """Validate ``req`` and build the allocation's argv. Raises ValidationError,
    RenderError, UserInputError (a scheduler hpcdl cannot allocate on)."""
    check_request(req)
    part, reason = choose_partition(profile, req.placement)
    cpus = req.placement.cpus_per_task or default_cpus_per_task(part, req.placement.gpus)
    spec = JobSpec(profile=profile, partition=part, nodes=req.placement.nodes, gpus_per_node=req.placement.gpus,
                   tasks_per_node=tasks_per_node(req.placement.gpus), cpus_per_task=cpus,
                   time_seconds=job_time(profile, part, req.placement),
                   job_name=req.files.job_name or "interactive", run_dir=None)
    alloc = dialect_for(profile.scheduler.type).alloc(spec, req.launch.command)
    script = render_template(
        alloc.template,
        {"profile": profile, "modules": profile.modules, "salloc_line": shell_join(alloc.argv),
         "cpus_per_task": cpus,
         # The dialect's variable for srun's CPUs per task (the release's, on Slurm).
         "cpus_env": alloc.env[0][0] if alloc.env else "SRUN_CPUS_PER_TASK"},
        template_file=req.files.template,
        template_dirs=[profile.template_dir] if profile.template_dir else (),
    )
    return AllocPlan(profile.name, part.name, reason, alloc.argv, script, alloc.env)


def alloc_command(plan: AllocPlan, executor: Executor = LOCAL
                  ) -> tuple[list[str], dict[str, str]]:
    """The local command that runs the allocation, and what it adds to the environment,
    as the transport ``executor`` runs a program on a terminal where the scheduler's
    commands run: here, the dialect's argv and environment; through a profile's
    ``login:`` node, ``ssh -t LOGIN -- env NAME=VALUE ... ARGV`` with every word quoted
    for the remote shell (see the transport's ``terminal``)."""
    return executor.terminal(list(plan.argv), dict(plan.env))


def run_alloc(plan: AllocPlan, executor: Executor = LOCAL) -> int:
    """Run the allocation in the foreground (it owns the terminal), where ``executor``
    runs the scheduler's commands (a login node's master connection is opened first,
    prompts allowed, so a host key or key refused is one line, not ssh's). Returns its
    exit code."""
    executor.connect()
    argv, env = alloc_command(plan, executor)
    return proc.interactive(argv, env=env)


@dataclass(frozen=True)
class PreparedAlloc:
    """An allocation made ready to run: its plan, the transport that runs it (with the
    profile's command directory) and for a dry run the lines to show before the script
    (None for real)."""

    plan: AllocPlan
    executor: Executor
    notes: list[str] | None


def prepare_alloc(profile: Profile, req: JobRequest, cluster: Cluster) -> PreparedAlloc:
    """``req`` as an allocation through ``cluster`` (hpcdl.jobs.prepare.open_cluster's,
    which refused a scheduler hpcdl does not allocate on, dry run or not), dry run
    (``cluster.planning``) or not. Raises ValidationError, RenderError, UserInputError."""
    # Lazy: the command directory's registry is the scheduler's, asked only here.
    from hpcdl.schedulers.registry import with_commands

    plan = build_alloc(profile, req)
    # The allocation command from the profile's command directory, as every other one;
    # opens nothing: a connection starts with its first use.
    executor = with_commands(profile, cluster.executor)
    notes = None
    if cluster.planning:
        notes = [f"runs on the login node {executor.target} (ssh -t)"] if executor.remote else []
    return PreparedAlloc(plan, executor, notes)
