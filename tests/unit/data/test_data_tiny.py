"""hpcdl data: the tiny ImageNet-format generator and the ImageFolder layout checks."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcdl.cli import cli
from hpcdl.data.tiny import TinySpec, class_name, make_tiny
from hpcdl.errors import UserInputError
from hpcdl.jobside.imagefolder import scan_imagefolder


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_make_tiny_writes_real_jpegs_that_scan_and_decode(tmp_path: Path) -> None:
    PIL = pytest.importorskip("PIL.Image")
    summary = make_tiny(
        tmp_path / "tiny", TinySpec(classes=3, per_class=4, val_per_class=2, size=40)
    )
    assert summary["train_images"] == 12 and summary["val_images"] == 6
    folder = scan_imagefolder(tmp_path / "tiny")
    assert folder.classes == (class_name(0), class_name(1), class_name(2))
    assert folder.counts() == {"train": 12, "val": 6}
    labels = sorted({label for _, label in folder.samples["train"]})
    assert labels == [0, 1, 2]
    for path, _ in folder.samples["train"] + folder.samples["val"]:
        with PIL.open(path) as im:
            assert im.format == "JPEG"
            assert im.size == (40, 40)
            assert im.mode == "RGB"


def test_make_tiny_is_deterministic_and_seed_dependent(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    spec = TinySpec(classes=2, per_class=3, val_per_class=1, size=32, seed=7)
    make_tiny(tmp_path / "a", spec)
    make_tiny(tmp_path / "b", spec)
    make_tiny(tmp_path / "c", TinySpec(classes=2, per_class=3, val_per_class=1, size=32, seed=8))
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    assert _digest(tmp_path / "a") != _digest(tmp_path / "c")


def test_make_tiny_refuses_non_empty_dir_and_leaves_no_temp(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    dest = tmp_path / "d"
    dest.mkdir()
    (dest / "keep.txt").write_text("x")
    with pytest.raises(UserInputError, match="not empty"):
        make_tiny(dest, TinySpec(classes=1, per_class=1, size=16))
    assert sorted(os.listdir(tmp_path)) == ["d"]
    make_tiny(dest, TinySpec(classes=1, per_class=1, size=16), force=True)
    assert not (dest / "keep.txt").exists()
    assert sorted(os.listdir(tmp_path)) == ["d"]  # the old copy and the temp dir are gone


@pytest.mark.parametrize(
    ("field", "spec"),
    [
        ("classes", TinySpec(classes=0)),
        ("size", TinySpec(size=4)),
        ("per-class", TinySpec(per_class=0)),
        # Empty val classes would be written, then refused by `data pack` and the examples.
        ("val-per-class", TinySpec(val_per_class=0)),
    ],
)
def test_tiny_spec_limits(field: str, spec: TinySpec, tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match=f"--{field}"):
        make_tiny(tmp_path / "x", spec)
    assert not (tmp_path / "x").exists()


def _layout(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root


JPEG = b"\xff\xd8\xff\xe0" + b"\0" * 16


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"val/a/1.JPEG": JPEG}, "no train/ directory"),
        ({"train/a/1.JPEG": JPEG}, "no val/ directory"),
        ({"train/x.txt": b"", "val/a/1.JPEG": JPEG}, "train/ holds no class directories"),
        ({"train/a/readme.txt": b"hi", "val/a/1.JPEG": JPEG}, "train/a/ holds no images"),
        ({"train/a/1.JPEG": b"<html>", "val/a/1.JPEG": JPEG}, "is not an image"),
        ({"train/a/1.JPEG": JPEG, "val/b/1.JPEG": JPEG}, "val/ has 1 class(es) that train/ lacks"),
    ],
)
def test_scan_reports_what_is_wrong(tmp_path: Path, files: dict[str, bytes], message: str) -> None:
    root = _layout(tmp_path / "ds", files)
    with pytest.raises(UserInputError) as info:
        scan_imagefolder(root)
    assert message in info.value.message
    assert str(root) in info.value.message
    assert "\n" not in info.value.message


def test_scan_missing_and_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="no such directory"):
        scan_imagefolder(tmp_path / "nope")
    (tmp_path / "f").write_text("x")
    with pytest.raises(UserInputError, match="is not a directory"):
        scan_imagefolder(tmp_path / "f")


def test_cli_make_tiny_and_check(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    runner = CliRunner()
    out = runner.invoke(
        cli,
        [
            "data",
            "make-tiny",
            str(tmp_path / "t"),
            "--classes",
            "2",
            "--per-class",
            "4",
            "--size",
            "24",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    summary = json.loads(out.output)
    assert (summary["train_images"], summary["val_images"]) == (8, 2)  # val default: per-class / 4
    out = runner.invoke(cli, ["data", "check", str(tmp_path / "t"), "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output) == {
        "path": str(tmp_path / "t"),
        "classes": 2,
        "train": 8,
        "val": 2,
    }
    out = runner.invoke(cli, ["data", "check", str(tmp_path / "missing")])
    assert out.exit_code == 2
    assert "no such directory" in out.output and "Traceback" not in out.output


def test_data_cli_does_not_import_torch_or_pil() -> None:
    code = (
        "import sys; from hpcdl.cli import main\n"
        "try:\n    main(['data', '--help'])\nexcept SystemExit:\n    pass\n"
        "bad = [m for m in ('torch', 'PIL') if m in sys.modules]\n"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_imagenet_like_jpegs_have_imagenets_sizes_and_bytes_and_repeat_by_seed(tmp_path):
    from PIL import Image

    from hpcdl.data.tiny import TinySpec, make_tiny

    spec = TinySpec(classes=2, per_class=12, val_per_class=1, seed=3, imagenet_like=True)
    summary = make_tiny(tmp_path / "a", spec)
    make_tiny(tmp_path / "b", spec)
    files = sorted((tmp_path / "a").rglob("*.JPEG"))
    assert len(files) == 26 and summary["size"] == "imagenet-like"
    assert all(f.read_bytes() == (tmp_path / "b" / f.relative_to(tmp_path / "a")).read_bytes()
               for f in files)  # same seed, same bytes
    sizes = [Image.open(f).size for f in files]
    assert all(300 <= max(s) <= 800 and min(s) >= 200 for s in sizes), sizes
    assert sum(s in ((500, 375), (500, 333), (375, 500), (333, 500)) for s in sizes) >= 13
    mean = summary["bytes"] / len(files)
    assert 60_000 < mean < 180_000, mean  # ImageNet's ~110 KB, not a flat image's few KB
    other = make_tiny(tmp_path / "c", TinySpec(2, 12, 1, seed=4, imagenet_like=True))
    assert other["bytes"] != summary["bytes"]
