#!/usr/bin/env python3
"""Time to detect the sandbox: on the cluster, and from a laptop over SSH (cold, warm).

Runs `hpcdl profiles detect` (this checkout, as the ordinary user, through their venv's
python) against the running default sandbox, side by side, median and range of
--repeats each:
  cluster   on the cluster: this machine's Slurm commands (SLURM_CONF / /etc/slurm)
  ssh cold  --login USER@10.77.0.250 with no master connection up: the key exchange and
            authentication are part of each run (a fresh ControlPath directory each time,
            its master stopped after)
  ssh warm  --login again with the master connection of the run before still up (what
            a second hpcdl command within ControlPersist's 5 minutes pays)
It also counts the sshd sessions of one cold run in the login node's log: one connection
carries every command. Needs root (it runs as the user with runuser), the sandbox and
its login node up (scripts/sandbox-login.sh up) and the user's key accepted there (the
tests' laptop fixture sets that up: tests/integration/test_remote_detect.py).

    python3 bench/bench_remote_detect.py [--repeats 5] [--user hpcuser] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.machine import describe, facts_line  # noqa: E402

HOST = "10.77.0.250"
SANDBOX_DIR = Path("/var/lib/hpcdl-sandbox")
VENV = Path(os.environ.get("HPCDL_TEST_USER_VENV") or "/opt/hpcdl-user/venv")


def as_user(user: str, argv: list[str], env: dict[str, str] | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
    home = Path("/home") / user
    base = {"HOME": str(home), "USER": user, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
            "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(["runuser", "-u", user, "--", "env", "-i",
                           *(f"{k}={v}" for k, v in base.items()), *argv],
                          capture_output=True, text=True, timeout=timeout, check=False,
                          cwd="/")


def sockets_dir(user: str) -> Path:
    made = as_user(user, ["mktemp", "-d", "/tmp/hpcdl-brd-XXXXXX"])
    if made.returncode != 0:
        raise SystemExit(made.stderr)
    return Path(made.stdout.strip())


def stop_master(user: str, sockets: Path) -> None:
    for socket in (sockets / "hpcdl" / "ssh").glob("*"):
        as_user(user, ["ssh", "-o", f"ControlPath={socket}", "-O", "exit", HOST], timeout=30)
    shutil.rmtree(sockets, ignore_errors=True)


def detect(user: str, python: str, login: bool, sockets: Path | None) -> float:
    argv = [python, "-m", "hpcdl", "profiles", "detect"]
    if login:
        argv += ["--login", f"{user}@{HOST}"]
    env = {"XDG_RUNTIME_DIR": str(sockets)} if sockets else {}
    t0 = time.monotonic()
    res = as_user(user, argv, env)
    took = time.monotonic() - t0
    if res.returncode != 0 or "partitions:" not in res.stdout:
        raise SystemExit(f"detect{' --login' if login else ''} failed: {res.stderr.strip()}")
    return took


def row(name: str, xs: list[float]) -> dict[str, Any]:
    return {"mode": name, "median_s": round(statistics.median(xs), 3),
            "min_s": round(min(xs), 3), "max_s": round(max(xs), 3), "runs": len(xs)}


def sessions_of_one_run(user: str, python: str) -> tuple[int, int]:
    """(connections accepted, commands run on them) in the login node's sshd log during
    one cold run."""
    log = SANDBOX_DIR / "login" / "sshd.log"
    start = log.stat().st_size
    sockets = sockets_dir(user)
    try:
        detect(user, python, True, sockets)
    finally:
        stop_master(user, sockets)
    with log.open() as text:
        text.seek(start)
        said = text.read()
    # Other sessions of the same user (tests running beside) may connect meanwhile:
    # the commands are counted on the connections accepted, not on masters already up.
    ports = re.findall(rf"Accepted publickey for {user} from \S+ port (\d+) ", said)
    return len(ports), sum(len(re.findall(rf"Starting session: command for {user} from \S+ "
                                          rf"port {port} ", said)) for port in ports)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--user", default="hpcuser", help="the ordinary user (default: hpcuser)")
    ap.add_argument("--python", default=str(VENV / "bin" / "python"),
                    help="a python with hpcdl's dependencies the user can run (default: the "
                         "tests' user venv); this checkout comes first on its path")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (runs the detection as --user with runuser)")
    reach = as_user(args.user, ["ssh", "-o", "BatchMode=yes", "-l", args.user, HOST, "true"],
                    timeout=60)
    if reach.returncode != 0:
        raise SystemExit(f"{args.user} cannot ssh to the login node {HOST} "
                         f"({reach.stderr.strip()}): scripts/sandbox-login.sh up, and run "
                         f"tests/integration/test_remote_detect.py once to trust the key")
    cluster = [detect(args.user, args.python, False, None) for _ in range(args.repeats)]
    cold = []
    for _ in range(args.repeats):
        sockets = sockets_dir(args.user)
        try:
            cold.append(detect(args.user, args.python, True, sockets))
        finally:
            stop_master(args.user, sockets)
    sockets = sockets_dir(args.user)
    try:
        detect(args.user, args.python, True, sockets)  # opens the master
        warm = [detect(args.user, args.python, True, sockets) for _ in range(args.repeats)]
    finally:
        stop_master(args.user, sockets)
    connections, sessions = sessions_of_one_run(args.user, args.python)
    rows = [row("cluster", cluster), row("ssh cold", cold), row("ssh warm", warm)]
    machine = describe(tools=("sinfo",))
    print(f"hpcdl profiles detect on the sandbox (5 partitions, 2 nodes): median of "
          f"{args.repeats}, as {args.user}")
    print(f"machine: {facts_line(machine)}")
    print(f"{'mode':<10} {'median s':>9} {'min s':>7} {'max s':>7}")
    for r in rows:
        print(f"{r['mode']:<10} {r['median_s']:>9.3f} {r['min_s']:>7.3f} {r['max_s']:>7.3f}")
    print(f"one cold --login run: {connections} SSH connection(s) accepted, {sessions} "
          f"remote commands on them (sshd log of the login node)")
    print("cluster: Slurm's commands here; ssh cold: a new master connection per run; "
          "ssh warm: the master of the run before reused. Python start-up included in all.")
    print(f"reproduce: python3 bench/bench_remote_detect.py --repeats {args.repeats}")
    if args.json_out:
        args.json_out.write_text(json.dumps({"machine": machine, "rows": rows,
                                             "connections": connections,
                                             "sessions": sessions}, indent=2) + "\n")


if __name__ == "__main__":
    main()
