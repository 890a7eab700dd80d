"""Unit tests are sealed from the real user's files: every test gets its own HOME, config,
cache, runtime and runs directories (in a folder of its own outside its tmp_path, which
many tests expect to find empty), and none of the variables that
point hpcdl at a profile or a cache comes in from the caller's shell. Without this a
profile written by `hpcdl sandbox up --nodes 3` into ~/.config/hpcdl/profiles changed
what `profiles list` printed in tests/unit/cli/test_cli.py."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

# `make unit` runs pytest with --hypothesis-profile=unit: the property tests each try their
# explicit examples (the four classic injections) and 4 generated values instead of their
# own count (40 or 150 in tests/unit/project/test_hostile_property.py, most of them running a
# script in bash), which `make test` runs. 4 rather than 8: the generated values are the
# same at each run (derandomize), and the 4 more cost ~4 s of CPU, a tenth of the tier.
# Registered here, before the hypothesis plugin loads it.
settings.register_profile("unit", max_examples=4)

# What hpcdl reads from the environment to find a user's files (grep hpcdl/ for
# os.environ, expanduser and Path.home): each is set to a folder of the test's own.
SEALED_DIRS = {
    "HOME": "home",
    "XDG_CONFIG_HOME": "home/.config",  # profiles (hpcdl.profiles.loader)
    "XDG_CACHE_HOME": "home/.cache",  # the user cache, the push hash cache
    "HPCDL_CACHE": "system-cache",  # the system cache (else /var/cache/hpcdl)
}
# HPCDL_RUNS (run directories: hpcdl.jobs.rundir.runs_root; else ./runs) is a folder of
# the test's own too, but on the tests' disk: a run directory must be on a path the
# profile's compute nodes share (the sandbox profile's /scratch), which a RAM folder is not.
# Read by hpcdl too, but a test sets them itself when it needs them: from the caller's
# shell they would pick a profile, a sandbox cluster or a py-spy for every test.
UNSET = ("HPCDL_PROFILE", "HPCDL_SANDBOX_DIR", "HPCDL_SANDBOX_CLUSTER", "HPCDL_SANDBOX_SHAPE",
         "HPCDL_SANDBOX_CTLD_PORT", "HPCDL_SANDBOX_ACCOUNTING", "HPCDL_SANDBOX_PYTHON",
         "HPCDL_PY_SPY", "HPCDL_SKIP_LIVE_CHECK", "SLURM_CONF")


@pytest.fixture(scope="session")
def matplotlib_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """matplotlib's config and font cache for the whole session: under a per-test
    XDG_CACHE_HOME each process that plots would rebuild its font list (~0.5 s)."""
    return tmp_path_factory.mktemp("matplotlib")


# Each test's outcome, for sealed_home's teardown (a failed test's folders are kept),
# and its sealed folders, for tests/unit/project/test_sealed.py.
PHASES = pytest.StashKey[dict[str, pytest.TestReport]]()
FOLDERS = pytest.StashKey[list[Path]]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    item.stash.setdefault(PHASES, {})[report.when] = report
    return report


def _ram_folder() -> str | None:
    """/dev/shm where it is a writable tmpfs that allows running files, else None.

    Why: with ~1,700 tests, six folders each on the tests' disk (here ext4 mounted with
    `discard`, ~1 ms an rmdir under load) cost 6-13 s whenever pytest removed an old
    session's folders, and each `mktemp` listed the whole base folder; in RAM, made and
    removed per test, they cost well under a second. Without such a folder (no /dev/shm,
    or one mounted noexec as in some containers) the system temporary folder does."""
    shm = "/dev/shm"
    try:
        flags = os.statvfs(shm).f_flag
    except OSError:
        return None
    if flags & (os.ST_NOEXEC | os.ST_RDONLY) or not os.access(shm, os.W_OK | os.X_OK):
        return None
    return shm


@pytest.fixture(scope="session")
def sealed_roots(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """(the folder in RAM for this session's sealed folders, removed at its end; the
    folder on disk for their runs folders, in pytest's base temporary folder)."""
    ram = Path(tempfile.mkdtemp(prefix="hpcdl-unit-", dir=_ram_folder()))
    yield ram, tmp_path_factory.mktemp("sealed")
    shutil.rmtree(ram, ignore_errors=True)


@pytest.fixture(autouse=True)
def sealed_home(request: pytest.FixtureRequest, sealed_roots: tuple[Path, Path],
                monkeypatch: pytest.MonkeyPatch, matplotlib_dir: Path) -> Iterator[Path]:
    """Point every user location hpcdl reads at a folder of this test's; yields the HOME.

    The folders are removed after the test; when it failed, its runs folder is kept, with
    the rest moved beside it as <runs folder>-sealed (under <basetemp>/sealed0)."""
    ram, disk = sealed_roots
    sealed = Path(tempfile.mkdtemp(prefix="t", dir=ram))
    name = re.sub(r"\W", "_", request.node.name)[:40]
    runs = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=disk))
    request.node.stash[FOLDERS] = [sealed, runs]
    for var, rel in SEALED_DIRS.items():
        folder = sealed / rel
        folder.mkdir(parents=True, exist_ok=True)
        monkeypatch.setenv(var, str(folder))
    monkeypatch.setenv("HPCDL_RUNS", str(runs))
    for var in UNSET:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MPLCONFIGDIR", str(matplotlib_dir))
    # The ssh master sockets' folder (hpcdl.remote.ssh.control_dir): a short path of its
    # own, since a Unix socket path must fit 107 bytes and tmp_path is long.
    runtime = sealed / "rt"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    yield sealed / "home"
    if any(report.failed for report in request.node.stash.get(PHASES, {}).values()):
        shutil.move(sealed, runs.with_name(f"{runs.name}-sealed"))
    else:
        shutil.rmtree(sealed, ignore_errors=True)
        shutil.rmtree(runs, ignore_errors=True)


@pytest.fixture
def sealed_folders(request: pytest.FixtureRequest, sealed_home: Path) -> list[Path]:
    """This test's own folders: the one with its HOME, caches and runtime folder, and its
    runs folder."""
    return request.node.stash[FOLDERS]
