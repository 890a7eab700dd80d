"""One line of output, written in one piece.

Under torchrun or mpirun the ranks share one stdout pipe, and the images (and many
clusters) set PYTHONUNBUFFERED=1, where ``print(text)`` is two writes: the text,
then the newline. Another rank's line can land between them; a
``hpcdl_rank_checksum`` line once read ``...35d`` + ``epoch 3/3 ...`` and parsed as
``...35de``. One write of a line shorter than the pipe's atomic size (4 KiB) is
never split.
"""

from __future__ import annotations

import sys
from typing import TextIO


def say(line: str, file: TextIO | None = None) -> None:
    out = file or sys.stdout
    out.write(line + "\n")
    out.flush()
