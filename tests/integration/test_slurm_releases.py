"""Slurm 24.11 and 26.05 beside the host's 22.05 (issue 41): `hpcdl sandbox up --slurm
RELEASE` brings up a real two-node cluster of that release (its daemons from the
release's Debian root filesystem, scripts/slurm-rootfs.sh), and hpcdl runs a real
two-node job on it through the profile it wrote, then reads its status and logs back.

The clusters live in directories of their own (never the shared sandbox's) and are
taken down at the end. Their node names (v2411n1, ...) are the release sandboxes'
own: a `hpcdl sandbox up --slurm` cluster left running by hand makes `up` refuse here,
in one line. The first run builds each root filesystem (~60-75 s each, cached by
content afterwards)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcdl import sandbox as shape
from tests.integration.conftest_slurm import hpcdl

pytestmark = [pytest.mark.slurm,
              pytest.mark.skipif(os.geteuid() != 0,
                                 reason="starts Slurm daemons and network namespaces")]

RELEASES = ("24.11", "26.05")


@pytest.fixture(scope="module")
def release_clusters(tmp_path_factory: pytest.TempPathFactory
                     ) -> Iterator[dict[str, dict[str, str]]]:
    """Each release's two-node cluster, up; its environment (a private config home with
    its profile, a runs directory on the nodes' shared /scratch)."""
    base = tmp_path_factory.mktemp("releases")
    up: dict[str, dict[str, str]] = {}
    folders = {r: Path("/var/lib") / f"hpcdl-test-slurm-{r}-{os.getpid()}" for r in RELEASES}
    runs = Path("/scratch") / f"hpcdl-test-releases-{os.getpid()}"
    # A runs directory per cluster: both clusters number their jobs from 1, and
    # `hpcdl status JOBID` finds a job by its id among the runs there.
    envs = {r: {"XDG_CONFIG_HOME": str(base / "cfg"), "HPCDL_RUNS": str(runs / r)}
            for r in RELEASES}
    try:
        for release, folder in folders.items():
            res = hpcdl("sandbox", "up", "--slurm", release, "--nodes", "2", "--dir",
                        str(folder), env=envs[release], timeout=600)
            assert res.returncode == 0, res.stdout + res.stderr
            up[release] = envs[release]
        yield up
    finally:
        for release, folder in folders.items():
            if folder.exists():
                down = hpcdl("sandbox", "down", "--slurm", release, "--nodes", "2", "--dir",
                             str(folder), env=envs[release], timeout=300)
                assert down.returncode == 0, down.stdout + down.stderr
                shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(runs, ignore_errors=True)


@pytest.mark.parametrize("release", RELEASES)
def test_a_two_node_job_on_each_release(release: str,
                                        release_clusters: dict[str, dict[str, str]]) -> None:
    env = release_clusters[release]
    profile = shape.profile_name(2, release)
    res = hpcdl("submit", "-p", profile, "-N", "2", "-G", "1", "--no-image", "--wait",
                "--json", "--", "hostname", env=env, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    record = json.loads(res.stdout.strip().splitlines()[-1])
    job = str(record["job_id"])
    # One rank on each node, each its own host: the release's srun started them.
    out = Path(record["stdout"]).read_text()
    names = sorted(line.split(":", 1)[1].strip() for line in out.splitlines()
                   if line[:1].isdigit())
    assert names == shape.node_names(2, release)
    # Status and logs read back through hpcdl, from the release's own commands (the
    # host's 22.05 cluster has its own job ids: a wrong one would not find this job's
    # nodes).
    status = hpcdl("status", job, "--json", env=env)
    assert status.returncode == 0, status.stdout + status.stderr
    row = json.loads(status.stdout)
    assert row["state"] == "COMPLETED"
    assert row["nodes"] == f"v{release.replace('.', '')}n[1-2]"
    logs = hpcdl("logs", job, env=env)
    assert logs.returncode == 0, logs.stdout + logs.stderr
    assert sorted(line.split(":", 1)[1].strip() for line in logs.stdout.splitlines()
                  if line[:1].isdigit()) == names
    # The job's own srun was the release's: its version in the job's PATH.
    version = hpcdl("submit", "-p", profile, "-N", "1", "-G", "0", "--no-image", "--wait",
                    "--json", "--", "srun", "--version", env=env, timeout=300)
    assert version.returncode == 0, version.stdout + version.stderr
    text = Path(json.loads(version.stdout.strip().splitlines()[-1])["stdout"]).read_text()
    assert f"slurm-wlm {release}." in text


MPI_HELLO = """\
import socket
from mpi4py import MPI
c = MPI.COMM_WORLD
print(f"{c.Get_rank()}/{c.Get_size()} {socket.gethostname()} {c.allreduce(c.Get_rank())}",
      flush=True)
"""


def test_open_mpi_over_pmix_on_24_11(release_clusters: dict[str, dict[str, str]],
                                     tmp_path: Path) -> None:
    """The headline path's PMI: 4 Open MPI ranks on 2 nodes started by 24.11's
    `srun --mpi=pmix` (its plugin reads the root's PMIx 5 through /run/hpcdl-pmix-24.11,
    scripts/slurm-rootfs.sh), each seeing the world of 4 and reducing across both nodes.
    Before the fix the step hung at launch in the host's PMIx 4."""
    import sys

    env = release_clusters["24.11"]
    script = Path(env["HPCDL_RUNS"]).parent / "mpi_hello.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(MPI_HELLO)
    profile = shape.profile_name(2, "24.11")
    dry = hpcdl("submit", "-p", profile, "-N", "2", "-G", "2", "--no-image", "--dry-run",
                "--", sys.executable, str(script), env=env)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "--mpi=pmix" in dry.stdout
    res = hpcdl("submit", "-p", profile, "-N", "2", "-G", "2", "--no-image", "--wait",
                "--json", "--", sys.executable, str(script), env=env, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    out = Path(json.loads(res.stdout.strip().splitlines()[-1])["stdout"]).read_text()
    rows = sorted(line.split(":", 1)[1].split() for line in out.splitlines()
                  if line[:1].isdigit() and "/4 " in line)
    assert [r[0] for r in rows] == ["0/4", "1/4", "2/4", "3/4"], out
    assert {r[1] for r in rows} == {"v2411n1", "v2411n2"}
    assert {r[2] for r in rows} == {"6"}
