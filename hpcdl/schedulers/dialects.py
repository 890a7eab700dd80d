"""The one place a job script's dialect is picked, by the profile's ``scheduler.type``.
The planning layer (hpcdl.plan) asks here and never imports a scheduler's package."""

from __future__ import annotations

from hpcdl.profiles.schema import SchedulerType
from hpcdl.schedulers.base import ScriptDialect
from hpcdl.schedulers.pbs.script import PbsDialect
from hpcdl.schedulers.slurm.script import SlurmDialect

DIALECTS: dict[SchedulerType, ScriptDialect] = {"slurm": SlurmDialect(), "pbs": PbsDialect()}


def dialect_for(kind: SchedulerType) -> ScriptDialect:
    """The script dialect of scheduler type ``kind`` (the schema allows no other)."""
    return DIALECTS[kind]
