"""The files that run inside a job, staged into its run directory.

Compute nodes see only what a cluster shares (home, the parallel filesystem), not the
venv or checkout hpcdl runs from on the login node. So the bundled examples, the probe
worker and the hpcdl modules they import (standard library only) are copied into
``RUN_DIR/job`` when the run directory is made: the job reads them from there (bound
read-only at /hpcdl in a container), and a run keeps the exact code it ran. The sh files
rendered for the job (the rank wrapper and the MASTER_PORT pick: hpcdl.launch.rankenv)
are written beside them, in ``job/bin``, executable.

Which hpcdl modules: those the entry points import, found by reading their imports
(transitively), so a new import in an example is staged without a list to keep.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import threading
from functools import lru_cache
from pathlib import Path, PurePosixPath

from hpcdl.core.atomic import atomic_dir, write_atomic
from hpcdl.core.resources import PACKAGE_DIR, examples_dir

# RUN_DIR/<this>: examples/ and hpcdl/ below it, the layout the job's PYTHONPATH expects.
JOB_DIR_NAME = "job"
# Entry points beside the examples: what `hpcdl probe` runs.
_ENTRY_MODULES = ("hpcdl.jobside.probe_worker",)
# The job's own hang watchdog (--hang-timeout; the batch script runs it): staged only
# into the runs that have one, so the others' job/ stays as it was.
WATCHDOG_MODULE = "hpcdl.jobside.hangwatch"


def job_dir(run_dir: str) -> str:
    """The staged directory of the run in ``run_dir``, as the nodes see it."""
    return str(PurePosixPath(run_dir) / JOB_DIR_NAME)


# A line that may start an import of hpcdl: ``from hpcdl... import`` or ``import ...hpcdl``
# at the line's start (indented too: imports inside functions count). Only these
# statements are parsed, not the whole file: parsing the ~30 job-side files whole took
# 60 to 240 ms of every submission. A statement this cannot cut out alone (a syntax error
# when parsed by itself) has the whole file parsed instead; one that looks like an import
# inside a string would count, so tests/unit/launch/test_staging_imports.py checks every bundled
# file against a parse of the whole file.
_IMPORT_START = re.compile(r"^[ \t]*(?:from[ \t]+hpcdl\b|import[ \t][^\n]*\bhpcdl\b)", re.M)


def _hpcdl_imports(path: Path) -> set[str]:
    """The hpcdl modules ``path`` imports (``from hpcdl.x import y`` -> hpcdl.x, and
    hpcdl.x.y when that is a module too)."""
    return imports_in(path.read_text(), str(path))


def imports_in(source: str, name: str = "<source>") -> set[str]:
    """The hpcdl modules the Python ``source`` imports (see _hpcdl_imports): each import
    statement found by _IMPORT_START parsed alone, or the whole source when one cannot be."""
    found: set[str] = set()
    for match in _IMPORT_START.finditer(source):
        try:
            nodes = ast.parse(_statement(source, match.start()), name).body
        except SyntaxError:
            return imports_parsed(source, name)
        for node in nodes:
            found |= _imported(node)
    return found


def imports_parsed(source: str, name: str = "<source>") -> set[str]:
    """imports_in from a parse of the whole ``source`` (every node of its tree)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source, name)):
        found |= _imported(node)
    return found


def _statement(source: str, start: int) -> str:
    """The statement that starts at ``start`` (a line's start): its line, and the lines
    an open parenthesis or a trailing backslash carries it on to, its indent removed."""
    end = source.find("\n", start)
    end = len(source) if end < 0 else end
    if "(" in source[start:end] and ")" not in source[start:end]:
        close = source.find(")", end)
        end = len(source) if close < 0 else close + 1
    while source[start:end].endswith("\\") and end < len(source):
        nxt = source.find("\n", end + 1)
        end = len(source) if nxt < 0 else nxt
    return source[start:end].lstrip(" \t")


def _imported(node: ast.AST) -> set[str]:
    """The hpcdl modules one parsed import statement names."""
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        if node.module == "hpcdl" or node.module.startswith("hpcdl."):
            return {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    elif isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name == "hpcdl" or a.name.startswith("hpcdl.")}
    return set()


def _module_file(module: str) -> str | None:
    """hpcdl-relative file of ``module`` (``hpcdl/x/y.py`` or ``hpcdl/x/__init__.py``),
    None when it is not a module of the package (an imported name)."""
    parts = module.split(".")[1:]
    base = PACKAGE_DIR.joinpath(*parts)
    if base.with_suffix(".py").is_file():
        return str(PurePosixPath("hpcdl", *parts).with_suffix(".py"))
    if (base / "__init__.py").is_file():
        return str(PurePosixPath("hpcdl", *parts, "__init__.py"))
    return None


# One reader at a time: CPython 3.11's ast.parse is not safe in concurrent threads
# ("AST constructor recursion depth mismatch", seen with 100 submissions in threads).
_FILES_LOCK = threading.Lock()


def job_side_files(watchdog: bool = False) -> tuple[str, ...]:
    """Every file the job side needs, relative to the job directory, sorted:
    ``examples/...`` (every bundled example and its trainkit) and ``hpcdl/...`` (the
    probe worker and each hpcdl module these import, with their packages' __init__;
    ``watchdog``: the hang watchdog's too). Read once per process."""
    with _FILES_LOCK:
        return _job_side_files(watchdog)


@lru_cache(maxsize=2)
def _job_side_files(watchdog: bool) -> tuple[str, ...]:
    examples = examples_dir()
    files = {str(PurePosixPath("examples", p.relative_to(examples).as_posix()))
             for p in examples.rglob("*.py") if "__pycache__" not in p.parts}
    todo = [source_of(f) for f in sorted(files)]

    def add(module: str) -> None:
        """``module`` and the packages it sits in (imported first), each read in turn."""
        parts = module.split(".")
        for i in range(1, len(parts) + 1):
            rel = _module_file(".".join(parts[:i]))
            if rel and rel not in files:
                files.add(rel)
                todo.append(source_of(rel))

    for module in (*_ENTRY_MODULES, *((WATCHDOG_MODULE,) if watchdog else ())):
        add(module)
    while todo:
        for module in _hpcdl_imports(todo.pop()):
            add(module)
    return tuple(sorted(files))


def source_of(rel: str) -> Path:
    """Where the installed hpcdl keeps the job-side file ``rel``."""
    path = PurePosixPath(rel)
    if path.parts[0] == "examples":
        return examples_dir().joinpath(*path.parts[1:])
    if path.parts[0] == "hpcdl":
        return PACKAGE_DIR.joinpath(*path.parts[1:])
    raise ValueError(f"not a job-side path: {rel}")


def stage(run_dir: Path, files: tuple[str, ...],
          scripts: tuple[tuple[str, str], ...] = ()) -> int:
    """Copy ``files`` (job_side_files() names) into ``run_dir``/job and write ``scripts``
    ((path relative to job/, text): the plan's job_scripts) there, executable; complete
    or not at all: into a temporary directory beside it, renamed into place. Returns the
    bytes written. Raises FileExistsError when job/ exists, ValueError for a script path
    that leaves job/, OSError."""
    copied = 0
    # A run's code is staged once (FileExistsError after): the run keeps what it ran.
    with atomic_dir(run_dir / JOB_DIR_NAME) as tmp:
        for rel in files:
            dest = tmp / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source_of(rel), dest)  # its mtime too: rsync links it
            copied += dest.stat().st_size
        # Readable by every rank (the job may run under another uid's group policy).
        for folder, _, names in os.walk(tmp):
            os.chmod(folder, 0o755)
            for name in names:
                os.chmod(os.path.join(folder, name), 0o644)
        for rel, text in scripts:
            path = PurePosixPath(rel)
            if path.is_absolute() or ".." in path.parts or rel in files:
                raise ValueError(f"not a job-side script path: {rel}")
            dest = tmp / rel
            dest.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            write_atomic(dest, text, mode=0o755)
            copied += dest.stat().st_size
    return copied


def stage_tool(run_dir: Path, path: str) -> str:
    """A copy of the host executable ``path`` in ``run_dir``/job/bin/, where the nodes can
    run it (the login node's venv is not theirs); returns the copy's path."""
    target = run_dir / JOB_DIR_NAME / "bin" / Path(path).name
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    shutil.copyfile(path, tmp)
    tmp.chmod(0o755)
    tmp.replace(target)
    return str(target)
