"""hpcdl.launch.staging finds the hpcdl modules the job side imports by parsing only the
import statements (imports_in), not whole files: the same answer as a parse of the whole
file (imports_parsed) for every file hpcdl bundles, and for the shapes an import takes."""

from __future__ import annotations

import pytest

from hpcdl.core.resources import PACKAGE_DIR, examples_dir
from hpcdl.launch.staging import imports_in, imports_parsed

BUNDLED = sorted([*PACKAGE_DIR.rglob("*.py"), *examples_dir().rglob("*.py")])


def test_every_bundled_file_reads_as_a_whole_parse() -> None:
    assert len(BUNDLED) > 100  # the package and the examples, not an empty glob
    differ = [str(p) for p in BUNDLED
              if imports_in(p.read_text(), str(p)) != imports_parsed(p.read_text(), str(p))]
    assert differ == []


@pytest.mark.parametrize("source, expected", [
    ("import os\nfrom hpcdl.core import tokens\n", {"hpcdl.core", "hpcdl.core.tokens"}),
    ("def f():\n    from hpcdl.a.b import c as d\n", {"hpcdl.a.b", "hpcdl.a.b.c"}),
    ("from hpcdl.x import (\n    y,  # why\n    z,\n)\n", {"hpcdl.x", "hpcdl.x.y", "hpcdl.x.z"}),
    ("from hpcdl.x import y, \\\n    z\n", {"hpcdl.x", "hpcdl.x.y", "hpcdl.x.z"}),
    ("import os, hpcdl.core.proc; import hpcdl\n", {"hpcdl.core.proc", "hpcdl"}),
    # a comment's parenthesis leaves the statement unclosed alone: the whole file is parsed
    ("from hpcdl.x import (a,  # (see b)\n    b)\n", {"hpcdl.x", "hpcdl.x.a", "hpcdl.x.b"}),
    ("from . import x\nfrom hpcdlx import y\nimport hpcdl_other\n", set()),
])
def test_import_shapes(source: str, expected: set[str]) -> None:
    assert imports_in(source) == expected == imports_parsed(source)


def test_an_import_line_inside_a_string_is_what_the_whole_file_check_catches() -> None:
    # The limit of reading statements alone, and why the test above reads every file.
    source = 'DOC = """\nfrom hpcdl.hidden import x\n"""\n'
    assert imports_in(source) == {"hpcdl.hidden", "hpcdl.hidden.x"}
    assert imports_parsed(source) == set()


def test_job_side_files_as_from_whole_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    # The files a job stages: the same set as when every file is parsed whole.
    from hpcdl.launch import staging

    fast = staging._job_side_files.__wrapped__(True)  # (the watchdog's modules too)
    monkeypatch.setattr(staging, "_hpcdl_imports",
                        lambda path: imports_parsed(path.read_text(), str(path)))
    assert fast == staging._job_side_files.__wrapped__(True)
    assert "hpcdl/jobside/probe_worker.py" in fast and "hpcdl/jobside/steps.py" in fast
