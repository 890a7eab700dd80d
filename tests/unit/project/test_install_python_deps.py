"""scripts/install-python-deps.sh installs what `make demo` runs (hpcdl + train) by
default and the tests' tools only with --test (scripts/setup.sh), each part with its own
stamp: the demo no longer pays for pytest, mkdocs, TensorBoard and the MLflow server.

The script runs for real with a stub Python that logs its arguments and answers the
import checks as told (the pip installs it would run are only logged)."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
STUB = """#!/bin/sh
echo "$*" >> "$STUB_LOG"
case "$*" in
  *sys.prefix*) echo _stub_venv ;;
  "-m pip"*) exit 0 ;;
  -c*) [ -f "$STUB_IMPORTS_OK" ] ;;
  *) exit 7 ;;
esac
"""


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("python", STUB), ("mpicc", "#!/bin/sh\nexit 0\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    # mpicc is found first: the script never reaches apt-get here.
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHON": str(bin_dir / "python"),
            "HPCDL_CACHE": str(tmp_path / "cache"), "STUB_LOG": str(tmp_path / "log"),
            "STUB_IMPORTS_OK": str(tmp_path / "imports-ok")}


def install(env: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    log = Path(env["STUB_LOG"])
    log.unlink(missing_ok=True)
    done = subprocess.run([str(REPO / "scripts" / "install-python-deps.sh"), *args], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    calls = log.read_text().splitlines() if log.exists() else []
    pips = [line for line in calls if line.startswith("-m pip")]
    return done, pips


def test_the_demo_installs_hpcdl_and_train_only(env: dict[str, str]) -> None:
    done, pips = install(env)
    assert done.returncode == 0, done.stderr
    assert pips == ["-m pip install -q torch==2.13.0", "-m pip install -q -e .[train]"]
    assert "python deps (demo): installed" in done.stdout
    assert sorted(p.name for p in (Path(env["HPCDL_CACHE"]) / "stamps").iterdir()) == [
        f"python-deps-demo-{stamp_key()}-_stub_venv"]


def test_make_test_adds_the_test_tools_with_its_own_stamp(env: dict[str, str]) -> None:
    done, pips = install(env, "--test")
    assert done.returncode == 0, done.stderr
    assert pips == ["-m pip install -q torch==2.13.0", "-m pip install -q -e .[train]",
                    "-m pip install -q -e .[dev,train,tensorboard]",
                    "-m pip install -q mlflow==3.17.2"]
    stamps = sorted(p.name for p in (Path(env["HPCDL_CACHE"]) / "stamps").iterdir())
    assert stamps == [f"python-deps-{part}-{stamp_key()}-_stub_venv" for part in ("demo", "test")]
    # Stamped and importable: both parts are up to date, nothing is installed again.
    Path(env["STUB_IMPORTS_OK"]).touch()
    again, pips = install(env, "--test")
    assert pips == []
    assert again.stdout.splitlines() == ["python deps (demo): up to date",
                                         "python deps (test): up to date"]


def test_the_demos_stamp_does_not_count_for_the_tests(env: dict[str, str]) -> None:
    install(env)
    Path(env["STUB_IMPORTS_OK"]).touch()
    done, pips = install(env, "--test")
    assert done.returncode == 0, done.stderr
    assert pips == ["-m pip install -q -e .[dev,train,tensorboard]",
                    "-m pip install -q mlflow==3.17.2"]


def test_an_unknown_argument_stops_before_any_install(env: dict[str, str]) -> None:
    done, pips = install(env, "--tests")
    assert done.returncode == 2
    assert done.stderr.strip() == ("install-python-deps.sh: unknown argument '--tests' "
                                   "(--test or nothing)")
    assert pips == []


def test_demo_and_setup_ask_for_their_parts() -> None:
    assert "stage \"install: python packages\" scripts/install-python-deps.sh\n" in \
        (REPO / "scripts" / "demo.sh").read_text()
    assert "scripts/install-python-deps.sh --test\n" in (REPO / "scripts" / "setup.sh").read_text()


def stamp_key() -> str:
    """The script's key: the first 16 hex digits of pyproject.toml's sha256."""
    return hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest()[:16]
