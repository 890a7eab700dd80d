#!/usr/bin/env python3
"""hpcdl's costs against the node count, on a sandbox cluster of up to 32 nodes.

The bench starts its own cluster with `hpcdl sandbox up --nodes MAX` (its own
directory /var/lib/hpcdl-sandbox-MAXn, nodes sMAXn1.., a network namespace and a
slurmd each, no accounting daemons; the profile goes to a temporary XDG_CONFIG_HOME)
and stops it at the end, whatever happens. The shared two-node sandbox is not touched.

Launch, per node count in --nodes (one rank per node), --repeats times in rotating
order: from the command's start to the moment the last rank started, each rank
printing its clock (`date +%s.%N`; every node shares this machine's clock):
  srun          `srun -N n --ntasks-per-node=1 date +%s.%N`: the floor
  sbatch        `sbatch --wait -N n --wrap "srun date +%s.%N"`: Slurm's own batch path
  hpcdl         `python -m hpcdl submit -p sandbox-MAXn -N n -G 0 --no-image --wait -- date
                +%s.%N` (plan, checks, run directory, sbatch; Python start-up included)
  hpcdl-image   the same with `--image SIF` (every rank in the CPU image, read from the
                shared path), when the image exists and --no-image-runs is not given

Probe, per node count in --probe-nodes: `hpcdl probe --wait --json` in the CPU image
with one node's link limited to --rate Mbit/s (`scripts/sandbox.sh shape NODE --rate`
with the cluster's environment): the 13th node from 16 nodes up, else the last one.
Wall time (command to verdict), exit status, the node named, pairs measured.

Prints a table of medians (min-max), the machine and the command to rerun; --plot
writes both curves into one PNG. Needs root.

    sudo python3 bench/bench_scale_nodes.py [--nodes 1,2,4,8,16,32] [--repeats 3]
        [--probe-nodes 4,8,16,32] [--rate 50] [--probe-sizes 64K,1M] [--probe-mpi off]
        [--plot docs/scale.png]
        [--json-out FILE] [--no-image-runs]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import run, spread, stamps  # noqa: E402
from bench.machine import describe, facts_line  # noqa: E402
from hpcdl import sandbox  # noqa: E402

SANDBOX = REPO / "scripts" / "sandbox.sh"
STAMP = ("date", "+%s.%N")
METHODS = ("srun", "sbatch", "hpcdl", "hpcdl-image")



def launch(method: str, n: int, env: dict[str, str], profile: str, image: str,
           work: Path) -> dict[str, float]:
    """One launch: seconds from the command's start to the last rank's start, and to
    the command's end."""
    if method == "srun":
        argv = ["srun", "-N", str(n), "--ntasks-per-node=1", "--label", *STAMP]
    elif method == "sbatch":
        out = work / f"sbatch-{n}-{time.monotonic_ns()}.out"
        argv = ["sbatch", "--wait", "--parsable", "-N", str(n), "--ntasks-per-node=1",
                "-o", str(out), "--wrap", f"srun --label {' '.join(STAMP)}"]
    else:
        argv = [sys.executable, "-m", "hpcdl", "submit", "-p", profile, "-N", str(n), "-G", "0",
                *(["--image", image] if method == "hpcdl-image" else ["--no-image"]),
                "--wait", "--json", "--", *STAMP]
    t0 = time.time()
    res = run(argv, env, timeout=900)
    end = time.time() - t0
    if method == "srun":
        text = res.stdout
    elif method == "sbatch":
        text = out.read_text()
    else:
        record = json.loads(res.stdout.strip().splitlines()[-1])
        text = Path(record["stdout"]).read_text()
    ranks = stamps(text)
    if len(ranks) != n:
        raise RuntimeError(f"{method} on {n} nodes: {len(ranks)} rank clocks in:\n{text[-2000:]}")
    return {"started_s": max(ranks) - t0, "first_s": min(ranks) - t0, "end_s": end}


def probe(n: int, env: dict[str, str], profile: str, image: str, sizes: str,
          mpi: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    res = run([sys.executable, "-m", "hpcdl", "probe", "-p", profile, "-N", str(n), "--image",
               image, "--sizes", sizes, "--iters", "3", "--warmup", "1", "--mpi", mpi,
               "--wait", "--json"],
              env, timeout=900, check=False)
    wall = time.perf_counter() - t0
    record = json.loads(res.stdout.strip().splitlines()[-1])
    report = record.get("probe") or {}
    failed = ""
    if res.returncode not in (0, 1):  # neither healthy nor a verdict: keep what the job said
        failed = "".join(Path(record[k]).read_text(errors="replace")[-4000:]
                         for k in ("stdout", "stderr") if record.get(k) and Path(record[k]).is_file())
    return {"exit": res.returncode, "wall_s": wall, "failed_output": failed,
            "named": report.get("verdict", {}).get("slow_nodes"),
            "pairs": len(report.get("pairs", [])), "pair_mode": report.get("pair_mode"),
            "probe_elapsed_s": report.get("elapsed_s"), "run_dir": record.get("run_dir")}



def _axes(ax: Any, title: str, xlabel: str, ylabel: str) -> None:
    """One panel's frame: nodes on a log-2 axis, labels, legend, light grid."""
    ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)


def plot(path: Path, launches: dict[str, dict[int, list[float]]],
         probes: list[dict[str, Any]], machine: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(16, 4.5))
    for method, by_n in launches.items():
        ns = sorted(by_n)
        if ns:
            left.plot(ns, [statistics.median(by_n[n]) for n in ns], marker="o", label=method)
    _axes(left, "launch", "nodes (one rank each)",
          "s from the command to the last rank's start (median)")
    done = [p for p in probes if p["exit"] in (0, 1)]
    if done:
        ns = [p["nodes"] for p in done]
        middle.plot(ns, [p["wall_s"] for p in done], marker="o", label="command to verdict")
        inside = [p["probe_elapsed_s"] for p in done]
        middle.plot(ns, inside, marker="s", label="in the job: init to verdict")
        middle.plot(ns, [inside[0] * (n / ns[0]) ** 2 for n in ns], linestyle="--", color="grey",
                    label=f"in the job x N^2 from {ns[0]} nodes")
        middle.set_ylim(0, max(p["wall_s"] for p in done) * 1.3)
        _axes(middle, "hpcdl probe", "nodes (one rank each, one node limited)", "s")
        right.plot(ns, [p["pairs"] for p in done], marker="o", label="pairs measured")
        right.plot(ns, [n * (n - 1) // 2 for n in ns], linestyle="--", color="grey",
                   label="every pair, N(N-1)/2")
        right.set_yscale("log")
        _axes(right, "probe: pairs measured", "nodes", "node pairs (process groups)")
    fig.suptitle(f"hpcdl at scale on a sandbox cluster ({machine})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="1,2,4,8,16,32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--probe-nodes", default="4,8,16,32", help="'' to skip the probe")
    ap.add_argument("--rate", type=float, default=50.0, help="Mbit/s of the limited node")
    ap.add_argument("--probe-sizes", default="64K,1M")
    # The MPI sweep (mpi4py over PMIx) is not part of the pair schedule, and at 16 ranks
    # here its MPI_Init failed now and then (PMIX ERROR gds_ds12_lock_pthread.c, then a
    # segfault): off unless asked for.
    ap.add_argument("--probe-mpi", choices=("auto", "on", "off"), default="off")
    # The build cache is the build host's only (the nodes do not see /var/cache/hpcdl):
    # the tests publish the image on the shared /scratch.
    ap.add_argument("--image", default="/scratch/images/pytorch-horovod-cpu.sif")
    ap.add_argument("--no-image-runs", action="store_true", help="skip hpcdl-image launches")
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_scale_nodes: needs root (starts Slurm daemons, network namespaces)",
              file=sys.stderr)
        return 2
    nodes = [int(x) for x in args.nodes.split(",") if x]
    probe_nodes = [int(x) for x in args.probe_nodes.split(",") if x]
    biggest = max(nodes + probe_nodes)
    have_image = Path(args.image).is_file()
    methods = [m for m in METHODS if m != "hpcdl-image" or (have_image and not args.no_image_runs)]
    if probe_nodes and not have_image:
        print(f"bench_scale_nodes: no image at {args.image} for the probe", file=sys.stderr)
        return 2
    # Where every node sees it (the sbatch logs, hpcdl's run directories): the nodes'
    # /tmp is their own (scripts/sandbox.sh node_mounts), the shared /scratch is not.
    Path("/scratch/tmp").mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="hpcdl-bsn-", dir="/scratch/tmp"))
    base = {"XDG_CONFIG_HOME": str(work / "config"), "HPCDL_RUNS": str(work / "runs")}
    folder = sandbox.cluster_dir(biggest)
    env: dict[str, str] = {}
    launches: dict[str, dict[int, list[float]]] = {m: {} for m in methods}
    firsts: dict[str, dict[int, list[float]]] = {m: {} for m in methods}
    probes: list[dict[str, Any]] = []
    profile = sandbox.profile_name(biggest)
    try:
        t0 = time.perf_counter()
        run([sys.executable, "-m", "hpcdl", "sandbox", "up", "--nodes", str(biggest)], base,
            timeout=900)
        up_s = time.perf_counter() - t0
        env = {**base, **sandbox.parse_env_file((folder / sandbox.ENV_FILE).read_text())}
        for n in nodes:
            for r in range(args.repeats):
                order = methods[r % len(methods):] + methods[:r % len(methods)]
                for method in order:
                    got = launch(method, n, env, profile, args.image, work)
                    launches[method].setdefault(n, []).append(got["started_s"])
                    firsts[method].setdefault(n, []).append(got["started_s"] - got["first_s"])
            print(f"launch on {n} nodes done", file=sys.stderr, flush=True)
        for n in probe_nodes:
            slow = sandbox.node_names(biggest)[min(13, n) - 1]
            run(["bash", str(SANDBOX), "shape", slow, "--rate", f"{args.rate:g}"], env)
            try:
                got = probe(n, env, profile, args.image, args.probe_sizes, args.probe_mpi)
            finally:
                run(["bash", str(SANDBOX), "shape", slow, "--clear"], env, check=False)
            probes.append({"nodes": n, "limited": slow, **got})
            print(f"probe on {n} nodes: {got['wall_s']:.1f} s, named {got['named']}",
                  file=sys.stderr, flush=True)
    finally:
        if env:
            run(["bash", str(SANDBOX), "down"], env, timeout=300, check=False)
        shutil.rmtree(work, ignore_errors=True)
    info = describe(packages=("torch",), tools=("srun", "apptainer"))
    short = f"{info['cpu']}, {info['cores']} cores, shared with other sessions"
    print(f"cluster: `hpcdl sandbox up --nodes {biggest}` in {folder}: up in {up_s:.1f} s")
    print("launch: seconds from the command to the last rank's start, median (min-max) of "
          f"{args.repeats}; one rank per node")
    print(f"{'nodes':>5}  " + "  ".join(f"{m:>19}" for m in methods)
          + "  hpcdl/srun  hpcdl/sbatch")

    def ratio(n: int, a: str, b: str) -> float:
        return statistics.median(launches[a][n]) / statistics.median(launches[b][n])

    for n in nodes:  # an empty --nodes: the probe alone
        print(f"{n:>5}  " + "  ".join(f"{spread(launches[m].get(n, [])):>19}" for m in methods)
              + f"  {ratio(n, 'hpcdl', 'srun'):>10.2f}  {ratio(n, 'hpcdl', 'sbatch'):>12.2f}")
    if nodes:
        print("first to last rank's start, median s: " + "; ".join(
            f"{m} " + ", ".join(f"{n}:{statistics.median(firsts[m][n]):.2f}" for n in nodes)
            for m in methods))
    if probes:
        print(f"\nprobe in the CPU image, sizes {args.probe_sizes}, 3 timed calls, --mpi "
              f"{args.probe_mpi}, one node limited to {args.rate:g} Mbit/s")
        print(f"{'nodes':>5} {'limited':>8} {'exit':>4} {'named':>10} {'pairs':>6} {'wall s':>7} "
              f"{'in job s':>8}  schedule")
        for p in probes:
            print(f"{p['nodes']:>5} {p['limited']:>8} {p['exit']:>4} "
                  f"{','.join(p['named'] or []) or '-':>10} {p['pairs']:>6} {p['wall_s']:>7.1f} "
                  f"{p['probe_elapsed_s'] or 0:>8.1f}  {p['pair_mode']}")
            if p["failed_output"]:
                print(f"  the job's output (exit {p['exit']}):\n{p['failed_output']}")
    print(f"machine: {facts_line(info)}")
    print(f"reproduce: sudo python3 bench/bench_scale_nodes.py --nodes {args.nodes} --repeats "
          f"{args.repeats} --probe-nodes '{args.probe_nodes}' --rate {args.rate:g} --probe-sizes "
          f"{args.probe_sizes} --probe-mpi {args.probe_mpi}" + (" --no-image-runs" if args.no_image_runs else "")
          + (f" --plot {args.plot}" if args.plot else ""))
    if args.plot:
        plot(args.plot, launches, probes, short)
    if args.json_out:
        args.json_out.write_text(json.dumps({"machine": info, "launch": launches,
                                             "first_rank": firsts, "probes": probes,
                                             "cluster_up_s": up_s}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
