"""`hpcdl submit --data DATA.sqfs` on the real two-node sandbox: the bundled example
(2 nodes x 1 rank, same seed) trained from the directory tree, from the packed file bound
into the image (Apptainer's image mount) and from the packed file mounted natively with
squashfuse on each node ends with the same loss; the native mounts are gone when the job
ends; a file that is not SquashFS is refused in one line before anything is submitted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hpcdl.results import protocol
from tests.integration.conftest_slurm import hpcdl, sandbox_dir

pytestmark = [pytest.mark.slurm, pytest.mark.apptainer, pytest.mark.horovod]

JOB_TIMEOUT = 420
EXAMPLE_ARGS = ("-X", "--arch=resnet18", "-X", "--image-size=32", "-X", "--batch-size=4",
                "-X", "--max-steps=3", "-X", "--epochs=1", "-X", "--seed=0")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny dataset under /scratch (the nodes see it) and its packed file."""
    root = tmp_path_factory.mktemp("packed-jobs")
    root.chmod(0o755)
    tree, packed = root / "tiny", root / "tiny.sqfs"
    res = hpcdl("data", "make-tiny", str(tree), "--classes", "4", "--per-class", "8",
                "--size", "40")
    assert res.returncode == 0, res.stderr
    res = hpcdl("data", "pack", str(tree), "-o", str(packed))
    assert res.returncode == 0, res.stderr
    return tree, packed


def _train(*args: str, runs: Path) -> tuple[dict[str, Any], str]:
    res = hpcdl("submit", "--profile", "sandbox", "--nodes", "2", "--gpus", "1",
                "--cpus-per-task", "1", "--backend", "ddp", "--wait", "--json", *args,
                *EXAMPLE_ARGS, env={"HPCDL_RUNS": str(runs)}, timeout=JOB_TIMEOUT)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    assert "Traceback" not in res.stderr, res.stderr
    record = json.loads(res.stdout.strip().splitlines()[-1])
    out = Path(record["stdout"]).read_text()
    result = protocol.parse_result(out)
    assert result, out[-3000:]
    return result, out


def test_packed_data_trains_as_the_tree_in_the_image_and_natively(
        slurm_cluster: Path, cpu_image: Path, tiny: tuple[Path, Path], runs_dir: Path) -> None:
    tree, packed = tiny
    image = ("--image", str(cpu_image))
    from_tree, _ = _train(*image, "--data", str(tree), "--bind", str(tree), runs=runs_dir)
    in_image, _ = _train(*image, "--data", str(packed), runs=runs_dir)
    native, out = _train("--no-image", "--data", str(packed), runs=runs_dir)
    assert "hpcdl: dataset " in out and " mounted at /local/hpcdl-data-" in out, out
    assert in_image["final_loss"] == pytest.approx(from_tree["final_loss"], rel=1e-6)
    assert native["final_loss"] == pytest.approx(from_tree["final_loss"], rel=1e-6)
    # Unmounted and removed on every node (each node's /local is nodes/NODE/local here).
    for local in (sandbox_dir() / "nodes").glob("*/local"):
        assert not [p for p in local.iterdir() if p.name.startswith("hpcdl-data-")], local


def test_a_file_that_is_not_squashfs_is_refused_before_submission(
        slurm_cluster: Path, tiny: tuple[Path, Path], runs_dir: Path) -> None:
    bad = tiny[0].parent / "bad.sqfs"
    bad.write_text("not squashfs\n")
    res2 = hpcdl("submit", "--profile", "sandbox", "--nodes", "2", "--gpus", "1", "--no-image",
                 "--data", str(bad), env={"HPCDL_RUNS": str(runs_dir)})
    assert res2.returncode == 2, res2.stdout + res2.stderr
    assert "is not a SquashFS file" in res2.stderr and res2.stderr.count("error:") == 1
    assert not runs_dir.exists() or not list(runs_dir.iterdir())
