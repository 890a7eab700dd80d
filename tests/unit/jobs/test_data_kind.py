"""`--data PATH` that is neither a dataset folder nor a packed SquashFS file (a text file,
a device, a SquashFS file under another name, a *.sqfs holding something else) refused in
one line naming what the path is and what --data takes, exit 2, nothing written, for
every command that takes --data, dry run or not, the bundled example or a COMMAND
(issue 44: it was dropped for a COMMAND and called a folder that "does not exist")."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdl.errors import ValidationError
from hpcdl.plan import JobRequest
from hpcdl.plan.data import check_data_kind
from tests.unit.clirun import hpcdl

BASE = ("-p", "sandbox", "-N", "1", "-G", "1", "--no-image")
COMMANDS = {
    "submit-example": ("submit", *BASE),
    "submit-command": ("submit", *BASE),  # a COMMAND follows the options
    "sweep": ("sweep", *BASE, "-c", "1", "--param", "lr=0.1,0.2"),
    "scale": ("scale", "-p", "sandbox", "-N", "1,2", "-G", "1", "--no-image"),
}


def _text(tmp: Path) -> Path:
    (tmp / "hostname").write_text("node01\n")
    return tmp / "hostname"


@pytest.mark.parametrize("dry", [True, False])
@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_text_file_as_data_is_refused_by_every_command(tmp_path, monkeypatch, name, dry):
    monkeypatch.chdir(tmp_path)
    data = _text(tmp_path)
    args = [*COMMANDS[name], "--data", str(data), *(["--dry-run"] if dry else [])]
    if name == "submit-command":
        args += ["--", "python3", "-c", "pass"]
    res = hpcdl(*args)
    assert res.returncode == 2, res.stdout + res.stderr
    first = res.stderr.splitlines()[0]
    assert first == (f"error: data: --data {data} is a regular file (7 bytes), neither a "
                     f"dataset folder nor a packed SquashFS file"), res.stderr
    assert "hint: --data takes a dataset folder (DIR/train/<class>/, DIR/val/<class>/) or a " \
           "packed dataset DATA.sqfs (hpcdl data pack)" in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hostname"]  # nothing written
    assert res.stdout == ""


def test_what_the_path_is_is_named(tmp_path):
    squash = tmp_path / "inet.img"
    squash.write_bytes(b"hsqs" + b"\0" * 60)
    with pytest.raises(ValidationError, match=r"inet.img is a SquashFS file without the "
                                              r"\.sqfs name") as exc:
        check_data_kind(JobRequest.of(nodes=1, gpus=1, data=str(squash)).data)
    assert exc.value.hint == "rename it (or link it) as inet.img.sqfs"
    fake = tmp_path / "inet.sqfs"
    fake.write_text("not squashfs")
    with pytest.raises(ValidationError, match=r"inet.sqfs is not a SquashFS file"):
        check_data_kind(JobRequest.of(nodes=1, gpus=1, data=str(fake)).data)
    with pytest.raises(ValidationError, match=r"--data /dev/null is a character device"):
        check_data_kind(JobRequest.of(nodes=1, gpus=1, data="/dev/null").data)
    # A folder, a real packed file, a path this host lacks: not this check's to refuse.
    (tmp_path / "tree").mkdir()
    (tmp_path / "ok.sqfs").write_bytes(b"hsqs" + b"\0" * 60)
    for fine in ("tree", "ok.sqfs", "missing"):
        check_data_kind(JobRequest.of(nodes=1, gpus=1, data=str(tmp_path / fine)).data)
