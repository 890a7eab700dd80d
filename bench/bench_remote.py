#!/usr/bin/env python3
"""hpcdl from a laptop over SSH against hpcdl on the login node, on the sandbox cluster.

Three measurements, side by side in one run (as root: it runs commands as the ordinary
user hpcuser with runuser, the way tests/integration/conftest_remote.py does):

  submit   `hpcdl submit` of a small native job (--no-image -N 1 -G 0 -- sh -c 'echo hi'):
           wall time to the job id, and with --wait to the result line, N repeats each:
             local   -p sandbox as the user on this machine (Slurm on PATH, SLURM_CONF),
             laptop  -p sandbox-remote as the user on a "laptop": a mount namespace of
                     their own with no Slurm on PATH and Slurm's configuration hidden,
                     reaching the cluster only through the login node (10.77.0.250);
                     "cold" closes the SSH master connection before each repeat, "warm"
                     finds it open (hpcdl keeps it 300 s after the last command).
  polling  SSH commands per polling cycle of hpcdl's Watcher following 1, 50 and 200 held
           jobs through the sandbox-remote profile's scheduler (goal: 1), and the seconds
           per cycle (the back-off sleeps skipped: the poll's own round trip).
  bytes    `submit --json -p sandbox-remote -- python3 train.py` twice from a project
           holding ~5 MB of code: bytes_moved of each, against the size of the run
           directory's own files (goal: the second moves about those, not the code).

SSH commands are counted by a shim first on the laptop's PATH that logs each `ssh` it is
asked to run and execs /usr/bin/ssh: that includes the ssh that rsync starts (--rsh)
for each copy, and `ssh -O` requests to the master connection; a master started by
ControlPersist forks from the first ssh and is not a second invocation.

Everything it makes is named bench-remote-<tag> and removed at the end (jobs cancelled,
run directories here and on the cluster deleted).
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shlex
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import spread  # noqa: E402
from bench.machine import describe, facts_line  # noqa: E402

USER = "hpcuser"
LOGIN_HOST = "10.77.0.250"
SANDBOX = Path("/var/lib/hpcdl-sandbox")
SLURM_CONF = SANDBOX / "etc" / "slurm.conf"
# The user's hpcdl: a venv outside /home, as tests/integration/conftest_user.py makes it
# (from a wheel of the checkout); --venv or $HPCDL_TEST_USER_VENV names another.
VENV = Path(os.environ.get("HPCDL_TEST_USER_VENV") or "/opt/hpcdl-user/venv")
# The laptop's tools besides hpcdl (links to ssh, rsync, sh, ...; no Slurm command):
# made by the remote tests' fixture (tests/integration/conftest_remote.py).
LAPTOP_BIN = Path("/opt/hpcdl-laptop/bin")
# Where the laptop's project and run directories go: the nodes do not see /opt, so a job
# that read these instead of their copies on the cluster would fail.
LAPTOP_HOME = Path("/opt/hpcdl-laptop")
# The sandbox-remote profile's runs directory, as the cluster (and this machine) sees it.
REMOTE_RUNS = "hpcdl-runs"
# As root in the laptop's mount namespace: an empty tmpfs over each path up to "--",
# then the rest (runuser ... as the user).
_HIDE = ('while [ "$1" != -- ]; do mount -t tmpfs -o size=1m,mode=0755 bench-laptop "$1"; '
         'shift; done; shift; exec "$@"')
SHIM = """#!/bin/sh
# bench_remote.py: one line per ssh invocation (hpcdl's own and rsync's --rsh), then ssh.
printf '%s\\n' "$*" >> {log}
exec /usr/bin/ssh "$@"
"""
COMMAND = ("sh", "-c", "echo hi")
TRAIN = 'print("train.py: hello from", __import__("socket").gethostname())\n'


@dataclass(frozen=True)
class Person:
    """The ordinary user, on the login node (``laptop`` False: this machine, Slurm on
    PATH) or on a laptop (a mount namespace without Slurm's configuration, the ``shim``
    directory and the laptop's tools on PATH)."""

    name: str
    uid: int
    gid: int
    home: Path
    laptop: bool
    shim: Path | None = None
    sockets: Path | None = None  # XDG_RUNTIME_DIR: hpcdl's SSH master sockets, ours alone

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {"HOME": str(self.home), "USER": self.name, "LOGNAME": self.name,
               "LANG": "C.UTF-8", "SHELL": "/bin/bash"}
        if self.laptop:
            first = [str(self.shim)] if self.shim else []
            env["PATH"] = ":".join([*first, str(VENV / "bin"), str(LAPTOP_BIN)])
            if self.sockets:
                env["XDG_RUNTIME_DIR"] = str(self.sockets)
        else:
            env["PATH"] = f"{VENV / 'bin'}:/usr/local/bin:/usr/bin:/bin"
            env["SLURM_CONF"] = str(SLURM_CONF)
        return {**env, **(extra or {})}

    def hidden(self) -> list[str]:
        paths = [str(SANDBOX / "etc"), str(self.home / REMOTE_RUNS),
                 str(self.home / "hpcdl-images"), "/etc/slurm"]
        return [p for p in paths if Path(p).is_dir()]

    def argv(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
        user = ["runuser", "-u", self.name, "--", "env", "-i",
                *(f"{k}={v}" for k, v in self.env(env).items()), *argv]
        if not self.laptop:
            return user
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", _HIDE,
                "sh", *self.hidden(), "--", *user]

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
            cwd: Path | None = None, timeout: float = 300,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(self.argv(argv, env), capture_output=True, text=True,
                             timeout=timeout, cwd=str(cwd or self.home), check=False)
        if check and res.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} as {self.name} "
                               f"({'laptop' if self.laptop else 'login node'}) failed "
                               f"({res.returncode}):\n{res.stdout[-2000:]}{res.stderr[-2000:]}")
        return res

    def own(self, path: Path, mode: int = 0o755) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        os.chown(path, self.uid, self.gid)
        os.chmod(path, mode)
        return path

    def own_tree(self, path: Path) -> None:
        for folder, _dirs, names in os.walk(path):
            os.chown(folder, self.uid, self.gid)
            for name in names:
                os.chown(os.path.join(folder, name), self.uid, self.gid)


def json_line(stdout: str) -> dict[str, Any]:
    return dict(json.loads(stdout.strip().splitlines()[-1]))


class SshLog:
    """The shim's log: one line per ssh invocation (its arguments)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def lines(self) -> list[str]:
        try:
            return self.path.read_text().splitlines()
        except FileNotFoundError:
            return []

    def count(self) -> int:
        return len(self.lines())


def kind_of(line: str) -> str:
    """What an ssh invocation ran: rsync's transfer, a request to the master
    connection (-O), or the remote command's first word (squeue, sacct, sbatch...)."""
    words = line.split()
    if "rsync" in words and "--server" in words:
        return "rsync"
    cut = words.index("--") if "--" in words else len(words)
    options, rest = words[:cut], words[cut + 1:]
    if "-O" in options:
        return "ssh -O"
    return rest[0].strip("'") if rest else "?"


def master_dir(laptop: Person) -> Path:
    """Where hpcdl keeps the laptop's master sockets (hpcdl.remote.ssh.control_dir under
    the laptop's XDG_RUNTIME_DIR), made as hpcdl would."""
    assert laptop.sockets is not None
    path = laptop.sockets
    for part in ("hpcdl", "ssh"):
        path = laptop.own(path / part, 0o700)
    return path


def close_master(laptop: Person) -> None:
    """Stop every master connection the laptop has open (the sockets directory is the
    bench's own; none running is fine)."""
    for sock in master_dir(laptop).iterdir():
        if sock.is_socket():
            laptop.run(["/usr/bin/ssh", "-o", f"ControlPath={sock}", "-O", "exit", LOGIN_HOST],
                       check=False, timeout=60)


# -- 1. submit -> job id, submit --wait -> result --------------------------------------------

def submit_once(who: Person, profile: str, name: str, runs: Path, *, wait: bool,
                log: SshLog | None) -> tuple[float, dict[str, Any], list[str]]:
    argv = [str(VENV / "bin" / "hpcdl"), "submit", "-p", profile, "--no-image", "-N", "1",
            "-G", "0", "-J", name, "--json", *(["--wait"] if wait else []), "--", *COMMAND]
    before = log.count() if log else 0
    t0 = time.perf_counter()
    res = who.run(argv, env={"HPCDL_RUNS": str(runs)}, cwd=runs.parent, timeout=600)
    elapsed = time.perf_counter() - t0
    info = json_line(res.stdout)
    if wait and info.get("exit_status") != 0:
        raise RuntimeError(f"{' '.join(argv)}: the job did not succeed: {info}")
    return elapsed, info, log.lines()[before:] if log else []


def measure_submit(local: Person, laptop: Person, tag: str, work: Path, remote_work: Path,
                   log: SshLog, repeats: int, jobs: list[str]) -> list[dict[str, Any]]:
    cases = [("local (login node)", local, "sandbox", remote_work / "runs-local", None),
             ("laptop, cold ssh", laptop, "sandbox-remote", work / "runs-submit", "cold"),
             ("laptop, warm ssh", laptop, "sandbox-remote", work / "runs-submit", "warm")]
    rows = []
    for wait in (False, True):
        results: dict[str, tuple[list[float], list[int]]] = {c[0]: ([], []) for c in cases}
        kinds: dict[str, Counter[str]] = {c[0]: Counter() for c in cases}
        last: dict[str, list[str]] = {}
        for i in range(repeats):
            # Order turned each repeat, so drift in the shared sandbox hits all alike.
            for label, who, profile, runs, ssh in cases[i % 3:] + cases[:i % 3]:
                who.own(runs)
                if ssh == "cold":
                    close_master(laptop)
                elif ssh == "warm":
                    warm_master(laptop)
                name = f"bench-remote-{tag}-{'wait' if wait else 'id'}"
                seconds, info, sshs = submit_once(who, profile, name, runs, wait=wait,
                                                  log=log if who.laptop else None)
                jobs.append(str(info["job_id"]))
                results[label][0].append(seconds)
                results[label][1].append(len(sshs))
                kinds[label].update(map(kind_of, sshs))
                last[label] = sshs
        for label, (times, calls) in results.items():
            rows.append({"what": "submit --wait -> result" if wait else "submit -> job id",
                         "where": label, "n": len(times), "seconds": times, "ssh": calls,
                         "by_kind": dict(kinds[label]), "last_ssh_lines": last[label]})
    return rows


def warm_master(laptop: Person) -> None:
    """Open the master connection as hpcdl does (its own code, in the user's venv), so
    the warm case finds one."""
    laptop.run([str(VENV / "bin" / "python"), "-c", WARM], timeout=120)


WARM = ("from hpcdl.jobs.cluster import connect; from hpcdl.profiles import load_profile; "
        "connect(load_profile('sandbox-remote')).executor.run(['true'], timeout=60)")

# -- 2. SSH commands per polling cycle -------------------------------------------------------

DRIVER = r"""
import json, sys, time
from pathlib import Path
from hpcdl.jobs.follow import Watcher
from hpcdl.jobs.cluster import connect
from hpcdl.profiles import load_profile

ids, cycles, log = sys.argv[1].split(","), int(sys.argv[2]), Path(sys.argv[3])
conn = connect(load_profile("sandbox-remote"))
conn.executor.run(["true"], timeout=60)  # the master connection, before counting

def lines():
    return len(log.read_text().splitlines())

class Enough(Exception):
    pass

marks = [(time.perf_counter(), lines())]
def on_poll(pending, elapsed):
    marks.append((time.perf_counter(), lines()))
    if len(pending) != len(ids):
        raise SystemExit(f"{len(ids) - len(pending)} held jobs ended: {sorted(pending)[:5]}")
    if len(marks) > cycles:
        raise Enough

try:
    Watcher(conn.scheduler, sleep=lambda s: None).watch(ids, on_poll=on_poll)
except Enough:
    pass
print(json.dumps({"seconds": [b[0] - a[0] for a, b in zip(marks, marks[1:])],
                  "ssh": [b[1] - a[1] for a, b in zip(marks, marks[1:])],
                  "first_line": marks[0][1], "last_line": marks[-1][1]}))
"""


def hold_jobs(laptop: Person, tag: str, n: int) -> list[str]:
    """``n`` held jobs submitted in one ssh call (a loop of sbatch --hold on the login
    node), as the laptop user; their ids."""
    name = f"bench-remote-{tag}-held"
    loop = (f"for i in $(seq {n}); do sbatch --hold --parsable -N 1 -t 1 -J {name} "
            f"-o /dev/null --wrap true || exit 1; done")
    res = laptop.run(["/usr/bin/ssh", "-o", "BatchMode=yes", LOGIN_HOST, loop], timeout=600)
    ids = [line.split(";")[0].strip() for line in res.stdout.splitlines() if line.strip()]
    if len(ids) != n:
        raise RuntimeError(f"asked for {n} held jobs, got {len(ids)}: {res.stdout[-500:]}")
    return ids


def measure_polling(laptop: Person, tag: str, log: SshLog, counts: Sequence[int],
                    cycles: int, jobs: list[str]) -> list[dict[str, Any]]:
    ids = hold_jobs(laptop, tag, max(counts))
    jobs.extend(ids)
    rows = []
    for n in counts:
        res = laptop.run([str(VENV / "bin" / "python"), "-c", DRIVER, ",".join(ids[:n]),
                          str(cycles), str(log.path)], timeout=600)
        out = json_line(res.stdout)
        made = log.lines()[out["first_line"]:out["last_line"]]
        rows.append({"jobs": n, "cycles": len(out["ssh"]), "ssh": out["ssh"],
                     "seconds": out["seconds"], "by_kind": dict(Counter(map(kind_of, made)))})
    return rows


# -- 3. bytes moved by a second submit of unchanged code -------------------------------------

def code_tree(root: Path, megabytes: float) -> int:
    """train.py and a package of generated modules (random text, so rsync's compression
    cannot shrink it to nothing), ``megabytes`` in all; returns the bytes written."""
    (root / "model").mkdir(parents=True)
    (root / "train.py").write_text(TRAIN)
    total, i = len(TRAIN), 0
    while total < megabytes * 1e6:
        body = "".join(f'W{j} = "{os.urandom(48).hex()}"\n' for j in range(1000))
        (root / "model" / f"layer_{i:03d}.py").write_text(body)
        total += len(body)
        i += 1
    return total


def dir_bytes(path: Path, *, skip: str | None = None) -> int:
    total = 0
    for folder, dirs, names in os.walk(path):
        if skip is not None and Path(folder) == path:
            dirs[:] = [d for d in dirs if d != skip]
        total += sum(os.lstat(os.path.join(folder, n)).st_size for n in names)
    return total


def measure_bytes(laptop: Person, tag: str, work: Path, megabytes: float,
                  jobs: list[str]) -> dict[str, Any]:
    project = work / "project"
    written = code_tree(project, megabytes)
    laptop.own_tree(project)
    runs = laptop.own(work / "runs-bytes")
    moved: list[int] = []
    own = code = job = 0
    for i in (1, 2):
        argv = [str(VENV / "bin" / "hpcdl"), "submit", "-p", "sandbox-remote", "--no-image",
                "-N", "1", "-G", "0", "-J", f"bench-remote-{tag}-code", "--json", "--",
                "python3", "train.py"]
        res = laptop.run(argv, env={"HPCDL_RUNS": str(runs)}, cwd=project, timeout=600)
        info = json_line(res.stdout)
        jobs.append(str(info["job_id"]))
        moved.append(int(info["bytes_moved"]))
        if i == 2:
            own = dir_bytes(Path(info["run_dir"]), skip="code")
            job = dir_bytes(Path(info["run_dir"]) / "job")
            code = dir_bytes(Path(info["run_dir"]) / "code")
    return {"code_written": written, "code_copied": code, "moved": moved, "run_dir_own": own,
            "run_dir_job": job}


# -- the run ---------------------------------------------------------------------------------

def cleanup(laptop: Person, tag: str, jobs: list[str], work: Path, remote_work: Path) -> None:
    # By id, and by name for any a failure left unrecorded (a loop of sbatch cut short).
    names = ",".join(f"bench-remote-{tag}-{k}" for k in ("id", "wait", "held", "code"))
    cancel = [["scancel", *sorted(set(jobs))]] if jobs else []
    cancel.append(["scancel", "-u", laptop.name, "-n", names])
    laptop.run(["/usr/bin/ssh", "-o", "BatchMode=yes", LOGIN_HOST,
                "; ".join(shlex.join(c) for c in cancel)], check=False, timeout=120)
    close_master(laptop)
    # The cluster's copies: the profile's runs directory on the shared /home.
    remote_runs = laptop.home / REMOTE_RUNS
    for path in remote_runs.glob(f"bench-remote-{tag}-*"):
        shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(remote_work, ignore_errors=True)


def ready() -> str | None:
    """Why the bench cannot run here, or None."""
    if os.geteuid() != 0:
        return "run it as root (it runs commands as the user hpcuser with runuser)"
    try:
        pwd.getpwnam(USER)
    except KeyError:
        return f"no user {USER}: the remote tests' fixtures create it"
    for path, why in ((VENV / "bin" / "hpcdl", "the user's hpcdl venv"),
                      (LAPTOP_BIN / "ssh", "the laptop's tools"),
                      (SLURM_CONF, "the sandbox (scripts/sandbox.sh up)"),
                      (SANDBOX / "login" / "host_ed25519.pub",
                       "the login node (scripts/sandbox-login.sh up)")):
        if not path.exists():
            return f"{path} is missing: {why}; run tests/integration/test_remote.py once"
    return None


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()
                     for r in rows)


def main() -> int:
    global VENV
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--repeats", type=int, default=3, help="repeats of each submit case")
    ap.add_argument("--jobs", default="1,50,200", help="held job counts for the polling case")
    ap.add_argument("--cycles", type=int, default=5, help="polling cycles counted per count")
    ap.add_argument("--code-mb", type=float, default=5.0, help="size of the generated code")
    ap.add_argument("--skip", default="", help="comma-separated parts to leave out: "
                    "submit, polling, bytes")
    ap.add_argument("--venv", type=Path, default=VENV,
                    help="the user's venv with hpcdl installed (default: %(default)s)")
    ap.add_argument("--json-out", help="also write the raw figures here")
    args = ap.parse_args()
    VENV = args.venv
    why = ready()
    if why:
        print(f"bench_remote: {why}", file=sys.stderr)
        return 1
    skip = {s for s in args.skip.split(",") if s}
    entry = pwd.getpwnam(USER)
    tag = f"{os.getpid()}-{time.strftime('%H%M%S')}"
    home = Path(entry.pw_dir)
    local = Person(USER, entry.pw_uid, entry.pw_gid, home, laptop=False)
    work = local.own(LAPTOP_HOME / f"bench-remote-{tag}")
    remote_work = local.own(home / f"bench-remote-{tag}")  # local runs: the nodes see /home
    shim = local.own(work / "shim")
    # Short: a socket's path has a limit of about 100 bytes.
    sockets = local.own(Path(f"/tmp/bench-remote-{tag}"), 0o700)
    log = SshLog(work / "ssh.log")
    log.path.touch()
    os.chown(log.path, entry.pw_uid, entry.pw_gid)
    (shim / "ssh").write_text(SHIM.format(log=shlex.quote(str(log.path))))
    os.chmod(shim / "ssh", 0o755)
    laptop = Person(USER, entry.pw_uid, entry.pw_gid, home, laptop=True, shim=shim,
                    sockets=sockets)
    jobs: list[str] = []
    result: dict[str, Any] = {}
    try:
        warm_master(laptop)
        if "submit" not in skip:
            result["submit"] = measure_submit(local, laptop, tag, work, remote_work, log,
                                              args.repeats, jobs)
        if "polling" not in skip:
            result["polling"] = measure_polling(laptop, tag, log,
                                                [int(x) for x in args.jobs.split(",")],
                                                args.cycles, jobs)
        if "bytes" not in skip:
            result["bytes"] = measure_bytes(laptop, tag, work, args.code_mb, jobs)
    finally:
        cleanup(laptop, tag, jobs, work, remote_work)
        shutil.rmtree(sockets, ignore_errors=True)

    info = describe(tools=("sbatch", "rsync"))
    # ssh has no --version: -V, on stderr.
    info["ssh"] = subprocess.run(["ssh", "-V"], capture_output=True, text=True, timeout=30,
                                 check=False).stderr.strip()
    print("hpcdl from a laptop over SSH vs on the login node (sandbox cluster; the laptop: "
          "user hpcuser, no Slurm, login node 10.77.0.250)")
    if "submit" in result:
        print(f"\n1. submit of a native job (-N 1 -G 0 --no-image -- {shlex.join(COMMAND)}), "
              f"wall seconds, median (min-max) of {args.repeats}")
        rows = [["what", "where", "seconds", "ssh calls", "remote commands per submit"]]
        for r in result["submit"]:
            laptop_row = r["where"] != "local (login node)"
            rows.append([r["what"], r["where"], spread(r["seconds"]),
                         spread([float(s) for s in r["ssh"]], "{:.0f}") if laptop_row else "-",
                         " ".join(f"{k}={round(v / r['n'], 1):g}"
                                  for k, v in sorted(r["by_kind"].items()))])
        print(table(rows))
    if "polling" in result:
        print(f"\n2. hpcdl's Watcher following held jobs through the login node, "
              f"{args.cycles} cycles each (back-off sleeps skipped)")
        rows = [["jobs", "ssh calls / cycle", "seconds / cycle", "remote commands (all cycles)"]]
        for r in result["polling"]:
            kinds = " ".join(f"{k}={v}" for k, v in sorted(r["by_kind"].items()))
            rows.append([str(r["jobs"]), spread([float(s) for s in r["ssh"]]),
                         spread(r["seconds"], "{:.3f}"), kinds])
        print(table(rows))
        worst = max(max(r["ssh"]) for r in result["polling"])
        print(f"goal: 1 ssh call per cycle whatever the number of jobs; worst cycle: {worst}")
    if "bytes" in result:
        b = result["bytes"]
        print(f"\n3. bytes moved by `submit --json -p sandbox-remote -- python3 train.py`, "
              f"twice, unchanged code ({b['code_written'] / 1e6:.1f} MB generated, "
              f"{b['code_copied'] / 1e6:.1f} MB in the run's code/)")
        rows = [["submit", "bytes_moved"], ["first", f"{b['moved'][0]:,}"],
                ["second", f"{b['moved'][1]:,}"],
                ["run directory's own files (all but code/)", f"{b['run_dir_own']:,}"],
                ["  of which job/ (hpcdl's job-side files)", f"{b['run_dir_job']:,}"]]
        print(table(rows))
        print("goal: the second moves about the run directory's own files, not the code")
    print("\nssh calls: invocations of the ssh binary on the laptop's PATH (a logging shim), "
          "including the ssh that rsync starts for each copy and `ssh -O` requests")
    print("machine: " + facts_line(info))
    print(f"reproduce: scripts/sandbox.sh up && scripts/sandbox-login.sh up && "
          f"python3 bench/bench_remote.py --repeats {args.repeats} --jobs {args.jobs} "
          f"--cycles {args.cycles} --code-mb {args.code_mb:g} --venv {args.venv}"
          + (f" --skip {args.skip}" if args.skip else ""))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"machine": info, **result}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
