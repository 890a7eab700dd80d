"""`hpcdl data pack` / `data check` of a tree read one way (walk_tree): symbolic links to
class directories and images, inside or outside the tree, packed as what they point to
(the real mksquashfs and unsquashfs, ~50 ms a pack); link loops and bad images refused
at pack time with one line, exit 2, nothing written (issue 44)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from hpcdl.data.packed import link_definitions, pack_plan
from hpcdl.errors import UserInputError
from hpcdl.jobside.imagefolder import TAIL, image_defect, walk_tree
from tests.conftest import require
from tests.unit.clirun import hpcdl

JPEG = b"\xff\xd8\xff\xe0" + b"\0" * 16 + b"\xff\xd9"
PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 20 + b"\0\0\0\0IEND\xaeB`\x82"


def images(d: Path, n: int, prefix: str = "") -> None:
    d.mkdir(parents=True)
    for i in range(n):
        (d / f"{prefix}{i}.JPEG").write_bytes(JPEG + bytes([i]) + b"\xff\xd9")


def linked_tree(tmp: Path) -> Path:
    """train/{a,b} and val/{a,b} real; train/c and val/c links to another directory
    (another disk, as a dataset assembled from pieces); train/b/x.JPEG a link to an
    image outside, val/b/y.JPEG a link to an image inside the tree."""
    root = tmp / "ds"
    for split, n in (("train", 3), ("val", 1)):
        for cls in ("a", "b"):
            images(root / split / cls, n)
        images(tmp / "elsewhere" / split / "c", n + 1, prefix="c")
        (root / split / "c").symlink_to(tmp / "elsewhere" / split / "c")
    (tmp / "lone.JPEG").write_bytes(JPEG)
    (root / "train" / "b" / "x.JPEG").symlink_to(tmp / "lone.JPEG")
    (root / "val" / "b" / "y.JPEG").symlink_to("../../train/a/0.JPEG")
    return root


def test_walk_follows_links_and_the_definitions_add_what_they_hold(tmp_path):
    root = linked_tree(tmp_path)
    listing = walk_tree(root)
    assert listing["train"].subdirs == ["a", "b", "c"] and listing["train"].links == ["c"]
    assert listing["train/c"].via_link and listing["train/c"].files == ["c0.JPEG", "c1.JPEG",
                                                                        "c2.JPEG", "c3.JPEG"]
    assert listing["train/b"].files == ["0.JPEG", "1.JPEG", "2.JPEG", "x.JPEG"]
    excludes, pseudo = link_definitions(listing)
    assert sorted(excludes) == ["train/b/x.JPEG", "train/c", "val/b/y.JPEG", "val/c"]
    elsewhere = (tmp_path / "elsewhere").resolve()
    assert "train/c d 755 0 0" in pseudo
    assert f"train/c/c0.JPEG l {elsewhere}/train/c/c0.JPEG" in pseudo
    assert f"train/b/x.JPEG l {(tmp_path / 'lone.JPEG').resolve()}" in pseudo
    assert f"val/b/y.JPEG l {(root / 'train/a/0.JPEG').resolve()}" in pseudo
    # A tree without links: mksquashfs alone, no -ef/-pf.
    plain = tmp_path / "plain"
    for split in ("train", "val"):
        images(plain / split / "a", 1)
    assert link_definitions(walk_tree(plain)) == ([], [])
    assert "-pf" not in pack_plan(plain, tmp_path / "p.sqfs").argv


def test_a_name_mksquashfs_reads_specially_is_escaped_and_a_newline_refused(tmp_path):
    root = tmp_path / "ds"
    for split in ("train", "val"):
        images(tmp_path / "far" / split / "c d", 1)
        (root / split).mkdir(parents=True)
        (root / split / "c d").symlink_to(tmp_path / "far" / split / "c d")
    _, pseudo = link_definitions(walk_tree(root))
    assert r"train/c\ d d 755 0 0" in pseudo
    (tmp_path / "far" / "train" / "c d" / "a\nb.JPEG").write_bytes(JPEG)
    with pytest.raises(UserInputError, match="control character"):
        pack_plan(root, tmp_path / "x.sqfs")


def test_pack_of_a_linked_tree_holds_what_check_counted(tmp_path):
    require(shutil.which("mksquashfs") is not None and shutil.which("unsquashfs") is not None,
            "squashfs-tools (mksquashfs, unsquashfs)")
    root = linked_tree(tmp_path)
    tree = hpcdl("data", "check", str(root), "--json")
    assert tree.returncode == 0, tree.stderr
    counted = json.loads(tree.stdout)
    assert (counted["classes"], counted["train"], counted["val"]) == (3, 11, 5)
    out = tmp_path / "ds.sqfs"
    res = hpcdl("data", "pack", str(root), "-o", str(out), "--json")
    assert res.returncode == 0, res.stderr
    packed = hpcdl("data", "check", str(out), "--json")
    assert packed.returncode == 0, packed.stderr
    assert {k: v for k, v in json.loads(packed.stdout).items() if k != "path"} == \
        {k: v for k, v in counted.items() if k != "path"}
    listing = subprocess.run(["unsquashfs", "-lls", str(out)], capture_output=True, text=True,
                             check=True).stdout
    kinds = {line.split()[-1].split("squashfs-root/", 1)[-1]: line[0]
             for line in listing.splitlines() if "squashfs-root/" in line}
    assert not [p for p, k in kinds.items() if k == "l"], listing  # no link inside
    assert kinds["train/c"] == "d" and kinds["train/c/c3.JPEG"] == "-"
    assert kinds["train/b/x.JPEG"] == "-" and kinds["val/b/y.JPEG"] == "-"
    # The same files as a copy with the links resolved (cp -rL), byte for byte (the
    # packed file itself differs in one inode: y.JPEG and the train/a/0.JPEG it links
    # to are one host file, which mksquashfs stores once, as a hard link).
    copy = tmp_path / "copy"
    shutil.copytree(root, copy, symlinks=False)
    assert hpcdl("data", "pack", str(copy), "-o", str(tmp_path / "copy.sqfs")).returncode == 0
    for sqfs in (out, tmp_path / "copy.sqfs"):
        subprocess.run(["unsquashfs", "-q", "-d", str(sqfs.with_suffix(".x")), str(sqfs)],
                       capture_output=True, check=True)
    got = {p.relative_to(out.with_suffix(".x")): p.read_bytes()
           for p in out.with_suffix(".x").rglob("*") if p.is_file()}
    want = {p.relative_to(copy): p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    assert got == want and len(got) == 16
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".ds")]
    assert leftovers == []  # the temporary file, the -ef and -pf files: gone


@pytest.mark.parametrize("make, words", [
    (lambda r: (r / "train/a/up").symlink_to(".."), "train/a/up is a link to .. that loops "
                                                    "back to train"),
    (lambda r: (r / "train/a/self").symlink_to(r / "train/a"), "loops back to train/a"),
    (lambda r: (r / "train/b").symlink_to(r / "nowhere"), "train/b is a link to"),
    (lambda r: (r / "train/a/0.JPEG").write_bytes(b""), "0.JPEG is empty (0 bytes)"),
    (lambda r: (r / "val/a/0.JPEG").write_bytes(JPEG[:-2] + b"\0" * 2000),
     "is a truncated JPEG: no end-of-image marker FFD9 in its last 1024 bytes"),
    (lambda r: (r / "val/a/0.JPEG").write_bytes(b"<html>not found</html>"),
     "is not an image (unrecognised header 3c68746d)"),
])
def test_pack_refuses_loops_and_bad_images_in_one_line_writing_nothing(tmp_path, make, words):
    root = tmp_path / "ds"
    for split in ("train", "val"):
        images(root / split / "a", 2)
    make(root)
    before = sorted(p.name for p in tmp_path.iterdir())
    for dry in ((), ("--dry-run",)):
        res = hpcdl("data", "pack", str(root), "-o", str(tmp_path / "x.sqfs"), *dry)
        assert res.returncode == 2, res.stdout + res.stderr
        assert words in res.stderr and res.stderr.count("error:") == 1, res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    if "loops" in words:  # check reads the tree the same way
        assert words in hpcdl("data", "check", str(root)).stderr


def test_image_defect_reads_both_ends_only():
    assert image_defect(JPEG[:8], JPEG[-TAIL:], len(JPEG)) is None
    # Padding after the marker, as some cameras write, is not a truncation.
    padded = JPEG + b"\0" * 500
    assert image_defect(padded[:8], padded[-TAIL:], len(padded)) is None
    assert "truncated JPEG" in str(image_defect(JPEG[:8], b"\xff\xd8\x00\x12", 5000))
    assert image_defect(PNG[:8], PNG[-TAIL:], len(PNG)) is None
    assert "truncated PNG" in str(image_defect(PNG[:8], PNG[:-12], len(PNG) - 12))
    bmp = b"BM" + (5000).to_bytes(4, "little") + b"\0\0"
    assert "truncated BMP: 100 bytes, its header says 5000" in str(image_defect(bmp, b"", 100))
    assert image_defect(bmp, b"", 5000) is None
    webp = b"RIFF" + (92).to_bytes(4, "little")
    assert image_defect(webp, b"", 100) is None and "WEBP" in str(image_defect(webp, b"", 50))
    assert image_defect(b"", b"", 0) == "is empty (0 bytes)"


def test_pack_decode_names_an_image_whose_ends_look_whole(tmp_path):
    pytest.importorskip("PIL")
    root = tmp_path / "ds"
    for split in ("train", "val"):
        images(root / split / "a", 1)  # headers and markers only: no picture in them
    assert pack_plan(root, tmp_path / "x.sqfs").files == 2
    res = hpcdl("data", "pack", str(root), "-o", str(tmp_path / "x.sqfs"), "--decode")
    assert res.returncode == 2 and "cannot be decoded" in res.stderr, res.stderr
