"""hpcdl's duration syntax (Slurm's time syntax) <-> seconds.

hpcdl's --time and a profile's max_time/default_time take what Slurm takes: "MM",
"MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM", "D-HH:MM:SS" and "infinite"/"UNLIMITED".
The text is parsed once where it comes in (request and profile validation, a
scheduler's output read by its adapter); the plan and the job spec carry seconds
(None: unlimited), and each scheduler dialect spells them in its own script
(hpcdl.schedulers.slurm.script, hpcdl.schedulers.pbs.script). ``format_time`` is
hpcdl's own display form (plan.json's "time", messages).
"""

from __future__ import annotations

import re

UNLIMITED = None
_UNLIMITED_WORDS = {"infinite", "unlimited"}
_DAYS = re.compile(r"(\d+)-(\d+)(?::(\d+))?(?::(\d+))?")
_CLOCK = re.compile(r"(\d+)(?::(\d+))?(?::(\d+))?")


def parse_time(text: str) -> int | None:
    """Seconds for a Slurm time string, or None for unlimited.

    Raises ValueError with the accepted forms when ``text`` is not a Slurm time.
    """
    value = str(text)
    if value.lower() in _UNLIMITED_WORDS:
        return UNLIMITED
    # fullmatch: a trailing newline is not part of a time (re's `$` would allow it).
    m = _DAYS.fullmatch(value)
    if m:
        days, hours, minutes, seconds = (int(g) if g else 0 for g in m.groups())
        return _checked(((days * 24 + hours) * 60 + minutes) * 60 + seconds, value)
    m = _CLOCK.fullmatch(value)
    if m:
        parts = [int(g) for g in m.groups() if g is not None]
        if len(parts) == 1:  # minutes
            return _checked(parts[0] * 60, value)
        if len(parts) == 2:  # minutes:seconds
            return _checked(parts[0] * 60 + parts[1], value)
        return _checked(parts[0] * 3600 + parts[1] * 60 + parts[2], value)
    raise ValueError(
        f"{value!r} is not a Slurm time (use HH:MM:SS, D-HH:MM:SS, minutes, or 'infinite')"
    )


def _checked(seconds: int, value: str) -> int:
    if seconds <= 0:
        raise ValueError(f"{value!r} is not a positive time")
    return seconds


def format_time(seconds: int | None) -> str:
    """Slurm's canonical form: D-HH:MM:SS (days only when needed), or 'infinite'."""
    if seconds is None:
        return "infinite"
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock
