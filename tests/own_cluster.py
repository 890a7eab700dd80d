"""A scripts/sandbox.sh cluster of one's own (its directory, ports, shape, node names
and subnet), so a test or a benchmark that needs a third node, a shaped link or other
partitions never touches the shared sandbox. Plain functions (no pytest): the
integration tests' fixtures and the benchmarks under bench/ both build their clusters
with them. What a cluster is, and the shape file's format, is hpcdl.sandbox.cluster's.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import socket
import string
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import yaml

from hpcdl.sandbox import cluster_profile as profile_of
from hpcdl.sandbox import pick_subnet
from hpcdl.sandbox.cluster import DEFAULT_SHAPE, PARTITION_KEYS, parse_shape

BUNDLED_SANDBOX_PROFILE = (Path(__file__).resolve().parents[1] / "hpcdl" / "profiles" / "bundled"
                           / "sandbox.yaml")


def free_port(addr: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on at ``addr`` now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])


def free_subnet() -> str:
    """A /24 (``10.A.B``, A from 80 to 127) that no interface of this machine holds an
    address in (hpcdl.sandbox.pick_subnet, which `hpcdl sandbox up --nodes` uses too)."""
    res = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True,
                         timeout=30, check=True)
    return pick_subnet(res.stdout)


def unique_prefix() -> str:
    """3 random letters: with 1..N after them, node names no other cluster here uses
    (they go into /etc/hosts while the cluster runs); also its cluster name's tail."""
    return "".join(random.choices(string.ascii_lowercase, k=3))


def node_names(prefix: str, count: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(1, count + 1)]


def sandbox_partition_lines(names: list[str]) -> list[str]:
    """The host sandbox's partitions (the default shape's: debug, gpu, short, lowprio,
    urgent, with their limits, tiers and preemption) as shape lines over ``names``."""
    lines = []
    for part in DEFAULT_SHAPE.partitions:
        words = ["partition", part.name, ",".join(names)]
        for key, attr in PARTITION_KEYS.items():
            value = getattr(part, attr)
            if value is None:
                continue
            words.append(f"{key}={('YES' if value else 'NO') if isinstance(value, bool) else value}")
        lines.append(" ".join(words))
    return lines


def cluster_env(folder: Path, shape: str, cluster: str, *,
                accounting: bool = False) -> dict[str, str]:
    """Write ``folder``/shape.txt (the shape file: hpcdl.sandbox.cluster) and
    return the environment that points sandbox.sh, and through SLURM_CONF Slurm's
    commands, at this cluster: a free slurmctld port, and no accounting unless
    ``accounting`` (then free slurmdbd and MariaDB ports)."""
    (folder / "shape.txt").write_text(shape)
    env = {"HPCDL_SANDBOX_DIR": str(folder), "HPCDL_SANDBOX_SHAPE": str(folder / "shape.txt"),
           "HPCDL_SANDBOX_CTLD_PORT": str(free_port()), "HPCDL_SANDBOX_CLUSTER": cluster,
           "SLURM_CONF": str(folder / "etc" / "slurm.conf")}
    if accounting:
        env.update(HPCDL_SANDBOX_DBD_PORT=str(free_port()), HPCDL_SANDBOX_DB_PORT=str(free_port()))
    else:
        env["HPCDL_SANDBOX_ACCOUNTING"] = "none"
    return env


def cluster_profile(folder: Path, name: str, path: Path) -> None:
    """Write a profile for the cluster in ``folder`` (its shape.txt, as cluster_env
    wrote it) to ``path``: the bundled sandbox's settings, the shape's partitions, the
    cluster's TmpFS (where Slurm's PMIx keeps each job's directory) bound into the
    container (hpcdl.sandbox.cluster_profile, as `hpcdl sandbox up --nodes` does)."""
    data = profile_of(yaml.safe_load(BUNDLED_SANDBOX_PROFILE.read_text()),
                      parse_shape((folder / "shape.txt").read_text()), folder, name,
                      f"scripts/sandbox.sh cluster in {folder} (tests)")
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def netns_name(folder: Path, node: str) -> str:
    """The network namespace scripts/sandbox.sh gives ``node`` of the cluster in
    ``folder``: hpcdl-TAG-NODE, TAG = 6 hex digits of the SHA-1 of the directory."""
    return f"hpcdl-{hashlib.sha1(str(folder).encode()).hexdigest()[:6]}-{node}"


def kill_node(folder: Path, node: str) -> float:
    """A node dies: every process in its network namespace (its slurmd, the steps, the
    ranks) killed at once. Returns when (epoch seconds). Raises RuntimeError when
    nothing runs there."""
    name = netns_name(folder, node)
    pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True,
                          timeout=30, check=True).stdout.split()
    if not pids:
        raise RuntimeError(f"nothing runs in {name}")
    died = time.time()
    subprocess.run(["kill", "-KILL", *pids], check=False, timeout=30)
    return died


def wait_checkpoint(run_dir: Path, step: int, timeout: float = 300) -> None:
    """Until the bundled example's checkpoint of ``step`` exists in ``run_dir``.
    Raises RuntimeError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (run_dir / "checkpoints" / f"checkpoint-{step:08d}.pt").exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no checkpoint of step {step} in {run_dir} in {timeout:.0f} s")
        time.sleep(0.5)


# A FUSE filesystem that never answers, as a dead NFS server's hard mount hangs a node:
# the kernel's INIT is answered (else a request waits killably for it), every request
# after it is read and left unanswered. A process whose request was read waits in the
# kernel in D state, and SIGKILL does not end the wait (fuse's request_wait_answer,
# once the request is with the server); it ends when the connection is aborted: the
# server's /dev/fuse closed. One line on stdout per request read: its opcode (26 INIT,
# 1 LOOKUP, 3 GETATTR, 36 INTERRUPT, 52 STATX...).
_HUNG_FS = r"""
import ctypes, os, struct, sys
fd = os.open("/dev/fuse", os.O_RDWR)
libc = ctypes.CDLL(None, use_errno=True)
opts = f"fd={fd},rootmode=40000,user_id=0,group_id=0".encode()
if libc.mount(b"hpcdl-hung", sys.argv[1].encode(), b"fuse", ctypes.c_ulong(6), opts):  # nosuid,nodev
    sys.exit(f"mount {sys.argv[1]}: {os.strerror(ctypes.get_errno())}")
print("mounted", flush=True)
while True:
    buf = os.read(fd, 1 << 18)
    _, op, unique = struct.unpack_from("<IIQ", buf)
    print(op, flush=True)
    if op == 26:  # INIT: fuse_init_out, protocol 7.(the kernel's minor), max_write 4096
        minor = struct.unpack_from("<I", buf, 44)[0]
        body = struct.pack("<IIIIHHIIHHI28x", 7, minor, 0, 0, 0, 0, 4096, 0, 0, 0, 0)
        os.write(fd, struct.pack("<IiQ", 16 + len(body), 0, unique) + body)
"""


def blocked(folder: Path, node: str) -> list[str]:
    """The processes in ``node``'s network namespace in D state, as "PID COMM WCHAN"."""
    pids = subprocess.run(["ip", "netns", "pids", netns_name(folder, node)],
                          capture_output=True, text=True, timeout=30, check=False).stdout.split()
    out = []
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            wchan = Path(f"/proc/{pid}/wchan").read_text()
        except OSError:
            continue  # (ended meanwhile)
        if stat[stat.rindex(")") + 2] == "D":
            out.append(f"{pid} {stat[stat.index('(') + 1:stat.rindex(')')]} {wchan}")
    return out


@contextlib.contextmanager
def hung_mount(folder: Path, node: str, path: Path) -> Iterator[list[int]]:
    """``path`` hangs on ``node`` only (its mount namespace: sandbox.sh gives each node its
    own): a FUSE mount there that never answers (_HUNG_FS). Yields the opcodes of the
    requests it took, as they come. On exit the connection is aborted (its server
    KILLed: the kernel ends every waiting request with ENOTCONN) and the mount removed."""
    slurmd = (folder / "run" / f"slurmd-{node}.pid").read_text().strip()
    # (-n too: the server is one of the node's processes, which a teardown finds)
    server = subprocess.Popen(["nsenter", "-t", slurmd, "-m", "-n", sys.executable, "-c",
                               _HUNG_FS, str(path)], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    ops: list[int] = []
    try:
        if server.stdout.readline().strip() != "mounted":
            raise RuntimeError(f"no FUSE mount at {path} on {node} (exit {server.wait(30)})")

        def read() -> None:
            assert server.stdout is not None
            for line in server.stdout:
                ops.append(int(line))
        threading.Thread(target=read, daemon=True).start()
        yield ops
    finally:
        server.kill()
        server.wait(30)
        subprocess.run(["nsenter", "-t", slurmd, "-m", "umount", "-l", str(path)],
                       capture_output=True, timeout=30, check=False)
