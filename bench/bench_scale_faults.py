#!/usr/bin/env python3
"""The hang watchdog and --requeue at 16 nodes, on a sandbox cluster of the bench's own.

The cluster: scripts/sandbox.sh, its own directory under /tmp, node names no other
cluster uses (3 random letters + 1..N), its own subnet and slurmctld port, no
accounting daemons; stopped at the end whatever happens (the shared two-node sandbox is
not touched). One rank per node.

hang     tests/integration/hang/gloo_hang.py in the CPU image on every node: 3 gloo
         all_reduce steps, then the rank on the 13th node (rank 12) sleeps while the
         others wait in the next all_reduce. `hpcdl submit --wait --json --hang-timeout
         T` must name rank 12 on the 13th node, in its frame, and cancel the job.
requeue  the bundled example (DDP, ResNet-18 32 px, synthetic data, --checkpoint-every
         2) run natively with `hpcdl submit --requeue`; once a checkpoint exists, the
         rank on the 13th node is killed with SIGKILL (a crash, no warning); the job
         must requeue itself and its next attempt resume from that checkpoint and
         complete. Slurm holds a requeued job ~2 min (BeginTime): the bench releases it
         once the nodes are done with the attempt, as tests/integration/test_requeue.py.

Prints what hpcdl printed and found, the timings, the machine and the command to rerun.
Costs ~6-10 min here (16 ranks of torch on 2 cores). Needs root. BENCH_KEEP_RUNS=1
keeps the run directories (under /scratch/hpcdl-bench-bsf-*) for a look afterwards.

    sudo python3 bench/bench_scale_faults.py [--nodes 16] [--hang-timeout 60]
        [--image /scratch/images/pytorch-horovod-cpu.sif] [--skip-hang] [--skip-requeue]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import own_cluster, run  # noqa: E402
from bench.machine import describe, facts_line  # noqa: E402

HANG_SCRIPT = REPO / "tests" / "integration" / "hang" / "gloo_hang.py"
EXAMPLE = REPO / "examples" / "resnet50_imagenet.py"



def hang_run(env: dict[str, str], profile: Path, nodes: list[str], image: Path,
             script: Path, timeout_s: float) -> dict[str, Any]:
    slow = 12 if len(nodes) >= 13 else len(nodes) - 1
    t0 = time.time()
    res = run([sys.executable, "-m", "hpcdl", "submit", "-p", str(profile), "-N",
               str(len(nodes)), "-G", "0", "-c", "1", "--image", str(image), "--job-name",
               "bench-hang16", "--hang-timeout", f"{timeout_s:g}", "--wait", "--json", "--",
               "python3", str(script), "--steps", "3", "--slow-rank", str(slow)],
              env, timeout=1500, check=False)
    wall = time.time() - t0
    out = json.loads(res.stdout.strip().splitlines()[-1])
    hang = out.get("hang") or {}
    log = Path(out["stdout"]).read_text() if out.get("stdout") else ""
    started = [float(line.split()[2]) for line in log.splitlines() if "HANG_START" in line]
    stragglers = hang.get("stragglers") or []
    return {
        "exit": res.returncode, "state": out.get("state"), "wall_s": wall,
        "expected": (f"rank {slow}", nodes[slow]),
        "named": [(s["label"], s["node"], s["frame"]) for s in stragglers],
        "places": [(p["where"], len(p["ranks"])) for p in hang.get("places", [])],
        "hang_to_diagnosis_s": hang["detected_at"] - started[0] if hang and started else None,
        "collect_s": hang.get("collect_s"), "silent_s": hang.get("silent_s"),
        # What the watchdog wrote (--json prints the same object, not these lines).
        "diagnosis": (Path(out["run_dir"]) / "hang" / "diagnosis.txt").read_text().splitlines()
        if out.get("run_dir") and (Path(out["run_dir"]) / "hang" / "diagnosis.txt").exists()
        else [],
        "run_dir": out.get("run_dir"),
    }


def squeue_state(job: str, env: dict[str, str]) -> tuple[str, str]:
    out = run(["squeue", "-h", "-j", job, "-o", "%T|%r"], env, check=False).stdout.strip()
    return (out.split("|", 1)[0], out.split("|", 1)[1]) if "|" in out else ("", "")


def rank_pid(run_dir: Path, rank: int) -> int | None:
    """The pid of the example's process with SLURM_PROCID=rank of this run."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if (any(a.endswith(b"resnet50_imagenet.py") for a in cmd)
                and str(run_dir).encode() in b" ".join(cmd)
                and f"SLURM_PROCID={rank}".encode() in environ
                and not any(a.endswith(b"srun") for a in cmd)):
            return int(proc.name)
    return None


def requeue_run(env: dict[str, str], profile: Path, nodes: list[str], runs: Path
                ) -> dict[str, Any]:
    victim = 12 if len(nodes) >= 13 else len(nodes) - 1
    run_dir = runs / "requeue16"
    t0 = time.time()
    res = run([sys.executable, "-m", "hpcdl", "submit", "-p", str(profile), "-N",
               str(len(nodes)), "-G", "0", "-c", "1", "--backend", "ddp", "--no-image",
               "--requeue", "--run-dir", str(run_dir), "--json",
               "-X", "--arch=resnet18", "-X", "--max-steps=8", "-X", "--epochs=1",
               "-X", "--checkpoint-every=2"], env, timeout=300)
    job = json.loads(res.stdout.strip().splitlines()[-1])["job_id"]
    deadline = time.monotonic() + 1500
    killed_at = None
    killed_after_step = None
    idle_since = None
    while True:
        if time.monotonic() > deadline:
            raise RuntimeError(f"requeue run: job {job} not done: {squeue_state(job, env)}")
        state, reason = squeue_state(job, env)
        if state in ("", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            break
        ckpts = sorted(int(p.stem.split("-")[1])
                       for p in (run_dir / "checkpoints").glob("checkpoint-*.pt"))
        if killed_at is None and state == "RUNNING" and ckpts and ckpts[-1] >= 4:
            pid = rank_pid(run_dir, victim)
            if pid:
                os.kill(pid, signal.SIGKILL)
                killed_at, killed_after_step = time.time(), ckpts[-1]
        if state == "PENDING" and reason == "BeginTime":
            busy = "comp" in run(["sinfo", "-h", "-o", "%T"], env, check=False).stdout
            idle_since = None if busy else (idle_since or time.monotonic())
            if idle_since and time.monotonic() - idle_since >= 2:
                run(["scontrol", "update", f"jobid={job}", "StartTime=now"], env, check=False)
                idle_since = None
        time.sleep(1)
    wall = time.time() - t0
    status = json.loads(run([sys.executable, "-m", "hpcdl", "status", job, "--json"], env,
                            check=False).stdout or "{}")
    out = (run_dir / f"slurm-{job}.out").read_text(errors="replace")
    resumed = re.findall(r".*resumed from \S+ at step \d+.*", out)
    return {"job": job, "state": status.get("state"), "wall_s": wall,
            "victim": (f"rank {victim}", nodes[victim]), "killed_after_checkpoint": killed_after_step,
            "attempts": [(a.get("number"), a.get("reason"), a.get("exit_code"))
                         for a in status.get("attempts", [])],
            # The batch script's own record: job, attempt, started, ended, exit, cause.
            "attempts_tsv": (run_dir / "attempts.tsv").read_text().splitlines()
            if (run_dir / "attempts.tsv").exists() else [],
            "resumed": resumed[:2], "run_dir": str(run_dir)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--hang-timeout", type=float, default=60.0)
    ap.add_argument("--image", type=Path, default=Path("/scratch/images/pytorch-horovod-cpu.sif"))
    ap.add_argument("--skip-hang", action="store_true")
    ap.add_argument("--skip-requeue", action="store_true")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_scale_faults: needs root (Slurm daemons, namespaces)", file=sys.stderr)
        return 2
    # Before the cluster: a tool's --version can be slow on a loaded machine.
    info = describe(packages=("torch", "py-spy"), tools=("srun", "apptainer"))
    results: dict[str, Any] = {}
    with own_cluster(args.nodes, "bsf", default_time="00:20:00", up_timeout=900,
                     down_timeout=300,
                     keep_runs=bool(os.environ.get("BENCH_KEEP_RUNS"))) as cluster:
        env, profile, names, runs = (cluster["env"], cluster["profile"], cluster["nodes"],
                                     cluster["runs"])
        runs.mkdir(parents=True)
        script = runs / HANG_SCRIPT.name  # the nodes do not see the checkout
        shutil.copyfile(HANG_SCRIPT, script)
        if not args.skip_hang:
            results["hang"] = hang_run(env, profile, names, args.image, script, args.hang_timeout)
            print(f"hang done: {results['hang']['named']}", file=sys.stderr, flush=True)
        if not args.skip_requeue:
            results["requeue"] = requeue_run(env, profile, names, runs)
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=2, default=str))
    print(f"cluster: {args.nodes} nodes {names[0]}..{names[-1]}, one rank per node")
    if "hang" in results:
        h = results["hang"]
        print(f"\nhang: rank {h['expected'][0].split()[1]} on {h['expected'][1]} (the 13th node) "
              f"sleeps; --hang-timeout {args.hang_timeout:g}")
        print(f"  submit --wait exit {h['exit']}, job {h['state']}, {h['wall_s']:.0f} s in all")
        print(f"  named: {h['named']}")
        print(f"  the others: {h['places']}")
        if h["hang_to_diagnosis_s"] is not None:
            print(f"  hang -> diagnosis {h['hang_to_diagnosis_s']:.1f} s (silent "
                  f"{h['silent_s']:.1f} s, stacks of {args.nodes} ranks collected in "
                  f"{h['collect_s']:.1f} s)")
        print("  hang/diagnosis.txt:")
        for line in h["diagnosis"]:
            print(f"    {line}")
        ok = [(n[0], n[1]) for n in h["named"]] == [h["expected"]] and h["state"] == "CANCELLED"
        print(f"  verdict: {'the hung rank and its node named, job cancelled' if ok else 'WRONG'}")
    if "requeue" in results:
        r = results["requeue"]
        print(f"\nrequeue: {r['victim'][0]} on {r['victim'][1]} killed (SIGKILL) after "
              f"checkpoint {r['killed_after_checkpoint']}")
        print(f"  job {r['job']}: {r['state']}, {r['wall_s']:.0f} s in all (Slurm's BeginTime "
              "hold released by the bench)")
        print(f"  attempts (attempt, reason, exit), hpcdl status: {r['attempts']}")
        for line in r["attempts_tsv"]:
            print(f"  attempts.tsv: {line}")
        for line in r["resumed"]:
            print(f"  {line.strip()}")
        reasons = [line.split("\t")[5] for line in r["attempts_tsv"]]
        ok = r["state"] == "COMPLETED" and reasons[-1:] == ["COMPLETED"] and len(reasons) >= 2 \
            and bool(r["resumed"])
        print(f"  verdict: {'requeued and resumed to completion' if ok else 'WRONG'}")
    print(f"machine: {facts_line(info)}")
    print("reproduce: sudo python3 bench/bench_scale_faults.py " + " ".join(sys.argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
