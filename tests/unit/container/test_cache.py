"""Cache choice: the system cache when writable; a read-only site cache reused for
reading while new artefacts go to the user's; the user's alone otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdl.container.build import plan_build
from hpcdl.container.cache import CacheDirs, cache_dirs, choose_cache, dir_state
from hpcdl.core.resources import user_cache
from tests.unit.fake_wheels import fill_wheelhouse

SYS, USER = "/var/cache/hpcdl", "/home/u/.cache/hpcdl"


def test_writable_system_cache_is_read_and_written() -> None:
    assert choose_cache(SYS, "writable", USER) == CacheDirs(SYS, (SYS,), f"{SYS} is writable")


def test_read_only_site_cache_is_reused_for_reading_only() -> None:
    dirs = choose_cache(SYS, "readable", USER)
    assert dirs.write == USER
    assert dirs.read == (USER, SYS)  # the user's own first, then the site's
    assert "read-only" in dirs.reason


def test_unusable_system_cache_leaves_the_users_alone() -> None:
    dirs = choose_cache(SYS, "unusable", USER)
    assert dirs.write == USER and dirs.read == (USER,)


def test_user_cache_follows_xdg() -> None:
    assert user_cache({"HOME": "/home/u"}) == USER
    assert user_cache({"HOME": "/home/u", "XDG_CACHE_HOME": "/scratch/u/cache"}) == \
        "/scratch/u/cache/hpcdl"
    # a relative XDG_CACHE_HOME is invalid (XDG base directory spec): ignored
    assert user_cache({"HOME": "/home/u", "XDG_CACHE_HOME": "rel"}) == USER


def test_dir_state_on_real_folders(tmp_path: Path) -> None:
    assert dir_state(str(tmp_path)) == "writable"
    assert dir_state(str(tmp_path / "new" / "deeper")) == "writable"  # creatable
    (tmp_path / "file").write_text("x")
    assert dir_state(str(tmp_path / "file")) == "unusable"


def test_cache_dirs_from_the_environment(tmp_path: Path) -> None:
    env = {"HPCDL_CACHE": str(tmp_path / "site"), "HOME": str(tmp_path / "home")}
    (tmp_path / "site").mkdir()
    assert cache_dirs(env).write == str(tmp_path / "site")  # writable here (root)




def test_a_build_reads_the_site_wheelhouse_and_writes_the_users_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule as plan_build applies it (the site cache made read-only by faking the
    state: tests run as root, who may write anything)."""
    site, home = tmp_path / "site", tmp_path / "home"
    fill_wheelhouse(site / "wheelhouse")
    monkeypatch.setenv("HPCDL_CACHE", str(site))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr("hpcdl.container.cache.dir_state", lambda path: "readable")
    plan = plan_build("pytorch-horovod-cpu")
    assert plan.output == home / ".cache" / "hpcdl" / "images" / "pytorch-horovod-cpu.sif"
    assert (str(site / "wheelhouse"), "/opt/wheelhouse") in plan.files
    # the user's own wheelhouse, once there, wins
    fill_wheelhouse(home / ".cache" / "hpcdl" / "wheelhouse")
    plan = plan_build("pytorch-horovod-cpu")
    assert (str(home / ".cache" / "hpcdl" / "wheelhouse"), "/opt/wheelhouse") in plan.files
