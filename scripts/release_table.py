"""The feature x release table in docs/guide/slurm-releases.md, written from
hpcdl/schedulers/slurm/releases.py (feature_table), not by hand.

    python3 scripts/release_table.py           # print the table
    python3 scripts/release_table.py --write   # rewrite it in the page

The table sits between ``<!-- release-table: begin -->`` and ``<!-- release-table: end -->``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "guide" / "slurm-releases.md"
BLOCK = re.compile(r"(<!-- release-table: begin -->\n)(.*?)(<!-- release-table: end -->)", re.S)


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT))
    from hpcdl.schedulers.slurm.releases import feature_table

    table = feature_table()
    if argv[1:] != ["--write"]:
        sys.stdout.write(table)
        return 0
    text = PAGE.read_text()
    if not BLOCK.search(text):
        print(f"release_table: {PAGE} has no release-table block", file=sys.stderr)
        return 1
    PAGE.write_text(BLOCK.sub(lambda m: m.group(1) + table + m.group(3), text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
