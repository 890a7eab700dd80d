"""The profile and image-spec reference, generated from the pydantic models at build time.

Used as a MkDocs hook (``hooks:`` in mkdocs.yml): a page line of the form

    <!-- reference: hpcdl.profiles.schema:Profile -->

is replaced by one table per model (the root, then every nested model in the order the
fields name them): field, type, default and description, all read from the models. The
models are the one source, so the reference cannot drift from what hpcdl accepts; a
marker naming a model that does not exist, or a field without a description, fails the
build. ``python3 scripts/docs_reference.py hpcdl.profiles.schema:Profile`` prints the
tables for a look without MkDocs.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

ROOT = Path(__file__).resolve().parent.parent
# The checkout's own models, not an installed hpcdl that may point at another tree.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MARKER = re.compile(r"^<!-- reference: (?P<module>[\w.]+):(?P<model>\w+) -->$", re.MULTILINE)


def load_model(module: str, name: str) -> type[BaseModel]:
    model = getattr(importlib.import_module(module), name, None)
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise ValueError(f"reference marker: {module}:{name} is not a pydantic model")
    return model


def anchor(path: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-") or "top"


def _kind(metadata: typing.Iterable[Any]) -> Any:
    # hpcdl.core.tokens.Kind, found by its shape so this module does not import hpcdl's internals.
    return next((m for m in metadata if hasattr(m, "pattern") and hasattr(m, "example")), None)


def _bounds(metadata: typing.Iterable[Any]) -> str:
    words = []
    for m in metadata:
        if isinstance(m, FieldInfo):  # Field(ge=1) inside an Annotated alias
            words.append(_bounds(m.metadata).strip())
        elif isinstance(m, annotated_types.Ge):
            words.append(f"≥ {m.ge}")
        elif isinstance(m, annotated_types.Gt):
            words.append(f"> {m.gt}")
        elif isinstance(m, annotated_types.Le):
            words.append(f"≤ {m.le}")
        elif isinstance(m, annotated_types.Lt):
            words.append(f"< {m.lt}")
    words = [w for w in words if w]
    return (" " + ", ".join(words)) if words else ""


def type_text(tp: Any, metadata: typing.Sequence[Any], links: dict[type, str]) -> str:
    """A reader's name for a field type: the token kind, the choices, the nested model."""
    origin = get_origin(tp)
    if origin is Annotated:
        inner, *more = get_args(tp)
        return type_text(inner, [*metadata, *more], links)
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        parts = [type_text(a, metadata, links) for a in args if a is not type(None)]
        text = " or ".join(parts)
        return f"{text} or null" if type(None) in args else text
    if origin is Literal:
        return " or ".join(f"`{json.dumps(a)}`" for a in get_args(tp))
    if origin is list:
        (item,) = get_args(tp)
        return f"list of {type_text(item, [], links)}"
    if origin is dict:
        key, value = get_args(tp)
        return f"map of {type_text(key, [], links)} to {type_text(value, [], links)}"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return f"[{tp.__name__}](#{links[tp]})"
    kind = _kind(metadata)
    if kind is not None:
        example = f" (e.g. `{kind.example}`)" if kind.example else ""
        return f"{kind.name}{example}"
    base = {str: "string", bool: "boolean", int: "integer", float: "number"}.get(tp)
    if base is None:
        raise ValueError(f"reference: no reader's name for the type {tp!r}")
    return base + _bounds(metadata)


def default_text(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "its fields' defaults"
    return f"`{json.dumps(value)}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def nested_models(tp: Any) -> list[type[BaseModel]]:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    return [m for arg in get_args(tp) for m in nested_models(arg)]


def walk(root: type[BaseModel], prefix: str) -> list[tuple[str, type[BaseModel]]]:
    """(YAML path, model) for the root and each nested model, depth first in field order."""
    out = [(prefix, root)]
    for name, field in root.model_fields.items():
        for model in nested_models(field.annotation):
            suffix = "[]" if get_origin(field.annotation) is list else ""
            path = f"{prefix}.{name}{suffix}" if prefix else f"{name}{suffix}"
            out.extend(walk(model, path))
    return out


def render(root: type[BaseModel], title: str) -> str:
    """The Markdown tables of ``root`` and every model nested in it."""
    sections = walk(root, "")
    links = {model: anchor(path or title) for path, model in reversed(sections)}
    out: list[str] = []
    for path, model in sections:
        heading = f"`{path}`" if path else title
        out.append(f"## {heading} {{#{anchor(path or title)}}}\n")
        doc = (model.__doc__ or "").strip()
        if doc and not doc.startswith(("Usage docs", "A base class")):
            out.append(" ".join(doc.split()).replace("``", "`") + "\n")
        out.append("| field | type | default | description |")
        out.append("|---|---|---|---|")
        for name, field in model.model_fields.items():
            key = field.alias or name
            if not field.description:
                raise ValueError(f"reference: {model.__name__}.{name} has no description "
                                 f"(add Field(description=...) in {model.__module__})")
            kind = type_text(field.annotation, field.metadata, links)
            out.append(f"| `{key}` | {_cell(kind)} | {_cell(default_text(field))} | "
                       f"{_cell(field.description)} |")
        out.append("")
    return "\n".join(out)


def expand(markdown: str) -> str:
    """Replace every reference marker in a page with the tables it names."""
    def one(m: re.Match[str]) -> str:
        return render(load_model(m["module"], m["model"]), m["model"])
    return MARKER.sub(one, markdown)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs hook: pages with a reference marker get their tables."""
    return expand(markdown)


if __name__ == "__main__":
    for ref in sys.argv[1:] or ["hpcdl.profiles.schema:Profile", "hpcdl.container.spec:ImageSpec"]:
        mod, _, name = ref.partition(":")
        print(render(load_model(mod, name), name))
