"""Where hpcdl keeps expensive artefacts (images, wheelhouses): the one owner of the rules.

The system cache is ``$HPCDL_CACHE`` or /var/cache/hpcdl. On a cluster an ordinary user
cannot write there, and a site may fill it (the wheelhouse an image spec installs from)
for everyone to read. So:

- system cache writable (or creatable): read and write it, as before;
- readable but not writable: write to the user's cache ($XDG_CACHE_HOME/hpcdl, else
  ~/.cache/hpcdl) and read from the user's first, then the site's: what the site
  prepared is reused, nothing of the user's lands in it;
- neither (absent and not creatable, or unreadable): the user's cache alone.

``choose_cache`` is the pure rule; ``cache_dirs`` applies it to this process.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from hpcdl.core.resources import user_cache

SYSTEM_CACHE = "/var/cache/hpcdl"

State = Literal["writable", "readable", "unusable"]


@dataclass(frozen=True)
class CacheDirs:
    write: str  # where new artefacts go
    read: tuple[str, ...]  # where existing ones are looked for, in order (``write`` first)
    reason: str  # one phrase: why these


def system_cache(env: Mapping[str, str] | None = None) -> str:
    """``$HPCDL_CACHE`` or /var/cache/hpcdl."""
    env = os.environ if env is None else env
    return env.get("HPCDL_CACHE") or SYSTEM_CACHE


def choose_cache(system: str, state: State, user: str) -> CacheDirs:
    """The cache directories for a system cache in ``state``. Pure."""
    if state == "writable" or system == user:
        return CacheDirs(system, (system,), f"{system} is writable")
    if state == "readable":
        return CacheDirs(user, (user, system),
                         f"{system} is read-only for this user: reused for reading, "
                         f"new artefacts go to {user}")
    return CacheDirs(user, (user,), f"{system} is not usable by this user: using {user}")


def dir_state(path: str) -> State:
    """Whether this user can write ``path`` (or create it), only read it, or neither."""
    p = Path(path)
    if p.is_dir():
        if os.access(p, os.W_OK | os.X_OK):
            return "writable"
        return "readable" if os.access(p, os.R_OK | os.X_OK) else "unusable"
    if p.exists():
        return "unusable"  # a file where the folder should be
    for parent in p.parents:  # creatable when the nearest existing folder is writable
        if parent.is_dir():
            return "writable" if os.access(parent, os.W_OK | os.X_OK) else "unusable"
    return "unusable"


def cache_dirs(env: Mapping[str, str] | None = None) -> CacheDirs:
    """The cache directories for this process (see the module docstring)."""
    system = system_cache(env)
    return choose_cache(system, dir_state(system), user_cache(env))
