"""Profile facts: the parts of a cluster profile that the doctor's verdicts look at."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProfileFacts:
    """The parts of a cluster profile that the verdicts look at."""

    name: str
    srun_mpi: str | None
    launcher: str
    nv: bool
    gpus_per_node: int  # the most any partition has


def profile_facts(ref: str) -> ProfileFacts:
    """The profile's launcher settings. Raises UserInputError/ConfigError like load_profile."""
    from hpcdl.profiles import load_profile

    p = load_profile(ref)
    return ProfileFacts(
        name=p.name,
        srun_mpi=p.mpi.srun_mpi,
        launcher=p.mpi.launcher,
        nv=p.container.nv,
        gpus_per_node=max((part.gpus_per_node for part in p.partitions), default=0),
    )
