"""Fixtures for tests that need a real Apptainer and the CPU (or GPU) image.

``cpu_image`` runs scripts/build-image.sh: it fills the wheelhouse and runs
``hpcdl build pytorch-horovod-cpu`` into ${HPCDL_CACHE:-/var/cache/hpcdl}/images, which is
a no-op when the content hash of the rendered definition + copied files matches the cached
image (CI on a fresh clone reuses it), and a full build (~2.5 min on 2 cores) otherwise.

``gpu_image`` does the same with ``scripts/build-image.sh --gpu`` for the GPU spec built
from PyPI (pytorch-horovod-gpu-pypi: CUDA torch + torchvision + NCCL + Horovod with NCCL);
its first build compiles Horovod with nvcc and packs a multi-GB image (see docs/benchmarks.md, "GPU image").
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import require

REPO = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT = 2400  # s: a cold build with the Horovod wheel (~4 min) and the image (~3 min)


GPU_BUILD_TIMEOUT = 3600  # s: Horovod CUDA wheel (nvcc, 2 cores) + a multi-GB image


def image_path(name: str = "pytorch-horovod-cpu") -> Path:
    cache = os.environ.get("HPCDL_CACHE") or "/var/cache/hpcdl"
    return Path(cache) / "images" / f"{name}.sif"


SHARED_IMAGES = Path("/scratch/images")
# For `apptainer exec` on the host: the tests' temporary files (scripts, outputs) live on
# /scratch (tests/conftest.py), which Apptainer does not bind by default ($HOME, /tmp
# and the working directory only).
HOST_BINDS = ("-B", "/scratch")


def published(image: Path) -> Path:
    """``image`` where the sandbox's nodes can read it (/scratch/images; the build cache
    is the build host's only): a hard link, or a copy across filesystems."""
    SHARED_IMAGES.mkdir(parents=True, exist_ok=True)
    SHARED_IMAGES.chmod(0o755)
    target = SHARED_IMAGES / image.name
    # The build record and definition go along: the plan reads the image's GPU
    # architectures and the run directory its content hash from them.
    for suffix in ("", ".hash", ".def"):
        source, dest = image.with_name(image.name + suffix), target.with_name(target.name + suffix)
        if not source.exists() or (dest.exists() and dest.stat().st_ino == source.stat().st_ino):
            continue
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}")
        try:
            os.link(source, tmp)
        except OSError:
            shutil.copyfile(source, tmp)
        tmp.chmod(0o644)
        os.replace(tmp, dest)
    return target


@pytest.fixture(scope="session")
def apptainer_bin() -> str:
    path = shutil.which("apptainer") or shutil.which("singularity")
    require(path is not None, "apptainer on PATH (scripts/install-apptainer.sh)")
    assert path is not None
    return path


@pytest.fixture(scope="session")
def cpu_image(apptainer_bin: str) -> Path:
    """The built CPU image (reused when its content hash matches)."""
    r = subprocess.run([str(REPO / "scripts" / "build-image.sh")], cwd=REPO, capture_output=True,
                       text=True, timeout=BUILD_TIMEOUT, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, f"scripts/build-image.sh failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    img = image_path()
    assert img.is_file(), r.stdout + r.stderr
    return published(img)


@pytest.fixture(scope="session")
def gpu_image(apptainer_bin: str) -> Path:
    """The built GPU image from PyPI wheels (reused when its content hash matches)."""
    r = subprocess.run([str(REPO / "scripts" / "build-image.sh"), "--gpu"], cwd=REPO,
                       capture_output=True, text=True, timeout=GPU_BUILD_TIMEOUT,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, (
        f"scripts/build-image.sh --gpu failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    img = image_path("pytorch-horovod-gpu-pypi")
    assert img.is_file(), r.stdout + r.stderr
    return published(img)
