"""`hpcdl sandbox up --nodes 3`: a real cluster of its own (its own --dir, never the
shared sandbox), a job on all three nodes through the profile it wrote, status, down.
Larger clusters (16, 32 nodes) are bench/bench_scale_nodes.py's, not a test's."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from hpcdl import sandbox as shape
from tests.integration.conftest_slurm import hpcdl

pytestmark = [pytest.mark.slurm]


@pytest.mark.skipif(os.geteuid() != 0, reason="starts Slurm daemons and network namespaces")
def test_three_node_sandbox_runs_a_job_on_every_node(tmp_path: Path) -> None:
    folder = Path("/var/lib") / f"hpcdl-test-sandbox-{os.getpid()}"
    base = {"XDG_CONFIG_HOME": str(tmp_path / "cfg"), "HPCDL_RUNS": str(tmp_path / "runs")}
    try:
        up = hpcdl("sandbox", "up", "--nodes", "3", "--dir", str(folder), env=base, timeout=300)
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"export SLURM_CONF={folder}/etc/slurm.conf" in up.stdout
        env = {**base, **shape.parse_env_file((folder / shape.ENV_FILE).read_text())}
        status = hpcdl("sandbox", "status", "--nodes", "3", "--dir", str(folder), env=base)
        assert status.returncode == 0, status.stdout + status.stderr
        res = hpcdl("submit", "-p", "sandbox-3n", "-N", "3", "-G", "0", "--no-image", "--wait",
                    "--json", "--", "hostname", env=env, timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr
        record = json.loads(res.stdout.strip().splitlines()[-1])
        out = Path(record["stdout"]).read_text()
        names = sorted(line.split(":", 1)[1].strip() for line in out.splitlines()
                       if line[:1].isdigit())
        assert names == ["s3n1", "s3n2", "s3n3"]  # one rank on each node, each its own host
    finally:
        down = hpcdl("sandbox", "down", "--nodes", "3", "--dir", str(folder), env=base,
                     timeout=300)
        gone = hpcdl("sandbox", "status", "--nodes", "3", "--dir", str(folder), env=base)
        shutil.rmtree(folder, ignore_errors=True)
    assert down.returncode == 0, down.stdout + down.stderr
    assert gone.returncode == 3
