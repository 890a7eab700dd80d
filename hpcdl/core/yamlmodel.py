"""Typed YAML files (cluster profiles, image specs): read, parse, validate with a
pydantic model, and turn every problem into one ConfigError line naming the file,
the line (YAML syntax) or the field (schema), the value and the valid keys.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, TypeVar

import pydantic
import yaml

from hpcdl.errors import ConfigError

M = TypeVar("M", bound=pydantic.BaseModel)
_WORD = re.compile(r"[A-Za-z0-9_.\-]+")


def load_yaml_model(path: Path, model: type[M], *, kind: str) -> M:
    """Read ``path`` and validate it as ``model``; ``kind`` names the file in errors."""
    return parse_yaml_model(read_text(path, kind=kind), model, source=str(path), kind=kind)


def read_text(path: Path, *, kind: str) -> str:
    """A UTF-8 text file (profile, spec, definition). Raises ConfigError naming the file
    when it cannot be read or is not UTF-8 (with the offset of the first bad byte)."""
    try:
        return path.read_text(encoding="utf-8")
    except IsADirectoryError as exc:
        raise ConfigError(f"{path}: is a directory, not a {kind} file") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {kind}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: {kind} is not UTF-8 text (byte {exc.object[exc.start:exc.start + 1]!r} "
            f"at offset {exc.start})"
        ) from exc


def parse_yaml_model(text: str, model: type[M], *, source: str, kind: str) -> M:
    """Validate YAML ``text`` as ``model``. Raises ConfigError with ``source`` and field."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{source}{where}: YAML syntax error: {problem}") from exc
    except RecursionError as exc:  # e.g. 50000 nested '[': not a profile or spec
        raise ConfigError(f"{source}: YAML nested too deeply to be a {kind}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a {kind} must be a YAML mapping, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        raise ConfigError(f"{source}: {describe_validation_error(exc, model)}") from exc


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
    # Token checks already quote the value (as repr: one line); others get it appended.
    quoted = isinstance(value, str) and repr(value) in msg
    shown = f" (got {value!r})" if not isinstance(value, dict | list) and not quoted else ""
    return f"field '{field}': {msg}{shown}" if field else f"{msg}{shown}"


def _dotted(loc: tuple[Any, ...]) -> str:
    """``env.vars.NAME``, ``modules[2]``; a key that is no plain word is shown as repr
    (one line), and pydantic's ``[key]`` marker (the key itself was refused) is dropped."""
    if loc and loc[-1] == "[key]":
        loc = loc[:-1]
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _WORD.fullmatch(str(part)):
            out += f"[{str(part)!r}]"
        else:
            out += f".{part}" if out else str(part)
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
