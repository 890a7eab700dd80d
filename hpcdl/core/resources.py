"""Where hpcdl's bundled files live: inside the installed wheel, or the repo checkout;
and where the user's cache is (here, below hpcdl.container.cache's rules for images, so
that core's template renderer keeps its compiled templates there too).

The wheel carries templates/, containers/ and examples/ under ``hpcdl/_data``
(see pyproject's force-include); a source checkout keeps them at top level.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # hpcdl/, above core/
REPO_ROOT = PACKAGE_DIR.parent


def data_dir(name: str) -> Path:
    """The bundled folder ``name`` (templates, containers, examples)."""
    installed = PACKAGE_DIR / "_data" / name
    if installed.is_dir():
        return installed
    return REPO_ROOT / name


def templates_dir() -> Path:
    return data_dir("templates")


def containers_dir() -> Path:
    return data_dir("containers")


def examples_dir() -> Path:
    return data_dir("examples")


def bundled_profiles_dir() -> Path:
    return PACKAGE_DIR / "profiles" / "bundled"


def user_cache(env: Mapping[str, str] | None = None) -> str:
    """``$XDG_CACHE_HOME/hpcdl``, else ``~/.cache/hpcdl`` (the XDG base directory rule:
    a relative XDG_CACHE_HOME is invalid and ignored)."""
    env = os.environ if env is None else env
    xdg = env.get("XDG_CACHE_HOME", "")
    if xdg.startswith("/"):
        return str(Path(xdg) / "hpcdl")
    home = env.get("HOME") or os.path.expanduser("~")
    return str(Path(home) / ".cache" / "hpcdl")
