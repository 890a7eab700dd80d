"""A wheelhouse of empty wheels with the names the CPU image spec asks for, for the
unit tests of image planning and of the cache rules (nothing is installed from it)."""

from __future__ import annotations

from pathlib import Path

WHEELS = [
    "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
    "horovod-0.28.1-cp311-cp311-linux_x86_64.whl",
    "mpi4py-4.1.2-cp311-cp311-manylinux1_x86_64.whl",
    "numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl",
    "pillow-13.0.0-cp311-cp311-manylinux_2_28_x86_64.whl",
]


def fill_wheelhouse(folder: Path) -> Path:
    """``folder`` (made, with its parents) holding an empty file for each of WHEELS."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in WHEELS:
        (folder / name).write_bytes(b"")
    return folder
