"""The build-time import check, host side: the ``%test`` section that runs it, and the
reading of its one line. The check itself is ``import_check.py`` beside this module,
run inside the image by ``hpcdl build`` (``%test``) and ``hpcdl doctor --image``
(``python3 -c``), so both say the same thing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

MARK = "HPCDL_IMPORT_CHECK"
_LINE = re.compile(rf"{MARK} (ok|FAIL) (.*)")
_HEREDOC = "HPCDL_IMPORT_CHECK_PY"


@dataclass(frozen=True)
class ImportCheck:
    ok: bool
    message: str  # "torch 2.13.0+cpu, horovod 0.28.1, ..." or why it failed (one line)


def import_check_source() -> str:
    """The in-image script (import_check.py, shipped in the package). Raises OSError only
    for a broken installation."""
    return resources.files("hpcdl.container").joinpath("import_check.py").read_text(encoding="utf-8")


def check_section(python: str = "python3") -> str:
    """A ``%test`` section that runs the import check with the image's ``python``
    (skipped in an image without it). Apptainer appends a second ``%test`` to the
    first, so it can follow any definition. Pure but for reading the script."""
    # Without its docstring: the definition shows the code, the file says why.
    source = re.sub(r'\A""".*?"""\n', "", import_check_source(), flags=re.S)
    # A line starting with '%' would open a new section of the definition.
    assert not re.search(r"^%", source, re.M) and _HEREDOC not in source
    return ("\n%test\n"
            "    # hpcdl's import check (hpcdl/container/import_check.py): torch with\n"
            "    # torchvision, horovod.torch and mpi4py when they are installed.\n"
            f"    if command -v {python} >/dev/null 2>&1; then\n"
            f"    {python} - <<'{_HEREDOC}'\n"
            f"{source.rstrip()}\n"
            f"{_HEREDOC}\n"
            "    fi\n")


def parse_import_check(line: str) -> ImportCheck | None:
    """The result on one output line (Apptainer may prefix it), or None. Pure."""
    at = line.find(MARK + " ")
    if at < 0:
        return None
    m = _LINE.match(line[at:].rstrip())
    if not m:
        return None
    return ImportCheck(ok=m.group(1) == "ok", message=m.group(2).strip())


def find_import_check(output: str) -> ImportCheck | None:
    """The last import-check result in a whole output, or None. Pure."""
    found = None
    for line in output.splitlines():
        found = parse_import_check(line) or found
    return found
