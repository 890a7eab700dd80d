"""The offline build path with real pip and real Apptainer: a spec derived from the
bundled CPU image whose pip.packages (tqdm, pure Python; msgpack, a compiled cp311
manylinux wheel) are resolved on this host, then built with NO network at all.

How "no network" is made real: the build runs inside a new network namespace
(``unshare --net``: only a loopback device, and that one down), so the whole of
``hpcdl build`` - apptainer, %post, pip - has no route anywhere, not even to this
machine's proxy. The test first shows that a pip download from PyPI fails in such a
namespace; the build then succeeds only because pip installs with --no-index from the
wheelhouse resolved on the host. Apptainer's build has no --net/--network option (1.4),
and setting an unusable index in %post would prove less (a file:// find-links or a
cached wheel could still satisfy it), so the namespace is the honest switch.

Also: a package with only a source release (pycrypto on PyPI) is refused before any
build, in one line, exit 2, nothing written. Cost: one resolve (~5 s, through this
host's pip and proxy), one sandbox build from the 539 MiB CPU image (~25-35 s on 2
cores), one exec; run as root, as tests/integration/test_build_host_trust.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import require
from tests.integration.conftest_apptainer import HOST_BINDS, SHARED_IMAGES, image_path

pytestmark = [pytest.mark.apptainer, pytest.mark.torch]
REPO = Path(__file__).resolve().parents[2]

SPEC = """\
name: offline-extras-test
gpu: false
base:
  bootstrap: localimage
  image: {base}
mpi: {{flavour: openmpi, version: 4.1.4, pmix: 4.2.2, source: base}}
project: false
pip:
  resolve: host
  packages: [{packages}]
"""


@pytest.fixture(scope="module")
def cpu_sif(apptainer_bin: str) -> Path:
    """The bundled CPU image where `make test` (the cpu_image fixture) or `make demo`
    left it; only its presence matters here."""
    for img in (image_path(), SHARED_IMAGES / "pytorch-horovod-cpu.sif"):
        if img.is_file():
            return img
    pytest.skip(f"{image_path()} is missing: scripts/build-image.sh builds it")


def hpcdl(*args: str, cwd: Path, netns: bool = False,
          timeout: float = 600) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "hpcdl", *args]
    if netns:
        argv = ["unshare", "--net", "--", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                          cwd=cwd)


def test_resolved_on_the_host_built_without_network(cpu_sif: Path, apptainer_bin: str,
                                                    tmp_path: Path) -> None:
    require(shutil.which("unshare") is not None, "unshare (util-linux) for a network namespace")
    spec = tmp_path / "extras.yaml"
    spec.write_text(SPEC.format(base=cpu_sif, packages="tqdm, msgpack"))
    wheels = tmp_path / "wheelhouses"
    out = tmp_path / "extras.sandbox"
    common = [str(spec), "--wheelhouse", str(wheels)]

    dry = hpcdl("build", *common, "--sandbox", "-o", str(out), "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert (f"pip.packages for CPython 3.11 on manylinux_2_36_x86_64 (from base image "
            f"{cpu_sif}), not resolved yet") in dry.stderr
    assert "-m pip download --only-binary=:all: --implementation cp --python-version 3.11 " \
           "--abi cp311 --platform manylinux_2_36_x86_64" in dry.stderr
    assert "-> /opt/hpcdl-wheels (%files; pip install --no-index" in dry.stderr
    assert not wheels.exists()

    start = time.monotonic()
    resolved = hpcdl("build", *common, "--resolve-only", cwd=tmp_path)
    resolve_s = time.monotonic() - start
    assert resolved.returncode == 0, resolved.stderr
    assert "resolved 2 wheels for CPython 3.11 on manylinux_2_36_x86_64" in resolved.stdout
    (folder,) = [p for p in wheels.iterdir() if p.is_dir()]
    names = sorted(p.name for p in folder.iterdir())
    assert len(names) == 2 and names[1].startswith("tqdm-") and names[1].endswith("-py3-none-any.whl")
    assert names[0].startswith("msgpack-") and "-cp311-cp311-" in names[0] and "manylinux" in names[0]

    # The namespace really has no network: pip cannot reach PyPI (or the proxy) there.
    probe = subprocess.run(
        ["unshare", "--net", "--", sys.executable, "-m", "pip", "--isolated", "download",
         "--no-cache-dir", "--retries", "0", "--timeout", "5", "--index-url",
         "https://pypi.org/simple", "-d", str(tmp_path / "probe"), "six"],
        capture_output=True, text=True, timeout=120, check=False)
    assert probe.returncode != 0, probe.stdout + probe.stderr
    assert not list((tmp_path / "probe").glob("*.whl"))

    start = time.monotonic()
    r = hpcdl("build", *common, "--sandbox", "-o", str(out), cwd=tmp_path, netns=True)
    build_s = time.monotonic() - start
    log = out.with_name(out.name + ".build.log").read_text(errors="replace")
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\n{log[-3000:]}"
    print(f"resolve on the host {resolve_s:.1f} s; build with no network {build_s:.1f} s")
    assert f"Processing /opt/hpcdl-wheels/{names[0]}" in log
    assert "Successfully installed msgpack-" in log and "Downloading" not in log
    # In the image: both import, msgpack with its compiled extension; the wheels are gone.
    check = subprocess.run(
        [apptainer_bin, "exec", *HOST_BINDS, str(out), "python3", "-c",
         "import tqdm, msgpack; from msgpack import _cmsgpack; "
         "print(tqdm.__version__, msgpack.unpackb(msgpack.packb({'a': [1, 2]})), "
         "_cmsgpack.__file__)"],
        capture_output=True, text=True, timeout=120, check=False)
    assert check.returncode == 0, check.stderr
    assert "{'a': [1, 2]}" in check.stdout and ".cpython-311-x86_64-linux-gnu.so" in check.stdout
    assert not (out / "opt" / "hpcdl-wheels").exists()
    # The content hash covers the resolved wheels; an unchanged rebuild is a no-op, still
    # with no network.
    record = json.loads(out.with_name(out.name + ".hash").read_text())
    assert str(folder / names[0]) in record["files"]
    again = hpcdl("build", *common, "--sandbox", "-o", str(out), cwd=tmp_path, netns=True)
    assert again.returncode == 0 and "is up to date" in again.stdout, again.stderr


def test_a_package_with_no_wheel_is_refused_in_one_line(cpu_sif: Path, tmp_path: Path) -> None:
    spec = tmp_path / "sdist.yaml"
    spec.write_text(SPEC.format(base=cpu_sif, packages="tqdm, pycrypto==2.6.1"))
    wheels = tmp_path / "wheelhouses"
    r = hpcdl("build", str(spec), "--wheelhouse", str(wheels), "-o", str(tmp_path / "x.sif"),
              cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    errors = [ln for ln in r.stderr.splitlines() if not ln.startswith("hint:")]
    assert errors == ["error: pip.packages: no wheel of 'pycrypto==2.6.1' for CPython 3.11 on "
                      "manylinux_2_36_x86_64 (glibc 2.36; resolving on the host takes binary "
                      "wheels only)"], r.stderr
    assert not wheels.exists() and not (tmp_path / "x.sif").exists()
