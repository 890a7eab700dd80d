"""The one place an adapter is picked, by the profile's ``scheduler.type``. The job
lifecycle is handed the Scheduler this returns and never imports an adapter."""

from __future__ import annotations

from hpcdl.core.errors import UserInputError
from hpcdl.schedulers.base import Scheduler
from hpcdl.schedulers.executor import LOCAL, Executor
from hpcdl.schedulers.slurm.adapter import SlurmScheduler

# scheduler.type -> the adapter that submits to it. PBS scripts are rendered for
# reading only (hpcdl.schedulers.pbs): no adapter submits them.
ADAPTERS: dict[str, type[SlurmScheduler]] = {"slurm": SlurmScheduler}


def scheduler_for(profile_name: str | None = None, kind: str = "slurm",
                  executor: Executor = LOCAL) -> Scheduler:
    """The scheduler of type ``kind`` whose commands run through ``executor``
    (``profile_name`` words its hints). Raises UserInputError for a type no adapter
    submits to."""
    adapter = ADAPTERS.get(kind)
    if adapter is None:
        raise UserInputError(f"scheduler: hpcdl submits to {', '.join(ADAPTERS)} only "
                             f"(profile {profile_name}: {kind})")
    return adapter(profile_name, executor)
