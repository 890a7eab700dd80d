"""hpcdl/jobside/imagefolder.py on real folders: the ImageFolder layout check and its
one-line refusals, labels by sorted class name, the walk that follows links (and stops
at a loop), and the cheap defect check of each image format. (Packing linked trees:
tests/unit/data/test_data_links.py.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcdl.jobside.errors import UserInputError
from hpcdl.jobside.imagefolder import (
    TAIL,
    dataset_dir,
    image_defect,
    read_ends,
    scan_imagefolder,
    walk_tree,
)

JPEG = b"\xff\xd8\xff\xe0" + bytes(16) + b"\xff\xd9"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(8) + b"\0\0\0\0IEND\xaeB`\x82"


def make(root: Path, layout: dict[str, dict[str, list[str]]], content: bytes = JPEG) -> Path:
    for split, classes in layout.items():
        (root / split).mkdir(parents=True, exist_ok=True)
        for cls, files in classes.items():
            (root / split / cls).mkdir(parents=True, exist_ok=True)
            for name in files:
                (root / split / cls / name).write_bytes(content)
    return root


def test_labels_follow_sorted_train_classes_and_val_may_have_fewer(tmp_path):
    root = make(tmp_path / "d", {"train": {"zebra": ["1.jpg", "0.JPEG"], "ant": ["a.png"],
                                            ".hidden": ["x.jpg"]},
                                  "val": {"zebra": ["v.jpg"]}})
    (root / "train" / "ant" / "notes.txt").write_text("not an image name: skipped")
    (root / "train" / "ant" / ".b.jpg").write_bytes(JPEG)
    folder = scan_imagefolder(root)
    assert folder.classes == ("ant", "zebra")
    assert [(Path(p).name, label) for p, label in folder.samples["train"]] == \
        [("a.png", 0), ("0.JPEG", 1), ("1.jpg", 1)]
    assert folder.samples["val"] == [(str(root / "val" / "zebra" / "v.jpg"), 1)]
    assert folder.counts() == {"train": 3, "val": 1}


@pytest.mark.parametrize(("layout", "message"), [
    ({"train": {"a": ["1.jpg"]}}, "no val/ directory"),
    ({"train": {}, "val": {"a": ["1.jpg"]}}, "train/ holds no class directories"),
    ({"train": {"a": ["1.jpg"]}, "val": {"b": ["1.jpg"]}},
     "val/ has 1 class(es) that train/ lacks, e.g. 'b'"),
    ({"train": {"a": ["x.txt"]}, "val": {"a": ["1.jpg"]}}, "train/a/ holds no images"),
])
def test_a_bad_layout_is_one_line_naming_the_dataset(tmp_path, layout, message):
    root = make(tmp_path / "d", layout)
    with pytest.raises(UserInputError) as err:
        scan_imagefolder(root)
    assert err.value.message == f"dataset {root}: {message}" + (
        f" ({', '.join(('.jpg', '.jpeg', '.png', '.ppm', '.bmp', '.webp'))})"
        if message.endswith("holds no images") else "")


def test_the_first_image_of_each_class_is_checked(tmp_path):
    root = make(tmp_path / "d", {"train": {"a": ["1.jpg"]}, "val": {"a": ["1.jpg"]}},
                content=b"<html>404</html>")
    with pytest.raises(UserInputError, match=r"1.jpg is not an image \(unrecognised header 3c68746d\)"):
        scan_imagefolder(root)
    (root / "train" / "a" / "1.jpg").write_bytes(b"")
    with pytest.raises(UserInputError, match=r"train/a/1.jpg is empty \(0 bytes\)"):
        scan_imagefolder(root)


def test_dataset_dir_refuses_a_missing_path_or_a_file(tmp_path):
    with pytest.raises(UserInputError, match="no such directory") as err:
        dataset_dir(tmp_path / "none")
    assert err.value.hint == "pass --data DIR, or --synthetic"
    (tmp_path / "f").write_text("x")
    with pytest.raises(UserInputError):
        dataset_dir(tmp_path / "f")
    assert dataset_dir(tmp_path) == tmp_path


def test_walk_follows_links_and_refuses_loops_and_dangling_ones(tmp_path):
    elsewhere = make(tmp_path / "disk2", {"train": {"b": ["2.jpg"]}})
    root = make(tmp_path / "d", {"train": {"a": ["1.jpg"]}, "val": {"a": ["1.jpg"]}})
    (root / "train" / "b").symlink_to(elsewhere / "train" / "b")
    (root / "val" / "a" / "2.jpg").symlink_to(root / "val" / "a" / "1.jpg")
    listing = walk_tree(root)
    assert listing["train/b"].via_link and listing["train/b"].files == ["2.jpg"]
    assert listing["train/b"].path == os.path.realpath(elsewhere / "train" / "b")
    assert listing["val/a"].links == ["2.jpg"] and listing["val/a"].files == ["1.jpg", "2.jpg"]
    assert walk_tree(root, only=("val",)).keys() == {"", "val", "val/a"}
    assert scan_imagefolder(root).counts() == {"train": 2, "val": 2}
    (root / "train" / "a" / "up").symlink_to(root / "train")
    with pytest.raises(UserInputError, match="train/a/up is a link to .* that loops back to train"):
        walk_tree(root)
    (root / "train" / "a" / "up").unlink()
    (root / "train" / "a" / "gone.jpg").symlink_to(tmp_path / "nowhere")
    with pytest.raises(UserInputError, match="gone.jpg is a link to .*nowhere that cannot be followed"):
        walk_tree(root)


@pytest.mark.parametrize(("data", "defect"), [
    (JPEG, None),
    (JPEG + bytes(100), None),  # padding after the end marker
    (JPEG[:-2], "is a truncated JPEG: no end-of-image marker FFD9 in its last 20 bytes"),
    (JPEG[:3] + bytes(2 * TAIL), f"is a truncated JPEG: no end-of-image marker FFD9 in its last {TAIL} bytes"),
    (PNG, None),
    (PNG[:-8], "is a truncated PNG: it does not end with the IEND chunk"),
    (b"BM" + (100).to_bytes(4, "little") + bytes(94), None),
    (b"BM" + (100).to_bytes(4, "little") + bytes(50), "is a truncated BMP: 56 bytes, its header says 100"),
    (b"RIFF" + (92).to_bytes(4, "little") + bytes(92), None),
    (b"RIFF" + (92).to_bytes(4, "little") + bytes(10), "is a truncated WEBP: 18 bytes, its header says 100"),
    (b"P6 2 2 255\n" + bytes(12), None),
    (b"", "is empty (0 bytes)"),
    (b"GIF89a..", "is not an image (unrecognised header 47494638)"),
])
def test_image_defects_from_a_files_two_ends(tmp_path, data, defect):
    path = tmp_path / "img"
    path.write_bytes(data)
    head, tail, size = read_ends(str(path))
    assert size == len(data) and head == data[:8] and tail == data[-TAIL:]
    assert image_defect(head, tail, size) == defect


@given(st.binary(min_size=1, max_size=3 * TAIL))
def test_a_jpeg_is_whole_exactly_when_its_tail_holds_the_end_marker(body):
    data = b"\xff\xd8\xff" + body
    tail = data[-TAIL:]
    defect = image_defect(data[:8], tail, len(data))
    assert (defect is None) == (b"\xff\xd9" in tail)
