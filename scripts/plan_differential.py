#!/usr/bin/env python3
"""A differential run of the planner: seeded random requests through build_plan,
build_alloc and the data preflight, recorded at one checkout and compared byte for byte
at another (a refactoring of hpcdl.plan must change nothing a user sees).

    # at the checkout before the change (hpcdl imported from there):
    PYTHONPATH=/path/to/before python3 scripts/plan_differential.py record -n 3000 -o /tmp/before.jsonl
    # at the checkout after it:
    PYTHONPATH=$PWD python3 scripts/plan_differential.py compare -n 3000 --against /tmp/before.jsonl

What is compared, per request: the rendered script, the job-side files, plan.json
(JobPlan.to_dict, minus the keys named with --ignore-key: a part added on purpose),
the warnings, build_alloc's script, many_files_warning's line, and every refusal
(exception type, message and hint). The requests come from this file's generator and
its seed, so both runs must use the same copy of this script. Paths of the checkout are
written as <repo> (the two checkouts live in different directories).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

TREE = Path("/tmp/hpcdl-differential/tree")  # a small dataset tree many_files_warning finds

# Per field: values a user gives, then broken ones (a few requests get one or two).
FIELDS: dict[str, tuple[list[Any], list[Any]]] = {
    "nodes": ([1, 1, 1, 2, 2, 3, 4], [0, 17, 600]),
    "gpus": ([0, 1, 1, 2, 2, 4, 4, 8, 3], [-1, 9]),
    "partition": ([None, None], ["nope"]),  # the profile's names are added
    "time": ([None, "00:20:00", "1:00:00", "2-00:00:00", "infinite", "UNLIMITED", "10",
              "00:04:00"], ["bogus", "7-00:00:01"]),
    "cpus_per_task": ([None, None, 1, 4, 16], [0, 200]),
    "job_name": ([None, "t1", "resnet50 ddp"], ["", " ", "a\nb"]),
    "image": ([None, None, "/scratch/images/x.sif", "/tmp/x.sif", "rel/x.sif", "docker://x/y"],
              ["a\nb.sif"]),
    "backend": (["horovod", "ddp"], ["mxnet"]),
    "env": ([(), (("NCCL_SOCKET_IFNAME", "ib0"),), (("MASTER_ADDR", "n1"),),
             (("MASTER_PORT", "29500"), ("PYTHONUNBUFFERED", "0"))],
            [(("bad-name", "x"),), (("A", "x\0"),)]),
    "binds": ([(), ("/scratch/data/imagenet:/imagenet",), ("/tmp/x",)], [("/scratch/a,b",)]),
    "command": ([(), (), ("python3", "train.py", "--lr", "0.1"), ("true",), ("hostname",),
                 ("python3", "/abs/t.py")], [("echo", "a\0b")]),
    "data": ([None, "/scratch/data/imagenet", "/scratch/data/imagenet.sqfs", "data.sqfs",
              "/imagenet", str(TREE), "/tmp/other.sqfs", "/scratch/data/"], ["bad\ndata"]),
    "synthetic": ([False, False, False, True], []),
    "example_args": ([(), ("--epochs", "1"), ("--lr=0.2", "--batch-size", "8")], [("a\0",)]),
    "run_dir": ([None, "/scratch/runs/r1", "/tmp/runs/r2", "runs/rel",
                 "/scratch/runs/with space"], ["/scratch/runs/a\nb"]),
    "launcher": ([None, None, "srun", "mpirun", "horovodrun", "torchrun"], ["nope"]),
    "no_image": ([False, False, False, True], []),
    "gpu_bind": ([None, None, "none", "local-rank"], ["bogus"]),
    "requeue": ([None, None, True, False], []),
    "max_restarts": ([None, None, 0, 2], [-1]),
    "signal": ([None, "USR1@60", "USR2@120", "TERM@30"], ["bogus"]),
    "chain": ([1, 1, 1, 2, 3], [0]),
    "probe": ([None, None, None, ("--sizes", "4K"), ("--sizes", "4K,1M", "--iters", "3")],
              [("x\0",)]),
    "probe_first": ([False, False, True], []),
    "hang_timeout": ([None, None, 30.0, 20.0, 1e9], [0.0, float("inf")]),
    "hang_action": ([None, None, "cancel", "leave", "relaunch"], ["bogus"]),
    "stage_image": ([None, None, True, False], []),
    "stage_data": ([False, False, True], []),
    "code_dir": ([None, None, "/home/jdoe/project"], []),
    "spares": ([None, None, None, 0, 1, 2], [-1]),
}


def random_request(rng: random.Random, partitions: list[str]) -> dict[str, Any]:
    """One request's keyword arguments: most leave most options alone, as users do; one
    in four has one or two broken values."""
    kw: dict[str, Any] = {}
    for key, (good, _) in FIELDS.items():
        if key in ("nodes", "gpus") or rng.random() < 0.4:
            kw[key] = rng.choice(good + partitions if key == "partition" else good)
    if rng.random() < 0.6:
        _coherent(kw)
    elif rng.random() < 0.5:
        for key in rng.sample([k for k, (_, bad) in FIELDS.items() if bad], rng.choice([1, 2])):
            kw[key] = rng.choice(FIELDS[key][1])
    return kw


def _coherent(kw: dict[str, Any]) -> None:
    """Clear what the request's own rules refuse together, so that more requests reach
    the planner's later stages."""
    if kw.get("probe") is None:
        kw.pop("probe_first", None)
    elif not kw.get("probe_first"):
        kw.pop("example_args", None)
        kw.pop("spares", None)
    if kw.get("hang_timeout") is None:
        kw.pop("hang_action", None)
    if kw.get("command"):
        kw.pop("example_args", None)
    if kw.get("synthetic"):
        kw.pop("data", None)
    if kw.get("image"):
        kw.pop("no_image", None)
    if kw.get("chain", 1) > 1:
        for key in ("spares", "requeue", "hang_timeout", "hang_action"):
            kw.pop(key, None)


def profile_variant(rng: random.Random, profile: Any) -> tuple[str, Any]:
    """The profile, or a copy with what the data, staging and resilience rules read set
    otherwise (a packed paths.imagenet, staging by default, requeue and spares by
    default, no shared paths, no local scratch)."""
    changes: list[str] = []
    paths, container, scheduler = profile.paths, profile.container, profile.scheduler
    if rng.random() < 0.4:
        imagenet = rng.choice(["/scratch/data/imagenet.sqfs", "/scratch/data/imagenet",
                               str(TREE), None])
        paths = paths.model_copy(update={"imagenet": imagenet})
        changes.append(f"imagenet={imagenet}")
    if rng.random() < 0.25:
        paths = paths.model_copy(update={"shared": rng.choice([[], ["/scratch"], ["/tmp"]])})
        changes.append(f"shared={paths.shared}")
    if rng.random() < 0.25:
        paths = paths.model_copy(update={"local_scratch": rng.choice([None, "/local"])})
        changes.append(f"local={paths.local_scratch}")
    if rng.random() < 0.3:
        container = container.model_copy(update={
            "default_image": rng.choice([None, "/scratch/images/default.sif"]),
            "stage": rng.choice(["sbcast", "none"]),
            "mode": rng.choice(["auto", "setuid", "unprivileged"])})
        changes.append(f"container={container.default_image},{container.stage},{container.mode}")
    if rng.random() < 0.3:
        scheduler = scheduler.model_copy(update={
            "requeue": rng.random() < 0.5, "spares": rng.choice([0, 1]),
            "max_restarts": rng.choice([0, 3])})
        changes.append(f"scheduler={scheduler.requeue},{scheduler.spares},"
                       f"{scheduler.max_restarts}")
    variant = profile.model_copy(update={"paths": paths, "container": container,
                                         "scheduler": scheduler})
    return f"{profile.name}[{';'.join(changes)}]", variant


def refusal(exc: Exception) -> dict[str, Any]:
    return {"refused": type(exc).__name__, "message": str(exc),
            "hint": getattr(exc, "hint", None)}


def outcomes(n: int, seed: int, ignore: list[str]) -> list[dict[str, Any]]:
    """Every request's outcome, in the generator's order."""
    from hpcdl.errors import HpcdlError
    from hpcdl.jobs.alloc import build_alloc
    from hpcdl.jobs.preflight import many_files_warning
    from hpcdl.plan import JobRequest, build_plan
    from hpcdl.profiles import load_profile

    plan_mod = sys.modules["hpcdl.plan"]

    TREE.mkdir(parents=True, exist_ok=True)
    for name in ("a", "b", "c"):
        (TREE / name).write_text(name)
    names = ["generic", "karolina", "neuron", "polaris", "sandbox", "sandbox-remote", "taurus"]
    profiles = {name: load_profile(name) for name in names}
    rng = random.Random(seed)
    out = []
    for i in range(n):
        base = profiles[rng.choice(names)]
        label, profile = profile_variant(rng, base)
        kw = random_request(rng, [p.name for p in base.partitions])
        mode = rng.choice([None, "setuid", "unprivileged", "root"])
        row: dict[str, Any] = {"i": i, "profile": label, "request": repr(kw), "mode": mode}
        # Since issue 45 a request is made of parts; JobRequest.of takes the flat fields.
        req = getattr(JobRequest, "of", JobRequest)(**kw)
        try:
            plan = build_plan(profile, req, runtime_mode=mode)
        except HpcdlError as exc:
            row["plan"] = refusal(exc)
        else:
            record = plan.to_dict()
            for key in ignore:
                record.pop(key, None)
            record["hpcdl_version"] = "<version>"
            row["plan"] = record
            row["job_script_paths"] = plan.job_script_paths()
            row["demand"] = repr(plan.demand())
        try:
            row["alloc"] = build_alloc(profile, req).script
        except HpcdlError as exc:
            row["alloc"] = refusal(exc)
        try:
            # Since issue 45 it takes the decided data part (decided the one way the
            # plan decides it); before, the request.
            data_req = req.data if hasattr(JobRequest, "of") else getattr(req, "dataset", None)
            dataset = (plan_mod.decide_data(profile.paths.imagenet, data_req)
                       if hasattr(plan_mod, "decide_data") else req)
            row["many_files"] = many_files_warning(profile, dataset, limit=1)
        except HpcdlError as exc:
            row["many_files"] = refusal(exc)
        out.append(row)
    return out


def normalised(rows: list[dict[str, Any]]) -> list[str]:
    import hpcdl

    repo = str(Path(hpcdl.__file__).resolve().parents[1])
    return [json.dumps(row, sort_keys=True).replace(repo, "<repo>") for row in rows]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["record", "compare"])
    parser.add_argument("--against", help="compare: the recorded file")
    parser.add_argument("-n", type=int, default=3000, help="requests (default 3000)")
    parser.add_argument("--seed", type=int, default=45)
    parser.add_argument("-o", "--out", help="record: where to write")
    parser.add_argument("--ignore-key", action="append", default=[],
                        help="a plan.json key left out (a part added on purpose)")
    args = parser.parse_args()
    import hpcdl

    print(f"hpcdl from {hpcdl.__file__}", file=sys.stderr)
    os.chdir("/tmp")  # relative paths are made absolute: the same directory for both runs
    rows = normalised(outcomes(args.n, args.seed, args.ignore_key))
    refused = sum("refused" in json.loads(r)["plan"] for r in rows)
    if args.mode == "record":
        Path(args.out).write_text("\n".join(rows) + "\n")
        print(f"recorded {len(rows)} requests ({len(rows) - refused} plans, {refused} refusals) "
              f"to {args.out}")
        return 0
    before = Path(args.against).read_text().splitlines()
    if len(before) != len(rows):
        print(f"{args.against} has {len(before)} requests, this run {len(rows)}")
        return 1
    differ = [i for i, (a, b) in enumerate(zip(before, rows, strict=True)) if a != b]
    print(f"compared {len(rows)} requests ({len(rows) - refused} plans, {refused} refusals): "
          f"{len(rows) - len(differ)} identical, {len(differ)} differ")
    for i in differ[:5]:
        a, b = json.loads(before[i]), json.loads(rows[i])
        print(f"--- request {i}: {a['profile']} {a['request']}")
        for key in a:
            if a[key] != b.get(key):
                print(f"  {key}:\n    before: {str(a[key])[:600]}\n    after:  {str(b.get(key))[:600]}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
