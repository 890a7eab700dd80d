"""Requeue on every release sandbox (issue 41; issue 42's batch host death): real jobs of
hpcdl's (``submit --requeue --no-image``) on the 24.11 and 26.05 release sandboxes
(conftest_releases: 3 nodes, the session's; a killed node is brought back afterwards),
whose ranks are a bash script that only says where and when it runs, marks its first
step done (HPCDL_PROGRESS_FILE) and, in the first attempt, waits for the requeue flag
and exits 85 as a checkpointing rank does. What ends the first attempt is real:

- a node dies (every process in its network namespace killed) and Slurm is told it is
  down 1 s later (drained, then ``scontrol update State=DOWN``: what slurmctld does
  itself after SlurmdTimeout,
  300 s by default, a site's setting): the batch host (no job-side guard can see its
  death) or the other node (the NODE_FAIL requeue without spares). On 26.05 the
  sandbox's slurm.conf enables ``--requeue=expedite`` (SlurmctldParameters=
  enable_expedited_requeue, hpcdl.sandbox.cluster.Cluster.expedited_requeue) and the
  profile says so, so hpcdl asks for it: the job is requeued at the front and starts
  again at once, with no hold, on the two nodes left. On 24.11 the plain requeue: the
  test lets the requeued job go from Slurm's hold (StartTime=now) as the 22.05 tests do.
  The time from the kill to the next attempt's first rank is printed (`-s` shows it).
- preemption: a job of the urgent partition takes the nodes of the job in lowprio (the
  release sandboxes have the host sandbox's pair, hpcdl/sandbox/__init__.py).
- a time limit: the signal 90 s before a 2-minute limit.
- a job that hpcdl does not requeue (its first attempt fails before its first step, or it
  runs out of --max-restarts) ends FAILED, not held: on 26.05 with expedite Slurm itself
  requeues, held for good (REQUEUE_HOLD), a job whose batch script ends non-zero, unless
  the script says Requeue=0 first (templates/sbatch.sh.j2's hpcdl_final).

The same cases on 22.05 (host sandbox and clusters of their own, with the bundled
example in the image): tests/integration/test_requeue.py (preemption, time limit, a
start-up failure, --max-restarts), test_spares.py (NODE_FAIL requeue without spares,
the non-batch node; 22.05 has no expedite). The batch host's death (and the other
node's) on 22.05 is here: ``test_a_dead_node_requeues_the_job_without_it[22.05]``, in a
3-node cluster of the test's own (``netns_cluster``: killing a node of the shared
sandbox would disturb every other test of it), the plain requeue and Slurm's hold let go
as on 24.11.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hpcdl import sandbox as shape
from hpcdl.data.packed import SQUASHFS_MAGIC
from hpcdl.jobside.requeue import EXIT_REQUEUE, FLAG_ENV, PROGRESS_ENV
from hpcdl.schedulers.slurm.releases import profile_behaviour
from tests.integration.conftest_releases import (
    HOST_RELEASE,
    matrix_releases,
    release_command,
)
from tests.integration.conftest_slurm import hpcdl
from tests.own_cluster import kill_node

pytestmark = [pytest.mark.slurm, pytest.mark.slurm_matrix, pytest.mark.timeout(600)]

# Every rank: where and when it runs (epoch seconds, the host's clock: the nodes are
# namespaces of this machine). The first attempt's ranks wait for the requeue flag and
# exit 85 (checkpointed, requeue me); a later attempt's end at once.
RANK_SCRIPT = rf"""#!/bin/bash
set -u
attempt=${{SLURM_RESTART_COUNT:-0}}
echo "matrix attempt=$attempt host=$(hostname -s) task=$SLURM_PROCID t=$(date +%s.%N)"
if [[ $SLURM_PROCID == 0 ]]; then touch "${PROGRESS_ENV}"; fi
if [[ $attempt == 0 ]]; then
  for _ in $(seq 1500); do
    if [[ -e ${{{FLAG_ENV}:-/nonexistent}} ]]; then
      echo "matrix checkpoint attempt=$attempt task=$SLURM_PROCID"
      exit {EXIT_REQUEUE}
    fi
    sleep 0.2
  done
  exit 4
fi
"""
LINE = re.compile(r"matrix attempt=(\d+) host=(\S+) task=(\d+) t=([\d.]+)")
DONE = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "REQUEUE_HOLD")


@dataclass
class Box:
    """One release sandbox as these tests use it."""

    release: str
    profile: str
    folder: Path
    env: dict[str, str]
    command: Callable[[str], str]
    nodes: list[str]
    killed: list[str] = field(default_factory=list)

    @property
    def expedite(self) -> bool:
        return profile_behaviour(self.release).requeue_expedite

    def cli(self, *args: str, timeout: float = 180):  # type: ignore[no-untyped-def]
        return hpcdl(*args, env=self.env, timeout=timeout)

    def slurm(self, name: str, *args: str) -> str:
        """A Slurm command of this release on this cluster: its stdout and stderr."""
        return release_command(self.command(name), *args, env=self.env)

    def submit(self, run: Path, *args: str) -> str:
        res = self.cli("submit", "--json", "-p", self.profile, "--no-image", "--requeue",
                       "--run-dir", str(run), *args)
        assert res.returncode == 0, res.stdout + res.stderr
        return str(json.loads(res.stdout.strip().splitlines()[-1])["job_id"])

    def squeue(self, job: str) -> str:
        """STATE|REASON|NODES of ``job``; empty once squeue forgot it."""
        return self.slurm("squeue", "-h", "-j", job, "-o", "%T|%r|%N").strip()

    def show(self, job: str) -> str:
        return self.slurm("scontrol", "show", "job", job)


def _releases(host: bool = False) -> list:  # type: ignore[type-arg]
    # Each case in its release's xdist group (tests/parallel.py): one worker per cluster.
    # With ``host``, 22.05 too, in a 3-node cluster of the test's own: anywhere.
    return [pytest.param(r, marks=() if r == HOST_RELEASE else
                         pytest.mark.xdist_group(f"slurm-{r}"), id=r)
            for r in matrix_releases() if host or r != HOST_RELEASE]


@pytest.fixture
def box(request: pytest.FixtureRequest, runs_dir: Path) -> Iterator[Box]:
    release = request.node.callspec.params["requeue_release"]
    runs_dir.mkdir(parents=True, exist_ok=True)
    (runs_dir / "ranks.sh").write_text(RANK_SCRIPT)
    if release == HOST_RELEASE:
        # A node killed in the shared sandbox would disturb every other test of it: 22.05
        # gets a 3-node cluster of its own (network namespaces, its own node names),
        # stopped at the end of the test, the killed node with it.
        own = request.getfixturevalue("netns_cluster")(nodes=3)
        yield Box(release, str(own.profile), own.dir, {**own.env, "HPCDL_RUNS": str(runs_dir)},
                  lambda name: name, list(own.nodes))
        return
    boxes = request.getfixturevalue("release_sandboxes")
    rel = boxes.get(release)
    env = {**rel.env, "HPCDL_RUNS": str(runs_dir),
           "SLURM_CONF": str(boxes.folders[release] / "etc" / "slurm.conf")}
    b = Box(release, rel.profile, boxes.folders[release], env, rel.command,
            shape.node_names(3, release))
    try:
        yield b
    finally:
        # The next test finds every node idle: no job of this one left, a killed node's
        # slurmd started again and the node resumed.
        for job in b.slurm("squeue", "-h", "-o", "%i").split():
            b.slurm("scancel", job)
        for node in b.killed:
            boxes.restore(release, node)


def _ranks(run: Path, job: str) -> list[tuple[int, str, int, float]]:
    out = run / f"slurm-{job}.out"
    text = out.read_text() if out.exists() else ""
    return [(int(m.group(1)), m.group(2), int(m.group(3)), float(m.group(4)))
            for m in LINE.finditer(text)]


def _until(what: str, cond: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not in {timeout:.0f} s"
        time.sleep(0.2)


# slurmd refuses a job's new credential in the second its old one was revoked ("Job
# credential revoked": the next attempt fails at once): a held attempt is let go this
# long after it was first seen held (as tests/integration/test_requeue.py does).
RELEASE_AFTER_S = 2.0
# From a node's death to Slurm's DOWN (Slurm's own: SlurmdTimeout, 300 s by default).
DOWN_AFTER_S = 1.0


def _follow(b: Box, job: str, release_hold: bool, timeout: float = 240,
            ready: Callable[[], bool] = lambda: True) -> list[str]:
    """Until ``job`` has ended; with ``release_hold``, a requeued attempt held by Slurm
    (BeginTime, ~2 min) is let go (StartTime=now) RELEASE_AFTER_S after it was first
    seen held, once ``ready()``. Returns the distinct squeue STATE|REASON seen."""
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    held_since: float | None = None
    while True:
        row = b.squeue(job)
        state = row.rsplit("|", 1)[0] if row else ""
        if state and state not in seen:
            seen.append(state)
        if state == "PENDING|BeginTime":
            held_since = held_since or time.monotonic()
            if release_hold and time.monotonic() - held_since >= RELEASE_AFTER_S and ready():
                b.slurm("scontrol", "update", f"jobid={job}", "StartTime=now")
        else:
            held_since = None
        if not state or state.split("|")[0] in DONE:
            return seen
        assert time.monotonic() < deadline, f"job {job}: {row} (seen: {seen})\n" + \
            _evidence(b, Path(b.show(job).split("StdOut=")[-1].split()[0]).parent, job)
        time.sleep(0.5)


def _status(b: Box, job: str) -> dict:
    res = b.cli("status", job, "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    return dict(json.loads(res.stdout))


def _evidence(b: Box, run: Path, job: str) -> str:
    logs = "".join(f"--- {p.name}\n{p.read_text()[-3000:]}\n" for p in sorted(run.glob("slurm-*")))
    ctld = b.folder / "log" / "slurmctld.log"
    tail = "".join(ctld.read_text().splitlines(True)[-60:]) if ctld.exists() else ""
    return f"{b.release}: scontrol show job\n{b.show(job)}\n{logs}--- slurmctld.log\n{tail}"


@pytest.mark.parametrize("victim", ["batch-host", "other-node"])
@pytest.mark.parametrize("requeue_release", _releases(host=True))
def test_a_dead_node_requeues_the_job_without_it(requeue_release: str, victim: str, box: Box,
                                                 runs_dir: Path) -> None:
    """A node of a 2-node ``--requeue`` job dies; the next attempt runs on the two nodes
    left. 26.05: ``--requeue=expedite``, no hold, the test releases nothing. 22.05: in a
    3-node cluster of the test's own (the other node's death has its 22.05 case with the
    image in test_spares.py too)."""
    b = box
    run = runs_dir / "run"
    job = b.submit(run, "-N", "2", "-G", "0", "--time", "00:05:00", "--", "bash",
                   str(runs_dir / "ranks.sh"))
    _until("the first attempt's ranks", lambda: len(_ranks(run, job)) == 2, 120)
    shown = b.show(job)
    if b.expedite:
        assert "--requeue=expedite" in (run / "job.sbatch").read_text()
        assert "ExpeditedRequeue=Yes" in shown, shown
    batch = re.search(r"BatchHost=(\S+)", shown)
    assert batch, shown
    first = sorted(h for _, h, _, _ in _ranks(run, job))
    dead = batch.group(1) if victim == "batch-host" else next(h for h in first
                                                               if h != batch.group(1))
    b.killed.append(dead)
    died = kill_node(b.folder, dead)
    # Drained first, then down: an answer the dead slurmd gave before the kill, handled
    # by slurmctld after the DOWN, "returned the node to service" (ReturnToService=2;
    # seen on 26.05 twice, 50 and 215 ms after the DOWN, in the first test after the
    # cluster started: its first ping round) and the requeued job was given the dead
    # node again and hung there COMPLETING. The drain stays (the restore resumes it);
    # Slurm's own detection comes SlurmdTimeout later, long after any such answer.
    time.sleep(DOWN_AFTER_S)
    for state in ("DRAIN", "DOWN"):
        down = b.slurm("scontrol", "update", f"NodeName={dead}", f"State={state}",
                       "Reason=matrix-node-death")
        assert not down.strip(), down
    downed = time.time()
    seen = _follow(b, job, release_hold=not b.expedite)
    evidence = f"{_evidence(b, run, job)}\nsqueue saw: {seen}"
    shown = b.show(job)
    assert "JobState=COMPLETED" in shown and "Restarts=1" in shown, evidence
    later = [r for r in _ranks(run, job) if r[0] == 1]
    hosts = sorted(h for _, h, _, _ in later)
    assert len(later) == 2 and dead not in hosts, evidence
    assert hosts == sorted(n for n in b.nodes if n != dead), evidence
    if b.expedite:
        # Requeued at the front, not held: never pending behind a BeginTime.
        assert not any("BeginTime" in s for s in seen), evidence
    back = min(t for *_, t in later)
    print(f"MEASURE {b.release} {victim}: kill -> next attempt's first rank {back - died:.1f} s"
          f", DOWN -> first rank {back - downed:.1f} s "
          f"({'expedite' if b.expedite else 'plain requeue, hold released by the test'}; "
          f"squeue saw {seen})")


@pytest.mark.parametrize("requeue_release", _releases())
def test_a_preempted_job_checkpoints_and_requeues(requeue_release: str, box: Box,
                                                  runs_dir: Path) -> None:
    """lowprio's job, every CPU of 2 nodes, preempted by urgent's on the same nodes: the
    ranks see the flag, exit 85, the job requeues (PREEMPTED, no restart spent) and the
    next attempt completes."""
    b = box
    run = runs_dir / "run"
    job = b.submit(run, "-N", "2", "-G", "0", "-c", "8", "--partition", "lowprio",
                   "--time", "00:05:00", "--", "bash", str(runs_dir / "ranks.sh"))
    _until("the first attempt's ranks", lambda: len(_ranks(run, job)) == 2, 120)
    nodes = ",".join(sorted(h for _, h, _, _ in _ranks(run, job)))
    urgent = b.slurm("sbatch", "--parsable", "-p", "urgent", "-N", "2", "-w", nodes,
                     "--ntasks-per-node=1", "-c", "8", "-t", "1", "-o", "/dev/null",
                     "--wrap", "sleep 1").strip()
    assert urgent.split(";")[0].isdigit(), urgent
    # The requeued attempt goes once urgent's job is done: released earlier, it may take
    # the nodes first and be preempted again.
    seen = _follow(b, job, release_hold=True, ready=lambda: not b.squeue(urgent.split(";")[0]))
    evidence = f"{_evidence(b, run, job)}\nsqueue saw: {seen}"
    status = _status(b, job)
    assert status["state"] == "COMPLETED", f"{status}\n{evidence}"
    # 24.11 once requeued the completed attempt again by itself (it ended 6 s after the
    # preemption, inside lowprio's GraceTime of 60 s) and ran a third one, which completed
    # too: more attempts are allowed, each of them COMPLETED.
    reasons = [a["reason"] for a in status["attempts"]]
    assert reasons[0] == "PREEMPTED" and set(reasons[1:]) == {"COMPLETED"}, evidence
    log = (run / f"slurm-{job}.out").read_text()
    assert "matrix checkpoint attempt=0" in log, evidence
    # The job requeued itself and stays requeueable (26.05: its first shell, TERMed by the
    # requeue, ran on and must not have set Requeue=0: hpcdl_final).
    assert "Requeue=1 " in b.show(job), evidence


@pytest.mark.parametrize("requeue_release", _releases())
def test_a_time_limit_checkpoints_and_requeues(requeue_release: str, box: Box,
                                               runs_dir: Path) -> None:
    """A 2-minute job with the signal 90 s before its limit (Slurm sends it up to 60 s
    early: 0-30 s in): TIMEOUT, requeued, and the next attempt completes."""
    b = box
    run = runs_dir / "run"
    job = b.submit(run, "-N", "1", "-G", "0", "--time", "00:02:00", "--signal", "USR1@90",
                   "--", "bash", str(runs_dir / "ranks.sh"))
    seen = _follow(b, job, release_hold=True, timeout=200)
    evidence = f"{_evidence(b, run, job)}\nsqueue saw: {seen}"
    status = _status(b, job)
    assert status["state"] == "COMPLETED", f"{status}\n{evidence}"
    assert [a["reason"] for a in status["attempts"]] == ["TIMEOUT", "COMPLETED"], evidence


@pytest.mark.parametrize("requeue_release", _releases())
def test_a_job_hpcdl_does_not_requeue_ends_failed_not_held(requeue_release: str, box: Box,
                                                           runs_dir: Path) -> None:
    """A start-up failure (one attempt) and a job out of --max-restarts (two) end FAILED
    with their exit code; on 26.05 (expedite) Slurm would otherwise hold them requeued."""
    b = box
    startup = b.submit(runs_dir / "startup", "-N", "1", "-G", "0", "--time", "00:02:00",
                       "--", "false")
    failing = b.submit(runs_dir / "failing", "-N", "1", "-G", "0", "--time", "00:02:00",
                       "--max-restarts", "1", "--", "bash", "-c",
                       f'touch "${PROGRESS_ENV}"; exit 3')
    for job, run, code, reasons in ((startup, "startup", 1, ["STARTUP"]),
                                    (failing, "failing", 3, ["FAILED", "FAILED"])):
        seen = _follow(b, job, release_hold=True, timeout=120)
        status = _status(b, job)
        evidence = f"{status}\nsqueue saw: {seen}\n{_evidence(b, runs_dir / run, job)}"
        assert (status["state"], status["exit_code"]) == ("FAILED", code), evidence
        lines = (runs_dir / run / "attempts.tsv").read_text().splitlines()
        assert [line.split("\t")[5] for line in lines] == reasons, evidence
        assert "JobState=FAILED" in b.show(job), evidence


@pytest.mark.parametrize("requeue_release", _releases())
def test_a_job_whose_dataset_mount_fails_ends_failed_not_held(requeue_release: str, box: Box,
                                                              runs_dir: Path) -> None:
    """An exit before the requeue block (the packed dataset's mount fails on the nodes:
    its file has SquashFS's magic and nothing else) ends the job FAILED with exit 1 and
    no attempt recorded; on
    26.05 (expedite) the script's hpcdl_final says Requeue=0 first, else Slurm holds the
    job requeued (REQUEUE_HOLD) for good."""
    b = box
    run = runs_dir / "mount"
    # Submit reads only the magic; squashfuse on the node refuses the rest at once.
    bad = runs_dir / "broken.sqfs"
    bad.write_bytes(SQUASHFS_MAGIC + bytes(4096))
    job = b.submit(run, "-N", "1", "-G", "0", "--time", "00:02:00", "--data", str(bad),
                   "--", "true")
    seen = _follow(b, job, release_hold=False, timeout=150)
    status = _status(b, job)
    evidence = f"{status}\nsqueue saw: {seen}\n{_evidence(b, run, job)}"
    assert (status["state"], status["exit_code"]) == ("FAILED", 1), evidence
    assert "JobState=FAILED" in b.show(job) and "Restarts=0" in b.show(job), evidence
    assert not (run / "attempts.tsv").exists(), evidence  # it never reached the block
    err = "".join(p.read_text() for p in run.glob("slurm-*"))
    assert "hpcdl: packed dataset: " in err and "no rank was started" in err, evidence
