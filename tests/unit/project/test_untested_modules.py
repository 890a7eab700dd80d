"""scripts/untested_modules.py's two rules (logic size, a test named after the module) on
a tree of its own, and its run on this checkout."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from tests.unit.project.scriptload import load_script

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "untested_modules.py"


def _script() -> ModuleType:
    return load_script("untested_modules")


def test_logic_size_counts_branches_inside_functions_only() -> None:
    source = '''
import typing
if typing.TYPE_CHECKING:
    import os
def f(x):
    if x:
        for i in x:
            while i:
                i -= 1
    try:
        pass
    except ValueError:
        pass
    def inner(y):
        match y:
            case 1:
                return 1
    return [a for a in x if a]
class C:
    def m(self):
        if self:
            return 1
if __name__ == "__main__":
    f(1)
'''
    # f: if, for, while, try (4); inner: match (1); C.m: if (1); module-level ifs: none;
    # the comprehension's filter is an expression, not a statement.
    assert _script().logic_size(ast.parse(source)) == 6


def _touch(path: Path, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_module_is_tested_by_a_file_named_after_it_in_its_packages_folder(
        tmp_path: Path) -> None:
    logic = "def f(x):\n    if x: pass\n    if x: pass\n    if x: pass\n"
    for rel in ("schedulers/slurm/parse.py", "schedulers/slurm/describe.py",
                "remote/ssh.py", "report/__init__.py", "jobs/flow.py", "jobs/thin.py",
                "errors.py", "doctor/probe.py", "data/pack.py"):
        _touch(tmp_path / "hpcdl" / rel, logic if rel != "jobs/thin.py" else "X = 1\n")
    for rel in ("schedulers/test_slurm_parse.py", "remote/test_ssh_pure_parts.py",
                "report/test_report.py", "jobs/test_job_flow.py", "core/test_errors.py",
                "probe/test_probe.py", "data/test_data_packed.py"):
        _touch(tmp_path / "tests" / "unit" / rel)
    found = _script().untested(tmp_path)
    # describe: no file; pack: test_data_packed is another word (packed); doctor/probe.py:
    # tests/unit/probe/ is another package's folder. test_job_flow counts for jobs/flow
    # (the folder's singular). Thin modules are not listed.
    assert found == [(3, "hpcdl/data/pack.py"), (3, "hpcdl/doctor/probe.py"),
                     (3, "hpcdl/schedulers/slurm/describe.py")]


def test_the_script_prints_the_count_of_this_checkout() -> None:
    res = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                         timeout=60, cwd=ROOT, check=True)
    last = res.stdout.splitlines()[-1]
    count = int(last.split()[0])
    assert last.endswith("have no unit test file named after them")
    assert count == len(res.stdout.splitlines()) - 1
