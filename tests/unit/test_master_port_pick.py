"""The batch shell's MASTER_PORT pick, run for real: the block rendered into every job
script is cut out of the script and run by sh against this machine's /proc/net/tcp,
with ports held by real listening sockets.

hpcdl derives MASTER_PORT from the job id; a port something else already listens on
(the sandbox's own database sits at 15000 + 1306) must move the job to the next free
port instead of failing rank 0 with "MASTER_PORT ... already in use".
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest

from hpcdl.launch.world import PORT_BASE, PORT_SPAN
from hpcdl.plan import PORT_TRIES, JobRequest, build_plan
from hpcdl.profiles import load_profile


def port_block(scheduler_profile: str = "sandbox") -> str:
    """The lines of the rendered script that set MASTER_PORT."""
    script = build_plan(load_profile(scheduler_profile),
                        JobRequest(nodes=1, gpus=1, command=("true",))).script
    lines = script.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("MASTER_PORT="))
    end = lines.index("export MASTER_PORT")
    return "\n".join(lines[start:end + 1])


def picked(job_id: int) -> int:
    out = subprocess.run(["sh", "-c", port_block() + '\necho "$MASTER_PORT"'],
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
            sock.bind(("127.0.0.1", port))
            sock.listen()
        yield


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
            pytest.skip(f"port {last} is taken on this machine")
        got = picked(last - PORT_BASE)
    assert PORT_BASE <= got < PORT_BASE + PORT_TRIES and got != last


def test_the_block_is_the_same_for_every_slurm_profile() -> None:
    blocks = {port_block(name) for name in ("sandbox", "generic", "neuron", "karolina")}
    assert len(blocks) == 1
    assert f"-lt {PORT_TRIES} ]" in blocks.pop()
