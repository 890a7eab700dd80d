"""What `hpcdl submit` needs of the hang watchdog to parse its options and plan the
job: the actions a hang may take and the timeout's parser. Kept apart from
hpcdl.hang.diagnosis (py-spy's dumps, the diagnosis: a dozen dataclasses and regular
expressions, ~5 ms to import) so that a submission, which only follows a job with
--wait, does not load it on its way to sbatch (issue 43).
"""

from __future__ import annotations

import math
import re

DEFAULT_HANG_ACTION = "cancel"
# relaunch: a job with spare nodes ends the step and starts the training again from its
# checkpoint inside the allocation (hpcdl.launch.nodes), without the hung rank's node
# when the diagnosis points at one; the default for such a job.
HANG_ACTIONS: tuple[str, ...] = (DEFAULT_HANG_ACTION, "leave", "relaunch")
# The job watches itself (hpcdl.jobside.hangwatch) under its batch host's python3, which
# must be this new (the job-side modules' syntax); the script checks before starting it.
WATCHDOG_PYTHON = (3, 9)
# What the script writes in the run directory when it cannot start the watchdog (no such
# python3 on the batch host): one line saying why. A follower then watches from where it
# runs (hpcdl.jobs.flow, hpcdl.jobs.watchdog).
UNWATCHED_NAME = "hang-unwatched"


def parse_seconds(field_name: str, text: str) -> float:
    """A positive, finite number of seconds (``90``, ``1.5``) for ``--field_name``.

    Raises ValueError with a one-line message naming the field, the value and the rule.
    """
    value = text.strip()
    if not re.fullmatch(r"-?([0-9]+(\.[0-9]*)?|\.[0-9]+)", value):
        raise ValueError(f"{field_name}: {text!r} is not a number of seconds (e.g. 600)")
    seconds = float(value)
    if not seconds > 0 or not math.isfinite(seconds):
        raise ValueError(f"{field_name}: must be more than 0 seconds (got {text})")
    return seconds
