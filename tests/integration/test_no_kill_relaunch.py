"""Slurm 22.05's --no-kill step bug against hpcdl's relaunch (issue 41).

SchedMD's 23.02.3 change log: "When a job requests --no-kill and one or more nodes fail
during the job, fix subsequent job steps unable to use some of the remaining resources
allocated to the job" (never fixed in 22.05). hpcdl's spares (``submit --spares``,
templates/hpcdl-nodes.sh) are exactly that: a --no-kill job of N+S nodes whose training
step is started again, inside the allocation, after a node died.

Each case is a real job of hpcdl's (``submit --spares 1 --no-image``, every CPU and all 4
fake GPUs of each node, 4 ranks a node: the job script, guard and relaunch srun that
hpcdl renders for the release) on 3 nodes, whose ranks only report what Slurm gave their
step (SLURM_CPUS_ON_NODE, SLURM_STEP_GPUS, CUDA_VISIBLE_DEVICES; rank 0 the step's
``scontrol show step``). The second node, active and not the batch host, dies (every
process in its network namespace killed) two ways:

- ``guard``: the guard finds it first (the survivor's ranks end, as DDP's do, the gate's
  step gets no answer from the dead node) and gives it back (``scontrol update
  NodeList``) long before Slurm's SlurmdTimeout;
- ``slurm``: Slurm declares it down first (``scontrol update State=DOWN``, the path
  slurmctld takes when a node stops answering: the job keeps running, without it).

Either way the relaunched step must run on the survivor and the spare with every CPU
(8) and every GPU (4) of each. On each release: 22.05 in a 3-node cluster of the test's
own (``netns_cluster``), 24.11 and 26.05 in the session's release sandboxes (3 nodes,
conftest_releases; the killed node is brought back afterwards). Every release passes:
22.05's bug is not met (docs/guide/slurm-releases.md has the evidence). What the
``slurm`` case found was the guard's: on 26.05 it once asked the gate for the node Slurm
had taken out of the job, and lost every node with it (hpcdl_drop_gone now). Cost: the
``guard`` case 24-26 s, the ``slurm`` case 3-9 s, per release.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpcdl import sandbox as shape
from tests.integration.conftest_releases import (
    HOST_RELEASE,
    matrix_releases,
    release_command,
)
from tests.integration.conftest_slurm import NetnsCluster, hpcdl
from tests.own_cluster import kill_node

pytestmark = [pytest.mark.slurm, pytest.mark.slurm_matrix, pytest.mark.timeout(600)]

CPUS, GPUS, RANKS = 8, 4, 4  # a sandbox node's; 4 ranks of 2 CPUs and 1 GPU each

# Every rank: one line of what its step has on its node; rank 0 also the step as
# slurmctld holds it. The first step's ranks wait for the test to say the node died,
# then end non-zero, as a DDP rank whose peer is gone does; the relaunch's end at once.
RANK_SCRIPT = r"""#!/bin/bash
set -u
echo "nokill cycle=${HPCDL_CYCLE:-?} host=$(hostname -s) task=${SLURM_PROCID} cpus=${SLURM_CPUS_ON_NODE:-none} step_gpus=${SLURM_STEP_GPUS:-none} cuda=${CUDA_VISIBLE_DEVICES:-none}"
if [[ $SLURM_PROCID == 0 ]]; then
  echo "nokill-step cycle=${HPCDL_CYCLE:-?} $(scontrol show step -o "${SLURM_JOB_ID}.${SLURM_STEP_ID}" 2>&1 | tr '\n' ' ')"
fi
if [[ ${HPCDL_CYCLE:-0} == 0 ]]; then
  until [[ -e $1 ]]; do sleep 0.5; done
  exit 3
fi
"""
LINE = re.compile(r"nokill cycle=(\d+) host=(\S+) task=(\d+) cpus=(\S+) step_gpus=(\S+) "
                  r"cuda=(\S+)")
STEP = re.compile(r"nokill-step cycle=(\d+) (.*)")


@dataclass
class Cluster:
    """A 3-node cluster of one release as this test uses it."""

    release: str
    nodes: list[str]
    folder: Path                  # its sandbox directory (the nodes' namespaces)
    env: dict[str, str]
    profile: str
    command: Callable[[str], str]  # Slurm command name -> what to run

    def cli(self, *args: str, timeout: float = 180):  # type: ignore[no-untyped-def]
        return hpcdl(*args, env=self.env, timeout=timeout)

    def slurm(self, name: str, *args: str) -> str:
        """A Slurm command of this release on this cluster: its stdout and stderr."""
        return release_command(self.command(name), *args, env=self.env)


def _releases() -> list:  # type: ignore[type-arg]
    # A release sandbox's case runs in that release's xdist group (tests/parallel.py):
    # one worker, one cluster of it. 22.05's cluster is the test's own: anywhere.
    return [pytest.param(r, marks=() if r == HOST_RELEASE else
                         pytest.mark.xdist_group(f"slurm-{r}"), id=r)
            for r in matrix_releases()]


@pytest.fixture
def three_nodes(request: pytest.FixtureRequest, runs_dir: Path) -> Iterator[Cluster]:
    release = request.node.callspec.params["nokill_release"]
    if release == HOST_RELEASE:
        cluster: NetnsCluster = request.getfixturevalue("netns_cluster")(nodes=3)
        yield Cluster(release, list(cluster.nodes), cluster.dir,
                      {**cluster.env, "HPCDL_RUNS": str(runs_dir)}, str(cluster.profile),
                      lambda name: name)
        return
    boxes = request.getfixturevalue("release_sandboxes")
    rel = boxes.get(release)
    env = {**rel.env, "HPCDL_RUNS": str(runs_dir), "SLURM_CONF": str(
        boxes.folders[release] / "etc" / "slurm.conf")}
    cluster = Cluster(release, shape.node_names(3, release), boxes.folders[release], env,
                      rel.profile, rel.command)
    try:
        yield cluster
    finally:
        # The next test of the session finds every node idle again: no job of this one
        # left, the killed node's slurmd started again and the node resumed.
        for job in cluster.slurm("squeue", "-h", "-o", "%i").split():
            cluster.slurm("scancel", job)
        boxes.restore(release, cluster.nodes[1])


def _wait_job(c: Cluster, job: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        res = c.cli("status", job, "--json")
        assert res.returncode == 0, res.stdout + res.stderr
        row = dict(json.loads(res.stdout))
        if row["state"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            return row
        if time.monotonic() > deadline:
            return row
        time.sleep(1)


def _until(what: str, cond: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not in {timeout:.0f} s"
        time.sleep(0.5)


@pytest.mark.parametrize("found_by", ["guard", "slurm"])
@pytest.mark.parametrize("nokill_release", _releases())
def test_the_relaunch_after_a_node_death_gets_every_cpu_and_gpu(
        nokill_release: str, found_by: str, three_nodes: Cluster, runs_dir: Path) -> None:
    c = three_nodes
    a, b, spare = c.nodes
    runs_dir.mkdir(parents=True, exist_ok=True)
    script = runs_dir / "report.sh"
    script.write_text(RANK_SCRIPT)
    stop = runs_dir / "stop"
    run = runs_dir / "nokill"
    res = c.cli("submit", "--json", "-p", c.profile, "-N", "2", "--spares", "1", "-G",
                str(GPUS), "--no-image", "--time", "00:04:00", "--run-dir", str(run), "--",
                "bash", str(script), str(stop))
    assert res.returncode == 0, res.stdout + res.stderr
    job = str(json.loads(res.stdout.strip().splitlines()[-1])["job_id"])
    out, err = run / f"slurm-{job}.out", run / f"slurm-{job}.err"

    def first_step_up() -> bool:
        text = out.read_text() if out.exists() else ""
        return len({m.group(3) for m in LINE.finditer(text) if m.group(1) == "0"}) == 2 * RANKS
    _until("the first step's ranks", first_step_up, 120)
    kill_node(c.folder, b)
    if found_by == "slurm":
        down = c.slurm("scontrol", "update", f"NodeName={b}", "State=DOWN",
                       "Reason=nokill-test")
        assert not down.strip(), down
    stop.touch()

    row = _wait_job(c, job, 200)
    log, errs = out.read_text(), err.read_text()
    evidence = (f"{c.release} ({found_by}): job {row}\n--- stdout\n{log[-4000:]}\n--- stderr\n"
                f"{errs[-4000:]}")
    if row["state"] not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
        evidence += "\n--- scontrol show job -d\n" + c.slurm("scontrol", "show", "job", "-d", job)
        evidence += "\n--- squeue -s\n" + c.slurm("squeue", "-s", "-j", job)
    print(evidence)
    assert f"hpcdl: relaunch 1 on {a},{spare} from " in errs, evidence
    assert (row["state"], row["exit_code"]) == ("COMPLETED", 0), evidence

    got: dict[tuple[int, str], dict[str, set[str]]] = {}
    for m in LINE.finditer(log):
        slot = got.setdefault((int(m.group(1)), m.group(2)), {"tasks": set(), "cpus": set(),
                                                            "step_gpus": set(), "cuda": set()})
        slot["tasks"].add(m.group(3))
        slot["cpus"].add(m.group(4))
        slot["step_gpus"].add(m.group(5))
        slot["cuda"].add(m.group(6))
    every_gpu = ",".join(str(i) for i in range(GPUS))
    whole = {"cpus": {str(CPUS)}, "step_gpus": {every_gpu}, "cuda": {every_gpu}}
    for cycle, hosts in ((0, (a, b)), (1, (a, spare))):
        assert sorted(h for (cy, h) in got if cy == cycle) == sorted(hosts), evidence
        for host in hosts:
            slot = got[(cycle, host)]
            assert len(slot["tasks"]) == RANKS, (cycle, host, slot, evidence)
            assert {k: slot[k] for k in whole} == whole, (cycle, host, slot, evidence)
    # slurmctld's own record of the relaunched step: both nodes' CPUs (its TRES holds no
    # GPUs on 22.05; the ranks' CUDA_VISIBLE_DEVICES above are the GPUs' evidence).
    steps = {int(m.group(1)): m.group(2) for m in STEP.finditer(log)}
    assert f" CPUs={2 * CPUS} Tasks={2 * RANKS} " in steps.get(1, ""), evidence
