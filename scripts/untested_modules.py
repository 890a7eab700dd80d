#!/usr/bin/env python3
"""The modules of hpcdl/ with logic that have no unit test file named after them:

    python3 scripts/untested_modules.py            # this checkout
    python3 scripts/untested_modules.py /other/checkout

Prints one line per such module, largest logic first (its logic size, its path), then
the count. It reports and never fails: the project's aim is "a unit test file per module
where the module has logic", and the count is what a before/after comparison reads.

The rules, kept simple so that a reader can check a line by hand:

- logic size: the number of branch statements (if, for, while, try, match, with their
  async forms) inside the module's functions and methods, counted by the AST. A module
  has logic when that number is at least LOGIC_MIN (3): below it a module is data,
  re-exports or a thin wrapper (module-level `if TYPE_CHECKING:` and `if __name__` do
  not count: they are not behaviour).
- named after it: hpcdl/<package>/.../<name>.py has a test file when
  tests/unit/<package>/ holds test_<word>.py or test_<word>_<anything>.py, where <word>
  is <name> or <part>_<name> for any folder <part> on its path, or its singular
  without a final s (so tests/unit/jobs/test_job_flow.py counts for hpcdl/jobs/flow.py,
  hpcdl/schedulers/slurm/parse.py is tested by tests/unit/schedulers/test_slurm_parse.py,
  hpcdl/remote/ssh.py by tests/unit/remote/test_remote_ssh.py). A package's __init__.py
  is named after its package (hpcdl/report/__init__.py: tests/unit/report/test_report.py).
  A top-level module (hpcdl/errors.py) may have its test in any folder of tests/unit/.
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

LOGIC_MIN = 3
BRANCHES = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.Try, ast.TryStar, ast.Match)


def logic_size(tree: ast.AST) -> int:
    """Branch statements inside functions (nested functions and methods included, each
    counted once)."""
    count = 0
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            # Only this function's own statements: a nested def is walked on its own.
            stack = list(node.body)
            while stack:
                child = stack.pop()
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    continue
                if isinstance(child, BRANCHES):
                    count += 1
                stack.extend(ast.iter_child_nodes(child))
    return count


def test_words(rel: Path) -> set[str]:
    """The <word>s a test file for hpcdl-relative path ``rel`` may be named after."""
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if not parts:
        return set()
    name, folders = parts[-1], parts[:-1]
    # A folder's singular counts too: tests/unit/jobs/test_job_flow.py is jobs/flow.py's.
    return {name} | {f"{f}_{name}" for folder in folders
                     for f in (folder, folder.removesuffix("s")) if f}


@functools.cache
def _test_stems(folder: Path) -> tuple[str, ...]:
    """The names of the test files under ``folder`` without "test_" (read once a folder)."""
    if not folder.is_dir():
        return ()
    return tuple(t.stem.removeprefix("test_") for t in folder.rglob("test_*.py"))


def has_test(rel: Path, unit: Path) -> bool:
    folder = unit / rel.parts[0] if len(rel.parts) > 1 else unit
    words = test_words(rel)
    return any(stem == w or stem.startswith(w + "_")
               for stem in _test_stems(folder) for w in words)


def untested(root: Path) -> list[tuple[int, str]]:
    """(logic size, path relative to ``root``) of each module with logic and no test
    named after it, largest first."""
    package, unit = root / "hpcdl", root / "tests" / "unit"
    found = []
    for path in sorted(package.rglob("*.py")):
        size = logic_size(ast.parse(path.read_text(encoding="utf-8")))
        rel = path.relative_to(package)
        if size >= LOGIC_MIN and not has_test(rel, unit):
            found.append((size, str(path.relative_to(root))))
    return sorted(found, key=lambda item: (-item[0], item[1]))


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1])
    found = untested(root)
    for size, rel in found:
        print(f"{size:4d}  {rel}")
    print(f"{len(found)} modules of hpcdl/ with logic (>= {LOGIC_MIN} branches) "
          "have no unit test file named after them")


if __name__ == "__main__":
    main()
