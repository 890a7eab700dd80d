"""hpcdl.core.templating's compiled-template cache (issue 43): a later process reuses
what an earlier one compiled, an edited template is compiled again, and a damaged or
unusable cache changes nothing but the time. Each "process" is a fresh environment
(the in-process one is kept: _environment.cache_clear())."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdl.core import templating
from hpcdl.core.resources import user_cache
from hpcdl.core.templating import CompiledTemplates, render_template


@pytest.fixture
def dumps(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The templates compiled from here on (Jinja stores what it compiled, and only that)."""
    names: list[str] = []
    real = CompiledTemplates.dump_bytecode

    def counted(self: CompiledTemplates, bucket) -> None:  # type: ignore[no-untyped-def]
        names.append(bucket.key)
        real(self, bucket)

    monkeypatch.setattr(CompiledTemplates, "dump_bytecode", counted)
    templating._environment.cache_clear()
    yield names
    templating._environment.cache_clear()


def render(folder: Path) -> str:
    templating._environment.cache_clear()  # as a new process would
    return render_template("job.j2", {"who": "rank $0"}, template_dirs=[folder])


def test_a_later_render_loads_what_an_earlier_one_compiled(tmp_path: Path,
                                                          dumps: list[str]) -> None:
    (tmp_path / "job.j2").write_text("echo {{ who | q }}\n")
    first = render(tmp_path)
    assert first == "echo 'rank $0'\n" and len(dumps) == 1
    (entry,) = (Path(user_cache()) / "templates").rglob("*.cache")
    assert entry.stat().st_mode & 0o777 == 0o600
    assert render(tmp_path) == first and len(dumps) == 1  # loaded, not compiled
    (tmp_path / "job.j2").write_text("echo hello {{ who | q }}\n")  # edited: compiled again
    assert render(tmp_path) == "echo hello 'rank $0'\n" and len(dumps) == 2


def test_a_damaged_or_unwritable_cache_only_costs_time(tmp_path: Path,
                                                       dumps: list[str]) -> None:
    (tmp_path / "job.j2").write_text("echo {{ who | q }}\n")
    first = render(tmp_path)
    (entry,) = (Path(user_cache()) / "templates").rglob("*.cache")
    for damaged in (b"", b"j2", entry.read_bytes()[:-7], b"not a cache at all"):
        entry.write_bytes(damaged)
        assert render(tmp_path) == first
    assert len(dumps) == 5  # each damaged entry was compiled again (and replaced)
    # A cache folder that cannot be made (a file where it should be): rendered all the same.
    cache = Path(user_cache())
    for child in sorted(cache.rglob("*"), reverse=True):
        child.unlink() if child.is_file() else child.rmdir()
    cache.rmdir()
    cache.write_text("not a folder")
    assert render(tmp_path) == first
