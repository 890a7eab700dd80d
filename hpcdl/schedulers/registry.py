"""The one place an adapter is picked, by the profile's ``scheduler.type``. The job
lifecycle is handed the Scheduler this returns and never imports an adapter."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpcdl.errors import UserInputError
from hpcdl.schedulers.base import RunFiles, Scheduler
from hpcdl.schedulers.executor import LOCAL, Executor, executor_for, executor_for_login
from hpcdl.schedulers.slurm.adapter import SlurmScheduler

# executor_for: re-exported, the one place a profile picks its transport is
# hpcdl.schedulers.executor.
__all__ = ["ADAPTERS", "describe_cluster", "detect_cluster", "executor_for", "with_commands",
           "profile_differences", "run_files", "scheduler_for", "scheduler_of"]

if TYPE_CHECKING:
    from hpcdl.profiles.schema import Login, Profile
    from hpcdl.schedulers.slurm.describe import Detected
    from hpcdl.schedulers.slurm.detect import ClusterFacts

# scheduler.type -> the adapter that submits to it. PBS scripts are rendered for
# reading only (hpcdl.schedulers.pbs): no adapter submits them.
ADAPTERS: dict[str, type[SlurmScheduler]] = {"slurm": SlurmScheduler}


def scheduler_for(profile_name: str | None = None, kind: str = "slurm",
                  executor: Executor = LOCAL, commands: str | None = None) -> Scheduler:
    """The scheduler of type ``kind`` whose commands run through ``executor``, from the
    directory ``commands`` when given (a profile's ``scheduler.commands``);
    ``profile_name`` words its hints. Raises UserInputError for a type no adapter
    submits to."""
    adapter = ADAPTERS.get(kind)
    if adapter is None:
        raise UserInputError(f"scheduler: hpcdl submits to {', '.join(ADAPTERS)} only "
                             f"(profile {profile_name}: {kind})")
    return adapter(profile_name, executor, commands)


def run_files(kind: str = "slurm") -> RunFiles:
    """The names of a run directory's script and logs for jobs of scheduler type
    ``kind``; by default scheduler_for()'s, since a run directory read by its path or
    job id alone is one hpcdl submitted, and hpcdl submits through ADAPTERS only.
    Raises UserInputError for a type no adapter submits to."""
    return scheduler_for(None, kind).run_files


def scheduler_of(profile: Profile) -> Scheduler:
    """The profile's scheduler, its commands run where executor_for says."""
    return scheduler_for(profile.name, profile.scheduler.type, executor_for(profile),
                         profile.scheduler.commands)


def with_commands(profile: Profile, executor: Executor) -> Executor:
    """``executor`` with the profile's scheduler commands run from its
    ``scheduler.commands`` directory (as the adapter runs them), for a command that
    runs one outside the adapter (`hpcdl alloc`'s salloc); as it is without one."""
    if not profile.scheduler.commands:
        return executor
    from hpcdl.schedulers.executor import CommandDir
    from hpcdl.schedulers.slurm.commands import SLURM_COMMANDS

    return CommandDir(executor, profile.scheduler.commands, SLURM_COMMANDS)


def detect_cluster(login: Login | None = None, commands: str | None = None) -> ClusterFacts:
    """The live cluster's facts for `profiles detect` and `profiles diff` (hpcdl detects
    Slurm clusters only): this machine's, or those of the cluster behind ``login`` over
    SSH; Slurm's commands from the directory ``commands`` (a profile's
    scheduler.commands) when given. Raises ToolError, UserInputError (a login node that
    cannot be used)."""
    from hpcdl.schedulers.executor import CommandDir
    from hpcdl.schedulers.slurm.commands import SLURM_COMMANDS
    from hpcdl.schedulers.slurm.detect import gather, gather_remote

    executor = executor_for_login(login)  # the transport decides; this asks it
    if commands:
        executor = CommandDir(executor, commands, SLURM_COMMANDS | {"sacctmgr"})
    return gather_remote(executor) if executor.remote else gather(executor=executor)


def describe_cluster(facts: ClusterFacts, name: str | None = None, when: str | None = None,
                     login: Login | None = None, commands: str | None = None) -> Detected:
    """The profile detect_cluster's ``facts`` describe: validated model, commented YAML,
    caveats (the Slurm adapter's writer). Raises ConfigError when no partition can be
    described."""
    from hpcdl.schedulers.slurm.describe import describe

    return describe(facts, name=name, when=when, login=login, commands=commands)


def profile_differences(profile: Profile, detected: Profile, *,
                        mpi_offered: tuple[str, ...] | None = None,
                        runtime_found: bool = True) -> list[str]:
    """What differs between ``profile`` and the one detect_cluster's facts describe, one
    line each (the Slurm adapter's comparison)."""
    from hpcdl.schedulers.slurm.livecheck import differences

    return differences(profile, detected, mpi_offered=mpi_offered,
                       runtime_found=runtime_found)
