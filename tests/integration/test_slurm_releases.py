"""Slurm 24.11 and 26.05 beside the host's 22.05 (issue 41): `hpcdl sandbox up --slurm
RELEASE` brings up a real two-node cluster of that release (its daemons from the
release's Debian root filesystem, scripts/slurm-rootfs.sh); a job's own srun is the
release's, and on 24.11 Open MPI's ranks start over the release's PMIx. (The 2-node
run, status, logs, cancel, sweep and detect on every release: test_slurm_matrix.py.)

The clusters live in directories of their own (never the shared sandbox's), shared
with the release matrix for the session and taken down at its end
(tests/integration/conftest_releases.py). Their node names (v2411n1, ...) are the release sandboxes'
own: a `hpcdl sandbox up --slurm` cluster left running by hand makes `up` refuse here,
in one line. The first run builds each root filesystem (~60-90 s each, cached by
content afterwards)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from hpcdl import sandbox as shape
from tests.integration.conftest_slurm import hpcdl

pytestmark = [pytest.mark.slurm,
              pytest.mark.skipif(os.geteuid() != 0,
                                 reason="starts Slurm daemons and network namespaces")]

RELEASES = ("24.11", "26.05")


@pytest.mark.parametrize("release", RELEASES)
def test_the_jobs_srun_is_the_releases(release: str, release_sandboxes) -> None:  # type: ignore[no-untyped-def]
    # The job's own srun is the release's (its version, in the job's PATH): the wrappers'
    # PATH reaches the nodes through sbatch's exported environment. The 2-node run with
    # its status and logs is the matrix's (test_slurm_matrix.py).
    env = release_sandboxes.get(release).env
    profile = shape.profile_name(2, release)
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


@pytest.mark.slurm_release_only("24.11")
def test_open_mpi_over_pmix_on_24_11(release_sandboxes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The headline path's PMI: 4 Open MPI ranks on 2 nodes started by 24.11's
    `srun --mpi=pmix` (its plugin reads the root's PMIx 5 through /run/hpcdl-pmix-24.11,
    scripts/slurm-rootfs.sh), each seeing the world of 4 and reducing across both nodes.
    Before the fix the step hung at launch in the host's PMIx 4."""
    import sys

    env = release_sandboxes.get("24.11").env
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


@pytest.mark.apptainer
@pytest.mark.horovod
@pytest.mark.slurm_release_only("24.11")
def test_the_headline_command_with_horovod_on_24_11(release_sandboxes,  # type: ignore[no-untyped-def]
                                                   cpu_image: Path) -> None:
    """The README's headline (the bundled example, Horovod, in the CPU image) on 24.11:
    the image's Open MPI ranks start over 24.11's PMIx through `srun --mpi=pmix`, one
    per node. (26.05's sandbox has no PMIx: its matrix row runs DDP.)"""
    rel = release_sandboxes.get("24.11")
    res = hpcdl("submit", "-p", rel.profile, "-N", "2", "-G", "1", "--image", str(cpu_image),
                "--wait", env=rel.env, timeout=600)
    assert res.returncode == 0, f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    for line in (r"^world size\s+2$", r"^nodes\s+2$", r"^backend\s+horovod$"):
        assert re.search(line, res.stdout, re.M), res.stdout
    assert "parameters identical on every rank" in res.stdout
