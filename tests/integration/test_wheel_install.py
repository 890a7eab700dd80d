"""`pip install .` into a fresh venv ships templates and profiles inside the wheel."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

from hpcdl.resources import REPO_ROOT


def test_fresh_venv_install_runs_from_any_directory(tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(REPO_ROOT)], check=True,
                   timeout=600, cwd=tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = subprocess.run(
        [str(env_dir / "bin" / "hpcdl"), "submit", "--profile", "neuron", "--nodes", "2",
         "--gpus", "4", "--dry-run"],
        capture_output=True, text=True, timeout=120, cwd=elsewhere,
    )
    assert out.returncode == 0, out.stderr
    assert "#SBATCH --partition=cas_v100nv_4" in out.stdout
    assert "#SBATCH --gres=gpu:4" in out.stdout
    # The installed copy is used (not the checkout), and torch is not a dependency.
    where = subprocess.run([str(py), "-c", "import hpcdl, importlib.util as u; "
                            "print(hpcdl.__file__); print(u.find_spec('torch') is None)"],
                           capture_output=True, text=True, timeout=60, cwd=elsewhere)
    path, no_torch = where.stdout.split()
    assert Path(path).is_relative_to(env_dir) and no_torch == "True"
    assert list(elsewhere.iterdir()) == []
    # The sandbox profile's example defaults name a bundled example: the wheel's own.
    sandbox = subprocess.run([str(env_dir / "bin" / "hpcdl"), "submit", "-p", "sandbox", "-N", "2",
                              "-G", "4", "--dry-run"], capture_output=True, text=True,
                             timeout=60, cwd=elsewhere)
    assert sandbox.returncode == 0, sandbox.stderr
    assert "_data/examples/resnet50_imagenet.py --backend horovod --synthetic --image-size=32" \
        in sandbox.stdout
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
