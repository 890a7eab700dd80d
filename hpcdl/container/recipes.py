"""Other people's recipes, read with spython: a Dockerfile converted to an Apptainer
definition (spython's Docker parser and Singularity writer), and a user's .def file
described (spython's Singularity parser).

spython is good at parsing and writing recipes; hpcdl does not use it to build (see
hpcdl.container.build's docstring). Imported lazily: the CLI must start fast.

Base images. No registry may be reachable, so a converted Dockerfile can be pointed at
a local image in two ways, both giving ``Bootstrap: localimage`` / ``From: PATH``:
``FROM localimage:/path/base.sif`` in the Dockerfile (Docker itself would not accept
it; a Dockerfile meant for both keeps its registry FROM and uses the option), or
``hpcdl build Dockerfile --base-image /path/base.sif``, which replaces the FROM of the
(single-stage) Dockerfile.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcdl.core.tokens import IMAGE_REF, check_token
from hpcdl.core.yamlmodel import read_text
from hpcdl.errors import UserInputError

LOCALIMAGE_PREFIX = "localimage:"
_HEADER = re.compile(r"\s*([A-Za-z][A-Za-z0-9]*)\s*:\s*(.*?)\s*")
_SECTION = re.compile(r"\s*%([A-Za-z]+)\b\s*(.*?)\s*")
# Lines of a whole definition text (re.M: ^ and $ at every line).
_BOOTSTRAP_LINE = re.compile(r"^Bootstrap:.*$", re.I | re.M)
_FROM_LINE = re.compile(r"^From:.*$", re.I | re.M)
_BOOTSTRAP_KEY = re.compile(r"^(\s*Bootstrap\s*:).*$", re.I | re.M)


def is_dockerfile(path: Path) -> bool:
    """``Dockerfile``, ``Dockerfile.NAME``, ``NAME.Dockerfile`` or ``*.dockerfile``."""
    name = path.name.lower()
    return name == "dockerfile" or name.startswith("dockerfile.") or name.endswith(".dockerfile")


def dockerfile_name(path: Path) -> str:
    """An image name for a Dockerfile: its folder's name (the build context), sanitised."""
    folder = path.resolve().parent.name or "dockerfile"
    name = re.sub(r"[^A-Za-z0-9_.\-]+", "-", folder).strip("-.") or "dockerfile"
    return name if name[0].isalnum() else f"img-{name}"


def convert_dockerfile(path: Path, *, base_image: str | None = None) -> str:
    """The Apptainer definition spython writes for the Dockerfile at ``path``; with
    ``base_image`` (or a ``FROM localimage:PATH``) its header becomes
    ``Bootstrap: localimage`` / ``From: PATH``.

    Raises UserInputError when the file cannot be read or converted, or when
    ``base_image`` is given for a multi-stage Dockerfile (which FROM would it replace?).
    """
    from spython.main.parse.parsers import DockerParser
    from spython.main.parse.writers import SingularityWriter

    text = read_text(path, kind="Dockerfile")
    froms = re.findall(r"(?im)^\s*FROM\s+(\S+)", text)
    if not froms:
        raise UserInputError(f"dockerfile: {path} has no FROM line")
    if base_image and len(froms) > 1:
        raise UserInputError(f"base-image: {path} has {len(froms)} FROM lines (multi-stage); "
                             "--base-image replaces the FROM of a single-stage Dockerfile")
    try:
        recipe = DockerParser(str(path)).recipe
        for stage in recipe.values():
            # spython puts /bin/bash in front of a CMD that has no ENTRYPOINT
            # (`exec /bin/bash python3 app.py`, which bash tries to read as a script);
            # Docker runs such a CMD as it is.
            if stage.entrypoint is None and stage.cmd is not None:
                stage.entrypoint = []
        definition = SingularityWriter(recipe).convert()
    except Exception as exc:  # spython raises bare exceptions for what it cannot parse
        raise UserInputError(f"dockerfile: spython could not convert {path}: {exc}") from exc
    if base_image is None and froms[0].startswith(LOCALIMAGE_PREFIX) and len(froms) == 1:
        base_image = froms[0][len(LOCALIMAGE_PREFIX):]
    if base_image is not None:
        base = str(Path(base_image).expanduser())
        try:  # the path lands unquoted in the definition's header
            check_token(base, IMAGE_REF)
        except ValueError as exc:
            raise UserInputError(f"base-image: {exc}") from exc
        definition = _BOOTSTRAP_LINE.sub("Bootstrap: localimage", definition, count=1)
        definition = _FROM_LINE.sub(lambda _: f"From: {base}", definition, count=1)
    header = (f"# Converted by hpcdl from {path.name} with spython's Docker -> Singularity "
              "writer.\n")
    return header + definition.rstrip("\n") + "\n"


@dataclass(frozen=True)
class DefinitionInfo:
    """What a definition file holds: its header and, per section, what spython parsed."""

    path: str
    bootstrap: str | None
    base: str | None
    header: dict[str, str]
    sections: list[str]
    files: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    environment: list[str] = field(default_factory=list)
    post_lines: int = 0
    runscript: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def inspect_definition(path: Path) -> DefinitionInfo:
    """Describe the definition file at ``path``.

    The header (Bootstrap, From, ...) and the section names are read here; the
    sections' contents come from spython's Singularity parser. That parser accepts
    only ``Bootstrap: docker`` recipes, although its section parsing does not depend
    on the bootstrap, so it reads a copy whose Bootstrap line says docker.
    Raises UserInputError when the file cannot be read or has no Bootstrap line.
    """
    from spython.main.parse.parsers import SingularityParser

    text = read_text(path, kind="definition")
    header: dict[str, str] = {}
    sections: list[str] = []
    for line in text.splitlines():
        section = _SECTION.fullmatch(line)
        if section:
            sections.append(section.group(1).lower())
            continue
        m = _HEADER.fullmatch(line)
        if m and not sections and not line.lstrip().startswith("#"):
            header.setdefault(m.group(1).lower(), m.group(2))
    if "bootstrap" not in header:
        raise UserInputError(f"definition: {path} has no 'Bootstrap:' line")
    parse_text = _BOOTSTRAP_KEY.sub(r"\1 docker", text, count=1)
    with tempfile.NamedTemporaryFile("w", suffix=".def") as tmp:
        tmp.write(parse_text)
        tmp.flush()
        try:
            recipes = list(SingularityParser(tmp.name).recipe.values())
        except Exception as exc:  # spython raises bare exceptions for what it cannot parse
            raise UserInputError(f"definition: spython could not parse {path}: {exc}") from exc
    recipe = recipes[-1] if recipes else None
    return DefinitionInfo(
        path=str(path),
        bootstrap=header.get("bootstrap"),
        base=header.get("from"),
        header=header,
        sections=sections,
        files=list(getattr(recipe, "files", []) or []),
        labels=list(getattr(recipe, "labels", []) or []),
        environment=list(getattr(recipe, "environ", []) or []),
        post_lines=len(getattr(recipe, "install", []) or []),
        runscript=getattr(recipe, "cmd", None),
    )
