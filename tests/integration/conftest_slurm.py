"""Fixtures for tests against the real sandbox Slurm cluster (marker ``slurm``).

``slurm_cluster`` brings the cluster up once per session through
scripts/sandbox.sh (idempotent: a no-op when it already runs). Locally a
cluster that cannot come up skips the tests; in CI (CI=true) tests/skip_policy.py fails them.

The cluster is the one scripts/sandbox.sh's environment names (HPCDL_SANDBOX_DIR,
_SHAPE, _CTLD_PORT, ...; default /var/lib/hpcdl-sandbox). For another directory the
fixture also points SLURM_CONF at it and the ``sandbox`` profile's bind at its TmpFS
(a user profile under a private XDG_CONFIG_HOME), so the tests run unchanged against
a developer's own cluster.

``netns_cluster`` (a factory) starts a separate cluster of its own (directory, ports,
subnet, bridge, node names), each node in its own network namespace, and can slow one
node's link (``scripts/sandbox.sh shape``): for tests that need a third node or a
shaped link without touching the shared sandbox.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpcdl.sandbox import cluster_binds
from tests.conftest import require
from tests.own_cluster import (
    BUNDLED_SANDBOX_PROFILE,
    cluster_env,
    cluster_profile,
    free_port,
    free_subnet,
    netns_name,
    node_names,
    sandbox_partition_lines,
    unique_prefix,
)

REPO = Path(__file__).resolve().parents[2]
SANDBOX = REPO / "scripts" / "sandbox.sh"
CLI_TIMEOUT = 180


DEFAULT_DIR = "/var/lib/hpcdl-sandbox"


def shared_copy(folder: Path) -> Path:
    """A copy of the checkout's ``folder`` (test scripts a job runs) where the sandbox's
    nodes can read it: under the tests' temporary directory, which is on the shared
    /scratch (tests/conftest.py); the nodes do not see the checkout. One copy per xdist
    worker: another worker's copy may be rewritten while a job of this one reads it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    target = Path(tempfile.gettempdir()) / "hpcdl-test-files" / worker / folder.name
    shutil.copytree(folder, target, dirs_exist_ok=True)
    for path in (target.parent, target, *target.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return target


def sandbox_dir() -> Path:
    """The directory of the cluster the tests use (scripts/sandbox.sh's default)."""
    return Path(os.environ.get("HPCDL_SANDBOX_DIR") or DEFAULT_DIR)


def node_netns(node: str, folder: Path | None = None) -> Path | None:
    """The network namespace of ``node`` of the cluster in ``folder`` (scripts/sandbox.sh
    names it hpcdl-TAG-NODE, TAG = 6 hex digits of the SHA-1 of the directory), or None
    when that node has none (a loopback-address cluster, or the cluster is down)."""
    path = Path("/run/netns") / netns_name(folder or sandbox_dir(), node)
    return path if path.exists() else None


def redirected_sandbox_profile(folder: Path) -> str:
    """The bundled ``sandbox`` profile binding ``folder``'s TmpFS instead, where Slurm's
    PMIx keeps each job's directory (for a cluster in another directory)."""
    data = yaml.safe_load(BUNDLED_SANDBOX_PROFILE.read_text())
    data["container"]["binds"] = cluster_binds(data["container"]["binds"], folder)
    return yaml.safe_dump(data, sort_keys=False)


def _redirect_sandbox_profile(folder: Path, home: Path) -> None:
    """A user profile ``sandbox`` (under XDG_CONFIG_HOME=home): redirected_sandbox_profile."""
    target = home / "hpcdl" / "profiles" / "sandbox.yaml"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(redirected_sandbox_profile(folder))


@contextmanager
def pointed_at(conf: Path, config_home: Path) -> Iterator[None]:
    """Slurm's commands (SLURM_CONF) and hpcdl's profiles (XDG_CONFIG_HOME) at another
    cluster for the block; the caller's values back afterwards (pytest's MonkeyPatch,
    outside a test's own fixture scope)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SLURM_CONF", str(conf))
        patch.setenv("XDG_CONFIG_HOME", str(config_home))
        yield


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Start the sandbox (once per session); returns its slurm.conf."""
    require(os.geteuid() == 0, "the Slurm sandbox needs root (it starts Slurm's daemons)")
    require(shutil.which("unshare") is not None, "unshare (util-linux) is missing")
    res = subprocess.run(["bash", str(SANDBOX), "up"], capture_output=True, text=True,
                         timeout=900, check=False)
    require(res.returncode == 0,
            f"scripts/sandbox.sh up failed (exit {res.returncode}):\n{res.stdout}\n{res.stderr}")
    require(shutil.which("sbatch") is not None, "sbatch not on PATH after sandbox up")
    folder = sandbox_dir()
    conf = folder / "etc/slurm.conf"
    if str(folder) == DEFAULT_DIR:
        yield conf
        return
    home = tmp_path_factory.mktemp("xdg")
    _redirect_sandbox_profile(folder, home)
    with pointed_at(conf, home):
        yield conf


# ---- a cluster of one's own, one network namespace per node ------------------------------

def command_lines() -> Iterator[tuple[int, list[bytes]]]:
    """(pid, argv) of every process but this one (those gone meanwhile are skipped)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            yield int(entry.name), (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue


def processes_of(folder: Path) -> list[int]:
    """PIDs whose command line names this cluster's directory (its daemons, nothing else)."""
    return [pid for pid, argv in command_lines() if str(folder).encode() in b" ".join(argv)]


@dataclass
class NetnsCluster:
    """A running scripts/sandbox.sh cluster of its own, a network namespace per node."""

    dir: Path
    nodes: list[str]
    addrs: dict[str, str]
    env: dict[str, str]
    profile: Path
    log: list[str] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.dir / "etc" / "slurm.conf"

    def log_tails(self, lines: int = 25) -> str:
        """The last ``lines`` of slurmctld's and every slurmd's log: for an assertion's
        message when Slurm did something a test did not expect."""
        parts = []
        for log in sorted((self.dir / "log").glob("slurm*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {log.name}\n" + "\n".join(tail))
        return "\n".join(parts)

    def sandbox(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """``scripts/sandbox.sh ARGS`` for this cluster."""
        return subprocess.run(["bash", str(SANDBOX), *args], capture_output=True, text=True,
                              timeout=timeout, check=False, env={**os.environ, **self.env})

    def run(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """A command (sbatch, srun, hpcdl ...) with this cluster's SLURM_CONF."""
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                              check=False, env={**os.environ, **self.env})

    def shape(self, node: str, *, rate_mbit: float | None = None,
              delay_ms: float | None = None) -> None:
        """Slow ``node``'s link both ways (tc: tbf for a rate, netem for a delay)."""
        args = ["shape", node]
        if delay_ms is not None:
            args += ["--delay", f"{delay_ms:g}"]
        if rate_mbit is not None:
            args += ["--rate", f"{rate_mbit:g}"]
        res = self.sandbox(*args, timeout=60)
        assert res.returncode == 0, f"sandbox.sh {' '.join(args)}: {res.stdout}{res.stderr}"
        self.log.append(res.stdout.strip())

    def clear(self, node: str) -> None:
        """Undo ``shape`` on ``node``'s link."""
        res = self.sandbox("shape", node, "--clear", timeout=60)
        assert res.returncode == 0, f"sandbox.sh shape {node} --clear: {res.stdout}{res.stderr}"


def require_netns_tools() -> None:
    require(os.geteuid() == 0, "a Slurm cluster with network namespaces needs root")
    require(all(shutil.which(t) for t in ("slurmctld", "slurmd", "munged", "unshare",
                                          "nsenter", "ip", "tc")),
            "slurmctld/slurmd/munged/unshare/nsenter/ip/tc missing")


@contextmanager
def netns_clusters(logs: Callable[[], Path]) -> Iterator[Callable[..., NetnsCluster]]:
    """Yields ``start(nodes=3, cpus=8, accounting=False, partitions=None)``: a cluster of
    its own (directory under /tmp, free ports, a free 10.x.y.0/24, node names no other
    cluster uses), each node in its own network namespace. ``partitions`` None: one
    partition ``debug`` holding all nodes; "sandbox": the host sandbox's partitions
    (hpcdl.sandbox.cluster's default shape) over these nodes. Everything started is
    stopped when the block ends, whatever happens, and the daemons' logs are copied to
    ``logs()``; it raises AssertionError if ``down`` leaves a daemon, namespace or bridge."""
    started: list[NetnsCluster] = []

    def start(nodes: int = 3, cpus: int = 8, accounting: bool = False,
              partitions: str | None = None) -> NetnsCluster:
        folder = Path(tempfile.mkdtemp(prefix="hpcdl-nx-", dir="/tmp"))  # short: socket paths
        prefix = unique_prefix()
        subnet = free_subnet()
        names = node_names(prefix, nodes)
        addrs = {n: f"{subnet}.{10 + i}" for i, n in enumerate(names, 1)}
        lines = [f"node {n} {addrs[n]} {free_port()} {cpus} 4096 gpu:fake:4 up" for n in names]
        if partitions == "sandbox":
            lines += sandbox_partition_lines(names)
        else:
            lines.append(f"partition debug {','.join(names)} Default=YES MaxNodes={nodes} "
                         "MaxTime=00:30:00 DefaultTime=00:10:00")
        name = f"nx{prefix}"
        env = cluster_env(folder, "\n".join(lines) + "\n", name, accounting=accounting)
        profile = folder / f"{name}.yaml"
        cluster_profile(folder, name, profile)
        cluster = NetnsCluster(folder, names, addrs, env, profile)
        started.append(cluster)
        res = cluster.sandbox("up")
        require(res.returncode == 0, f"netns cluster did not start:\n{res.stdout}\n{res.stderr}")
        return cluster

    try:
        yield start
    finally:
        problems = []
        for cluster in started:
            res = cluster.sandbox("down", timeout=180)
            left = processes_of(cluster.dir)
            for pid in left:  # only processes started for this directory
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
            gone = [n for n in cluster.nodes if node_netns(n, cluster.dir) is not None]
            if res.returncode != 0 or left or gone:
                problems.append(f"{cluster.dir}: down rc {res.returncode}, daemons left {left}, "
                                f"namespaces left {gone}\n{res.stdout}{res.stderr}")
            shutil.copytree(cluster.dir / "log", logs(), dirs_exist_ok=True)
            shutil.rmtree(cluster.dir, ignore_errors=True)
        assert not problems, "\n".join(problems)


@pytest.fixture
def netns_cluster(tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[Callable[..., NetnsCluster]]:
    """Factory: ``netns_cluster(nodes=3)`` starts a cluster of its own (netns_clusters),
    partition ``debug`` (default) holding all nodes, no accounting; stopped at the end of
    the test. The daemons' logs are kept under pytest's basetemp (``cluster-logs*``): a
    failure that only CI met can be read afterwards."""
    require_netns_tools()
    with netns_clusters(lambda: tmp_path_factory.mktemp("cluster-logs")) as start:
        yield start


@pytest.fixture(scope="session")
def twin_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NetnsCluster, Path]]:
    """The session's twin of the sandbox (see sandbox_twin), started on first use:
    (the cluster, the XDG_CONFIG_HOME whose profile ``sandbox`` points at it)."""
    require_netns_tools()
    with netns_clusters(lambda: tmp_path_factory.mktemp("cluster-logs")) as start:
        cluster = start(nodes=2, accounting=True, partitions="sandbox")
        home = tmp_path_factory.mktemp("twin-xdg")
        target = home / "hpcdl" / "profiles" / "sandbox.yaml"
        target.parent.mkdir(parents=True)
        cluster_profile(cluster.dir, "sandbox", target)
        yield cluster, home


@pytest.fixture(scope="module")
def sandbox_twin(twin_cluster: tuple[NetnsCluster, Path]) -> Iterator[NetnsCluster]:
    """A second sandbox: a cluster shaped like the host sandbox (its partitions, 8 CPUs
    and 4 fake GPUs a node, accounting) under node names of its own, for modules whose
    jobs fill both nodes for minutes (time limits, preemption, sweeps, scaling) and
    need nothing of the host sandbox's own (its node names, its login, its user). While
    the module runs, Slurm's commands (SLURM_CONF) and the profile ``sandbox`` (a user
    profile under a private XDG_CONFIG_HOME) point at it. tests/parallel.py keeps every
    module that uses it in one xdist worker, one module after the other, beside the
    worker that runs the host sandbox's tests."""
    cluster, home = twin_cluster
    with pointed_at(cluster.conf, home):
        yield cluster


@pytest.fixture
def runs_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run directories of this test go under tmp_path (for the CLI and the library)."""
    path = tmp_path / "runs"
    monkeypatch.setenv("HPCDL_RUNS", str(path))
    return path


def hpcdl(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
          timeout: float = CLI_TIMEOUT) -> subprocess.CompletedProcess[str]:
    """Run the real CLI (``python -m hpcdl``) with a hard timeout."""
    return subprocess.run([sys.executable, "-m", "hpcdl", *args], capture_output=True, text=True,
                          timeout=timeout, check=False, env={**os.environ, **(env or {})},
                          cwd=cwd)


def submit_json(*args: str, **kw: Any) -> dict[str, Any]:
    """``hpcdl submit --json ...``; asserts success and returns the printed object."""
    res = hpcdl("submit", "--json", *args, **kw)
    assert res.returncode == 0, f"submit failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
    assert "Traceback" not in res.stderr
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


def wait_final(job_id: str, timeout: float = 120) -> dict[str, Any]:
    """Poll ``hpcdl status JOBID --json`` until a final state (hard timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        res = hpcdl("status", job_id, "--json")
        assert res.returncode == 0, res.stderr
        row = dict(json.loads(res.stdout))
        if row["state"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            return row
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} not finished after {timeout} s: {row}")
        time.sleep(0.5)
