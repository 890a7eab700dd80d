"""The one place a job script's dialect is picked, by the profile's ``scheduler.type``.
The planning layer (hpcdl.plan) asks here and never imports a scheduler's package."""

from __future__ import annotations

from hpcdl.profiles.schema import Profile, SchedulerType
from hpcdl.schedulers.base import ScriptDialect
from hpcdl.schedulers.pbs.script import NO_SCRIPT, PbsDialect, refusal
from hpcdl.schedulers.slurm.script import SlurmDialect

DIALECTS: dict[SchedulerType, ScriptDialect] = {"slurm": SlurmDialect(), "pbs": PbsDialect()}


def dialect_for(kind: SchedulerType) -> ScriptDialect:
    """The script dialect of scheduler type ``kind`` (the schema allows no other)."""
    return DIALECTS[kind]


def refuse(profile: Profile, command: str, *, dry_run: bool = False) -> None:
    """Raise UserInputError (exit 2, one line) when hpcdl does not submit to ``profile``'s
    scheduler (its dialect's scripts are for reading): ``command`` is refused, and so is
    its ``dry_run`` where that prints no script (hpcdl.schedulers.pbs.script.NO_SCRIPT:
    a sweep's job array, an allocation); a dry run refuses what the command refuses."""
    if dialect_for(profile.scheduler.type).submits or (dry_run and command not in NO_SCRIPT):
        return
    raise refusal(profile, command)
