"""Images and doctor as an ordinary cluster user (``hpcuser``, hpcdl from a wheel in a
venv), the way a scientist meets them: no root, Apptainer without setuid.

/dev/fuse's mode is the state under test, and the running sandbox sets it to 0666 for
everyone. Each test that needs a mode runs its commands in a private mount namespace
whose /dev/fuse is a fresh node of the same device with that mode (bind-mounted over
it): the host's /dev/fuse, and every other test or user, never sees a change, and
nothing needs restoring.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from tests.conftest import require
from tests.integration.conftest_apptainer import image_path
from tests.integration.conftest_user import ClusterUser

pytestmark = pytest.mark.apptainer

SITE = Path("/var/cache/hpcdl")
# Runs "$@" with /dev/fuse replaced by a node of mode $2 made in the tmpfs mounted at $1.
FUSE_SCRIPT = ('mount -t tmpfs -o mode=0755 hpcdl-fuse "$1" && mknod -m "$2" "$1/fuse" c "$3" "$4"'
               ' && mount --bind "$1/fuse" /dev/fuse && shift 4 && exec "$@"')


def as_user(user: ClusterUser, argv: Sequence[str], *, fuse: str | None = None,
            env: Mapping[str, str] | None = None, timeout: float = 300,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``argv`` as ``user`` (like ClusterUser.run); with ``fuse`` ("0600", "0666") in a
    private mount namespace whose /dev/fuse has that mode."""
    command = ["runuser", "-u", user.name, "--", "env", "-i",
               *(f"{k}={v}" for k, v in user.env(env).items()), *argv]
    if fuse is None:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              cwd=str(cwd or user.home), check=False)
    dev = os.stat("/dev/fuse").st_rdev
    with tempfile.TemporaryDirectory(prefix="hpcdl-fuse-") as mnt:
        return subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", FUSE_SCRIPT, "sh",
             mnt, fuse, str(os.major(dev)), str(os.minor(dev)), *command],
            capture_output=True, text=True, timeout=timeout, cwd=str(cwd or user.home),
            check=False)


@pytest.fixture(scope="module")
def site_image(request: pytest.FixtureRequest, apptainer_bin: str) -> Path:
    """The site's CPU image (built by root) and its wheelhouse, readable by everyone.
    Any built CPU image serves (the user only reads it): cpu_image, which rebuilds it
    whenever this checkout's hpcdl differs from the image's, only when there is none."""
    require(Path("/dev/fuse").exists(), "/dev/fuse (the fuse module)")
    require(shutil.which("unshare") is not None, "unshare (util-linux)")
    image = image_path()
    if not (image.is_file() and (SITE / "wheelhouse").is_dir()):
        image = request.getfixturevalue("cpu_image")
    for path in (SITE, SITE / "wheelhouse", image):
        mode = path.stat().st_mode
        assert mode & 0o004, f"{path} must be world-readable for this test"
    return image


def verdict(report: dict, topic: str) -> dict:
    found = [v for v in report["verdicts"] if v["topic"] == topic]
    assert len(found) == 1, report["verdicts"]
    return found[0]


def test_caches_as_the_user(cluster_user: ClusterUser, site_image: Path,
                            tmp_path: Path) -> None:
    """The real rule for a real user: the site cache is read-only to them (reused for
    reading), a closed one is ignored, an XDG_CACHE_HOME is followed."""
    code = ("import json; from hpcdl.container.cache import cache_dirs; d = cache_dirs(); "
            "print(json.dumps([d.write, list(d.read)]))")
    py = str(cluster_user.venv / "bin" / "python")
    r = as_user(cluster_user, [py, "-c", code])
    assert r.returncode == 0, r.stderr
    own = str(cluster_user.home / ".cache" / "hpcdl")
    assert json.loads(r.stdout) == [own, [own, str(SITE)]]
    closed = Path(tempfile.mkdtemp(prefix="hpcdl-closed-"))  # root's, 0700
    try:
        r = as_user(cluster_user, [py, "-c", code],
                    env={"HPCDL_CACHE": str(closed), "XDG_CACHE_HOME": "/tmp/hpcuser-cache"})
        assert json.loads(r.stdout) == ["/tmp/hpcuser-cache/hpcdl", ["/tmp/hpcuser-cache/hpcdl"]]
    finally:
        closed.rmdir()


def test_doctor_as_the_user_names_fuse_and_setuid_not_a_build(
        cluster_user: ClusterUser, site_image: Path) -> None:
    r = as_user(cluster_user, ["hpcdl", "doctor", "--image", str(site_image), "--json"],
                fuse="0600", timeout=300)
    assert r.returncode == 1, r.stderr
    report = json.loads(r.stdout)
    access = report["host"]["access"]
    assert access["euid"] == cluster_user.uid and access["fuse_mode"] == "0600"
    assert access["fuse_error"] == "Permission denied"
    v = verdict(report, "container access")
    assert v["level"] == "problem"
    assert "/dev/fuse is 0600 root:root" in v["message"] and "setuid starter" in v["message"]
    assert "chmod 0666 /dev/fuse" in v["fix"] and "starter-suid" in v["fix"]
    assert "--unsquash" in v["fix"]
    image = verdict(report, "image")
    assert image["level"] == "problem" and "Permission denied" in image["message"]
    assert f"--unsquash {site_image}" in image["fix"]
    assert all("hpcdl build" not in (x["fix"] or "") for x in report["verdicts"])

    # The same user once /dev/fuse is open: unprivileged mode, and the image is probed.
    r = as_user(cluster_user, ["hpcdl", "doctor", "--image", str(site_image), "--json"],
                fuse="0666", timeout=300)
    report = json.loads(r.stdout)
    assert verdict(report, "container access")["level"] == "ok"
    assert verdict(report, "container access")["message"].startswith("unprivileged")
    assert report["image"]["torch"] == "2.13.0+cpu", report["image"]
    assert r.returncode == 0, [v for v in report["verdicts"] if v["level"] == "problem"]

    # The words a person reads.
    r = as_user(cluster_user, ["hpcdl", "doctor"], fuse="0600")
    assert "problem  container access: this user cannot start SIF images" in r.stdout
    assert "fix: ask the admin for `chmod 0666 /dev/fuse`" in r.stdout


@pytest.fixture
def closed_images(cluster_user: ClusterUser) -> Iterator[tuple[Path, Path]]:
    """(an image file root keeps 0600, an image inside a folder root keeps 0700)."""
    root = Path(tempfile.mkdtemp(prefix="hpcdl-closed-", dir="/tmp"))
    try:
        root.chmod(0o755)
        private = root / "private.sif"
        private.write_bytes(b"not for hpcuser")
        private.chmod(0o600)
        inner = root / "inner"
        inner.mkdir(mode=0o700)
        (inner / "x.sif").write_bytes(b"")
        yield private, inner / "x.sif"
    finally:
        shutil.rmtree(root)


def test_doctor_and_inspect_as_the_user_name_an_unreadable_image(
        cluster_user: ClusterUser, site_image: Path,
        closed_images: tuple[Path, Path]) -> None:
    private, behind = closed_images
    r = as_user(cluster_user, ["hpcdl", "doctor", "--image", str(private), "--json"],
                fuse="0666")
    assert r.returncode == 1, r.stderr
    v = verdict(json.loads(r.stdout), "image")
    assert v["message"] == f"{private} is not readable by hpcuser (mode 0600, owner root:root)"
    assert f"chmod o+r {private}" in v["fix"] and "hpcdl build" not in v["fix"]
    r = as_user(cluster_user, ["hpcdl", "doctor", "--image", str(behind), "--json"],
                fuse="0666")
    v = verdict(json.loads(r.stdout), "image")
    assert f"directory {behind.parent} is 0700 root:root" in v["message"]
    assert f"chmod o+x {behind.parent}" in v["fix"]
    r = as_user(cluster_user, ["hpcdl", "doctor", "--image", str(private)], fuse="0666")
    assert f"error             : {private} is not readable by hpcuser" in r.stdout
    r = as_user(cluster_user, ["hpcdl", "inspect", str(private)])
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "not readable by hpcuser (mode 0600, owner root:root)" in r.stderr.splitlines()[0]


def test_a_spec_without_its_wheelhouse_is_bad_input(cluster_user: ClusterUser,
                                                    site_image: Path) -> None:
    spec = cluster_user.home / "nowheels.yaml"
    text = (Path(__file__).resolve().parents[2] / "containers" / "pytorch-horovod-cpu.yaml"
            ).read_text()
    spec.write_text(text.replace("wheelhouse: ${HPCDL_CACHE}/wheelhouse",
                                 "wheelhouse: /nonexistent/wheelhouse"))
    os.chown(spec, cluster_user.uid, cluster_user.gid)
    try:
        r = as_user(cluster_user, ["hpcdl", "build", str(spec), "--dry-run"])
    finally:
        spec.unlink()
    assert r.returncode == 2, r.stderr
    first = r.stderr.splitlines()[0]
    assert "pip.wheelhouse" in first and "/nonexistent/wheelhouse does not exist" in first


def test_pip_install_user_works(cluster_user: ClusterUser, site_image: Path,
                                tmp_path_factory: pytest.TempPathFactory) -> None:
    """`pip install --user` with Debian's python (PEP 668 wants its override flag), then
    the same commands as from the venv."""
    wheels = tmp_path_factory.mktemp("userwheel")
    subprocess.run([str(cluster_user.venv / "bin" / "python"), "-m", "pip", "wheel", "-q",
                    "--no-deps", "-w", str(wheels), str(Path(__file__).resolve().parents[2])],
                   check=True, timeout=600, capture_output=True)
    wheel = next(wheels.glob("hpcdl-*.whl"))
    shared = Path(tempfile.mkdtemp(prefix="hpcdl-wheel-"))
    base = cluster_user.own(cluster_user.home / ".hpcdl-test-userbase")
    try:
        shutil.copy(wheel, shared / wheel.name)
        shared.chmod(0o755)
        (shared / wheel.name).chmod(0o644)
        env = {"PYTHONUSERBASE": str(base), "PATH": f"{base}/bin:/usr/bin:/bin"}
        r = as_user(cluster_user, ["/usr/bin/python3", "-m", "pip", "install", "-q", "--user",
                                   "--break-system-packages", str(shared / wheel.name)],
                    env=env, timeout=900)
        assert r.returncode == 0, r.stderr[-2000:]
        r = as_user(cluster_user, [f"{base}/bin/hpcdl", "build", "pytorch-horovod-cpu",
                                   "--dry-run", "--json"], env=env)
        assert r.returncode == 0, r.stderr
        plan = json.loads(r.stdout)
        assert plan["output"] == str(cluster_user.home / ".cache/hpcdl/images/pytorch-horovod-cpu.sif")
        assert {"source": str(SITE / "wheelhouse"), "destination": "/opt/wheelhouse"} in plan["files"]
        assert "--fakeroot" in plan["build_options"]
    finally:
        shutil.rmtree(shared)
        shutil.rmtree(base)


@pytest.mark.timeout(2000)
def test_the_user_builds_the_cpu_image_into_their_own_cache(cluster_user: ClusterUser,
                                                            site_image: Path) -> None:
    """A real build as the user, with /dev/fuse closed (building needs user namespaces,
    not FUSE): the site's wheelhouse is read, the image lands in ~/.cache/hpcdl, its
    %test ran, and the user can start it once FUSE is open."""
    cache = cluster_user.home / ".cache" / "hpcdl"
    out = cache / "images" / "pytorch-horovod-cpu.sif"
    shutil.rmtree(cache / "images", ignore_errors=True)  # a real build, not a no-op
    try:
        r = as_user(cluster_user, ["hpcdl", "build", "pytorch-horovod-cpu"], fuse="0600",
                    timeout=1900)
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
        assert "as an ordinary user: --fakeroot: user namespace mapped to this user's " \
               "/etc/subuid range" in r.stderr
        assert f"built {out} in" in r.stdout
        assert out.stat().st_uid == cluster_user.uid
        record = json.loads(out.with_name(out.name + ".hash").read_text())
        assert record["image_facts"]["torch"] == "2.13.0+cpu"  # printed by its %test
        assert str(SITE / "wheelhouse") in json.dumps(record["files"])
        log = out.with_name(out.name + ".build.log").read_text(errors="replace")
        assert "build --fakeroot" in log.splitlines()[1]
        r = as_user(cluster_user, ["apptainer", "exec", str(out), "python3", "-c",
                                   "import torch, horovod.torch; print(torch.__version__)"],
                    fuse="0666", timeout=300)
        assert r.returncode == 0 and r.stdout.strip() == "2.13.0+cpu", r.stderr
    finally:
        shutil.rmtree(cache / "images", ignore_errors=True)
