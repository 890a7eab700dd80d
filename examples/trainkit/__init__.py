"""Building blocks shared by the example training scripts (model, data, LR schedule,
checkpoints, distributed backends). They import torch; the ``hpcdl`` package does not.

The examples run as plain scripts (``python3 examples/resnet50_imagenet.py``): in a job's
image from the read-only bind at /hpcdl (``PYTHONPATH=/hpcdl``, see hpcdl.plan), from
/opt/hpcdl in images hpcdl built, or from a checkout; when ``hpcdl`` is not importable,
this directory's grandparent (the checkout's root, or /hpcdl) is put on sys.path.
"""

import importlib.util
import sys
from pathlib import Path

if importlib.util.find_spec("hpcdl") is None:
    sys.path.insert(1, str(Path(__file__).resolve().parents[2]))
