"""docs/guide/slurm-releases.md's feature x release table is hpcdl's own release table
(scripts/release_table.py writes it from hpcdl/schedulers/slurm/releases.py), and
current: a change to the table without `release_table.py --write` fails here."""

from __future__ import annotations

import re
from pathlib import Path

from hpcdl.schedulers.slurm.releases import KNOWN, feature_table

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "guide" / "slurm-releases.md"


def test_the_pages_table_is_the_generated_one():
    block = re.search(r"<!-- release-table: begin -->\n(.*?)<!-- release-table: end -->",
                      PAGE.read_text(), re.S)
    assert block, f"{PAGE} has no release-table block"
    assert block.group(1) == feature_table(), "stale: python3 scripts/release_table.py --write"


def test_every_row_has_a_cell_per_release():
    lines = feature_table(("22.05", "24.11", "25.11", "26.05")).splitlines()
    assert all(line.count("|") == 6 for line in lines)
    assert "--requeue=expedite" in lines[4].split("|")[4]  # 25.11's cell
    assert set(KNOWN) >= {"22.05", "24.11", "26.05"}
