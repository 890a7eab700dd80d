"""The one place a job script's dialect is picked, by the profile's ``scheduler.type``.
The planning layer (hpcdl.plan) asks here and never imports a scheduler's package."""

from __future__ import annotations

from hpcdl.profiles.schema import Profile, SchedulerType
from hpcdl.schedulers.base import ScriptDialect
from hpcdl.schedulers.pbs.script import PbsDialect, refusal
from hpcdl.schedulers.slurm.script import SlurmDialect

DIALECTS: dict[SchedulerType, ScriptDialect] = {"slurm": SlurmDialect(), "pbs": PbsDialect()}


def dialect_for(kind: SchedulerType) -> ScriptDialect:
    """The script dialect of scheduler type ``kind`` (the schema allows no other)."""
    return DIALECTS[kind]


def refuse(profile: Profile, command: str, dry_run_helps: bool = True) -> None:
    """Raise UserInputError (exit 2, one line) when hpcdl does not submit to ``profile``'s
    scheduler (its dialect's scripts are for reading): ``command`` is refused, with
    ``--dry-run`` offered where it prints the script."""
    if not dialect_for(profile.scheduler.type).submits:
        raise refusal(profile, command, dry_run_helps)
