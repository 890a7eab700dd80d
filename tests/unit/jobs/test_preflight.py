"""hpcdl/jobs/preflight.py on real files in a temporary folder: the script a command runs,
the inputs a submission needs (image, script, dataset), what --data may be, and the
image's GPU facts read from its build record. (count_files and many_files_warning:
tests/unit/plan/test_data_stage.py; every command's refusal of a bad --data:
test_data_kind.py.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcdl.errors import ValidationError
from hpcdl.jobs.preflight import (
    check_inputs,
    command_script,
    image_arch_facts,
)
from hpcdl.plan import JobRequest
from hpcdl.plan.data import check_data_kind


@pytest.mark.parametrize(("command", "script"), [
    (("python3", "train.py", "--lr", "0.1"), "train.py"),
    (("/usr/bin/python3.11", "-u", "-O", "a/b.py"), "a/b.py"),
    (("python", "-u", "--check-hash-based-pycs", "x.py"), "x.py"),
    (("python3", "-m", "torch.distributed.run", "x.py"), None),
    (("python3", "-mpdb", "x.py"), None),
    (("python3", "-c", "print(1)"), None),
    (("python3", "-cprint(1)"), None),
    (("python3", "data.txt"), None),
    (("python3",), None),
    (("bash", "run.py"), None),
    (("pythonista", "x.py"), None),
    ((), None),
])
def test_the_script_of_a_python_command(command, script):
    assert command_script(command) == script


@given(st.lists(st.from_regex(r"[A-Za-z0-9_./=-]{1,12}", fullmatch=True), max_size=5))
def test_a_script_found_is_a_py_argument_of_a_python_command(args):
    command = ("python3", *args)
    found = command_script(command)
    if found is not None:
        assert found.endswith(".py") and found in args and not found.startswith("-")
        # Nothing before it but options: the first plain argument is the script.
        before = args[:args.index(found)]
        assert all(a.startswith("-") for a in before)
    assert command_script(("bash", *args)) is None


def test_a_missing_image_says_how_to_build_it(tmp_path):
    with pytest.raises(ValidationError) as err:
        check_inputs(JobRequest.of(nodes=1, gpus=0, image=str(tmp_path / "none.sif")))
    assert err.value.message == f"image: {str(tmp_path / 'none.sif')!r} does not exist"
    assert "hpcdl build pytorch-horovod-cpu -o" in (err.value.hint or "")


def test_a_missing_script_is_refused_unless_it_may_live_in_the_image(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    image = tmp_path / "a.sif"
    image.write_bytes(b"x")
    with pytest.raises(ValidationError, match=r"command: script 'train.py' does not exist \(in "):
        check_inputs(JobRequest.of(nodes=1, gpus=0, command=("python3", "train.py")))
    # A relative path is bound from here into the image: it must exist here too.
    with pytest.raises(ValidationError, match="script 'train.py'"):
        check_inputs(JobRequest.of(nodes=1, gpus=0, command=("python3", "train.py"),
                                   image=str(image)))
    # An absolute one may be the image's own.
    check_inputs(JobRequest.of(nodes=1, gpus=0, command=("python3", "/opt/t.py"),
                               image=str(image)))
    with pytest.raises(ValidationError, match="script '/opt/t.py'"):
        check_inputs(JobRequest.of(nodes=1, gpus=0, command=("python3", "/opt/t.py")))
    (tmp_path / "train.py").write_text("pass\n")
    check_inputs(JobRequest.of(nodes=1, gpus=0, command=("python3", "train.py")))


def test_the_example_needs_a_dataset_folder_with_train(tmp_path):
    with pytest.raises(ValidationError, match="dataset folder '.*nope' does not exist") as err:
        check_inputs(JobRequest.of(nodes=1, gpus=0, data=str(tmp_path / "nope")))
    assert "hpcdl data make-tiny" in (err.value.hint or "")
    (tmp_path / "ds" / "val").mkdir(parents=True)
    with pytest.raises(ValidationError, match="has no train/ folder"):
        check_inputs(JobRequest.of(nodes=1, gpus=0, data=str(tmp_path / "ds")))
    (tmp_path / "ds" / "train").mkdir()
    check_inputs(JobRequest.of(nodes=1, gpus=0, data=str(tmp_path / "ds")))
    # A COMMAND's data may live only on the nodes: not checked here.
    check_inputs(JobRequest.of(nodes=1, gpus=0, data=str(tmp_path / "nope"),
                               command=("bash", "-c", "true")))


def test_a_packed_dataset_must_be_squashfs(tmp_path):
    fake = tmp_path / "d.sqfs"
    fake.write_bytes(b"PK\x03\x04")
    with pytest.raises(ValidationError, match=r"data: .*d.sqfs is not a SquashFS file \(starts with 504b0304"):
        check_inputs(JobRequest.of(nodes=1, gpus=0, data=str(fake)))
    fake.write_bytes(b"hsqs" + bytes(60))
    check_inputs(JobRequest.of(nodes=1, gpus=0, data=str(fake)))
    with pytest.raises(ValidationError, match="no such file"):
        check_inputs(JobRequest.of(nodes=1, gpus=0, data=str(tmp_path / "gone.sqfs")))


def test_what_data_may_be(tmp_path):
    def kind(path: Path) -> None:
        check_data_kind(JobRequest.of(nodes=1, gpus=0, data=str(path)).data)

    kind(tmp_path)  # a folder
    kind(tmp_path / "absent")  # not on this host: check_inputs's business
    check_data_kind(JobRequest.of(nodes=1, gpus=0, data=str(tmp_path / "x.txt"),
                                  synthetic=True).data)
    squash = tmp_path / "data.img"
    squash.write_bytes(b"hsqs" + bytes(10))
    with pytest.raises(ValidationError, match="is a SquashFS file without the .sqfs name") as err:
        kind(squash)
    assert err.value.hint == "rename it (or link it) as data.img.sqfs"
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(ValidationError, match="is a named pipe, neither a dataset folder"):
        kind(fifo)
    folder_sqfs = tmp_path / "d.sqfs"
    folder_sqfs.mkdir()
    with pytest.raises(ValidationError, match=r"data: .*d.sqfs is a directory, not a packed"):
        kind(folder_sqfs)


def _record(image: Path, facts: object) -> Path:
    side = image.with_name(image.name + ".hash")
    side.write_text(json.dumps({"version": 1, "image_facts": facts}))
    return side


def test_image_facts_come_from_a_fresh_build_record(tmp_path):
    assert image_arch_facts(None) is None
    assert image_arch_facts("docker://x/y").unknown == "a remote image is not read before submission"
    assert image_arch_facts(str(tmp_path / "no.sif")).unknown == "the image is not a file on this host"
    image = tmp_path / "a.sif"
    image.write_bytes(b"x")
    assert image_arch_facts(str(image)).unknown == "no hpcdl build record beside the image"
    side = _record(image, {"cuda_archs": ["sm_80", "sm_90"], "torch": "2.5.1",
                           "torch_cuda": "12.4"})
    os.utime(image, ns=(10**18, 10**18))
    os.utime(side, ns=(2 * 10**18, 2 * 10**18))
    facts = image_arch_facts(str(image))
    assert (facts.archs, facts.torch, facts.torch_cuda, facts.unknown) == \
        (("sm_80", "sm_90"), "2.5.1", "12.4", None)
    # The image was replaced after its record was written: the record is not its.
    os.utime(image, ns=(3 * 10**18, 3 * 10**18))
    assert image_arch_facts(str(image)).unknown == "its build record is older than the image"
