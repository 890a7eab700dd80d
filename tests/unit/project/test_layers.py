"""The layers of hpcdl/, as hpcdl/__init__.py declares them: the import graph of every
module (imports anywhere in a module count, inside functions and under TYPE_CHECKING
too) has no circle, no
module imports from a layer above its own, and the job-side layer imports nothing but
the standard library, the training runtime and itself."""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

import pytest

import hpcdl

PACKAGE = Path(hpcdl.__file__).resolve().parent


def declared_layers() -> list[tuple[str, list[str]]]:
    """(layer, module prefixes) from the table in hpcdl/__init__.py, lowest first."""
    doc = hpcdl.__doc__ or ""
    table = doc.split("Layers, lowest first", 1)[1]
    rows = []
    for line in table.splitlines():
        words = line.split()
        if len(words) >= 2 and line.startswith("    ") and words[1].startswith("hpcdl"):
            rows.append((words[0], words[1:]))
    return rows


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


@functools.cache
def _parse(path: Path) -> ast.Module:
    """Each module parsed once at collection (GRAPH and TYPED_GRAPH both read them)."""
    return ast.parse(path.read_text(encoding="utf-8"))


def imports_of(path: Path, known: dict[str, Path], typing: bool = False
               ) -> tuple[set[str], set[str]]:
    """(hpcdl modules, other top-level modules) that ``path`` imports; ``typing``: the
    imports under ``if TYPE_CHECKING:`` count too."""
    ours, others = set(), set()

    def resolve(name: str) -> str:
        while name not in known and "." in name:
            name = name.rpartition(".")[0]
        return name

    tree = _parse(path)
    typing_only = set() if typing else {
        id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
        and _is_type_checking(block.test) for stmt in block.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                (ours.add(resolve(alias.name)) if alias.name.split(".")[0] == "hpcdl"
                 else others.add(alias.name.split(".")[0]))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] != "hpcdl":
                others.add(node.module.split(".")[0])
                continue
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                ours.add(full if full in known else resolve(node.module))
    return ours, others


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def layer_of(module: str, layers: list[tuple[str, list[str]]]) -> int | None:
    best, rank = -1, None
    for i, (_, prefixes) in enumerate(layers):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), i
    return rank


# What a job has besides the standard library: the training runtime of the image (the
# probe worker measures with torch and mpi4py). hpcdl's own dependencies (pydantic,
# jinja2, click, yaml) are not there.
RUNTIME = {"__future__", "torch", "numpy", "mpi4py", "horovod"}
LAYERS = declared_layers()
MODULES = modules()
GRAPH = {m: imports_of(p, MODULES) for m, p in MODULES.items()}
# The same with the imports only a type checker reads: a circle there is a circle in the
# design (a lower layer naming a higher one's types), hidden from the interpreter.
TYPED_GRAPH = {m: imports_of(p, MODULES, typing=True) for m, p in MODULES.items()}


def test_the_table_is_there_and_covers_every_module():
    assert [name for name, _ in LAYERS][:2] == ["job-side", "core"] and LAYERS[-1][0] == "cli"
    loose = [m for m in MODULES if m != "hpcdl" and layer_of(m, LAYERS) is None]
    assert not loose, f"modules in no declared layer: {loose}"


def test_no_module_imports_from_a_layer_above_its_own():
    upward = []
    for module, (ours, _) in TYPED_GRAPH.items():  # a type checker's imports too
        own = layer_of(module, LAYERS)
        for target in ours - {module, "hpcdl"}:
            there = layer_of(target, LAYERS)
            if own is not None and there is not None and there > own:
                upward.append(f"{module} ({LAYERS[own][0]}) -> {target} ({LAYERS[there][0]})")
    assert not upward, "\n".join(sorted(upward))


@pytest.mark.parametrize("graph", [GRAPH, TYPED_GRAPH], ids=["run-time", "with-type-imports"])
def test_no_import_circle(graph: dict[str, tuple[set[str], set[str]]]) -> None:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, (set(), set()))[0] - {v, "hpcdl"}:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in graph:
        if v not in index:
            visit(v)
    assert not circles, circles


def test_the_job_side_layer_needs_only_the_standard_library_and_the_runtime():
    job_side = [m for m in MODULES if layer_of(m, LAYERS) == 0]
    assert "hpcdl.jobside.protocol" in job_side and "hpcdl.jobside.probe_worker" in job_side
    for module in job_side:
        ours, others = GRAPH[module]
        assert others <= set(sys.stdlib_module_names) | RUNTIME, (module, others)
        assert all(layer_of(m, LAYERS) == 0 for m in ours - {"hpcdl"}), (module, ours)


@pytest.mark.parametrize("layer, prefixes", LAYERS, ids=[name for name, _ in LAYERS])
def test_every_declared_prefix_names_a_module(layer, prefixes):
    assert all(p in MODULES for p in prefixes), (layer, [p for p in prefixes if p not in MODULES])


def test_outside_the_job_side_errors_come_from_hpcdl_errors_and_nothing_imports_the_worker():
    """hpcdl.errors is the hierarchy's name for the rest of hpcdl (it re-exports
    hpcdl.jobside.errors, where the staged job side finds it), and the probe worker is a
    script, not a library: its command line and exit status are hpcdl.jobside.protocol's."""
    wrong = sorted(f"{module} -> {target}" for module, (ours, _) in TYPED_GRAPH.items()
                   if layer_of(module, LAYERS) != 0 and module != "hpcdl.errors"
                   for target in ours & {"hpcdl.jobside.errors", "hpcdl.jobside.probe_worker"})
    assert not wrong, wrong
    assert "hpcdl.jobside.errors" in GRAPH["hpcdl.errors"][0]
