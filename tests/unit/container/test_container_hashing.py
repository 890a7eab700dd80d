"""Content hash of a build: definition + copied files, digest reuse, rebuild reasons."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpcdl.container.build import files_of_definition, rebuild_reasons
from hpcdl.container.hashing import (
    FileDigest,
    content_hash,
    previous_digests,
    read_record,
)
from hpcdl.core.atomic import write_json_atomic


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    (root / "pkg" / "__pycache__").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("print('a')\n")
    (root / "pkg" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    (root / "data.bin").write_bytes(b"x" * 1000)
    return root


def h(defn: str, root: Path, **kw) -> str:  # type: ignore[no-untyped-def]
    return content_hash(defn, [(str(root), "/opt/x")], **kw).digest


def test_same_content_same_hash(tree: Path) -> None:
    assert h("def", tree) == h("def", tree)


def test_definition_change_changes_hash(tree: Path) -> None:
    assert h("def", tree) != h("def2", tree)


def test_file_content_change_changes_hash(tree: Path) -> None:
    before = h("def", tree)
    (tree / "pkg" / "a.py").write_text("print('b')\n")
    assert h("def", tree) != before


def test_new_file_and_mode_change_hash(tree: Path) -> None:
    before = h("def", tree)
    (tree / "pkg" / "b.py").write_text("")
    after_new = h("def", tree)
    assert after_new != before
    os.chmod(tree / "pkg" / "b.py", 0o755)
    assert h("def", tree) != after_new


def test_bytecode_caches_are_ignored(tree: Path) -> None:
    before = h("def", tree)
    (tree / "pkg" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"changed")
    (tree / "pkg" / "__pycache__" / "new.pyc").write_bytes(b"new")
    assert h("def", tree) == before


def test_host_location_does_not_matter(tree: Path, tmp_path: Path) -> None:
    # A fresh clone elsewhere with the same content reuses the cached image.
    clone = tmp_path / "clone"
    os.rename(tree, clone)
    moved = h("def", clone)
    os.rename(clone, tree)
    assert moved == h("def", tree)


def test_destination_matters(tree: Path) -> None:
    a = content_hash("d", [(str(tree), "/opt/x")]).digest
    b = content_hash("d", [(str(tree), "/opt/y")]).digest
    assert a != b


def test_options_matter(tree: Path) -> None:
    assert h("def", tree, options=["sandbox"]) != h("def", tree)


def test_missing_source_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        content_hash("d", [(str(tmp_path / "nope"), "/x")])


def test_digests_reused_when_size_and_mtime_match(tree: Path) -> None:
    first = content_hash("d", [(str(tree), "/opt/x")])
    path = str(tree / "data.bin")
    d = first.files[path]
    # A remembered digest with the file's size+mtime is trusted (this is what makes the
    # no-op rebuild fast); a stale one (different mtime) is recomputed.
    fake = {path: FileDigest(d.size, d.mtime_ns, "0" * 64)}
    assert content_hash("d", [(str(tree), "/opt/x")], previous=fake).files[path].sha256 == "0" * 64
    stale = {path: FileDigest(d.size, d.mtime_ns - 1, "0" * 64)}
    assert content_hash("d", [(str(tree), "/opt/x")], previous=stale).files[path].sha256 == d.sha256


def test_record_round_trip(tree: Path, tmp_path: Path) -> None:
    digest = content_hash("d", [(str(tree), "/opt/x")])
    rec = tmp_path / "img.sif.hash"
    write_json_atomic(rec, digest.record(spec="x"))
    data = read_record(rec)
    assert data and data["hash"] == digest.digest
    assert previous_digests(data) == digest.files
    assert not list(tmp_path.glob(".img.sif.hash.tmp*"))


def test_unreadable_record_is_none(tmp_path: Path) -> None:
    (tmp_path / "r").write_text("{not json")
    assert read_record(tmp_path / "r") is None
    assert read_record(tmp_path / "missing") is None


def test_rebuild_reasons(tree: Path, tmp_path: Path) -> None:
    img = tmp_path / "img.sif"
    old = content_hash("d", [(str(tree), "/opt/x")]).record()
    assert rebuild_reasons(old, old, img, False) == [f"{img} does not exist"]
    img.write_bytes(b"sif")
    assert rebuild_reasons(old, old, img, False) == []
    assert rebuild_reasons(None, old, img, False) == ["no hash record beside the image"]
    (tree / "pkg" / "a.py").write_text("changed\n")
    new = content_hash("d2", [(str(tree), "/opt/x")]).record()
    reasons = rebuild_reasons(old, new, img, False)
    assert "the rendered definition changed" in reasons
    assert f"changed {tree / 'pkg' / 'a.py'}" in reasons


def test_files_of_definition(tmp_path: Path) -> None:
    text = (
        "Bootstrap: localimage\nFrom: base.sif\n\n%files\n    rel/dir /opt/dir\n"
        "    /abs/file\n    # comment\n%files from build\n    /x /y\n%post\n    true\n"
    )
    assert files_of_definition(text, tmp_path) == [
        (str(tmp_path / "rel" / "dir"), "/opt/dir"),
        ("/abs/file", "/abs/file"),
    ]
