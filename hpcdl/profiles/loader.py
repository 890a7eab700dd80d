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
from typing import Any

import pydantic
import yaml

from hpcdl.errors import ConfigError, UserInputError
from hpcdl.profiles.schema import Profile
from hpcdl.resources import bundled_profiles_dir

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
        if not path.is_file():
            raise UserInputError(f"profile: file '{ref}' does not exist")
        return path
    for source in list_profiles():
        if source.name == ref:
            return source.path
    raise UserInputError(f"profile: unknown profile '{ref}' (available: {names})")


def load_profile(ref: str | None = None) -> Profile:
    """Load a profile by name or path, following the lookup order.

    Raises UserInputError (unknown profile) or ConfigError (malformed file).
    """
    return load_profile_file(resolve_profile(ref))


def load_profile_file(path: str | os.PathLike[str]) -> Profile:
    """Parse and validate one profile file. Raises ConfigError naming file and field."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read profile: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}{where}: YAML syntax error: {problem}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a profile must be a YAML mapping, got {type(data).__name__}")
    try:
        return Profile.model_validate(data)
    except pydantic.ValidationError as exc:
        raise ConfigError(f"{path}: {describe_validation_error(exc, Profile)}") from exc


def describe_validation_error(exc: pydantic.ValidationError, model: type[pydantic.BaseModel]) -> str:
    """One line for the first schema error: field path, problem, value, valid keys."""
    errors = exc.errors()
    # An unknown key usually explains the "missing" errors beside it (a typo): name it first.
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = err["loc"]
    field = _dotted(loc)
    if err["type"] == "extra_forbidden":
        valid = ", ".join(sorted(_fields_at(model, loc[:-1])))
        return f"unknown key '{field}' (valid keys here: {valid})"
    if err["type"] == "missing":
        return f"field '{field}' is required"
    msg = err["msg"].removeprefix("Value error, ")
    value = err.get("input")
    shown = f" (got {value!r})" if not isinstance(value, dict | list) else ""
    return f"field '{field}': {msg}{shown}" if field else f"{msg}{shown}"


def _dotted(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _fields_at(model: type[pydantic.BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Field names of the (nested) model at ``loc``, for the 'valid keys' hint."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        info = current.model_fields.get(part)
        if info is None:
            return []
        current = _model_of(info.annotation)
        if current is None:
            return []
    return list(current.model_fields)


def _model_of(annotation: Any) -> type[pydantic.BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_of(arg)
        if found:
            return found
    return None
