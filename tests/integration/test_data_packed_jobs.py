"""`hpcdl submit --data DATA.sqfs` on the real two-node sandbox: the bundled example
(2 nodes x 1 rank, same seed) trained from the directory tree, from the packed file bound
into the image (Apptainer's image mount) and from the packed file mounted natively with
squashfuse_ll (squashfuse without it) on each node ends with the same loss, each node
saying which it ran; the native mounts are gone when the job ends; a file that is not
SquashFS is refused in one line before anything is submitted.
With --stage-data the packed file is first copied to each node's /local with sbcast (in
the image beside the image's own copy, --stage-image) and read from there: the same
loss again, no copy left on any node; a file larger than the nodes' free space stops the
job in one line naming the nodes and their free space (exit 1), before any rank."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from hpcdl.jobside import protocol
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


@pytest.fixture(scope="module")
def from_tree(slurm_cluster: Path, cpu_image: Path, tiny: tuple[Path, Path],
              tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The reference: the example trained in the image from the directory tree."""
    tree = tiny[0]
    result, _ = _train("--image", str(cpu_image), "--data", str(tree), "--bind", str(tree),
                       runs=tmp_path_factory.mktemp("tree-runs"))
    return result


def _left_on_nodes(*job_ids: str) -> dict[str, list[str]]:
    """What the jobs ``job_ids`` left in each node's /local (nodes/NODE/local here): their
    copies (hpcdl-JOBID-...) and mount points (hpcdl-data-JOBID); other jobs of the shared
    sandbox may have files of their own there."""
    mine = {f"hpcdl-{j}-" for j in job_ids} | {f"hpcdl-data-{j}" for j in job_ids}
    return {local.parent.name: sorted(p.name for p in local.iterdir()
                                      if any(p.name.startswith(m) for m in mine))
            for local in (sandbox_dir() / "nodes").glob("*/local")}


def _mounters(out: str) -> list[tuple[str, str]]:
    """What each node said it mounts the packed file with (node, mounter), sorted."""
    return sorted(re.findall(r"^hpcdl: node (\S+) mounts the dataset with (\S+)$", out, re.M))


# The sandbox's nodes run this machine's programs: squashfuse_ll where it has one.
MOUNTER = "squashfuse_ll" if shutil.which("squashfuse_ll") else "squashfuse"


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
        slurm_cluster: Path, cpu_image: Path, tiny: tuple[Path, Path], runs_dir: Path,
        from_tree: dict[str, Any]) -> None:
    tree, packed = tiny
    image = ("--image", str(cpu_image))
    in_image, _ = _train(*image, "--data", str(packed), runs=runs_dir)
    native, out = _train("--no-image", "--data", str(packed), runs=runs_dir)
    assert "hpcdl: dataset " in out and " mounted at /local/hpcdl-data-" in out, out
    mounters = _mounters(out)
    assert [m for _, m in mounters] == [MOUNTER] * 2 and len({n for n, _ in mounters}) == 2, out
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


def test_stage_data_trains_as_the_tree_from_each_nodes_copy(
        slurm_cluster: Path, cpu_image: Path, tiny: tuple[Path, Path], runs_dir: Path,
        from_tree: dict[str, Any]) -> None:
    packed = tiny[1]
    size = packed.stat().st_size >> 20
    in_image, out = _train("--image", str(cpu_image), "--stage-image", "--data", str(packed),
                           "--stage-data", runs=runs_dir)
    copy = re.search(r"hpcdl: staging \S+ \(\d+ MiB\) to (/local/hpcdl-(\d+)-data-tiny\.sqfs) "
                     r"on 2 nodes with sbcast", out)
    assert copy and f"hpcdl: staging {packed} ({size} MiB) to {copy[1]}" in out, out
    assert f"-{cpu_image.name} on 2 nodes with sbcast" in out, out  # the image's copy too
    native, out = _train("--no-image", "--data", str(packed), "--stage-data", runs=runs_dir)
    mounted = re.search(r"hpcdl: dataset (/local/hpcdl-(\d+)-data-tiny\.sqfs) mounted at "
                        r"/local/hpcdl-data-(\d+) on 2 nodes", out)
    assert mounted and mounted[2] == mounted[3], out
    assert [m for _, m in _mounters(out)] == [MOUNTER] * 2, out
    assert in_image["final_loss"] == pytest.approx(from_tree["final_loss"], rel=1e-6)
    assert native["final_loss"] == pytest.approx(from_tree["final_loss"], rel=1e-6)
    # No copy and no mount point left on any node.
    assert _left_on_nodes(copy[2], mounted[2]) == {n: [] for n in _left_on_nodes()}


def test_stage_data_without_room_on_the_nodes_stops_the_job_in_one_line(
        slurm_cluster: Path, tiny: tuple[Path, Path], runs_dir: Path) -> None:
    # A SquashFS file whose size (1 TiB, sparse: it takes no room here) no node's /local
    # has free: the same check as a full node's, without filling a disk the sandbox shares.
    big = tiny[1].parent / "big.sqfs"
    shutil.copyfile(tiny[1], big)
    with big.open("r+b") as fh:
        fh.truncate(1 << 40)
    res = hpcdl("submit", "--profile", "sandbox", "--nodes", "2", "--gpus", "1",
                "--cpus-per-task", "1", "--no-image", "--data", str(big), "--stage-data",
                "--wait", "--json", *EXAMPLE_ARGS, env={"HPCDL_RUNS": str(runs_dir)},
                timeout=JOB_TIMEOUT)
    assert res.returncode == 1, res.stdout + res.stderr
    record = json.loads(res.stdout.strip().splitlines()[-1])
    err = [line for line in Path(record["stderr"]).read_text().splitlines()
           if line.startswith("hpcdl:")]
    assert len(err) == 1 and re.fullmatch(
        rf"hpcdl: dataset staging: no room for {re.escape(str(big))} \(1048576 MiB\) in "
        r"/local on n\d \(\d+ MiB free\), n\d \(\d+ MiB free\); no rank was started",
        err[0]), err
    assert "mounted at" not in Path(record["stdout"]).read_text()
    assert _left_on_nodes(str(record["job_id"])) == {n: [] for n in _left_on_nodes()}


def test_the_ordinary_user_mounts_a_packed_file_natively(
        sandbox_user: Any, tiny: tuple[Path, Path]) -> None:
    """hpcdl from the user's own wheel, natively: squashfuse_ll mounts as the user through
    the setuid fusermount3 (the fuse3 package, as on cluster nodes), every rank reads the
    classes, and the mount is gone at the end. (The user's Python here has no torch, so
    the command lists the dataset rather than training on it.)"""
    mine = sandbox_user.own(Path("/scratch") / f"hpcdl-packed-{tiny[1].parent.name}")
    packed = mine / "tiny.sqfs"
    shutil.copyfile(tiny[1], packed)
    shutil.chown(packed, sandbox_user.uid, sandbox_user.gid)
    runs = sandbox_user.own(mine / "runs")
    try:
        res = sandbox_user.cli("submit", "-p", "sandbox", "-N", "2", "-G", "1", "-c", "1",
                               "--no-image", "--data", str(packed), "--wait", "--json", "--",
                               "sh", "-c", 'echo "classes=$(ls "$HPCDL_DATA/train" | wc -l)"',
                               env={"HPCDL_RUNS": str(runs)}, timeout=JOB_TIMEOUT)
        assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
        record = json.loads(res.stdout.strip().splitlines()[-1])
        out = Path(record["stdout"]).read_text()
        assert " mounted at /local/hpcdl-data-" in out, out[-3000:]
        assert [m for _, m in _mounters(out)] == [MOUNTER] * 2, out[-3000:]
        assert sorted(re.findall(r"^(\d+): classes=(\d+)$", out, re.M)) == [
            ("0", "4"), ("1", "4")], out[-3000:]
        assert _left_on_nodes(str(record["job_id"])) == {n: [] for n in _left_on_nodes()}
    finally:
        shutil.rmtree(mine, ignore_errors=True)
