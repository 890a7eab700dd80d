"""Where the CLI picks the scheduler the job lifecycle runs against: Slurm, the one
adapter today. The application layer is handed it and never imports an adapter."""

from __future__ import annotations

from hpcdl.scheduler import Scheduler


def scheduler_for(profile_name: str | None = None) -> Scheduler:
    """The scheduler for ``profile_name``'s cluster (its name words Slurm's hints)."""
    from hpcdl.slurm.scheduler import SlurmScheduler

    return SlurmScheduler(profile_name)
