"""The sandbox's network (scripts/sandbox.sh): each node in its own network namespace on
a per-cluster bridge, with its own address and a name that resolves; `shape` slows one
node's link; `down` removes exactly its own namespaces, veths, bridge and hosts block.

Every test starts clusters of its own (``netns_cluster``: own directory, ports, subnet,
node names), never the shared sandbox. Hard timeouts everywhere (conftest_slurm).
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.conftest_slurm import SANDBOX, NetnsCluster, node_netns

pytestmark = [pytest.mark.slurm]

ClusterFactory = Callable[..., NetnsCluster]

# A TCP sender and receiver of a fixed number of bytes (stdlib only): the receiver prints
# the rate it saw. Run in two nodes' namespaces, the bytes cross both nodes' veths.
TPUT = """\
import socket, sys, time
mode, host, port, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if mode == "recv":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port)); s.listen(1); print("listening", flush=True)
    c, _ = s.accept(); got = 0; t0 = None
    while got < size:
        b = c.recv(1 << 20)
        if not b: break
        t0 = t0 or time.monotonic(); got += len(b)
    dt = time.monotonic() - t0; c.sendall(b"k")
    print(f"mbit={got * 8 / dt / 1e6:.1f} bytes={got}", flush=True)
else:
    c = socket.create_connection((host, port), timeout=60); buf = b"x" * (1 << 16)
    for _ in range(size // len(buf)): c.sendall(buf)
    c.recv(1)
"""


def _in_node(cluster: NetnsCluster, node: str, *argv: str) -> list[str]:
    ns = node_netns(node, cluster.dir)
    assert ns is not None, f"no namespace for {node} of {cluster.dir}"
    return ["nsenter", f"--net={ns}", *argv]


def throughput(cluster: NetnsCluster, src: str, dst: str, size: int, tmp: Path) -> float:
    """Mbit/s of one TCP stream from node ``src`` to node ``dst`` (by name, resolved in
    the sender's namespace through /etc/hosts)."""
    script = tmp / "tput.py"
    script.write_text(TPUT)
    port = 20000 + os.getpid() % 10000
    recv = subprocess.Popen(_in_node(cluster, dst, sys.executable, str(script), "recv",
                                     cluster.addrs[dst], str(port), str(size)),
                            stdout=subprocess.PIPE, text=True)
    try:
        assert recv.stdout is not None
        assert recv.stdout.readline().strip() == "listening"
        subprocess.run(_in_node(cluster, src, sys.executable, str(script), "send", dst,
                                str(port), str(size)), check=True, timeout=120)
        out, _ = recv.communicate(timeout=60)
    finally:
        if recv.poll() is None:
            recv.kill()
    m = re.search(r"mbit=([\d.]+) bytes=(\d+)", out)
    assert m and int(m.group(2)) == size, out
    return float(m.group(1))


def test_each_node_has_its_own_address_name_and_namespace(netns_cluster: ClusterFactory) -> None:
    cluster = netns_cluster(nodes=3)
    names = " ".join(cluster.nodes)
    res = cluster.run("srun", "-N3", "-n3", "-t", "1", "bash", "-c",
                      "echo node=$(hostname) eth0=$(ip -4 -o addr show eth0 | awk '{print $4}') "
                      f"net=$(readlink /proc/self/ns/net) hosts=$(getent hosts {names} "
                      "| awk '{print $2 \"@\" $1}' | paste -sd, -)")
    assert res.returncode == 0, res.stdout + res.stderr
    rows = {m.group(1): m.groups()[1:] for m in re.finditer(
        r"node=(\S+) eth0=(\S+) net=(\S+) hosts=(\S+)", res.stdout)}
    assert sorted(rows) == sorted(cluster.nodes), res.stdout
    expected_hosts = ",".join(f"{n}@{cluster.addrs[n]}" for n in cluster.nodes)
    for node, (eth0, _net, hosts) in rows.items():
        assert eth0 == f"{cluster.addrs[node]}/24"
        assert hosts == expected_hosts  # every name resolves in every node
    assert len({net for _eth0, net, _hosts in rows.values()}) == 3  # three namespaces
    assert os.readlink("/proc/self/ns/net") not in {net for _e, net, _h in rows.values()}
    # ... and on the host, from the marked block of /etc/hosts.
    for node in cluster.nodes:
        assert socket.gethostbyname(node) == cluster.addrs[node]
    status = cluster.sandbox("status", timeout=60)
    assert status.returncode == 0, status.stdout + status.stderr
    for node in cluster.nodes:
        assert re.search(rf"^node-{node} +{re.escape(cluster.addrs[node])} netns hpcdl-\w+-{node}, "
                         rf"link hsv-\w+-\d+$", status.stdout, re.M), status.stdout


@pytest.mark.mpi
def test_open_mpi_traffic_crosses_the_nodes_links(netns_cluster: ClusterFactory) -> None:
    cluster = netns_cluster(nodes=2)
    tag = hashlib.sha1(str(cluster.dir).encode()).hexdigest()[:6]
    counter = Path(f"/sys/class/net/hsv-{tag}-1/statistics/rx_bytes")  # what n1 sends
    before = int(counter.read_text())
    size = 8 * 1024 * 1024  # float64s: 64 MiB per rank
    prog = ("from mpi4py import MPI; import numpy as np; c = MPI.COMM_WORLD; "
            f"a = np.ones({size}); b = np.empty_like(a); c.Allreduce(a, b); "
            "print('sum', c.rank, b[0])")
    res = cluster.run("srun", "-N2", "-n2", "--mpi=pmix", "-t", "2", sys.executable, "-c", prog,
                      timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(res.stdout.split("\n")[:2]) == ["sum 0 2.0", "sum 1 2.0"], res.stdout
    # At least the half of the vector that n1 owes n2 went over n1's veth.
    assert int(counter.read_text()) - before > size * 8 // 2


def test_shape_limits_one_nodes_rate_both_ways(netns_cluster: ClusterFactory,
                                                 tmp_path: Path) -> None:
    cluster = netns_cluster(nodes=3)
    a, b, c = cluster.nodes
    size = 4 * 1024 * 1024
    free = throughput(cluster, a, c, size, tmp_path)
    cluster.shape(c, rate_mbit=40)
    into_c = throughput(cluster, a, c, size, tmp_path)
    out_of_c = throughput(cluster, c, a, size, tmp_path)
    between_others = throughput(cluster, a, b, size, tmp_path)
    status = cluster.sandbox("status", timeout=60).stdout
    assert re.search(rf"^node-{c} .* shaped: tbf rate 40Mbit", status, re.M), status
    cluster.clear(c)
    again = throughput(cluster, a, c, size, tmp_path)
    # tbf holds the rate within a few percent; the free link is far faster (>1 Gbit/s here).
    assert 28 < into_c < 46, into_c
    assert 28 < out_of_c < 46, out_of_c
    assert free > 400 and again > 400 and between_others > 400, (free, again, between_others)


@pytest.mark.parametrize("args, message, code", [
    ([], "usage: ", 2),
    (["N1", "--rate", "5"], "sandbox: shape: node 'N1' is not a node name", 2),
    (["{n}"], "sandbox: shape: give --delay MS, --rate MBIT (or both), or --clear", 2),
    (["{n}", "--rate"], "sandbox: shape: --rate needs a value (Mbit/s)", 2),
    (["{n}", "--rate", "0"], "sandbox: shape: --rate '0' must be a number of Mbit/s from 0.01 "
                             "to 100000", 2),
    (["{n}", "--delay", "1e3"], "sandbox: shape: --delay '1e3' must be a number of milliseconds "
                                "above 0 and at most 60000", 2),
    (["{n}", "--rate", "5", "--clear"], "sandbox: shape: --clear takes no --delay or --rate", 2),
    (["{n}", "--jitter", "5"], "sandbox: shape: unknown argument '--jitter' (--delay MS, --rate "
                               "MBIT or --clear)", 2),
    (["zz9", "--rate", "5"], "sandbox: shape: node 'zz9' is not in this cluster's shape "
                             "(nodes: {nodes})", 2),
])
def test_shape_bad_input_is_one_line(args: list[str], message: str, code: int,
                                     netns_cluster: ClusterFactory) -> None:
    cluster = netns_cluster(nodes=1)
    argv = [a.format(n=cluster.nodes[0]) for a in args]
    res = cluster.sandbox("shape", *argv, timeout=60)
    assert res.returncode == code
    assert res.stderr.count("\n") == 1 and res.stdout == ""
    assert res.stderr.startswith(message.format(nodes=" ".join(cluster.nodes))), res.stderr


def test_delay_needs_netem(netns_cluster: ClusterFactory) -> None:
    """netem when the kernel has it; one line naming the missing qdisc when it has not
    (this project's machines: CONFIG_NET_SCH_NETEM is not set)."""
    cluster = netns_cluster(nodes=1)
    node = cluster.nodes[0]
    res = cluster.sandbox("shape", node, "--delay", "20", timeout=60)
    if res.returncode == 0:
        status = cluster.sandbox("status", timeout=60).stdout
        assert re.search(rf"^node-{node} .* shaped: netem .*delay 20ms", status, re.M), status
    else:
        assert res.returncode == 1
        assert res.stderr == ("sandbox: shape: --delay needs tc's netem qdisc, which this kernel "
                              "lacks (CONFIG_NET_SCH_NETEM); --rate alone works (tbf)\n")


def hosts_lines(text: str, tag: str) -> list[str]:
    """The lines of an /etc/hosts outside every sandbox block, and those of block ``tag``
    (markers included)."""
    lines, inside = [], None
    for line in text.splitlines():
        if line.startswith("# >>> hpcdl-sandbox "):
            inside = line.split()[3]
        if inside is None or inside == tag:
            lines.append(line)
        if line.startswith("# <<< hpcdl-sandbox "):
            inside = None
    return lines


def test_clusters_side_by_side_and_down_removes_only_its_own(
        netns_cluster: ClusterFactory) -> None:
    first = netns_cluster(nodes=2)
    second = netns_cluster(nodes=1)
    hosts_before = Path("/etc/hosts").read_text()
    assert hosts_before.count("# >>> hpcdl-sandbox ") >= 2
    tag = hashlib.sha1(str(first.dir).encode()).hexdigest()[:6]
    down = first.sandbox("down", timeout=180)
    assert down.returncode == 0, down.stdout + down.stderr
    assert (f"sandbox: removed hsv-{tag}-1 hsv-{tag}-2 hpcdl-{tag}-{first.nodes[0]} "
            f"hpcdl-{tag}-{first.nodes[1]} hsb-{tag} hosts block") in down.stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                           timeout=30, check=True).stdout
    assert f"hsb-{tag}" not in links and f"hsv-{tag}-" not in links
    assert all(node_netns(n, first.dir) is None for n in first.nodes)
    hosts = Path("/etc/hosts").read_text()
    assert f"# >>> hpcdl-sandbox {tag}" not in hosts
    assert all(f"{first.addrs[n]} {n}\n" not in hosts for n in first.nodes)
    # Every other line is still there, in its order: the lines outside any cluster's
    # block and the second cluster's block (other clusters, a parallel worker's, may
    # come and go meanwhile: their blocks are not this test's to compare).
    other = hashlib.sha1(str(second.dir).encode()).hexdigest()[:6]
    kept = [ln for ln in hosts_lines(hosts_before, other)
            if not any(ln == f"{first.addrs[n]} {n}" for n in first.nodes)]
    assert hosts_lines(hosts, other) == kept
    # The other cluster still runs jobs; a second down has nothing left to do.
    res = second.run("srun", "-N1", "-t", "1", "hostname")
    assert res.returncode == 0 and res.stdout.strip() == second.nodes[0], res.stdout + res.stderr
    again = first.sandbox("down", timeout=180)
    assert again.returncode == 0 and "removed" not in again.stdout, again.stdout


def test_up_recovers_after_a_crash(netns_cluster: ClusterFactory) -> None:
    cluster = netns_cluster(nodes=2)
    # A crash: the nodes' slurmd die, their namespaces stay behind.
    for node in cluster.nodes:
        pid = int((cluster.dir / "run" / f"slurmd-{node}.pid").read_text())
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{int((cluster.dir / 'run' / f'slurmd-{n}.pid').read_text())}").exists()
              for n in cluster.nodes):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert all(node_netns(n, cluster.dir) is not None for n in cluster.nodes)
    up = cluster.sandbox("up")
    assert up.returncode == 0, up.stdout + up.stderr
    assert f"started slurmd {cluster.nodes[0]} slurmd {cluster.nodes[1]}" in up.stdout
    res = cluster.run("srun", "-N2", "-t", "1", "hostname")
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(res.stdout.split()) == sorted(cluster.nodes)


def test_up_rebuilds_a_cluster_whose_running_config_differs(
        netns_cluster: ClusterFactory) -> None:
    # What CI meets on a reused machine: a sandbox started by an older sandbox.sh (or
    # another shape) still runs. 'up' must rebuild it, not run half the old cluster.
    cluster = netns_cluster(nodes=2)
    shape = Path(cluster.env["HPCDL_SANDBOX_SHAPE"])
    shape.write_text(shape.read_text() + f"partition extra {cluster.nodes[0]} MaxNodes=1\n")
    up = cluster.sandbox("up")
    assert up.returncode == 0, up.stdout + up.stderr
    assert ("sandbox: restarting: slurm.conf differs from the one slurmctld runs with "
            "(running jobs are cancelled)") in up.stdout
    assert "started" in up.stdout and "slurmctld" in up.stdout
    parts = cluster.run("sinfo", "-h", "-o", "%P").stdout.split()
    assert "extra" in parts, parts
    res = cluster.run("srun", "-N2", "-t", "1", "hostname")
    assert res.returncode == 0 and sorted(res.stdout.split()) == sorted(cluster.nodes), res.stderr
    # Nothing differs now: a second up starts nothing.
    again = cluster.sandbox("up")
    assert again.returncode == 0 and "restarting" not in again.stdout, again.stdout
    assert "already up (nothing started)" in again.stdout


def test_bad_shape_addresses_are_one_line(tmp_path: Path) -> None:
    cases = {
        "node a1 10.9.1.11 7001 8 4096 - up\nnode a2 127.0.9.2 7002 8 4096 - up\n":
            "sandbox: bad shape: node addresses mix 127.0.0.0/8 (no network namespaces) and "
            "10.9.1.0/24 (one namespace per node)",
        "node a1 10.9.1.11 7001 8 4096 - up\nnode a2 10.9.2.12 7002 8 4096 - up\n":
            "sandbox: bad shape line: node a2: address 10.9.2.12 is outside the cluster's "
            "subnet 10.9.1.0/24 (all nodes in one /24)",
        "node a1 10.9.1.1 7001 8 4096 - up\n":
            "sandbox: bad shape line: node a1: address 10.9.1.1 must end in 2-254 (.1 is the bridge)",
        "node a1 10.9.300.5 7001 8 4096 - up\n":
            "sandbox: bad shape line: node a1: address 10.9.300.5 is not an IPv4 address",
    }
    for text, message in cases.items():
        shape = tmp_path / "shape.txt"
        shape.write_text(text)
        res = subprocess.run(["bash", str(SANDBOX), "config"], capture_output=True, text=True,
                             timeout=30, check=False,
                             env={**os.environ, "HPCDL_SANDBOX_SHAPE": str(shape),
                                  "HPCDL_SANDBOX_DIR": str(tmp_path / "c")})
        assert (res.returncode, res.stderr) == (2, message + "\n"), text


@pytest.mark.apptainer
def test_hpcdl_submit_with_the_clusters_profile_runs_in_each_nodes_namespace(
        netns_cluster: ClusterFactory, cpu_image: Path, runs_dir: Path) -> None:
    """The fixture's profile works for `hpcdl submit` (what a test of `hpcdl probe` needs);
    Apptainer in a node runs in that node's namespace, where the node names resolve."""
    cluster = netns_cluster(nodes=3)
    prog = ("import socket; h = socket.gethostname(); "
            "ifs = sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]); "
            "print('seen', h, socket.gethostbyname(h), ','.join(ifs))")
    res = cluster.run(sys.executable, "-m", "hpcdl", "submit", "--profile", str(cluster.profile),
                      "-N", "3", "-G", "1", "--image", str(cpu_image), "--wait", "--",
                      "python3", "-c", prog, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    seen = sorted(set(re.findall(r"seen (\S+) (\S+) (\S+)", res.stdout)))
    assert seen == sorted((n, cluster.addrs[n], "eth0,lo") for n in cluster.nodes), res.stdout
