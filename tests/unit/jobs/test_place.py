"""hpcdl/jobs/place.py with this machine standing in for the cluster (LocalExecutor: its
push and pull copy folders, as SSH's rsync moves them): the cluster's path of a run and
back (property), shipping, fetching without checkpoints or the job's files, discarding
only under the runs root, and a dry run's place that moves nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcdl.jobs.place import HERE, Shipped
from hpcdl.jobs.rundir import RunDir
from hpcdl.schedulers.executor import LocalExecutor

PARTS = st.lists(st.from_regex(r"[a-z0-9][a-z0-9_.-]{0,8}", fullmatch=True).filter(
    lambda p: p not in (".", "..")), min_size=1, max_size=3)


@given(PARTS)
def test_a_runs_cluster_path_maps_back_to_it(parts):
    place = Shipped(LocalExecutor(), "/cluster/runs", Path("/laptop/runs"))
    local = Path("/laptop/runs", *parts)
    cluster = place.cluster_path(local)
    assert cluster == "/cluster/runs/" + "/".join(parts)
    assert place.local_path(cluster) == local


def test_paths_outside_the_roots_keep_only_their_name():
    place = Shipped(LocalExecutor(), "/cluster/runs/", Path("/laptop/runs"))
    assert place.root == "/cluster/runs"
    assert place.cluster_path(Path("/elsewhere/r1")) == "/cluster/runs/r1"
    assert place.local_path("/scratch/other/r2") == Path("/laptop/runs/r2")
    assert place.describe() == "localhost:/cluster/runs"
    assert (HERE.cluster_path(Path("/a/b")), HERE.local_path("/a/b")) == ("/a/b", Path("/a/b"))


def test_ship_fetch_and_discard(tmp_path):
    local_root, cluster_root = tmp_path / "laptop", tmp_path / "cluster" / "runs"
    place = Shipped(LocalExecutor(), str(cluster_root), local_root)
    place.prepare()
    assert cluster_root.is_dir()
    run = RunDir(local_root / "sweep-1" / "p0")
    (run.path / "job").mkdir(parents=True)
    (run.path / "job.sbatch").write_text("#!/bin/bash\n")
    (run.path / "job" / "hpcdl-nodes").write_text("x")
    assert place.ship(run) == len("#!/bin/bash\n") + 1
    there = cluster_root / "sweep-1" / "p0"
    assert (there / "job.sbatch").read_text() == "#!/bin/bash\n"
    # The job writes on the cluster; fetch brings back all but checkpoints and copies.
    (there / "slurm-1.out").write_text("epoch 1\n")
    (there / "checkpoints").mkdir()
    (there / "checkpoints" / "c.pt").write_bytes(bytes(100))
    (there / "job" / "hpcdl-nodes").write_text("changed there")
    assert place.fetch(run) == len("epoch 1\n") + len("#!/bin/bash\n")
    assert (run.path / "slurm-1.out").read_text() == "epoch 1\n"
    assert not (run.path / "checkpoints").exists()
    assert (run.path / "job" / "hpcdl-nodes").read_text() == "x"
    place.discard(run)
    assert not there.exists() and (cluster_root / "sweep-1").is_dir()


def test_a_dry_runs_place_moves_nothing(tmp_path):
    place = Shipped(LocalExecutor(), str(tmp_path / "c"), tmp_path / "l", planning=True)
    run = RunDir(tmp_path / "l" / "r")
    for move in (place.prepare, lambda: place.ship(run), lambda: place.fetch(run),
                 lambda: place.discard(run)):
        with pytest.raises(RuntimeError, match="a dry run's place moves nothing"):
            move()
    assert not (tmp_path / "c").exists()
