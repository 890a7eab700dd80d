"""`hpcdl profiles detect/diff` against real Slurm (marker ``slurm``).

(a) The shared sandbox, read-only: the detected profile equals the bundled sandbox.yaml
    field by field (the fields Slurm cannot know are named in EXCLUDED).
(b) A second, differently shaped real cluster started here (scripts/sandbox.sh with its
    own directory, ports, munge and shape; no slurmdbd): typed GPUs of two kinds, a
    heterogeneous partition, a partition without DefaultTime, no default partition, a
    CPU-only partition, a hidden one, a DOWN and a DRAIN partition, a DOWN node, a node
    drained for missing GRES files, a partition without nodes. For a table of requests, hpcdl's verdict with the
    detected profile is compared with Slurm's own: real submissions deferred with
    ``--begin=now+1hour`` (``--test-only`` is wrong when nodes are down), then cancelled.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpcdl.core.duration import parse_time
from hpcdl.errors import ValidationError
from hpcdl.plan import (
    JobRequest,
    build_plan,
    default_cpus_per_task,
    job_time,
    tasks_per_node,
)
from hpcdl.profiles import load_profile, load_profile_file
from hpcdl.profiles.schema import Profile
from hpcdl.schedulers.slurm.commands import sbatch_argv
from hpcdl.schedulers.slurm.script import scheduler_options
from tests.conftest import require
from tests.integration.conftest_slurm import SANDBOX, hpcdl, processes_of
from tests.own_cluster import cluster_env, free_port

# One worker for the whole module (tests/parallel.py): its second cluster has fixed node
# names and addresses (SHAPE), which a second worker's copy would clash with.
pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("profiles-detect-c2")]

# Fields a Slurm cluster cannot tell (site set-up, not scheduler facts).
EXCLUDED = {"name", "description", "modules", "env", "paths", "python", "template_dir", "examples",
            "container.binds", "container.binary", "container.default_image",
            "mpi.launcher_args", "scheduler.account", "scheduler.qos",
            "scheduler.extra_options", "partitions[].description",
            # Site policy for hpcdl submit --requeue, not a scheduler fact.
            "scheduler.requeue", "scheduler.max_restarts", "scheduler.requeue_signal",
            # What the site says its network should give (hpcdl probe compares): Slurm
            # does not know it.
            "interconnect",
            # Where hpcdl reaches the cluster from, not a Slurm fact: detect --login
            # writes what it was given (test_remote_detect checks it).
            "login"}
PARTITION_FIELDS = ["name", "nodes", "gpus_per_node", "gpu_type", "cpus_per_node",
                    "mem_per_node_gb", "node_limit", "max_seconds", "default",
                    "max_jobs_per_user", "max_gpus_per_user"]


def compared_fields(detected: Profile, bundled: Profile) -> list[tuple[str, object, object]]:
    """(field, detected, bundled) for every detectable field; max_nodes_per_job and
    max_time compared by meaning (node_limit, seconds): 'null' and the node count agree;
    an unset scheduler.release is 22.05."""
    rows: list[tuple[str, object, object]] = []
    for section in ("scheduler", "container", "mpi"):
        mine, theirs = getattr(detected, section), getattr(bundled, section)
        for field in type(mine).model_fields:
            if f"{section}.{field}" in EXCLUDED:
                continue
            a, b = getattr(mine, field), getattr(theirs, field)
            if field == "default_time":
                a, b = parse_time(a), parse_time(b)
            if f"{section}.{field}" == "scheduler.release":
                # By meaning: a profile without a release renders 22.05's scripts
                # (hpcdl/schedulers/slurm/releases.py), what detect reads off this sandbox.
                a, b = a or "22.05", b or "22.05"
            rows.append((f"{section}.{field}", a, b))
    top = set(Profile.model_fields) - {"scheduler", "container", "mpi", "partitions"}
    assert top <= EXCLUDED, f"a new top-level field needs a decision: {top - EXCLUDED}"
    assert [p.name for p in detected.partitions] == [p.name for p in bundled.partitions]
    for mine, theirs in zip(detected.partitions, bundled.partitions, strict=True):
        for field in PARTITION_FIELDS:
            rows.append((f"partitions[{mine.name}].{field}", getattr(mine, field),
                         getattr(theirs, field)))
    return rows


def test_detect_sandbox_equals_bundled_profile(slurm_cluster: Path, tmp_path: Path) -> None:
    out = tmp_path / "sandbox.yaml"
    res = hpcdl("profiles", "detect", "--name", "sandbox", "-o", str(out),
                env={"SLURM_CONF": str(slurm_cluster)})
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    detected = load_profile_file(out)
    rows = compared_fields(detected, load_profile("sandbox"))
    assert len(rows) >= 3 * len(PARTITION_FIELDS) + 5
    differing = [r for r in rows if r[1] != r[2]]
    assert differing == [], differing
    diff = hpcdl("profiles", "diff", "sandbox", env={"SLURM_CONF": str(slurm_cluster)})
    assert diff.returncode == 0, diff.stdout + diff.stderr
    cluster = os.environ.get("HPCDL_SANDBOX_CLUSTER") or "hpcdl-sandbox"
    assert diff.stdout.strip() == f"profile sandbox agrees with cluster {cluster}"


def test_no_slurm_commands_is_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    res = subprocess.run([sys.executable, "-m", "hpcdl", "profiles", "detect"], capture_output=True,
                         text=True, timeout=60, check=False, env={**os.environ, "PATH": str(empty)})
    assert res.returncode == 1
    assert res.stderr.splitlines()[0] == "error: cannot read the cluster: scontrol: command not found"
    assert "Traceback" not in res.stderr and res.stdout == ""


# ---- the second cluster ----------------------------------------------------------------

SHAPE = """\
# scripts/sandbox.sh shape: node NAME ADDR PORT CPUS MEM_MB GRES up|down|nogres
node g1 127.0.16.1 {p1} 8 4096 gpu:a100:4 up
node g2 127.0.16.2 {p2} 4 2048 gpu:v100:2 up
node c1 127.0.16.3 {p3} 4 2048 - up
node x1 127.0.16.4 {p4} 8 4096 gpu:a100:4 down
node b1 127.0.16.5 {p5} 4 2048 gpu:a100:2 nogres
partition a100 g1,x1 MaxNodes=2 MaxTime=01:00:00
partition v100 g2 MaxTime=00:30:00 DefaultTime=00:10:00
partition mixed g1,g2 MaxTime=02:00:00 DefaultTime=00:20:00
partition cpu c1 MaxTime=UNLIMITED DefaultTime=00:05:00
partition hid c1 Hidden=YES MaxTime=00:10:00
partition broken b1 MaxTime=00:10:00
partition empty - MaxTime=00:10:00
partition maint g2 MaxTime=00:30:00 State=DOWN
partition closed c1 MaxTime=00:30:00 State=DRAIN
"""


@dataclass(frozen=True)
class Cluster:
    dir: Path
    conf: Path
    env: dict[str, str]

    def run(self, *argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=False,
                              env={**os.environ, **self.env}, cwd=cwd)


@pytest.fixture(scope="module")
def second_cluster() -> Iterator[Cluster]:
    """A second real Slurm (own dir, ports, munge, shape); stopped at the end whatever happens."""
    require(os.geteuid() == 0, "a second Slurm cluster needs root")
    require(all(shutil.which(t) for t in ("slurmctld", "slurmd", "munged", "unshare")),
            "slurmctld/slurmd/munged/unshare missing (scripts/install-slurm.sh)")
    folder = Path(tempfile.mkdtemp(prefix="hpcdl-c2-", dir="/tmp"))  # short: socket paths
    ports = {f"p{i}": free_port(f"127.0.16.{i}") for i in range(1, 6)}
    env = cluster_env(folder, SHAPE.format(**ports), "c2")
    cluster = Cluster(folder, folder / "etc" / "slurm.conf", env)

    def down() -> list[int]:
        subprocess.run(["bash", str(SANDBOX), "down"], capture_output=True, text=True,
                       timeout=180, check=False, env={**os.environ, **env})
        left = processes_of(folder)
        for pid in left:  # only processes started for this directory
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        return left

    try:
        res = subprocess.run(["bash", str(SANDBOX), "up"], capture_output=True, text=True,
                             timeout=300, check=False, env={**os.environ, **env})
        require(res.returncode == 0, f"second cluster did not start:\n{res.stdout}\n{res.stderr}")
        yield cluster
    finally:
        left = down()
        shutil.rmtree(folder, ignore_errors=True)
        assert left == [], f"sandbox.sh down left daemons of {folder} running: {left}"


@pytest.fixture(scope="module")
def c2_profile(second_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Profile, str]:
    out = tmp_path_factory.mktemp("c2") / "c2.yaml"
    t0 = time.monotonic()
    res = hpcdl("profiles", "detect", "-o", str(out), env=second_cluster.env)
    assert res.returncode == 0, res.stderr
    assert time.monotonic() - t0 < 60
    return out, load_profile_file(out), res.stderr


def test_c2_detect_marks_gaps(c2_profile: tuple[Path, Profile, str]) -> None:
    path, prof, stderr = c2_profile
    assert "Traceback" not in stderr
    assert "note: GAP: qos: sacctmgr failed" in stderr  # no slurmdbd: accounting unreachable
    assert "note: partition empty: no nodes" in stderr
    assert "note: partition closed: State=DRAIN, Slurm takes no new jobs: left out" in stderr
    assert "note: no default partition" in stderr
    assert prof.default_partition is None
    mixed = prof.partition("mixed")
    assert mixed is not None and (mixed.gpus_per_node, mixed.cpus_per_node, mixed.gpu_type) == (2, 4, None)
    text = path.read_text()
    assert "heterogeneous (2: g2; 4: g1): the smallest node decides" in text
    assert "x1 DOWN" in text and "gres/gpu count reported lower than configured" in text


def test_c2_diff(second_cluster: Cluster, c2_profile: tuple[Path, Profile, str]) -> None:
    path, _prof, _ = c2_profile
    same = hpcdl("profiles", "diff", str(path), env=second_cluster.env)
    assert same.returncode == 0, same.stdout + same.stderr
    other = hpcdl("profiles", "diff", "sandbox", env=second_cluster.env)
    assert other.returncode == 1
    assert ("partition: profile sandbox partition debug does not exist on the cluster "
            "(cluster partitions: a100, broken, cpu, hid, maint, mixed, v100)") in other.stdout.splitlines()
    assert "Traceback" not in other.stderr


def test_unreachable_controller_is_one_line(second_cluster: Cluster, tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    text = second_cluster.conf.read_text()
    port = free_port()
    lines = [f"SlurmctldPort={port}" if ln.startswith("SlurmctldPort=") else ln
             for ln in text.splitlines()]
    conf.write_text("\n".join(lines) + "\n")
    res = hpcdl("profiles", "detect", env={"SLURM_CONF": str(conf)}, timeout=120)
    assert res.returncode == 1
    first = res.stderr.splitlines()[0]
    assert first.startswith("error: cannot read the cluster: ") and "Unable to contact slurm controller" in first
    assert "Traceback" not in res.stderr


# ---- hpcdl's verdict vs Slurm's, request by request -----------------------------------

# (partition or None for "let hpcdl choose", nodes, GPUs per node, time, cpus per task, why)
# "stricter": the one kind of disagreement the profile admits by design: in the
# heterogeneous partition the smallest node decides, so hpcdl refuses what only g1 can run.
REQUESTS: list[tuple[str | None, int, int, str | None, int | None, str]] = [
    ("a100", 1, 4, "00:30:00", None, "same"),
    ("a100", 2, 4, "01:00:00", None, "same"),      # x1 is DOWN: Slurm queues it
    ("a100", 3, 1, None, None, "same"),
    ("a100", 1, 5, None, None, "same"),
    ("a100", 1, 2, "01:00:01", None, "same"),
    ("a100", 1, 0, None, None, "same"),            # no DefaultTime: hpcdl passes --time
    ("a100", 1, 4, None, 2, "same"),
    ("a100", 1, 4, None, 3, "same"),
    ("a100", 2, 1, "00:10:00", 8, "same"),
    ("v100", 1, 2, None, None, "same"),
    ("v100", 1, 3, None, None, "same"),
    ("v100", 2, 1, None, None, "same"),
    ("v100", 1, 2, "00:31:00", None, "same"),
    ("v100", 1, 2, None, 2, "same"),
    ("v100", 1, 2, None, 3, "same"),
    ("mixed", 2, 2, None, None, "same"),
    ("mixed", 2, 3, None, None, "same"),
    ("mixed", 1, 4, None, None, "stricter"),
    ("mixed", 1, 3, None, None, "stricter"),
    ("mixed", 1, 2, None, 4, "stricter"),
    ("mixed", 2, 1, "02:00:00", None, "same"),
    ("mixed", 2, 2, "03:00:00", None, "same"),
    ("mixed", 3, 1, None, None, "same"),
    ("cpu", 1, 0, None, None, "same"),
    ("cpu", 1, 1, None, None, "same"),
    ("cpu", 1, 0, "7-00:00:00", None, "same"),     # MaxTime=UNLIMITED
    ("cpu", 1, 0, None, 4, "same"),
    ("cpu", 1, 0, None, 5, "same"),
    ("cpu", 2, 0, None, None, "same"),
    ("hid", 1, 0, "00:10:00", None, "same"),
    ("hid", 1, 0, "00:11:00", None, "same"),
    ("broken", 1, 2, None, None, "same"),          # drained node: Slurm queues it
    ("broken", 1, 3, None, None, "same"),
    ("empty", 1, 0, None, None, "same"),           # no nodes: left out of the profile
    ("nosuch", 1, 1, None, None, "same"),
    ("maint", 1, 2, None, None, "same"),           # State=DOWN partition: Slurm queues it
    ("closed", 1, 0, None, None, "same"),          # State=DRAIN: left out of the profile
    (None, 1, 4, None, None, "same"),
    (None, 1, 0, "3-00:00:00", None, "same"),
    (None, 2, 4, "01:30:00", None, "same"),
    (None, 1, 8, None, None, "same"),
    (None, 1, 3, "01:30:00", None, "stricter"),
]


@dataclass
class Verdict:
    request: str
    hpcdl: str      # "accept (PART)" or the refusal
    slurm: str      # "accept (PART, job N)" or sbatch's error
    kind: str

    @property
    def hpcdl_ok(self) -> bool:
        return self.hpcdl.startswith("accept")

    @property
    def slurm_ok(self) -> bool:
        return self.slurm.startswith("accept")


def _describe(part: str | None, nodes: int, gpus: int, t: str | None, cpt: int | None) -> str:
    out = [f"-p {part}" if part else "(hpcdl picks)", f"-N {nodes}", f"-G {gpus}"]
    if t:
        out.append(f"-t {t}")
    if cpt:
        out.append(f"-c {cpt}")
    return " ".join(out)


def _sbatch(cluster: Cluster, argv: list[str], cwd: Path, jobs: list[str]) -> tuple[bool, str]:
    res = cluster.run("sbatch", "--parsable", "--begin=now+1hour", *argv, cwd=cwd)
    if res.returncode == 0:
        job = res.stdout.strip().split(";")[0]
        jobs.append(job)
        return True, job
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    return False, (lines[-1] if lines else f"exit {res.returncode}").replace("sbatch: error: ", "")


def _equivalent(prof: Profile, part_name: str, req: JobRequest) -> list[str]:
    """The sbatch options hpcdl would have written for ``req`` in ``part_name``."""
    part = prof.partition(part_name)
    placement = req.placement
    if part is None:  # not in the profile: the same options with Slurm's defaults
        opts = [f"--partition={part_name}", f"--nodes={placement.nodes}",
                f"--ntasks-per-node={tasks_per_node(placement.gpus)}",
                f"--cpus-per-task={placement.cpus_per_task or 1}", f"--time={placement.time or '00:05:00'}"]
        return opts + ([f"--gres=gpu:{placement.gpus}"] if placement.gpus else [])
    cpus = placement.cpus_per_task or default_cpus_per_task(part, placement.gpus)
    return scheduler_options(prof, part, nodes=placement.nodes, gpus=placement.gpus,
                             tasks_per_node=tasks_per_node(placement.gpus), cpus_per_task=cpus,
                             time_seconds=job_time(prof, part, placement))


def judge(cluster: Cluster, prof: Profile, row: tuple[str | None, int, int, str | None, int | None, str],
          work: Path, jobs: list[str]) -> Verdict:
    part, nodes, gpus, t, cpt, kind = row
    req = JobRequest.of(nodes=nodes, gpus=gpus, partition=part, time=t, cpus_per_task=cpt,
                     job_name="hpcdl-judge", command=("true",))
    label = _describe(part, nodes, gpus, t, cpt)
    try:
        plan = build_plan(prof, req)
    except ValidationError as exc:
        hpcdl_says = f"refuse: {exc.message}"
        # Slurm judges the same request: in the named partition, or in any partition.
        names = [part] if part else [p.name for p in prof.partitions]
        answers = []
        for name in names:
            ok, msg = _sbatch(cluster, ["--output=/dev/null", *_equivalent(prof, name, req),
                                        "--wrap=true"], work, jobs)
            if ok:
                return Verdict(label, hpcdl_says, f"accept ({name}, job {msg})", kind)
            answers.append(msg)
        return Verdict(label, hpcdl_says, f"refuse: {answers[0]}", kind)
    # hpcdl accepts: Slurm judges the very script hpcdl rendered.
    script = work / f"job-{len(jobs)}-{time.monotonic_ns()}.sbatch"
    script.write_text(plan.script)
    argv = sbatch_argv(script, plan.spec.job_name)[2:]  # drop "sbatch --parsable": _sbatch adds them
    ok, msg = _sbatch(cluster, argv, work, jobs)
    slurm_says = f"accept ({plan.spec.partition.name}, job {msg})" if ok else f"refuse: {msg}"
    return Verdict(label, f"accept ({plan.spec.partition.name})", slurm_says, kind)


def format_table(rows: list[Verdict]) -> str:
    lines = ["| # | request | hpcdl (detected profile) | Slurm (sbatch --begin=now+1hour) | agree |",
             "|---|---|---|---|---|"]
    for i, v in enumerate(rows, 1):
        agree = "yes" if v.hpcdl_ok == v.slurm_ok else "no: hpcdl stricter (smallest node)"
        lines.append(f"| {i} | {v.request} | {v.hpcdl} | {v.slurm} | {agree} |")
    return "\n".join(lines)


def test_detected_profile_accepts_what_slurm_accepts(
    second_cluster: Cluster, c2_profile: tuple[Path, Profile, str], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _path, prof, _ = c2_profile
    jobs: list[str] = []
    try:
        verdicts = [judge(second_cluster, prof, row, tmp_path, jobs) for row in REQUESTS]
    finally:
        if jobs:
            second_cluster.run("scancel", *jobs)
    table = format_table(verdicts)
    (tmp_path / "requests.md").write_text(table + "\n")
    with capsys.disabled():
        print(f"\nhpcdl vs Slurm on cluster c2 ({len(verdicts)} requests):\n{table}")
    assert len(verdicts) >= 30
    assert sum(v.slurm_ok for v in verdicts) >= 10 and sum(not v.slurm_ok for v in verdicts) >= 10
    for v in verdicts:
        if v.kind == "same":
            assert v.hpcdl_ok == v.slurm_ok, f"{v.request}: hpcdl {v.hpcdl}; Slurm {v.slurm}"
        else:  # by design: refused by hpcdl, runnable on the larger node only
            assert not v.hpcdl_ok and v.slurm_ok, f"{v.request}: hpcdl {v.hpcdl}; Slurm {v.slurm}"
    # Cancelled, not run: nothing of the table may start on the cluster.
    left = second_cluster.run("squeue", "-h", "-t", "RUNNING,COMPLETED", "-o", "%i")
    assert left.stdout.strip() == ""


# ---- a third cluster with accounting: per-user limits from sacctmgr ------------------------

ACCOUNTING_SHAPE = """\
node q1 127.0.16.11 {p1} 8 4096 gpu:fake:4 up
partition main q1 Default=YES MaxTime=01:00:00 DefaultTime=00:10:00
"""


def test_qos_limits_come_from_sacctmgr(tmp_path: Path) -> None:
    """Own slurmdbd + MariaDB (as the sandbox has): QOS normal gets per-user limits with
    sacctmgr, and detect writes them into every partition that uses it."""
    require(os.geteuid() == 0, "a Slurm cluster with accounting needs root")
    require(all(shutil.which(t) for t in ("slurmctld", "slurmdbd", "mariadbd", "sacctmgr")),
            "slurmdbd/MariaDB missing (scripts/install-slurm.sh)")
    folder = Path(tempfile.mkdtemp(prefix="hpcdl-c3-", dir="/tmp"))
    env = cluster_env(folder, ACCOUNTING_SHAPE.format(p1=free_port("127.0.16.11")), "c3",
                      accounting=True)
    cluster = Cluster(folder, folder / "etc" / "slurm.conf", env)
    try:
        up = subprocess.run(["bash", str(SANDBOX), "up"], capture_output=True, text=True,
                            timeout=300, check=False, env={**os.environ, **env})
        require(up.returncode == 0, f"accounting cluster did not start:\n{up.stdout}\n{up.stderr}")
        # slurmctld registers the gres/gpu TRES with slurmdbd shortly after it starts.
        deadline = time.monotonic() + 60
        while True:
            res = cluster.run("sacctmgr", "-i", "modify", "qos", "where", "name=normal", "set",
                              "MaxTRESPerUser=gres/gpu=2", "MaxJobsPerUser=3")
            if res.returncode == 0:
                break
            assert time.monotonic() < deadline, f"sacctmgr modify qos failed: {res.stdout}{res.stderr}"
            time.sleep(1)
        out = tmp_path / "c3.yaml"
        det = hpcdl("profiles", "detect", "-o", str(out), env=env)
        assert det.returncode == 0, det.stderr
        assert "GAP" not in det.stderr
        main = load_profile_file(out).partition("main")
        assert main is not None
        assert (main.max_gpus_per_user, main.max_jobs_per_user, main.default) == (2, 3, True)
        assert "QOS normal, Slurm's default (sacctmgr show qos) MaxTRESPU gres/gpu=2" in out.read_text()
        # With the detected profile hpcdl refuses what the per-user limit forbids, naming it.
        fits = hpcdl("submit", "--profile", str(out), "-N", "1", "-G", "2", "--dry-run")
        assert fits.returncode == 0, fits.stderr
        refused = hpcdl("submit", "--profile", str(out), "-N", "1", "-G", "4", "--dry-run")
        assert refused.returncode == 2
        assert refused.stderr.startswith("error: gpus: 1 nodes x 4 GPUs = 4 exceeds partition "
                                         "main's per-user limit of 2 GPUs")
    finally:
        subprocess.run(["bash", str(SANDBOX), "down"], capture_output=True, text=True,
                       timeout=180, check=False, env={**os.environ, **env})
        left = processes_of(folder)
        for pid in left:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        shutil.rmtree(folder, ignore_errors=True)
    assert left == [], f"sandbox.sh down left daemons of {folder} running: {left}"

