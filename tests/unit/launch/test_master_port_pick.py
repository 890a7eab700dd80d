"""The batch shell's MASTER_PORT pick, run for real: the file a Slurm job stages
(RUN_DIR/job/bin/hpcdl-master-port, from the plan) is run by sh against this machine's
/proc/net/tcp, with ports held by real listening sockets.

hpcdl derives MASTER_PORT from the job id; a port something else already listens on
(the sandbox's own database sits at 15000 + 1306) must move the job to the next free
port instead of failing rank 0 with "MASTER_PORT ... already in use".
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from hpcdl.jobside.world import PORT_BASE, PORT_SPAN
from hpcdl.launch.rankenv import PORT_PICK_FILE
from hpcdl.plan import PORT_TRIES, JobRequest, build_plan
from hpcdl.profiles import load_profile


def port_file(scheduler_profile: str = "sandbox") -> str:
    """The port pick the job's batch shell runs (and exports what it prints)."""
    plan = build_plan(load_profile(scheduler_profile), JobRequest.of(nodes=1, gpus=1, command=("true",)))
    assert "MASTER_PORT=$(/bin/sh ./job/bin/hpcdl-master-port)\nexport MASTER_PORT\n" in plan.script
    return dict(plan.files.job_scripts)[PORT_PICK_FILE]


def picked(job_id: int) -> int:
    out = subprocess.run(["sh", "-c", port_file(), "hpcdl-master-port"],
                         env={"SLURM_JOB_ID": str(job_id), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=30, check=True)
    return int(out.stdout.strip())


def free_run(length: int) -> int:
    """A port P in hpcdl's range with P .. P+length-1 all free right now."""
    for start in range(PORT_BASE + 7000, PORT_BASE + PORT_SPAN - length, 97):
        with ExitStack() as stack:
            try:
                for port in range(start, start + length):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return start
    pytest.fail("no run of free ports found")


@contextmanager
def listening(*ports: int) -> Iterator[None]:
    with ExitStack() as stack:
        for port in ports:
            sock = stack.enter_context(socket.socket())
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
            sock.listen()
        yield


def taken(port: int) -> bool:
    """Whether a socket listens on ``port`` (IPv4 or IPv6), read as the pick reads it."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                return True
    return False


def test_a_free_derived_port_is_kept() -> None:
    port = free_run(1)
    assert picked(port - PORT_BASE) == port
    # The job id only counts modulo the span.
    assert picked(port - PORT_BASE + 3 * PORT_SPAN) == port


def test_a_taken_port_moves_to_the_next_free_one() -> None:
    port = free_run(3)
    with listening(port, port + 1):
        assert picked(port - PORT_BASE) == port + 2


def test_the_search_wraps_inside_the_range() -> None:
    last = PORT_BASE + PORT_SPAN - 1
    with ExitStack() as stack:
        try:
            stack.enter_context(listening(last))
        except OSError:
            # Something else listens there already: the port is taken, which is all this
            # test needs (SO_REUSEADDR below lets a mere TIME_WAIT not count as taken).
            assert taken(last), f"port {last} cannot be bound but nothing listens on it"
        got = picked(last - PORT_BASE)
    assert PORT_BASE <= got < PORT_BASE + PORT_TRIES and got != last


def test_the_file_is_the_same_for_every_slurm_profile() -> None:
    files = {port_file(name) for name in ("sandbox", "generic", "neuron", "karolina")}
    assert len(files) == 1
    assert f"-lt {PORT_TRIES} ]" in files.pop()


def test_the_pbs_script_carries_the_same_pick_inline() -> None:
    # hpcdl stages nothing for a PBS script (qsub'ed by hand): the same lines, inline,
    # from PBS's job id.
    slurm = port_file().splitlines()
    loop = [line for line in slurm if not line.startswith(("#", "echo"))]
    pbs = build_plan(load_profile("polaris"), JobRequest.of(nodes=1, gpus=1, command=("true",))).script
    lines = pbs.splitlines()
    start = lines.index("MASTER_PORT=$((15000 + ${PBS_JOBID%%.*} % 15000)) hpcdl_tries=0")
    assert lines[start + 1:start + 4] == loop[1:] and lines[start + 4] == "export MASTER_PORT"
