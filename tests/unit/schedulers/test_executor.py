"""hpcdl/schedulers/executor.py's local transport on real folders and commands: a push or
pull copies a tree (links as links, only the top-level exclusions left out, nothing when
both sides are one folder), commands run as argv, and the transport a profile gets."""

from __future__ import annotations

import pytest

from hpcdl.errors import ToolError
from hpcdl.profiles.schema import Profile
from hpcdl.schedulers.executor import LOCAL, LocalExecutor, executor_for, executor_for_login


def test_a_push_copies_the_tree_and_counts_its_bytes(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "far" / "dst"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("abc")
    (src / "sub" / "b.bin").write_bytes(bytes(10))
    (src / "link").symlink_to("a.txt")
    assert LOCAL.push(src, str(dst)) == 13
    assert (dst / "sub" / "b.bin").read_bytes() == bytes(10)
    assert (dst / "link").is_symlink() and (dst / "link").readlink().as_posix() == "a.txt"
    assert LOCAL.push(src, str(src)) == 0  # one folder: nothing moves
    with pytest.raises(ToolError, match="copy: .*nothing is not a directory"):
        LOCAL.push(tmp_path / "nothing", str(dst))


def test_a_pull_leaves_out_the_top_level_exclusions_only(tmp_path):
    src, dst = tmp_path / "cluster", tmp_path / "local"
    for rel in ("checkpoints/c.pt", "job/x", "logs/checkpoints/keep.txt", "out.txt"):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text("1")
    LOCAL.pull(str(src), dst, exclude=("/checkpoints/", "/job/", "not-rooted/"))
    got = sorted(p.relative_to(dst).as_posix() for p in dst.rglob("*") if p.is_file())
    assert got == ["logs/checkpoints/keep.txt", "out.txt"]


def test_commands_run_as_argv_here():
    res = LocalExecutor().run(["printf", "%s|", "a b", "$HOME"], timeout=30)
    assert res.ok and res.stdout == "a b|$HOME|"
    assert LOCAL.which_all(["sh", "no-such-tool-x"])["no-such-tool-x"] is None
    assert LOCAL.terminal(["bash"], {"A": "1"}) == (["bash"], {"A": "1"})
    with pytest.raises(ToolError):
        LOCAL.run(["sh", "-c", "exit 3"], timeout=30)
    assert LOCAL.run(["sh", "-c", "exit 3"], timeout=30, check=False).returncode == 3


def test_a_profile_without_login_runs_here_and_one_with_login_over_ssh():
    here = Profile.model_validate({"name": "a", "partitions": [
        {"name": "p", "nodes": 1, "gpus_per_node": 0, "cpus_per_node": 1, "max_time": "00:10:00"}]})
    assert executor_for(here) is LOCAL and executor_for_login(None) is LOCAL
    there = here.model_copy(update={"login": {"host": "login1", "user": "me"}})
    remote = executor_for(Profile.model_validate(there.model_dump()))
    assert remote.remote and remote.target == "me@login1"
