"""hpcdl.remote.images' pure parts and its local side: remote names, image formats, the
sha256 cache (hit, miss on a changed mtime, racy files, a broken cache), and the push
command's refusals that need no cluster. (tests/integration/test_remote_push.py pushes
through the sandbox's login node.)"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcdl.cli import cli
from hpcdl.errors import UserInputError
from hpcdl.remote import images
from hpcdl.remote.images import (
    CACHE_ENTRIES,
    Progress,
    check_image,
    image_kind,
    image_sha256,
    read_hash_cache,
    remember,
    remote_name,
)
from hpcdl.remote.ssh import rsync_progress

SHA = hashlib.sha256(b"x").hexdigest()
# A SIF's first bytes: the launch line, then SIF_MAGIC at byte 32.
SIF_HEAD = b"#!/usr/bin/env run-singularity\n\x00SIF_MAGIC\x0001\x0002\x00"
HOUR_AGO_NS = (int(time.time()) - 3600) * 10**9


def _sif(path: Path, body: bytes = b"payload") -> Path:
    path.write_bytes(SIF_HEAD + body)
    os.utime(path, ns=(HOUR_AGO_NS, HOUR_AGO_NS))
    return path


@pytest.mark.parametrize("name, expected", [
    ("pytorch-horovod-cpu.sif", "pytorch-horovod-cpu"),
    ("my image (v2).sif", "my_image_v2_"),
    ("-rf.sif", "rf"),
    (".hidden.sif", "hidden"),
    ("$(reboot);x.img", "reboot_x"),
    ("...sif", "image"),
])
def test_the_remote_name_is_a_plain_stem_and_the_hash(name, expected):
    got = remote_name(Path("/imgs") / name, SHA)
    assert got == f"{expected}-{SHA[:16]}.sif"


def test_a_long_stem_is_cut_and_a_bad_digest_refused():
    assert len(remote_name(Path("a" * 300 + ".sif"), SHA)) == 100 + 1 + 16 + 4
    with pytest.raises(ValueError, match="64 lowercase hex"):
        remote_name(Path("a.sif"), "abc")


def test_the_copy_is_written_beside_its_final_name_and_gets_time_by_size():
    plan = images.PushPlan(Path("/i/a.sif"), "login", "/home/u/hpcdl-images",
                           f"/home/u/hpcdl-images/a-{SHA[:16]}.sif", SHA, 10, 0, False)
    assert plan.temp_path("ab12") == f"/home/u/hpcdl-images/.a-{SHA[:16]}.sif.tmp-ab12"
    assert images.transfer_timeout(0) == 600
    assert images.transfer_timeout(4 * 10**9) == 4600  # 4 GB: at least 1 MB/s


def test_image_formats_are_told_by_their_magic():
    assert image_kind(SIF_HEAD) == "sif"
    assert image_kind(b"hsqs" + bytes(100)) == "squashfs"
    assert image_kind(bytes(0x438) + b"\x53\xef") == "ext3"
    assert image_kind(b"not an image") is None
    assert image_kind(b"") is None


def test_check_image_names_the_path_and_the_problem(tmp_path):
    assert check_image(_sif(tmp_path / "ok.sif")).st_size == len(SIF_HEAD) + 7
    for path, needle in [(tmp_path / "missing.sif", "does not exist"),
                         (tmp_path, "is a directory"),
                         (tmp_path / "notes.txt", "is not a SIF, squashfs or ext3 image")]:
        if path.name == "notes.txt":
            path.write_text("hello")
        with pytest.raises(UserInputError, match=needle) as err:
            check_image(path)
        assert str(path) in err.value.message and "\n" not in err.value.message


@pytest.fixture
def hashed(monkeypatch):
    """The paths hashed for real (the cache's misses)."""
    calls: list[Path] = []
    real = images.file_sha256

    def counting(path: Path) -> str:
        calls.append(path)
        return real(path)

    monkeypatch.setattr(images, "file_sha256", counting)
    return calls


def test_the_digest_is_remembered_until_the_mtime_changes(tmp_path, hashed):
    img, cache = _sif(tmp_path / "a.sif"), tmp_path / "cache" / "image-sha256.json"
    said: list[str] = []
    first = image_sha256(img, cache=cache, note=said.append)
    assert first.sha256 == hashlib.sha256(img.read_bytes()).hexdigest()
    assert hashed == [img] and said == [f"hashing {img} (0.0 MB)"]
    assert image_sha256(img, cache=cache, note=said.append) == first
    assert len(hashed) == 1 and len(said) == 1  # a hit: nothing read, nothing said
    entry = json.loads(cache.read_text())["files"][str(img.resolve())]
    assert entry == {"size": first.size, "mtime_ns": HOUR_AGO_NS, "sha256": first.sha256}
    # Same size, new content, new mtime (an image rebuilt in place): hashed again.
    _sif(img, b"PAYLOAD")
    os.utime(img, ns=(HOUR_AGO_NS + 10**9, HOUR_AGO_NS + 10**9))
    second = image_sha256(img, cache=cache)
    assert len(hashed) == 2 and second.sha256 != first.sha256
    assert second.sha256 == hashlib.sha256(img.read_bytes()).hexdigest()
    # Through a symlink the key is the file itself: a hit.
    link = tmp_path / "link.sif"
    link.symlink_to(img)
    assert image_sha256(link, cache=cache) == second and len(hashed) == 2


def test_a_file_modified_just_now_is_hashed_but_not_remembered(tmp_path, hashed):
    img, cache = _sif(tmp_path / "fresh.sif"), tmp_path / "c.json"
    now = HOUR_AGO_NS / 1e9 + 0.5  # as if hashed half a second after the last write
    image_sha256(img, cache=cache, now=now)
    assert not cache.exists()
    image_sha256(img, cache=cache)
    assert len(hashed) == 2 and cache.exists()


def test_a_broken_or_foreign_cache_is_an_empty_one(tmp_path, hashed):
    img, cache = _sif(tmp_path / "a.sif"), tmp_path / "c.json"
    for text in ("{not json", json.dumps({"version": 99, "files": {}}),
                 json.dumps({"version": 1, "files": {str(img): {"size": "x"}}}),
                 json.dumps({"version": 1, "files": {str(img): {
                     "size": img.stat().st_size, "mtime_ns": HOUR_AGO_NS, "sha256": "bad"}}})):
        cache.write_text(text)
        assert read_hash_cache(cache) == {}
    image_sha256(img, cache=cache)
    assert len(hashed) == 1 and str(img) in read_hash_cache(cache)


def test_an_unwritable_cache_costs_only_a_rehash(tmp_path, hashed):
    img = _sif(tmp_path / "a.sif")
    blocker = tmp_path / "file"
    blocker.write_text("")
    cache = blocker / "c.json"  # its folder is a file
    assert image_sha256(img, cache=cache) == image_sha256(img, cache=cache)
    assert len(hashed) == 2


def test_the_cache_keeps_the_newest_entries():
    known = {f"/i/{n}.sif": images.FileDigest(n, n, SHA) for n in range(CACHE_ENTRIES)}
    data = remember(known, "/i/0.sif", images.FileDigest(1, 1, SHA))
    assert len(data["files"]) == CACHE_ENTRIES and list(data["files"])[-1] == "/i/0.sif"
    data = remember(known, "/i/new.sif", images.FileDigest(1, 1, SHA))
    assert len(data["files"]) == CACHE_ENTRIES and "/i/0.sif" not in data["files"]
    assert list(data["files"])[-1] == "/i/new.sif"


def _one_error_line(res) -> str:
    lines = res.output.strip().splitlines()
    assert lines[0].startswith("error: ") and all(
        line.startswith("hint: ") for line in lines[1:]), res.output
    return lines[0]


def test_push_refuses_a_profile_without_a_login_node(tmp_path):
    res = CliRunner().invoke(cli, ["push", str(_sif(tmp_path / "a.sif")), "-p", "sandbox"])
    assert res.exit_code == 2
    assert _one_error_line(res) == ("error: profile sandbox has no login: node; push is for "
                                    "a cluster reached over SSH")


def test_push_refuses_what_is_not_an_image_before_connecting(tmp_path):
    # sandbox-remote's login node is never asked: the image is checked first.
    for path, needle in [(tmp_path / "nope.sif", "does not exist"),
                         (tmp_path, "is a directory")]:
        res = CliRunner().invoke(cli, ["push", str(path), "-p", "sandbox-remote"])
        assert res.exit_code == 2 and needle in _one_error_line(res), res.output


def test_push_help_explains_with_an_example():
    res = CliRunner().invoke(cli, ["push", "--help"])
    assert res.exit_code == 0
    text = " ".join(res.output.split())  # as read, whatever click's wrapping
    for needle in ("login.images", "img-0123456789abcdef.sif", "first 16 hex digits", "moves nothing", "Example:",
                   "hpcdl push ~/images/pytorch-horovod-cpu.sif -p sandbox-remote", "--json"):
        assert needle in text


# rsync 3.x's --progress as it prints it (each update ends in '\r'), then its last line.
PROGRESS = ("\r         32,768   0%    0.00kB/s    0:00:00  "
            "\r    229,081,088  40%   45.22MB/s    0:00:07  "
            "\r    565,022,720 100%   48.01MB/s    0:00:11 (xfr#1, to-chk=0/1)\n")


def test_rsyncs_progress_lines_are_read():
    lines = [line for line in PROGRESS.replace("\r", "\n").splitlines() if line]
    assert [rsync_progress(line) for line in lines] == [
        (32768, 0, "0.00kB/s", "0:00:00"), (229081088, 40, "45.22MB/s", "0:00:07"),
        (565022720, 100, "48.01MB/s", "0:00:11")]
    for other in ("sending incremental file list", "pytorch-horovod-cpu.sif",
                  "Total bytes sent: 427,000,000", ""):
        assert rsync_progress(other) is None


def test_a_long_copy_says_how_far_it_got_every_ten_seconds():
    said: list[str] = []
    clock = iter([0.0, 1.0, 10.5, 12.0, 25.0, 40.0])
    progress = Progress(565_022_720, said.append, clock=lambda: next(clock))
    progress("         32,768   0%    0.00kB/s    0:00:00")  # t=1: too soon
    progress("    229,081,088  40%   45.22MB/s    0:00:07")  # t=10.5: said
    progress("    300,000,000  53%   45.00MB/s    0:00:06")  # t=12: too soon
    progress("sending incremental file list")  # t=25: not progress
    progress("    565,022,720 100%   48.01MB/s    0:00:11 (xfr#1, to-chk=0/1)")  # done: the
    assert said == ["sent 229 MB of 565 MB (40%, 45.22MB/s, 0:00:07 left)"]  # result says
