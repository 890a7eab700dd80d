"""`pip install .` into a fresh venv ships templates, profiles, specs and examples inside
the wheel, and every command works from an unrelated directory: submit (dry-run), and
build (dry-run and a real build) with the project files taken from the installed wheel.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from hpcdl.core.resources import REPO_ROOT
from tests.conftest import require
from tests.integration.conftest_apptainer import HOST_BINDS


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(venv, an empty folder elsewhere) with hpcdl installed from the checkout as a wheel."""
    root = tmp_path_factory.mktemp("wheel")
    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(REPO_ROOT)], check=True,
                   timeout=600, cwd=root)
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    return env_dir, elsewhere


def site_hpcdl(env_dir: Path) -> Path:
    py = env_dir / "bin" / "python"
    out = subprocess.run([str(py), "-c", "import hpcdl; print(hpcdl.__file__)"],
                         capture_output=True, text=True, timeout=60, cwd="/", check=True)
    return Path(out.stdout.strip()).parent


def test_fresh_venv_install_runs_from_any_directory(installed: tuple[Path, Path]) -> None:
    env_dir, elsewhere = installed
    py = env_dir / "bin" / "python"
    out = subprocess.run(
        [str(env_dir / "bin" / "hpcdl"), "submit", "--profile", "neuron", "--nodes", "2",
         "--gpus", "4", "--dry-run"],
        capture_output=True, text=True, timeout=120, cwd=elsewhere,
    )
    assert out.returncode == 0, out.stderr
    assert "#SBATCH --partition=cas_v100nv_4" in out.stdout
    assert "#SBATCH --gres=gpu:4" in out.stdout
    # The dry run is the submission: the bundled example is bound into the image from the
    # run directory's job/, which a submission fills from the installed wheel.
    run = re.search(r"^# run directory (\S+?):? ", out.stderr, re.M)
    assert run, out.stderr
    assert f"-B {run.group(1)}/job:/hpcdl:ro" in out.stdout
    package = site_hpcdl(env_dir)
    assert str(package) not in out.stdout
    # The installed copy is used (not the checkout), and torch is not a dependency.
    where = subprocess.run([str(py), "-c", "import hpcdl, importlib.util as u; "
                            "print(hpcdl.__file__); print(u.find_spec('torch') is None)"],
                           capture_output=True, text=True, timeout=60, cwd=elsewhere)
    path, no_torch = where.stdout.split()
    assert Path(path).is_relative_to(env_dir) and no_torch == "True"
    # The doctor's in-image probe is package data the installed wheel carries.
    probe = subprocess.run([str(py), "-c", "from hpcdl.doctor.image import probe_source; "
                            "s = probe_source(); print('def main()' in s, 'HPCDL_PROBE' in s)"],
                           capture_output=True, text=True, timeout=60, cwd=elsewhere)
    assert probe.returncode == 0 and probe.stdout.split() == ["True", "True"], probe.stderr
    assert list(elsewhere.iterdir()) == []
    # The sandbox profile's example defaults name a bundled example: the wheel's own.
    sandbox = subprocess.run([str(env_dir / "bin" / "hpcdl"), "submit", "-p", "sandbox", "-N", "2",
                              "-G", "4", "--dry-run"], capture_output=True, text=True,
                             timeout=60, cwd=elsewhere)
    assert sandbox.returncode == 0, sandbox.stderr
    assert "/job/examples/resnet50_imagenet.py --backend horovod --synthetic --checkpoint-dir " \
        in sandbox.stdout and " --image-size=32 " in sandbox.stdout
    assert "# example defaults from profile sandbox: " in sandbox.stderr
    bad = subprocess.run([str(env_dir / "bin" / "hpcdl"), "submit", "-p", "neuron", "-N", "99",
                          "-G", "4", "--dry-run"], capture_output=True, text=True, timeout=60,
                         cwd=elsewhere)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    # A PBS profile renders the PBS template the wheel carries.
    pbs = subprocess.run([str(env_dir / "bin" / "hpcdl"), "submit", "-p", "polaris", "-N", "2",
                          "-G", "4", "--dry-run"], capture_output=True, text=True, timeout=60,
                         cwd=elsewhere)
    assert pbs.returncode == 0, pbs.stderr
    assert "#PBS -l select=2:ncpus=32:ngpus=4" in pbs.stdout
    assert sys.version_info >= (3, 10)


def test_build_dry_run_of_the_bundled_spec_from_the_wheel(installed: tuple[Path, Path]) -> None:
    cache = Path(os.environ.get("HPCDL_CACHE") or "/var/cache/hpcdl")
    require((cache / "wheelhouse").is_dir(),
            f"the wheelhouse in {cache} (scripts/build-image.sh --prepare-only)")
    env_dir, elsewhere = installed
    res = subprocess.run([str(env_dir / "bin" / "hpcdl"), "build", "pytorch-horovod-cpu",
                          "--dry-run", "--json", "-o", str(elsewhere.parent / "never.sif")],
                         capture_output=True, text=True, timeout=300, cwd=elsewhere)
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    package = site_hpcdl(env_dir)
    files = {f["destination"]: f["source"] for f in plan["files"]}
    assert files["/opt/hpcdl/hpcdl"] == str(package)
    assert files["/opt/hpcdl/examples"] == str(package / "_data" / "examples")
    assert f"{package}/_data/examples /opt/hpcdl/examples" in plan["definition"]
    assert list(elsewhere.iterdir()) == []


@pytest.mark.apptainer
def test_real_build_from_the_wheel_carries_the_project(installed: tuple[Path, Path],
                                                       cpu_image: Path, apptainer_bin: str,
                                                       tmp_path: Path) -> None:
    # A small spec on the CPU image (no registry here, no 3-minute rebuild): only the
    # project files the wheel carries go in.
    env_dir, elsewhere = installed
    spec = tmp_path / "from-wheel.yaml"
    spec.write_text(
        "name: from-wheel\ngpu: false\n"
        f"base: {{bootstrap: localimage, image: {cpu_image}}}\n"
        "mpi: {flavour: openmpi, version: 4.1.4, source: base}\nproject: true\n")
    out = tmp_path / "from-wheel"
    res = subprocess.run([str(env_dir / "bin" / "hpcdl"), "build", str(spec), "--sandbox",
                          "-o", str(out)], capture_output=True, text=True, timeout=1200,
                         cwd=elsewhere)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    probe = subprocess.run(
        [apptainer_bin, "exec", *HOST_BINDS, str(out), "python3", "-c",
         "import hpcdl, hpcdl.jobside.world, os; print(hpcdl.__file__); "
         "print(os.path.isfile('/opt/hpcdl/examples/resnet50_imagenet.py'))"],
        capture_output=True, text=True, timeout=300, cwd="/")
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == ["/opt/hpcdl/hpcdl/__init__.py", "True"]
    assert list(elsewhere.iterdir()) == []


def test_the_watchdogs_py_spy_comes_with_the_wheel(installed: tuple[Path, Path]) -> None:
    """py-spy is a dependency: the installed hpcdl finds its static binary in its own venv
    (what `submit --hang-timeout` binds into the image), not a shim on PATH."""
    env_dir, elsewhere = installed
    py = env_dir / "bin" / "python"
    out = subprocess.run([str(py), "-c", "from hpcdl.jobs.watchdog import find_py_spy; "
                          "print(find_py_spy())"], capture_output=True, text=True, timeout=60,
                         cwd=elsewhere, env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    found = Path(out.stdout.strip())
    assert found.is_relative_to(env_dir.resolve()), found
    assert found.read_bytes()[:4] == b"\x7fELF"
