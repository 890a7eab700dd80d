"""Finding and loading cluster profiles.

Lookup order for a profile: ``--profile NAME|PATH``, then ``$HPCDL_PROFILE``,
then ``~/.config/hpcdl/profiles/NAME.yaml`` (``$XDG_CONFIG_HOME`` honoured),
then the profiles bundled with hpcdl. Every problem in a file becomes a
ConfigError naming the file and the field.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from hpcdl.core.resources import bundled_profiles_dir
from hpcdl.core.yamlmodel import load_yaml_model
from hpcdl.errors import UserInputError
from hpcdl.profiles.schema import Profile

ENV_VAR = "HPCDL_PROFILE"


@dataclass(frozen=True)
class ProfileSource:
    name: str
    path: Path
    origin: str  # "user" or "bundled"


def user_profiles_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "hpcdl" / "profiles"


def list_profiles() -> list[ProfileSource]:
    """All profiles by name; a user profile hides a bundled one of the same name."""
    found: dict[str, ProfileSource] = {}
    for origin, folder in (("bundled", bundled_profiles_dir()), ("user", user_profiles_dir())):
        if folder.is_dir():
            for path in sorted(folder.glob("*.y*ml")):
                found[path.stem] = ProfileSource(path.stem, path, origin)
    return sorted(found.values(), key=lambda s: s.name)


def _looks_like_path(ref: str) -> bool:
    return "/" in ref or ref.endswith((".yaml", ".yml"))


def resolve_profile(ref: str | None) -> Path:
    """The file a profile reference points at. Raises UserInputError when none matches."""
    ref = ref or os.environ.get(ENV_VAR) or None
    names = ", ".join(s.name for s in list_profiles())
    if not ref:
        raise UserInputError(
            f"profile: none given (pass --profile NAME|PATH or set {ENV_VAR}; available: {names})"
        )
    if _looks_like_path(ref):
        path = Path(ref).expanduser()
        if path.is_dir():
            raise UserInputError(f"profile: {ref!r} is a directory, not a profile file "
                                 f"(pass a .yaml file or a profile name)")
        if not path.is_file():
            raise UserInputError(f"profile: file {ref!r} does not exist")
        return path
    for source in list_profiles():
        if source.name == ref:
            return source.path
    raise UserInputError(f"profile: unknown profile {ref!r} (available: {names})")


def load_profile(ref: str | None = None) -> Profile:
    """Load a profile by name or path, following the lookup order.

    Raises UserInputError (unknown profile) or ConfigError (malformed file).
    """
    return load_profile_file(resolve_profile(ref))


def load_profile_file(path: str | os.PathLike[str]) -> Profile:
    """Parse and validate one profile file. Raises ConfigError naming file and field."""
    return load_yaml_model(Path(path), Profile, kind="profile")
