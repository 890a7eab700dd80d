"""tests/integration/user_cache.py: the ordinary user's venv cached by its wheel's
content, and the run directories a session removes at its end (only its own)."""

from __future__ import annotations

import zipfile
from pathlib import Path

from tests.integration.user_cache import (
    COMPLETE,
    RunRecord,
    Sessions,
    cached_venv,
    claimed,
    point_latest,
    remove,
    wheel_content_hash,
)


def make_wheel(path: Path, members: dict[str, bytes], when: tuple[int, ...]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(zipfile.ZipInfo(name, date_time=when), data)  # type: ignore[arg-type]
    return path


def test_the_wheel_hash_is_its_content_not_its_timestamps(tmp_path: Path) -> None:
    members = {"hpcdl/__init__.py": b"x = 1\n", "hpcdl-1.0.dist-info/RECORD": b"r\n"}
    a = make_wheel(tmp_path / "a.whl", members, (2020, 1, 1, 0, 0, 0))
    b = make_wheel(tmp_path / "b.whl", dict(reversed(members.items())), (2024, 5, 6, 7, 8, 10))
    assert a.read_bytes() != b.read_bytes()
    assert wheel_content_hash(a) == wheel_content_hash(b)
    changed = make_wheel(tmp_path / "c.whl", {**members, "hpcdl/__init__.py": b"x = 2\n"},
                         (2020, 1, 1, 0, 0, 0))
    renamed = make_wheel(tmp_path / "d.whl", {"hpcdl/init.py": b"x = 1\n",
                                              "hpcdl-1.0.dist-info/RECORD": b"r\n"},
                         (2020, 1, 1, 0, 0, 0))
    assert len({wheel_content_hash(p) for p in (a, changed, renamed)}) == 3


class Builder:
    def __init__(self) -> None:
        self.built: list[Path] = []

    def __call__(self, path: Path) -> None:
        path.mkdir()
        (path / "bin").mkdir()
        self.built.append(path)


def test_a_venv_is_built_once_per_key_and_reused(tmp_path: Path) -> None:
    build = Builder()
    first = cached_venv(tmp_path, "a" * 64, build)
    assert first.built and build.built == [tmp_path / f"venv-{'a' * 16}"]
    assert (first.path / COMPLETE).read_text() == "a" * 64
    again = cached_venv(tmp_path, "a" * 64, build)
    assert not again.built and again.path == first.path and len(build.built) == 1
    first.release()
    again.release()


def test_a_half_built_venv_is_built_again(tmp_path: Path) -> None:
    half = tmp_path / f"venv-{'b' * 16}"
    (half / "lib").mkdir(parents=True)
    (half / "lib" / "left-over").write_text("")  # a build that died: no completion mark
    build = Builder()
    venv = cached_venv(tmp_path, "b" * 64, build)
    assert venv.built and build.built == [half] and not (half / "lib").exists()
    venv.release()


def test_an_old_venv_goes_unless_a_session_uses_it(tmp_path: Path) -> None:
    build = Builder()
    old = cached_venv(tmp_path, "c" * 64, build)  # held: another session uses it
    new = cached_venv(tmp_path, "d" * 64, build)
    assert old.path.is_dir() and new.path.is_dir()
    old.release()
    newer = cached_venv(tmp_path, "e" * 64, build)
    assert not old.path.exists()  # nobody held it any more
    assert new.path.is_dir()  # still held by `new`
    new.release()
    newer.release()


def test_claims_alone_everything_shared_only_what_the_output_names(tmp_path: Path) -> None:
    new = {tmp_path / "runs" / "train-1", tmp_path / "runs" / "train-2"}
    assert claimed(new, "", alone=True) == new
    assert claimed(new, "run directory: /home/u/runs/train-2\n", alone=False) == {
        tmp_path / "runs" / "train-2"}


def run_folder(tmp_path: Path) -> tuple[Path, Path]:
    runs = tmp_path / "home" / "runs"
    runs.mkdir(parents=True)
    (runs / "older").mkdir()  # there before the session: never removed
    return runs, tmp_path / "locks"


def test_alone_a_session_removes_what_appeared_since_it_started(tmp_path: Path) -> None:
    runs, locks = run_folder(tmp_path)
    sessions = Sessions(locks)
    record = RunRecord((runs, tmp_path / "absent"), sessions)
    assert record.around(lambda: ("", (runs / "r1").mkdir())) is None
    (runs / "by-a-popen").mkdir()  # made outside `around`: still this session's, alone
    assert record.made == {runs / "r1"}
    gone = record.to_remove()
    assert gone == {runs / "r1", runs / "by-a-popen"}
    remove(gone)
    assert sorted(p.name for p in runs.iterdir()) == ["older"]
    sessions.close()


def test_with_another_session_alive_only_what_its_commands_named(tmp_path: Path) -> None:
    runs, locks = run_folder(tmp_path)
    mine = Sessions(locks)
    record = RunRecord((runs,), mine)
    other = Sessions(locks)  # started during this session, still alive

    def submit() -> tuple[str, None]:
        (runs / "mine-1").mkdir()
        (runs / "theirs-1").mkdir()  # the other session's, made in the same moment
        return "run directory: /home/hpcuser/runs/mine-1", None

    record.around(submit)
    (runs / "unnamed").mkdir()
    assert record.to_remove() == {runs / "mine-1"}
    other.close()
    # The other session has ended, but it overlapped this one: still only what was named.
    assert record.to_remove() == {runs / "mine-1"}
    mine.close()


def test_a_session_that_came_and_went_still_counts(tmp_path: Path) -> None:
    runs, locks = run_folder(tmp_path)
    mine = Sessions(locks)
    record = RunRecord((runs,), mine)
    Sessions(locks).close()  # started and ended between two of this session's checks
    (runs / "kept-for-a-failure").mkdir()
    assert record.to_remove() == set()
    mine.close()


def test_a_crashed_sessions_lock_file_does_not_count_as_alive(tmp_path: Path) -> None:
    runs, locks = run_folder(tmp_path)
    stale = locks / "1-deadbeef.session"
    locks.mkdir()
    stale.write_text("")  # its process died: no lock held on it
    mine = Sessions(locks)
    assert not mine.others_alive() and not stale.exists()
    mine.close()


def test_the_latest_link_replaces_the_old_fixed_venv_and_follows_each_build(tmp_path: Path) -> None:
    (tmp_path / "venv" / "bin").mkdir(parents=True)  # the venv of before the cache
    first = cached_venv(tmp_path, "f" * 64, Builder())
    point_latest(tmp_path / "venv", first.path)
    assert (tmp_path / "venv").resolve() == first.path.resolve()
    second = cached_venv(tmp_path, "0" * 64, Builder())
    point_latest(tmp_path / "venv", second.path)
    assert (tmp_path / "venv").resolve() == second.path.resolve()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".venv")) == []
    first.release()
    second.release()
