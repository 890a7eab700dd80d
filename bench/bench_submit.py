#!/usr/bin/env python3
"""Submission overhead: `hpcdl submit` (render + validate + live check + run dir + sbatch)
against plain `sbatch` of the same rendered script, on the sandbox cluster.

Rounds of runs, their order rotating from round to round so drift hits every side alike.
Three comparisons, each against plain `sbatch --parsable SCRIPT` measured in the same rounds:
  cli      `python -m hpcdl submit -p sandbox ...`: what a user types (includes Python start-up)
  library  hpcdl.jobs.submit.submit() in this process: hpcdl's own work + sbatch
  wait     `hpcdl submit --wait` vs `sbatch --wait`: submit and follow the job to its end
With --baseline REF the CLI of git revision REF (exported with `git archive`) runs in the
same rounds as this checkout's: before and after side by side, one run. Prints medians,
hpcdl's own time (hpcdl - sbatch, the goal: 0.3 s or less), the CLI's CPU seconds (steadier
than wall time on a loaded machine), the machine, and the command to reproduce.

    python3 bench/bench_submit.py [--pairs 20] [--wait-pairs 5] [--baseline REF] [--pycache]
        [--own-cluster | --profile NAME] [--nodes 2] [--gpus 4] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import own_cluster, shared_tmp  # noqa: E402
from bench.machine import describe, facts_line  # noqa: E402
from hpcdl.jobs.submit import plan_run, submit  # noqa: E402
from hpcdl.launch.staging import stage  # noqa: E402
from hpcdl.plan import JobRequest, build_plan  # noqa: E402
from hpcdl.profiles import load_profile  # noqa: E402
from hpcdl.schedulers.slurm.adapter import SlurmScheduler  # noqa: E402

COMMAND = ("true",)
GOAL_S = 0.3  # hpcdl's own time over plain sbatch (issue 43, "hpcdl submit in a blink"; 0.5 s in issue 31)


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run(argv: list[str], timeout: float = 120, env: dict[str, str] | None = None,
        cwd: Path | None = None) -> None:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                         env=env, cwd=cwd)
    if res.returncode != 0:
        raise SystemExit(f"failed ({res.returncode}): {' '.join(argv)}\n{res.stderr}")


def child_cpu() -> float:
    """CPU seconds (user + system) of this process's waited-for children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def rounds(n: int, fns: list[Callable[[], object]]) -> list[list[float]]:
    """``n`` rounds of every fn, the order rotating by one each round; seconds per fn."""
    times: list[list[float]] = [[] for _ in fns]
    for i in range(n):
        for k in range(len(fns)):
            j = (i + k) % len(fns)
            times[j].append(timed(fns[j]))
    return times


def paired(n: int, a: Callable[[], object], b: Callable[[], object]) -> tuple[list[float], list[float]]:
    ta, tb = rounds(n, [a, b])
    return ta, tb


class Cli:
    """One hpcdl CLI (this checkout's or a baseline's) run with ``env`` in ``cwd``; records
    the CPU seconds each run took. ``cwd`` must hold no hpcdl: `python -m` puts the
    current directory before PYTHONPATH, so from a checkout every CLI would be that one."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.argv, self.env, self.cwd = argv, env, cwd
        self.cpu: list[float] = []

    def check(self, root: Path) -> None:
        """Exits unless this CLI imports hpcdl from ``root``."""
        res = subprocess.run([self.argv[0], "-c", "import hpcdl; print(hpcdl.__file__)"],
                             capture_output=True, text=True, env=self.env, cwd=self.cwd,
                             timeout=60, check=False)
        if not res.stdout.startswith(str(root) + os.sep):
            raise SystemExit(f"the CLI for {root} imports hpcdl from {res.stdout.strip()} "
                             f"{res.stderr.strip()}")

    def __call__(self, extra: tuple[str, ...] = (), timeout: float = 120) -> None:
        before = child_cpu()
        run([*self.argv[:4], *extra, *self.argv[4:]], timeout, self.env, self.cwd)
        if not extra:
            self.cpu.append(child_cpu() - before)


def programs_run(fn: Callable[[], object]) -> Counter[str]:
    """Every program ``fn`` makes hpcdl run, by name (hpcdl.core.proc.run is the one place
    hpcdl runs programs; the Slurm adapter reaches it through the local executor)."""
    from hpcdl.core import proc

    counts: Counter[str] = Counter()
    real = proc.run

    def counted(argv: Any, *a: Any, **kw: Any) -> Any:
        counts[" ".join(str(x) for x in argv[:2])] += 1
        return real(argv, *a, **kw)

    proc.run = counted  # type: ignore[assignment]
    try:
        fn()
    finally:
        proc.run = real  # type: ignore[assignment]
    return counts


def export_revision(ref: str, into: Path) -> Path:
    """hpcdl's files at git revision ``ref`` (the package and what it reads: templates,
    containers, examples) in ``into``, for PYTHONPATH; exits when ``ref`` is unknown."""
    into.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "hpcdl", "templates",
                              "containers", "examples"], capture_output=True, check=False)
    if archive.returncode != 0:
        raise SystemExit(f"--baseline {ref}: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def cli_env(path: Path, pycache: Path | None) -> dict[str, str]:
    """The environment a CLI of the checkout at ``path`` runs with: hpcdl from there;
    with ``pycache`` its bytecode cached there (as a pip install leaves it compiled)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(path), *filter(None, [os.environ.get("PYTHONPATH")])])}
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


@contextmanager
def cluster(own: bool, nodes: int, profile: str) -> Iterator[str]:
    """The profile to submit with: ``profile``, or (``own``) that of a cluster of
    ``nodes`` of its own, started here and stopped at the end (bench.common.own_cluster;
    Slurm's commands reach it through SLURM_CONF in this process's environment)."""
    if not own:
        yield profile
        return
    with own_cluster(nodes, "sub") as c:
        saved = dict(os.environ)
        os.environ.update(c["env"])
        try:
            yield str(c["profile"])
        finally:
            os.environ.clear()
            os.environ.update(saved)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=20, help="rounds for cli and library")
    ap.add_argument("--wait-pairs", type=int, default=5, help="rounds for submit --wait")
    ap.add_argument("--baseline", metavar="REF",
                    help="also time the CLI of this git revision (e.g. main, HEAD~3) in the "
                         "same rounds: before and after side by side")
    ap.add_argument("--pycache", action="store_true",
                    help="run the CLIs with their bytecode cached (PYTHONPYCACHEPREFIX in the "
                         "work directory, written by the warm-up), as a pip install leaves "
                         "hpcdl; default: this environment's setting")
    ap.add_argument("--own-cluster", action="store_true",
                    help="a Slurm cluster of --nodes nodes of its own (scripts/sandbox.sh, "
                         "started and stopped here) instead of the shared sandbox")
    ap.add_argument("--profile", default="sandbox",
                    help="the profile (name or file) of the running cluster to submit to "
                         "(default sandbox; e.g. sandbox-32n after `hpcdl sandbox up --nodes "
                         "32`, with its SLURM_CONF)")
    ap.add_argument("--nodes", type=int, default=2, help="nodes of the job (default 2)")
    ap.add_argument("--gpus", type=int, default=4, help="GPUs per node (default 4)")
    ap.add_argument("--json-out", help="also write the raw timings here")
    args = ap.parse_args()
    if not shutil.which("sbatch"):
        print("sbatch not found: start the sandbox first (scripts/sandbox.sh up)", file=sys.stderr)
        return 1
    with cluster(args.own_cluster, args.nodes, args.profile) as profile_ref:
        return measure(args, profile_ref)


def measure(args: argparse.Namespace, profile_ref: str) -> int:
    nodes, gpus = args.nodes, args.gpus
    work = shared_tmp("hpcdl-bench-submit-")  # the nodes see only /home and /scratch
    os.environ["HPCDL_RUNS"] = str(work / "runs")
    profile = load_profile(profile_ref)
    # One name for every job of this run, so that the end cancels what is still queued:
    # dozens of `true` jobs would otherwise hold the shared sandbox's queue for minutes.
    name = f"bench-submit-{os.getpid()}"
    req = JobRequest.of(nodes=nodes, gpus=gpus, command=COMMAND, job_name=name,
                     run_dir=str(work / "plain"))
    (work / "plain").mkdir()
    plan = build_plan(profile, req)  # the same script hpcdl submits (logs to work/plain)
    script = work / "plain" / "job.sbatch"
    script.write_text(plan.script)
    stage(work / "plain", plan.files.job_files, plan.files.job_scripts)  # the files the script runs
    plain = SlurmScheduler().submit_argv(script, plan.spec.job_name)
    argv = [sys.executable, "-m", "hpcdl", "submit", "-p", profile_ref, "-N", str(nodes),
            "-G", str(gpus), "-J", name, "--", *COMMAND]
    pycache = work / "pycache" if args.pycache else None
    cli = Cli(argv, cli_env(REPO, pycache), work)
    cli.check(REPO)
    base = None
    if args.baseline:
        old = export_revision(args.baseline, work / "baseline")
        base = Cli(argv, cli_env(old, pycache), work)
        base.check(old)
    lib_req = JobRequest.of(nodes=nodes, gpus=gpus, command=COMMAND, job_name=name)

    def library() -> None:
        submit(profile, plan_run(profile, lib_req), scheduler=SlurmScheduler(profile.name))

    run(plain)  # warm-up: first contact with slurmctld, page cache (and the bytecode cache)
    for one in (cli, base):
        if one is not None:
            one()
            one.cpu.clear()
    rows = []
    clis = [cli] if base is None else [cli, base]
    t_cli, *t_base, t_sb1 = rounds(args.pairs, [*clis, lambda: run(plain)])
    rows.append(("cli: hpcdl submit", t_cli, t_sb1, cli.cpu))
    if base is not None:
        rows.append((f"cli: hpcdl submit @{args.baseline}", t_base[0], t_sb1, base.cpu))
    t_lib, t_sb2 = paired(args.pairs, library, lambda: run(plain))
    rows.append(("library: submit()", t_lib, t_sb2, []))
    programs = programs_run(library)
    if args.wait_pairs:
        t_w, t_sw = paired(args.wait_pairs, lambda: cli(("--wait",), 300),
                           lambda: run([plain[0], "--wait", *plain[1:]], 300))
        rows.append(("wait: submit --wait", t_w, t_sw, []))

    info = describe(tools=("sbatch",))
    load = os.getloadavg()
    print(f"hpcdl submission overhead vs plain sbatch ({profile.name}, "
          f"{nodes} nodes x {gpus} GPUs, command {' '.join(COMMAND)}; bytecode "
          f"{'cached (--pycache)' if pycache else _bytecode_note()})")
    print(f"{'comparison':<30} {'n':>3} {'hpcdl median':>13} {'sbatch median':>14} "
          f"{'hpcdl-sbatch':>13} {'ratio':>6} {'hpcdl cpu':>10}")
    out = []
    for name, ta, tb, cpu in rows:
        ma, mb = statistics.median(ta), statistics.median(tb)
        cpu_s = f"{statistics.median(cpu):>8.2f} s" if cpu else f"{'-':>10}"
        print(f"{name:<30} {len(ta):>3} {ma * 1000:>10.1f} ms {mb * 1000:>11.1f} ms "
              f"{(ma - mb) * 1000:>10.1f} ms {ma / mb:>6.2f} {cpu_s}")
        out.append({"comparison": name, "n": len(ta), "hpcdl_median_s": ma,
                    "sbatch_median_s": mb, "own_s": ma - mb, "ratio": ma / mb,
                    "hpcdl_s": ta, "sbatch_s": tb, "cli_cpu_s": cpu})
    print(f"programs one submission runs: {sum(programs.values())} ("
          + ", ".join(f"{name} x{n}" for name, n in programs.items()) + ")")
    print(f"goal: hpcdl - sbatch <= {GOAL_S} s (and ratio <= 1.5)")
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} (1, 5, 15 min) at the end")
    print("machine: " + facts_line(info))
    flags = "".join([f" --baseline {args.baseline}" if args.baseline else "",
                     " --pycache" if args.pycache else "",
                     f" --own-cluster --nodes {nodes}" if args.own_cluster else
                     (f" --nodes {nodes}" if nodes != 2 else ""),
                     f" --profile {args.profile}"
                     if args.profile != "sandbox" and not args.own_cluster else "",
                     f" --gpus {gpus}" if gpus != 4 else ""])
    print(f"reproduce: {'' if args.own_cluster else 'scripts/sandbox.sh up && '}"
          f"python3 bench/bench_submit.py --pairs {args.pairs} --wait-pairs {args.wait_pairs}"
          f"{flags}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"machine": info, "results": out,
                                                   "programs": dict(programs)}, indent=2))
    subprocess.run(["scancel", "--name", name], capture_output=True, timeout=60, check=False)
    shutil.rmtree(work, ignore_errors=True)
    return 0


def _bytecode_note() -> str:
    """Whether the CLIs compile hpcdl's modules at every start (this environment)."""
    return ("not written (PYTHONDONTWRITEBYTECODE: every module compiled at each start)"
            if os.environ.get("PYTHONDONTWRITEBYTECODE") else "as this environment caches it")


if __name__ == "__main__":
    sys.exit(main())
