"""The test counts in docs/benchmarks.md, written by collecting the tests, not by hand.

    python3 scripts/docs_counts.py           # print the block
    python3 scripts/docs_counts.py --write   # rewrite it in docs/benchmarks.md
    python3 scripts/docs_counts.py --check   # exit 1 when the page's block is stale

The block sits between ``<!-- test-counts: begin -->`` and ``<!-- test-counts: end -->``.
It counts what ``pytest --collect-only`` collects (nothing runs; a parametrized case is
one test) per tier: ``make unit`` (tests/unit without the ``slow`` marker), the unit
tests only ``make test`` runs (``slow``), and tests/integration. It runs pytest once in
this process and reads each item's markers, so the tiers add up to one collection.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "benchmarks.md"
BLOCK = re.compile(r"(<!-- test-counts: begin -->\n)(.*?)(<!-- test-counts: end -->)", re.S)


class _Items:
    """A pytest plugin that keeps the collected items' ids and marker names."""

    def __init__(self) -> None:
        self.items: list[tuple[str, set[str]]] = []

    def pytest_collection_finish(self, session: Any) -> None:
        self.items = [(item.nodeid, {m.name for m in item.iter_markers()})
                      for item in session.items]


def collect() -> list[tuple[str, set[str]]]:
    """Every test under tests/ with its markers (pytest --collect-only, in this process)."""
    import pytest

    os.chdir(ROOT)  # pytest's rootdir and the tests' own relative paths
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    plugin = _Items()
    # no:terminal: the ids pytest would print are not this script's output (and the
    # addopts it reads, -ra, are the terminal's).
    code = pytest.main(["--collect-only", "-o", "addopts=", "-p", "no:terminal",
                        "-p", "no:cacheprovider", "tests"],
                       plugins=[plugin])
    if code != 0:
        raise SystemExit(f"docs_counts: pytest could not collect the tests (exit {code})")
    return plugin.items


def tiers(items: list[tuple[str, set[str]]]) -> dict[str, int]:
    unit = [marks for nodeid, marks in items if nodeid.startswith("tests/unit/")]
    return {
        "unit": sum("slow" not in m for m in unit),
        "slow": sum("slow" in m for m in unit),
        "integration": sum(nodeid.startswith("tests/integration/") for nodeid, _ in items),
        "all": len(items),
    }


def block(counts: dict[str, int]) -> str:
    rows = [("`make unit` (tests/unit, not `slow`)", counts["unit"]),
            ("unit tests marked `slow` (`make test` only)", counts["slow"]),
            ("tests/integration (`make test`)", counts["integration"]),
            ("all: `make test`", counts["all"])]
    return ("| tier | tests |\n|---|---|\n"
            + "".join(f"| {name} | {n:,} |\n" for name, n in rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the block in the page")
    mode.add_argument("--check", action="store_true", help="exit 1 when the block is stale")
    args = parser.parse_args(argv)
    if not (args.write or args.check):
        print(block(tiers(collect())), end="")
        return 0
    page = PAGE.read_text()
    found = BLOCK.search(page)
    if found is None:
        raise SystemExit(f"docs_counts: no test-counts block in {PAGE}")
    new = block(tiers(collect()))
    if args.write:
        PAGE.write_text(page[:found.start(2)] + new + page[found.end(2):])
        return 0
    if found[2] != new:
        print(f"{PAGE.relative_to(ROOT)}: the test counts are stale; run "
              f"python3 scripts/docs_counts.py --write\n--- page\n{found[2]}--- now\n{new}",
              file=sys.stderr)
        return 1
    return 0

if __name__ == "__main__":
    sys.exit(main())
