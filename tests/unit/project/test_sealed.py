"""tests/unit/conftest.py's sealed_home: no unit test reads or writes the real user's
profiles, caches, ssh sockets or runs, and hpcdl finds those places when it is called
(an import-time constant would have kept the real user's path)."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

from hpcdl.container.cache import cache_dirs
from hpcdl.core.resources import user_cache
from hpcdl.jobs.rundir import runs_root
from hpcdl.profiles.loader import list_profiles, user_profiles_dir
from hpcdl.remote.images import hash_cache_path
from hpcdl.remote.ssh import control_dir

REAL_HOME = Path(pwd.getpwuid(os.getuid()).pw_dir)


def test_every_user_location_is_the_tests_own(sealed_home: Path,
                                              sealed_folders: list[Path]) -> None:
    assert Path.home() == sealed_home
    sealed, runs = sealed_folders
    assert sealed_home.parent == sealed
    places = {"profiles": user_profiles_dir(), "user cache": Path(user_cache()),
              "hash cache": hash_cache_path(), "write cache": Path(cache_dirs().write)}
    for what, path in places.items():
        assert path.is_relative_to(sealed), f"{what}: {path}"
        assert not path.is_relative_to(REAL_HOME), f"{what}: {path}"
    # Run directories: on the tests' disk (the sandbox profile's nodes must see them).
    assert runs_root() == runs and not runs.is_relative_to(REAL_HOME), runs_root()
    assert runs.is_dir() and not any(runs.iterdir())
    sockets = control_dir()
    assert not sockets.is_relative_to(REAL_HOME) and len(str(sockets)) < 60, sockets


def test_only_bundled_profiles_and_this_tests_own_are_seen(sealed_home: Path) -> None:
    assert {s.origin for s in list_profiles()} == {"bundled"}
    mine = sealed_home / ".config" / "hpcdl" / "profiles" / "sandbox-3n.yaml"
    mine.parent.mkdir(parents=True)
    mine.write_text("name: sandbox-3n\n")
    users = [s for s in list_profiles() if s.origin == "user"]
    assert [(s.name, s.path) for s in users] == [("sandbox-3n", mine)]


def test_the_callers_profile_choice_does_not_come_in() -> None:
    assert "HPCDL_PROFILE" not in os.environ and "SLURM_CONF" not in os.environ
