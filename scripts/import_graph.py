#!/usr/bin/env python3
"""hpcdl's size and the imports between its packages, for a before/after comparison:

    python3 scripts/import_graph.py            # this checkout
    python3 scripts/import_graph.py /other/checkout

Prints the number of modules and lines under hpcdl/, the package -> package import
edges (hpcdl.<package>, imports anywhere in a module counted, those under
TYPE_CHECKING too) and the pairs of packages that import each other. Module-level
circles are tests/unit/project/test_layers.py's business; a two-way pair of packages is a
coarser sign of two homes for one concern.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path


def package_of(rel: Path) -> str:
    """hpcdl/<package>/... -> package; hpcdl/<module>.py -> module."""
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def imported(tree: ast.AST) -> list[str]:
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
    return [n for n in names if n.startswith("hpcdl.")]


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1])
    package = root / "hpcdl"
    modules = lines = 0
    edges: Counter[tuple[str, str]] = Counter()
    for path in sorted(package.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        modules += 1
        lines += len(source.splitlines())
        me = package_of(path.relative_to(package))
        for name in imported(ast.parse(source)):
            other = name.split(".")[1]
            if other != me:
                edges[(me, other)] += 1
    both = sorted({tuple(sorted(pair)) for pair in edges if pair[::-1] in edges})
    print(f"{root}: {modules} modules, {lines:,} lines under hpcdl/; "
          f"{len(edges)} package -> package edges ({sum(edges.values())} imports)")
    print("packages importing each other: "
          + (", ".join(f"{a} <-> {b}" for a, b in both) or "none"))


if __name__ == "__main__":
    main()
