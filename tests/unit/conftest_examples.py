"""Examples' test set-up: puts the repo's examples/ directory on sys.path (at plugin
load, before test modules are collected) so tests can import ``trainkit``."""

import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))
