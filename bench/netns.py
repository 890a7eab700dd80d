"""Ports and a subnet for a benchmark's own sandbox cluster (scripts/sandbox.sh with its
own directory, ports and shape), so it never touches the shared sandbox."""

from __future__ import annotations

import random
import socket
import subprocess


def free_port() -> int:
    """A TCP port nothing listens on right now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_subnet() -> str:
    """A 10.120-127.x /24 prefix ("10.a.b") no interface of this machine uses."""
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True,
                         timeout=30, check=True).stdout
    used = {".".join(line.split()[3].split(".")[:3]) for line in out.splitlines()}
    while True:
        subnet = f"10.{random.randint(120, 127)}.{random.randint(0, 255)}"
        if subnet not in used:
            return subnet
