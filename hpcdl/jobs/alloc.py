"""`hpcdl alloc`: an interactive allocation (salloc on Slurm), checked like a batch job.

Users on Neuron type `salloc --partition=amd_a100nv_8 -J debug --nodes=2
--time=2:00:00 --gres=gpu:4 --comment=horovod` by hand (KISTI's Neuron guide); this
builds the same command from the profile after the same limit checks as `submit`: the
profile's scheduler dialect spells it (ScriptDialect.alloc), with the same options as
its job script, or refuses in one line where hpcdl has no interactive allocation.
"""

from __future__ import annotations

import re
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
from hpcdl.remote.ssh import SshExecutor
from hpcdl.schedulers.base import JobSpec
from hpcdl.schedulers.dialects import dialect_for

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


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
    part, reason = choose_partition(profile, req)
    cpus = req.cpus_per_task or default_cpus_per_task(part, req.gpus)
    spec = JobSpec(profile=profile, partition=part, nodes=req.nodes, gpus_per_node=req.gpus,
                   tasks_per_node=tasks_per_node(req.gpus), cpus_per_task=cpus,
                   time_seconds=job_time(profile, part, req),
                   job_name=req.job_name or "interactive", run_dir=None)
    alloc = dialect_for(profile.scheduler.type).alloc(spec, req.command)
    script = render_template(
        alloc.template,
        {"profile": profile, "modules": profile.modules, "salloc_line": shell_join(alloc.argv),
         "cpus_per_task": cpus},
        template_file=req.template,
        template_dirs=[profile.template_dir] if profile.template_dir else (),
    )
    return AllocPlan(profile.name, part.name, reason, alloc.argv, script, alloc.env)


def alloc_command(plan: AllocPlan, login: SshExecutor | None = None
                  ) -> tuple[list[str], dict[str, str]]:
    """The local command that runs the allocation, and what it adds to the environment:
    here, the dialect's argv and environment; through ``login`` (a profile with a
    ``login:`` node), ``ssh -t LOGIN -- env NAME=VALUE ... ARGV`` with every word quoted
    for the remote shell (ssh does not carry the environment; ``env`` sets it there)."""
    if login is None:
        return list(plan.argv), dict(plan.env)
    for name, _ in plan.env:
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(f"environment variable name {name!r}")
    return login.terminal_argv(["env", *(f"{k}={v}" for k, v in plan.env), *plan.argv]
                               if plan.env else list(plan.argv)), {}


def run_alloc(plan: AllocPlan, login: SshExecutor | None = None) -> int:
    """Run the allocation in the foreground (it owns the terminal), on this machine or
    through the login node ``login`` (its master connection opened first, prompts
    allowed, so a host key or key refused is one line, not ssh's). Returns its exit
    code."""
    if login is not None:
        login.connect()
    argv, env = alloc_command(plan, login)
    return proc.interactive(argv, env=env)
