"""hpcdl/core/atomic.py on real files: a file or directory is there whole or not at all,
with its mode, and nothing is left beside it when writing fails."""

from __future__ import annotations

import json
import stat

import pytest

from hpcdl.core.atomic import atomic_dir, write_atomic, write_json_atomic


def test_a_file_replaces_the_old_one_whole_with_its_mode(tmp_path):
    target = tmp_path / "plan.json"
    target.write_text("old")
    write_atomic(target, "n\u00e9w\n", mode=0o600)
    assert target.read_bytes() == "n\u00e9w\n".encode()
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    write_atomic(target, b"\x00\xff")
    assert target.read_bytes() == b"\x00\xff" and stat.S_IMODE(target.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_json_is_sorted_and_indented(tmp_path):
    write_json_atomic(tmp_path / "r.json", {"b": 1, "a": [1, 2]})
    text = (tmp_path / "r.json").read_text()
    assert text == '{\n  "a": [\n    1,\n    2\n  ],\n  "b": 1\n}\n'
    assert json.loads(text) == {"a": [1, 2], "b": 1}


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "r.json"
    target.write_text("old")
    with pytest.raises(TypeError):
        write_json_atomic(target, {"x": object()})  # fails before any file is made
    with pytest.raises(TypeError):
        write_atomic(target, 42)  # type: ignore[arg-type]
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_a_directory_appears_whole_or_not_at_all(tmp_path):
    target = tmp_path / "image.d"
    with atomic_dir(target) as tmp:
        (tmp / "a").write_text("1")
        assert not target.exists() and tmp.parent == tmp_path
    assert (target / "a").read_text() == "1"
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    with pytest.raises(FileExistsError, match="image.d exists"):
        with atomic_dir(target):
            pass
    with pytest.raises(RuntimeError, match="build failed"):
        with atomic_dir(tmp_path / "other") as tmp:
            (tmp / "half").write_text("x")
            raise RuntimeError("build failed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["image.d"]
