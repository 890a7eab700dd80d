"""Runs INSIDE an image with the image's python and prints one line,
``HPCDL_PROBE {json}``: python, torch (CUDA, GPU architectures, NCCL), Horovod and
`horovodrun -cb`, the MPI library.

Package data, not a module hpcdl imports: hpcdl.doctor.image reads this file with
importlib.resources and passes it to ``python3 -c`` in the image. Only the stdlib at
top level: each probe may fail on its own. Importing it runs nothing.
"""
import json
import platform
import shutil
import subprocess


def main() -> None:
    out: dict = {"python": platform.python_version()}
    try:
        import torch
        out["torch"] = torch.__version__
        out["torch_cuda"] = torch.version.cuda
        # get_arch_list() may be [] without a GPU; the flags it reads are compiled in.
        flags = getattr(torch._C, "_cuda_getArchFlags", lambda: None)() if torch.version.cuda else None
        out["cuda_archs"] = (flags or "").split()
        try:
            v = torch.cuda.nccl.version() if torch.version.cuda else None
            out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else (str(v) if v else None)
        except Exception:
            out["nccl"] = None
    except Exception as e:
        out["torch_error"] = repr(e)
    try:
        import horovod
        out["horovod"] = horovod.__version__
    except Exception:
        pass
    if shutil.which("horovodrun"):
        r = subprocess.run(["horovodrun", "-cb"], capture_output=True, text=True, timeout=120)
        out["horovod_table"] = r.stdout
    try:
        import mpi4py
        mpi4py.rc.initialize = False
        from mpi4py import MPI
        out["mpi_library"] = MPI.Get_library_version().strip()
    except Exception:
        if shutil.which("mpirun"):
            r = subprocess.run(["mpirun", "--version"], capture_output=True, text=True, timeout=30)
            out["mpi_library"] = (r.stdout + r.stderr).strip()
    print("HPCDL_PROBE " + json.dumps(out))


if __name__ == "__main__":  # `python3 -c SOURCE` runs as __main__
    main()
