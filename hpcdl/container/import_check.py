"""Runs INSIDE an image with the image's python: do torch and the packages built against
it load together? Prints one line, ``HPCDL_IMPORT_CHECK ok ...`` or
``HPCDL_IMPORT_CHECK FAIL <why>`` (exit 1), where <why> names both packages and their
versions, e.g. ``torchvision 0.28.0 does not match torch 2.13.0+cpu: operator
torchvision::nms does not exist``.

Checked when installed: torch; torchvision (imported, and one compiled operator run:
``torchvision.ops.nms`` on a tiny tensor, since a torchvision built for another torch
may import its Python and fail at its C++ operators); ``horovod.torch`` (its extension
is linked against one torch); mpi4py (loads the image's MPI library, without MPI_Init).

Package data, not a module hpcdl imports: ``hpcdl build`` appends it to a definition's
``%test`` (so ``apptainer test IMAGE`` reruns it) and ``hpcdl doctor --image`` runs it
with ``python3 -c``; both read this file with importlib.resources. Stdlib only at top
level; importing it runs nothing.
"""
import importlib.util
import sys
from importlib import metadata

MARK = "HPCDL_IMPORT_CHECK"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "(unknown version)"


def _why(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__


def _fail(message: str) -> int:
    print(f"{MARK} FAIL {message}", flush=True)
    return 1


def main() -> int:
    if importlib.util.find_spec("torch") is None:
        print(f"{MARK} ok no torch in the image: nothing to check", flush=True)
        return 0
    try:
        import torch
    except Exception as exc:
        return _fail(f"torch {_version('torch')} does not import: {_why(exc)}")
    torch_v = f"torch {torch.__version__}"
    checked = [torch_v]
    if importlib.util.find_spec("torchvision") is not None:
        vision = f"torchvision {_version('torchvision')}"
        try:
            import torchvision  # noqa: F401
            from torchvision.ops import nms

            nms(torch.tensor([[0.0, 0.0, 1.0, 1.0]]), torch.tensor([1.0]), 0.5)
        except Exception as exc:
            return _fail(f"{vision} does not match {torch_v}: {_why(exc)}")
        checked.append(vision + " (nms ran)")
    if importlib.util.find_spec("horovod") is not None:
        hvd = f"horovod {_version('horovod')}"
        try:
            import horovod.torch  # noqa: F401
        except Exception as exc:
            return _fail(f"{hvd} does not match {torch_v}: {_why(exc)}")
        checked.append(hvd)
    if importlib.util.find_spec("mpi4py") is not None:
        mpi = f"mpi4py {_version('mpi4py')}"
        try:
            import mpi4py

            mpi4py.rc.initialize = False
            from mpi4py import MPI

            library = MPI.Get_library_version().strip().splitlines()[0].split(",")[0]
        except Exception as exc:
            return _fail(f"{mpi} does not load its MPI library: {_why(exc)}")
        checked.append(f"{mpi} ({library})")
    print(f"{MARK} ok " + ", ".join(checked), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
