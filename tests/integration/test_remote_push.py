"""`hpcdl push` from a laptop: the test user, off the cluster (the ``laptop`` fixture:
no Slurm, the remote images directory hidden), copies the CPU image to the sandbox
through its SSH login node with the bundled ``sandbox-remote`` profile. The pushed copy
is read back from the host's side, where the login node put it."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from hpcdl.container.hashing import file_sha256
from tests.integration.conftest_remote import LOGIN_HOST, Laptop
from tests.integration.conftest_slurm import hpcdl

pytestmark = [pytest.mark.slurm, pytest.mark.apptainer, pytest.mark.timeout(600)]

PROFILE = "sandbox-remote"
SIF_HEAD = b"#!/usr/bin/env run-singularity\n\x00SIF_MAGIC\x0001\x0002\x00"


@pytest.fixture(scope="module")
def cache_env(laptop: Laptop) -> dict[str, str]:
    """A hash cache of the module's own (so the first push hashes), in the user's home."""
    cache = laptop.user.home / ".cache-hpcdl-push-test"
    if cache.exists():
        shutil.rmtree(cache)
    return {"XDG_CACHE_HOME": str(laptop.user.own(cache))}


def test_an_image_is_pushed_once_whole_and_then_found(laptop: Laptop, cpu_image: Path,
                                                      cache_env: dict[str, str]) -> None:
    size = cpu_image.stat().st_size
    for old in laptop.remote_images.glob(f"{cpu_image.stem}-*.sif"):
        old.unlink()  # an earlier run's copy: this one must move the image

    dry = laptop.cli("push", str(cpu_image), "-p", PROFILE, "--dry-run", env=cache_env)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert dry.stdout.startswith(f"would push {cpu_image} (") and "  rsync " in dry.stdout
    assert list(laptop.remote_images.glob(f"{cpu_image.stem}-*")) == []  # nothing copied

    first = laptop.cli("push", str(cpu_image), "-p", PROFILE, "--json", env=cache_env)
    assert first.returncode == 0, first.stdout + first.stderr
    done = json.loads(first.stdout)
    local_sha = file_sha256(cpu_image)
    name = f"{cpu_image.stem}-{local_sha[:16]}.sif"
    assert done["remote_path"] == f"{laptop.user.home}/hpcdl-images/{name}"
    assert done["host"] == LOGIN_HOST and done["sha256"] == local_sha and done["size"] == size
    assert done["already_there"] is False and done["bytes_moved"] > 0.5 * size, done
    # Progress on stderr before the long parts: the hash, then the transfer with its size.
    mb = f"({size / 1e6:,.0f} MB)"
    assert f"hashing {cpu_image} {mb}" in dry.stderr, dry.stderr  # remembered since
    assert "hashing" not in first.stderr, first.stderr
    assert f"sending {cpu_image} {mb} to {LOGIN_HOST}:{done['remote_path']}" in first.stderr

    # The copy, as the cluster sees it: whole, with no temporary file left beside it.
    copy = laptop.remote_images / name
    assert file_sha256(copy) == local_sha
    assert list(laptop.remote_images.glob(f".{name}.tmp-*")) == []

    before = copy.stat()
    again = laptop.cli("push", str(cpu_image), "-p", PROFILE, env=cache_env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.strip() == (f"{cpu_image} already on {LOGIN_HOST}:{done['remote_path']} "
                                    f"(sha256 {local_sha}; nothing moved)")
    assert "hashing" not in again.stderr and "sending" not in again.stderr, again.stderr
    after = copy.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)

    dry = laptop.cli("push", str(cpu_image), "-p", PROFILE, "--dry-run", env=cache_env)
    assert dry.returncode == 0 and "nothing would move" in dry.stdout, dry.stdout + dry.stderr

    # What submit asks (hpcdl.remote.images.remote_image), as the laptop user.
    script = ("import sys; from pathlib import Path; from hpcdl.profiles import load_profile; "
              "from hpcdl.remote.images import remote_image; "
              "from hpcdl.schedulers.registry import executor_for; "
              "p = load_profile(sys.argv[1]); "
              "print(remote_image(executor_for(p), p.login, Path(sys.argv[2])))")
    found = laptop.run([str(laptop.user.venv / "bin" / "python"), "-c", script, PROFILE,
                        str(cpu_image)], env=cache_env)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == done["remote_path"]


def test_push_refuses_in_one_line(laptop: Laptop, cpu_image: Path,
                                  cache_env: dict[str, str]) -> None:
    def refused(*args: str) -> str:
        res = laptop.cli("push", *args, env=cache_env)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and res.stdout == "", res.stdout + res.stderr
        assert lines[0].startswith("error: ") and all(
            line.startswith("hint: ") for line in lines[1:]), res.stderr
        return lines[0]

    assert refused(str(cpu_image), "-p", "sandbox") == (
        "error: profile sandbox has no login: node; push is for a cluster reached over SSH")
    missing = laptop.user.home / "no-such-image.sif"
    assert refused(str(missing), "-p", PROFILE) == f"error: image: {missing} does not exist"
    # An images directory the user cannot write (root's home, through the login node).
    profile = laptop.user.home / "push-readonly.yaml"
    source = (Path(__file__).resolve().parents[2] / "hpcdl" / "profiles" / "bundled"
              / f"{PROFILE}.yaml").read_text()
    profile.write_text(re.sub(r"(?m)^name: .*$", "name: push-readonly", source).replace(
        f"  host: {LOGIN_HOST}\n", f"  host: {LOGIN_HOST}\n  images: /root/hpcdl-images\n"))
    shutil.chown(profile, laptop.user.uid, laptop.user.gid)
    line = refused(str(cpu_image), "-p", str(profile))
    assert line.startswith(f"error: login.images: /root/hpcdl-images is not writable on "
                           f"{LOGIN_HOST}"), line


def test_a_failed_push_exits_1_in_one_line_and_leaves_nothing(laptop: Laptop,
                                                             cache_env: dict[str, str]) -> None:
    # A small file with a SIF's header is enough here: push reads it, never runs it.
    image = laptop.user.home / "push-fails.sif"
    image.write_bytes(SIF_HEAD + os.urandom(1 << 20))
    shutil.chown(image, laptop.user.uid, laptop.user.gid)
    name = f"push-fails-{file_sha256(image)[:16]}.sif"
    # A directory where the copy should go: the final rename fails on the cluster.
    blocker = laptop.user.own(laptop.remote_images / name)
    try:
        res = laptop.cli("push", str(image), "-p", PROFILE, env=cache_env)
        assert res.returncode == 1, res.stdout + res.stderr
        error = res.stderr.strip().splitlines()[-1]
        assert error.startswith(f"error: mv on {LOGIN_HOST} failed (exit 1): "), res.stderr
        assert "cannot overwrite directory" in error
        # The copy was sent under its temporary name and removed again.
        assert "sending" in res.stderr
        assert list(laptop.remote_images.glob(f".{name}.tmp-*")) == []
        assert list(blocker.iterdir()) == []
    finally:
        shutil.rmtree(blocker)
        image.unlink()


def test_the_same_content_under_another_name_is_linked_not_sent(
        laptop: Laptop, cache_env: dict[str, str]) -> None:
    first, renamed = laptop.user.home / "push-twin-a.sif", laptop.user.home / "push-twin-b.sif"
    first.write_bytes(SIF_HEAD + os.urandom(1 << 20))
    shutil.copy2(first, renamed)
    for path in (first, renamed):
        shutil.chown(path, laptop.user.uid, laptop.user.gid)
    digest = file_sha256(first)[:16]
    remote = [laptop.remote_images / f"{p.stem}-{digest}.sif" for p in (first, renamed)]
    try:
        sent = laptop.cli("push", str(first), "-p", PROFILE, "--json", env=cache_env)
        assert sent.returncode == 0 and json.loads(sent.stdout)["bytes_moved"] > 1 << 19
        res = laptop.cli("push", str(renamed), "-p", PROFILE, "--json", env=cache_env)
        assert res.returncode == 0, res.stdout + res.stderr
        done = json.loads(res.stdout)
        assert done["bytes_moved"] == 0 and done["already_there"] is False
        assert done["linked_from"] == str(remote[0]) and done["remote_path"] == str(remote[1])
        assert "sending" not in res.stderr
        assert remote[0].stat().st_ino == remote[1].stat().st_ino  # one file, two names
        assert remote[1].read_bytes() == renamed.read_bytes()
    finally:
        for path in (first, renamed, *remote):
            path.unlink(missing_ok=True)


def test_a_packed_dataset_is_pushed_once_and_a_job_reads_it(
        laptop: Laptop, cache_env: dict[str, str]) -> None:
    """A packed dataset on the laptop: push copies it under its content's name (a second
    push moves nothing); `submit --data` over the login node reads the pushed copy,
    mounted natively on the node. (Packed here by the test: the laptop stand-in's PATH has
    no mksquashfs.)"""
    tree, packed = laptop.user.home / "push-tiny", laptop.user.home / "push-tiny.sqfs"
    remote: Path | None = None
    try:
        for args in (("data", "make-tiny", str(tree), "--classes", "3", "--per-class", "4"),
                     ("data", "pack", str(tree), "-o", str(packed))):
            made = hpcdl(*args)
            assert made.returncode == 0, made.stdout + made.stderr
        shutil.chown(packed, laptop.user.uid, laptop.user.gid)
        first = laptop.cli("push", str(packed), "-p", PROFILE, "--json", env=cache_env)
        assert first.returncode == 0, first.stdout + first.stderr
        done = json.loads(first.stdout)
        remote = Path(done["remote_path"])
        assert remote.name == f"push-tiny-{file_sha256(packed)[:16]}.sqfs" and done["bytes_moved"] > 0
        assert remote.read_bytes() == packed.read_bytes()
        again = laptop.cli("push", str(packed), "-p", PROFILE, "--json", env=cache_env)
        assert again.returncode == 0 and json.loads(again.stdout)["bytes_moved"] == 0, again.stdout
        job = laptop.cli("submit", "-p", PROFILE, "-N", "1", "-G", "0", "--no-image", "--data",
                         str(packed), "--wait", "--json", "--", "sh", "-c",
                         'echo "classes=$(ls "$HPCDL_DATA/train" | wc -l)"', env=cache_env,
                         timeout=420)
        assert job.returncode == 0, job.stdout + job.stderr
        record = json.loads(job.stdout.strip().splitlines()[-1])
        # (the run's local copy; a relative path is the laptop user's, from their home)
        assert "classes=3" in (laptop.user.home / record["stdout"]).read_text(), record
    finally:
        shutil.rmtree(tree, ignore_errors=True)
        packed.unlink(missing_ok=True)
        if remote is not None:
            remote.unlink(missing_ok=True)
