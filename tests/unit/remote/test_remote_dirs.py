"""hpcdl/remote/dirs.py with its shell scripts run for real through this machine's
executor (the Shell the module takes; a login node's SSH runs the same argv): the home
asked once and remembered for a dry run, the configured or default directories, and the
writable check naming the profile field."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hpcdl.core.resources import user_cache
from hpcdl.remote.dirs import (
    DEFAULT_RUNS,
    HOMES_FILE,
    ensure_writable,
    known_offline,
    remembered_home,
    remote_dir,
    remote_home,
)
from hpcdl.remote.ssh import RemoteError, RemoteInputError
from hpcdl.schedulers.executor import LocalExecutor


@pytest.fixture
def here(monkeypatch, tmp_path):
    """This machine as the 'login node', with a home of the test's own."""
    home = tmp_path / "home dir"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    remote_home.cache_clear()
    yield LocalExecutor(), home
    remote_home.cache_clear()


def test_the_home_is_asked_once_and_remembered_for_a_dry_run(here):
    ex, home = here
    assert remembered_home(ex) is None and not known_offline(ex, None)
    assert remote_home(ex) == str(home)
    record = json.loads((Path(user_cache()) / HOMES_FILE).read_text())
    assert record == {"localhost": str(home)}
    assert remembered_home(ex) == str(home) and known_offline(ex, None)
    assert remote_dir(ex, None, DEFAULT_RUNS, remembered=True) == f"{home}/{DEFAULT_RUNS}"


def test_a_configured_directory_needs_no_login_node(here):
    ex, _ = here
    assert remote_dir(ex, "/scratch/me/../me/runs/", DEFAULT_RUNS) == "/scratch/me/runs"
    assert known_offline(ex, "/scratch/me/runs")


def test_a_home_that_is_no_absolute_path_is_refused(here, monkeypatch):
    ex, _ = here
    monkeypatch.setenv("HOME", "relative")
    with pytest.raises(RemoteError, match=r"login node localhost: \$HOME is 'relative', not an "
                                          r"absolute path"):
        remote_home(ex)


def test_a_broken_record_is_ignored(here):
    ex, _ = here
    path = Path(user_cache()) / HOMES_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    for text in ("{", "[1]", '{"localhost": "not/absolute", "x": 3}'):
        path.write_text(text)
        assert remembered_home(ex) is None


def test_writable_makes_the_directory_or_names_the_field(here, tmp_path):
    ex, _ = here
    target = tmp_path / "a b" / "c; rm -rf x"
    ensure_writable(ex, str(target), "login.runs")
    assert target.is_dir()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(RemoteInputError) as err:
        ensure_writable(ex, str(blocker / "sub"), "login.images")
    assert err.value.message.startswith(f"login.images: {blocker}/sub is not writable on "
                                        f"localhost (mkdir: ")
    assert "login.runs / login.images" in (err.value.hint or "")
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        with pytest.raises(RemoteInputError, match="is not writable on localhost"):
            ensure_writable(ex, str(ro), "login.runs")
