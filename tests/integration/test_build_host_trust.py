"""Derived images built with real Apptainer on this machine, whose HTTPS goes through a
TLS-intercepting proxy that only the host's CA bundle trusts:

- a Dockerfile FROM the bundled CPU image adding tqdm from the index builds with no
  certificate handling by the user, and the host's CA bundle is not in the image;
- PyPI's torchvision (a CUDA build) added to the CPU image fails the build in one line
  naming torchvision and torch with their versions, and leaves no image.

Two builds (from the 539 MiB CPU image, ~1-2 min each on 2 cores). Run as root: a build
as the ordinary user goes through --fakeroot the same way (tests/integration/
test_cluster_user_images.py builds the CPU image so).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.conftest_apptainer import image_path

pytestmark = [pytest.mark.apptainer, pytest.mark.torch]
HOST_CA = "/etc/ssl/certs/ca-certificates.crt"


def hpcdl(*args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpcdl", *args], capture_output=True, text=True,
                          timeout=timeout, check=False, cwd=cwd)


@pytest.fixture(scope="module")
def cpu_sif(apptainer_bin: str) -> Path:
    """The bundled CPU image as `make demo`/`make test` left it (the cpu_image fixture
    rebuilds it when stale; here only its presence matters)."""
    img = image_path()
    if not img.is_file():
        pytest.skip(f"{img} is missing: scripts/build-image.sh builds it")
    return img


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_pip_install_through_the_proxy_needs_no_certificate_handling(
        cpu_sif: Path, tmp_path: Path) -> None:
    context = tmp_path / "tqdm-img"
    context.mkdir()
    (context / "Dockerfile").write_text(
        f"FROM localimage:{cpu_sif}\n"
        "RUN PIP_BREAK_SYSTEM_PACKAGES=1 pip install --no-cache-dir tqdm\n")
    out = tmp_path / "tqdm-img"
    out = tmp_path / "tqdm.sandbox"
    dry = hpcdl("build", "Dockerfile", "--sandbox", "-o", str(out), "--dry-run", cwd=context)
    assert dry.returncode == 0, dry.stderr
    assert "--bind <build dir>/host-ca:/mnt:ro" in dry.stderr
    assert "APPTAINERENV_PIP_CERT=/mnt/hpcdl-host-ca.crt" in dry.stderr
    start = time.monotonic()
    # A sandbox folder: the same build (bind, environment, %test) without the minutes of
    # mksquashfs, and the image's files can be read directly.
    r = hpcdl("build", "Dockerfile", "--sandbox", "-o", str(out), cwd=context)
    seconds = time.monotonic() - start
    log = out.with_name(out.name + ".build.log").read_text(errors="replace")
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\n{log[-3000:]}"
    assert "CERTIFICATE_VERIFY_FAILED" not in log
    assert "Successfully installed tqdm" in log
    assert "import check: torch 2.13.0+cpu" in r.stdout and "horovod" in r.stdout
    print(f"derived sandbox build with tqdm from the index: {seconds:.0f} s")
    # The host's bundle was bound, not copied in: /mnt is empty and the image's own CA
    # list is not the host's.
    assert list((out / "mnt").iterdir()) == []
    assert sha256(out / "etc/ssl/certs/ca-certificates.crt") != sha256(Path(HOST_CA))
    env_files = "".join(p.read_text(errors="replace") for p in (out / ".singularity.d/env").iterdir())
    assert "hpcdl-host-ca" not in env_files and "PIP_CERT" not in env_files
    assert not list(tmp_path.glob(".*.building-*"))


def test_pypi_torchvision_in_the_cpu_image_fails_the_build_in_one_line(
        cpu_sif: Path, tmp_path: Path) -> None:
    (tmp_path / "tv.def").write_text(
        f"Bootstrap: localimage\nFrom: {cpu_sif}\n\n%post\n"
        "    PIP_BREAK_SYSTEM_PACKAGES=1 pip install --no-cache-dir --no-deps torchvision==0.28.0\n")
    out = tmp_path / "tv.sif"
    start = time.monotonic()
    r = hpcdl("build", "tv.def", "-o", str(out), cwd=tmp_path)
    print(f"derived build with PyPI's torchvision, failing at %test: {time.monotonic() - start:.0f} s")
    assert r.returncode == 1, r.stdout + r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert errors == ["error: import check failed: torchvision 0.28.0 does not match torch "
                      "2.13.0+cpu: operator torchvision::nms does not exist"], r.stderr
    assert not out.exists() and not list(tmp_path.glob(".tv.sif.building-*"))
    assert os.path.exists(str(out) + ".build.log")
