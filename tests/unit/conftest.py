"""Unit tests are sealed from the real user's files: every test gets its own HOME, config,
cache, runtime and runs directories (in a folder beside its tmp_path, which many tests
expect to find empty), and none of the variables that
point hpcdl at a profile or a cache comes in from the caller's shell. Without this a
profile written by `hpcdl sandbox up --nodes 3` into ~/.config/hpcdl/profiles changed
what `profiles list` printed in tests/unit/test_cli.py."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

# `make unit` runs pytest with --hypothesis-profile=unit: the property tests each try their
# explicit examples and 8 generated values instead of their own count (40 or 150 in
# tests/unit/test_hostile_property.py, most of them running a script in bash), which
# `make test` runs. Registered here, before the hypothesis plugin loads it.
settings.register_profile("unit", max_examples=8)

# What hpcdl reads from the environment to find a user's files (grep hpcdl/ for
# os.environ, expanduser and Path.home): each is set to a folder of the test's own.
SEALED_DIRS = {
    "HOME": "home",
    "XDG_CONFIG_HOME": "home/.config",  # profiles (hpcdl.profiles.loader)
    "XDG_CACHE_HOME": "home/.cache",  # the user cache, the push hash cache
    "HPCDL_RUNS": "runs",  # run directories (hpcdl.jobs.rundir.runs_root; else ./runs)
    "HPCDL_CACHE": "system-cache",  # the system cache (else /var/cache/hpcdl)
}
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


@pytest.fixture(autouse=True)
def sealed_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
                matplotlib_dir: Path) -> Iterator[Path]:
    """Point every user location hpcdl reads at a folder of this test's; yields the HOME."""
    sealed = tmp_path_factory.mktemp("sealed")
    for var, rel in SEALED_DIRS.items():
        folder = sealed / rel
        folder.mkdir(parents=True, exist_ok=True)
        monkeypatch.setenv(var, str(folder))
    for var in UNSET:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MPLCONFIGDIR", str(matplotlib_dir))
    # The ssh master sockets' folder (hpcdl.remote.ssh.control_dir): a short path of its
    # own, since a Unix socket path must fit 107 bytes and tmp_path is long.
    runtime = Path(tempfile.mkdtemp(prefix="hpcdl-rt-"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    yield sealed / "home"
    shutil.rmtree(runtime, ignore_errors=True)
