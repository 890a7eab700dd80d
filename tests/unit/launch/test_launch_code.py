"""hpcdl/launch/code.py on real folders: which files of --code DIR go (defaults, the
ignore file's comments and directory-only patterns, links followed to files only, the
runs directory skipped) and their copy into the run directory, all or nothing. (The
size limit and the patterns' table: tests/unit/remote/test_remote_place.py.)"""

from __future__ import annotations

import os
import stat

import pytest

from hpcdl.errors import ValidationError
from hpcdl.launch.code import (
    CODE_DIR_NAME,
    DEFAULT_IGNORES,
    IGNORE_FILE,
    ignore_patterns,
    ignored,
    scan_code,
    stage_code,
)


def tree(root, files):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_ignore_file_adds_to_the_defaults(tmp_path):
    assert ignore_patterns(tmp_path) == DEFAULT_IGNORES
    (tmp_path / IGNORE_FILE).write_text("# data stays\ndata/\n\n  *.ckpt  \nsub/out.txt\n")
    assert ignore_patterns(tmp_path)[len(DEFAULT_IGNORES):] == ("data/", "*.ckpt", "sub/out.txt")


def test_which_files_go(tmp_path):
    src = tmp_path / "src"
    tree(src, {"train.py": "print(1)\n", "lib/model.py": "x = 1\n", "lib/__pycache__/m.pyc": "",
               "data/big.bin": "0" * 100, "notes/data": "a file named data goes\n",
               "sub/out.txt": "left out by path\n", "out.txt": "kept: no / in its pattern\n",
               "w.ckpt": "", ".git/HEAD": "ref\n", "runs/r1/job.sbatch": "#!/bin/bash\n",
               IGNORE_FILE: "data/\n*.ckpt\nsub/out.txt\n"})
    (src / "linked.py").symlink_to(src / "train.py")
    (src / "linkdir").symlink_to(src / "lib", target_is_directory=True)
    (src / "dangling.py").symlink_to(tmp_path / "nowhere")
    code = scan_code(src, limit_bytes=10_000, skip=(src / "runs",))
    # A link to a file goes as the file; a linked directory and a dangling link do not.
    assert code.files == (IGNORE_FILE, "lib/model.py", "linked.py", "notes/data", "out.txt",
                          "train.py")
    assert code.size == sum((src / f).stat().st_size for f in code.files)
    assert code.root == src.resolve()


def test_directory_patterns_match_directories_only():
    assert ignored("a/data", True, ("data/",)) and not ignored("a/data", False, ("data/",))
    assert ignored("x/y/z.pyc", False, ("*.pyc",))
    assert ignored("sub/out.txt", False, ("sub/out.txt",))
    assert not ignored("other/sub/out.txt", False, ("sub/out.txt",))


def test_a_file_is_no_code_directory(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValidationError, match="code: .* is not a directory"):
        scan_code(tmp_path / "f", limit_bytes=1)


def test_the_copy_keeps_contents_and_times_or_leaves_nothing(tmp_path):
    src, run = tmp_path / "src", tmp_path / "run"
    tree(src, {"a.py": "a\n", "pkg/b.py": "bb\n"})
    os.utime(src / "a.py", (1_000_000, 1_000_000))
    run.mkdir()
    assert stage_code(run, src, ("a.py", "pkg/b.py")) == 5
    code = run / CODE_DIR_NAME
    assert (code / "pkg" / "b.py").read_text() == "bb\n"
    assert (code / "a.py").stat().st_mtime == 1_000_000
    assert stat.S_IMODE(code.stat().st_mode) == 0o755
    other = tmp_path / "run2"
    other.mkdir()
    with pytest.raises(FileNotFoundError):
        stage_code(other, src, ("a.py", "gone.py"))
    assert list(other.iterdir()) == []
