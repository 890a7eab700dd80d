"""`hpcdl submit --stage-image` on a real cluster of its own (3 nodes, each with its own
node-local /local, scripts/sandbox.sh): sbcast puts one copy of the CPU image on every
node, the ranks run that copy (Apptainer names the image it runs in
$APPTAINER_CONTAINER), the copies are gone when the job ends; then one node's /local is
made a 64 MiB tmpfs and the same job stops in one line naming that node and its free
space, before any rank starts. About 30 s here (the cluster's start and three 539 MiB
copies on one disk)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest_slurm import NetnsCluster, hpcdl

pytestmark = [pytest.mark.slurm, pytest.mark.apptainer]

TIMEOUT = 300
# Each rank: the image Apptainer runs, its size as the rank sees it, its node.
PROBE = ('echo "ran in $APPTAINER_CONTAINER $(stat -c %s "$APPTAINER_CONTAINER") bytes '
         'on $SLURMD_NODENAME"')


def submit(cluster: NetnsCluster, image: Path, runs: Path
           ) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    res = hpcdl("submit", "-p", str(cluster.profile), "-N", str(len(cluster.nodes)), "-G", "0",
                "--image", str(image), "--stage-image", "--wait", "--json", "--",
                "sh", "-c", PROBE, env={**cluster.env, "HPCDL_RUNS": str(runs)},
                timeout=TIMEOUT)
    assert "Traceback" not in res.stderr, res.stderr
    return res, json.loads(res.stdout.strip().splitlines()[-1])


def test_ranks_run_each_nodes_copy_and_a_full_node_is_named(
        netns_cluster: Callable[..., NetnsCluster], cpu_image: Path, runs_dir: Path) -> None:
    cluster = netns_cluster(nodes=3)
    res, record = submit(cluster, cpu_image, runs_dir)
    assert res.returncode == 0, res.stdout + res.stderr
    copy = f"/local/hpcdl-{record['job_id']}-{cpu_image.name}"
    out = Path(record["stdout"]).read_text()
    ranks = sorted(line.split(": ", 1)[1] for line in out.splitlines() if ": ran in " in line)
    size = cpu_image.stat().st_size
    assert ranks == [f"ran in {copy} {size} bytes on {node}" for node in cluster.nodes], out
    assert f"hpcdl: staging {cpu_image} ({size >> 20} MiB) to {copy} on 3 nodes with sbcast" in out
    plan = json.loads((Path(record["run_dir"]) / "plan.json").read_text())
    assert (plan["stage"], plan["staged_image"]) == (
        "sbcast", f"/local/hpcdl-$SLURM_JOB_ID-{cpu_image.name}")
    # Removed at the end: each node's /local is the cluster's nodes/NODE/local here.
    left = {n: sorted(p.name for p in (cluster.dir / "nodes" / n / "local").iterdir())
            for n in cluster.nodes}
    assert left == {n: [] for n in cluster.nodes}

    # The last node's /local becomes a 64 MiB tmpfs (in its own mount namespace).
    full = cluster.nodes[-1]
    pid = (cluster.dir / "run" / f"slurmd-{full}.pid").read_text().strip()
    mount = subprocess.run(["nsenter", "-t", pid, "-m", "mount", "-t", "tmpfs", "-o",
                            "size=64m,mode=1777", "hpcdl-tiny", "/local"],
                           capture_output=True, text=True, timeout=30, check=False)
    assert mount.returncode == 0, mount.stderr
    res, record = submit(cluster, cpu_image, runs_dir)
    assert res.returncode == 1, res.stdout + res.stderr
    err = [line for line in Path(record["stderr"]).read_text().splitlines()
           if line.startswith("hpcdl:")]
    assert err == [f"hpcdl: image staging: no room for {cpu_image} ({size >> 20} MiB) in "
                   f"/local on {full} (64 MiB free); no rank was started"], err
    assert " ran in " not in Path(record["stdout"]).read_text()
