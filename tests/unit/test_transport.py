"""The transport (hpcdl.schedulers.executor): local and SSH are two implementations of
one Executor, and nothing outside hpcdl/remote/ and the transport module names SSH or
asks a profile's login: block whether the cluster is remote."""

from __future__ import annotations

from pathlib import Path

from hpcdl.profiles import load_profile
from hpcdl.schedulers.executor import LOCAL, Executor, LocalExecutor, executor_for


def test_a_local_push_copies_and_a_pull_leaves_out_what_it_is_told(tmp_path: Path) -> None:
    src = tmp_path / "run"
    (src / "job").mkdir(parents=True)
    (src / "job" / "x.sh").write_text("echo hi\n")
    (src / "job.sbatch").write_text("#!/bin/sh\n")
    (src / "link").symlink_to("job.sbatch")
    moved = LOCAL.push(src, str(tmp_path / "there" / "run"))
    assert moved == len("echo hi\n") + len("#!/bin/sh\n")
    there = tmp_path / "there" / "run"
    assert (there / "job" / "x.sh").read_text() == "echo hi\n"
    assert (there / "link").is_symlink() and (there / "link").readlink() == Path("job.sbatch")
    (there / "out.log").write_text("done\n")
    back = tmp_path / "back"
    assert LOCAL.pull(str(there), back, exclude=("/job/",)) == len("done\n") + len("#!/bin/sh\n")
    assert (back / "out.log").read_text() == "done\n" and not (back / "job").exists()


def test_a_push_onto_the_same_directory_moves_nothing(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("x")
    assert LOCAL.push(tmp_path, str(tmp_path)) == 0
    assert LOCAL.pull(str(tmp_path), tmp_path) == 0
    assert (tmp_path / "a.txt").read_text() == "x"


def test_local_and_ssh_are_two_executors_picked_by_the_profile() -> None:
    here: Executor = executor_for(load_profile("sandbox"))
    assert isinstance(here, LocalExecutor) and not here.remote
    assert here.where == "this machine"
    there: Executor = executor_for(load_profile("sandbox-remote"))
    assert there.remote and there.target == "10.77.0.250"
    assert there.where.startswith("login node 10.77.0.250")
    # A program on a terminal: here as it is, with its environment; there over ssh -t
    # with the environment set by `env` on the remote side.
    assert here.terminal(["salloc", "sh"], {"A": "1"}) == (["salloc", "sh"], {"A": "1"})
    argv, env = there.terminal(["salloc", "sh"], {"A": "1"})
    assert argv[:2] == ["ssh", "-t"] and argv[-1] == "env A=1 salloc sh" and env == {}
