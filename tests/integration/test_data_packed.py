"""`hpcdl data pack` / `data check` with the real squashfs-tools, and the two ways a job
mounts the packed file, without Slurm: Apptainer's image mount (`-B
X.sqfs:/data:image-src=/,ro`, as root and as the ordinary user) and squashfuse (root; an
ordinary user needs a setuid fusermount3, which this machine lacks). About 3 s."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import require
from tests.integration.conftest_apptainer import image_path
from tests.integration.conftest_slurm import hpcdl

USER = "hpcuser"


@pytest.fixture(scope="module")
def shared_dir() -> Iterator[Path]:
    """A directory every user can read (pytest's own are 0700), on /scratch."""
    base = Path("/scratch/tmp") if Path("/scratch/tmp").is_dir() else None
    d = Path(tempfile.mkdtemp(prefix="hpcdl-packed-", dir=base))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def packed(shared_dir: Path) -> Path:
    require(shutil.which("mksquashfs") is not None and shutil.which("unsquashfs") is not None,
            "squashfs-tools (mksquashfs, unsquashfs)")
    tree = shared_dir / "tiny"
    res = hpcdl("data", "make-tiny", str(tree), "--classes", "4", "--per-class", "6",
                "--size", "16")
    assert res.returncode == 0, res.stderr
    out = shared_dir / "tiny.sqfs"
    res = hpcdl("data", "pack", str(tree), "-o", str(out), "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    summary = json.loads(res.stdout)
    assert (summary["classes"], summary["train"], summary["val"]) == (4, 24, 4)
    out.chmod(0o644)
    return out


def test_pack_is_deterministic_and_recorded(packed: Path, shared_dir: Path) -> None:
    record = json.loads(packed.with_name(packed.name + ".hash").read_text())
    assert record["size"] == packed.stat().st_size
    assert packed.read_bytes()[:4] == b"hsqs"
    again = shared_dir / "again.sqfs"
    res = hpcdl("data", "pack", str(shared_dir / "tiny"), "-o", str(again), "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["hash"] == record["hash"]  # same tree, same bytes
    assert not [p for p in shared_dir.iterdir() if ".tmp-" in p.name]


def test_check_reads_the_packed_file(packed: Path) -> None:
    res = hpcdl("data", "check", str(packed), "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {"path": str(packed), "classes": 4, "train": 24, "val": 4}


def test_corrupt_and_wrong_inputs_are_one_line_exit_2(packed: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.sqfs"
    cut.write_bytes(packed.read_bytes()[: packed.stat().st_size // 2])
    other = tmp_path / "other.sqfs"
    other.write_bytes(b"\x7fELF" + b"\0" * 100)
    for path, words in ((cut, "unsquashfs cannot read it"), (other, "not a SquashFS file")):
        res = hpcdl("data", "check", str(path))
        assert res.returncode == 2, res.stdout + res.stderr
        assert words in res.stderr and res.stderr.count("error:") == 1, res.stderr
    notdata = tmp_path / "notdata"
    (notdata / "a").mkdir(parents=True)
    res = hpcdl("data", "pack", str(notdata), "-o", str(tmp_path / "n.sqfs"))
    assert res.returncode == 2 and "no train/ directory" in res.stderr, res.stderr
    assert not (tmp_path / "n.sqfs").exists()


@pytest.fixture(scope="module")
def any_image() -> Path:
    """A built image (the CPU image, else the test base image); not built here."""
    require(shutil.which("apptainer") is not None, "apptainer on PATH")
    for img in (image_path(), image_path("hpcdl-test-base")):
        if img.is_file():
            return img
    require(False, "a built image (make demo, or the apptainer tests)")
    raise AssertionError


LIST = "ls /data/train; ls /data/train/n00000001 | wc -l; touch /data/x 2>&1 || true"


@pytest.mark.apptainer
@pytest.mark.parametrize("user", ["root", USER])
def test_apptainer_image_mount_lists_the_classes(packed: Path, any_image: Path,
                                                 user: str) -> None:
    argv = ["apptainer", "exec", "-B", f"{packed}:/data:image-src=/,ro", str(any_image),
            "sh", "-c", LIST]
    if user != "root":
        require(shutil.which("runuser") is not None and _has_user(user), f"user {user}")
        argv = ["runuser", "-u", user, "--", *argv]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd="/")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[:5] == [f"n{i:08d}" for i in range(4)] + ["6"], res.stdout
    assert "Read-only file system" in res.stdout


def _has_user(name: str) -> bool:
    return subprocess.run(["id", name], capture_output=True).returncode == 0


def test_squashfuse_mounts_and_unmounts_natively(packed: Path, tmp_path: Path) -> None:
    require(shutil.which("squashfuse") is not None and os.path.exists("/dev/fuse"),
            "squashfuse and /dev/fuse")
    require(os.geteuid() == 0, "root (an ordinary user needs fusermount3)")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    res = subprocess.run(["squashfuse", str(packed), str(mnt)], capture_output=True, text=True,
                         timeout=30)
    assert res.returncode == 0, res.stderr
    try:
        res = hpcdl("data", "check", str(mnt), "--json")
        assert json.loads(res.stdout)["train"] == 24, res.stderr
    finally:
        umount = shutil.which("fusermount") or shutil.which("fusermount3")
        subprocess.run([umount, "-u", str(mnt)] if umount else ["umount", str(mnt)],
                       check=True, timeout=30)
    assert not os.path.ismount(mnt)
