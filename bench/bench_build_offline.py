#!/usr/bin/env python3
"""Offline builds: resolve on the host + build with no network, against the same spec
built online (pip in %post from the index).

    python3 bench/bench_build_offline.py                 # 1 round, sandbox builds
    python3 bench/bench_build_offline.py --repeat 2 --packages tqdm,msgpack,rich

The spec derives from the bundled CPU image and adds ``--packages``. Each round: the
online build (``pip.resolve: build``: the build's pip reaches the index through the
host's CA bundle and proxies); then, into a fresh wheelhouse folder, the host's resolve
(``hpcdl build --resolve-only``: the base image's python read with apptainer exec, then
``pip download``), and the offline build (``pip.resolve: host``), run inside
``unshare --net`` (no network at all) where that works (root), plainly otherwise; and
the plan of a resolved spec alone (``--dry-run``: what a warm offline build adds before
building). Needs Apptainer and the CPU image (scripts/build-image.sh). Prints measured
figures only, with the machine and the command.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import spread  # noqa: E402
from bench.machine import describe, facts_line  # noqa: E402

SPEC = """\
name: bench-offline
gpu: false
base: {{bootstrap: localimage, image: {image}}}
mpi: {{flavour: openmpi, version: 4.1.4, pmix: 4.2.2, source: base}}
project: false
pip:
  resolve: {resolve}
  packages: [{packages}]
"""


def timed(argv: list[str], cwd: Path) -> tuple[float, str]:
    start = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=1800, cwd=cwd,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    seconds = time.monotonic() - start
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return seconds, r.stdout + r.stderr


def netns_works() -> bool:
    if not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "--net", "--", "true"], capture_output=True,
                          check=False).returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image", default=None,
                        help="base image (default: <cache>/images/pytorch-horovod-cpu.sif, "
                             "else /scratch/images/pytorch-horovod-cpu.sif)")
    parser.add_argument("--packages", default="tqdm,msgpack",
                        help="pip.packages, comma-separated (default: tqdm,msgpack)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds")
    parser.add_argument("--sif", action="store_true",
                        help="build SIF files (default: sandbox folders, no mksquashfs)")
    args = parser.parse_args()
    cache = os.environ.get("HPCDL_CACHE") or "/var/cache/hpcdl"
    candidates = [Path(args.image)] if args.image else [
        Path(f"{cache}/images/pytorch-horovod-cpu.sif"),
        Path("/scratch/images/pytorch-horovod-cpu.sif")]
    image = next((p for p in candidates if p.is_file()), None)
    if image is None:
        raise SystemExit(f"{candidates[0]} is missing: scripts/build-image.sh builds it")
    packages = ", ".join(p.strip() for p in args.packages.split(",") if p.strip())
    netns = netns_works()
    print(facts_line(describe(tools=("apptainer",))))
    print("command: " + " ".join([sys.executable, *sys.argv]))
    hpcdl = [sys.executable, "-m", "hpcdl", "build"]
    rows: dict[str, list[float]] = {"online build (pip in %post, from the index)": [],
                                    "resolve on the host (--resolve-only)": [],
                                    "offline build (--no-index" + (", unshare --net)" if netns
                                                                   else ")"): [],
                                    "resolve + offline build": [],
                                    "plan of a resolved spec (--dry-run)": []}
    names = list(rows)
    with tempfile.TemporaryDirectory(prefix="bench-build-offline-", dir="/scratch"
                                     if Path("/scratch").is_dir() else None) as tmp:
        folder = Path(tmp)
        for kind in ("build", "host"):
            (folder / f"{kind}.yaml").write_text(
                SPEC.format(image=image, resolve=kind, packages=packages))
        for round_ in range(args.repeat):
            def out(name: str, round_: int = round_) -> list[str]:
                target = folder / f"{name}-{round_}{'.sif' if args.sif else ''}"
                return ["-o", str(target), "--force", *([] if args.sif else ["--sandbox"])]

            online, _ = timed([*hpcdl, "build.yaml", *out("online")], folder)
            wheels = folder / f"wheels-{round_}"
            resolve_s, said = timed([*hpcdl, "host.yaml", "--wheelhouse", str(wheels),
                                     "--resolve-only"], folder)
            offline_argv = [*hpcdl, "host.yaml", "--wheelhouse", str(wheels), *out("offline")]
            offline, _ = timed((["unshare", "--net", "--"] if netns else []) + offline_argv,
                               folder)
            plan, _ = timed([*hpcdl, "host.yaml", "--wheelhouse", str(wheels), "--dry-run"],
                            folder)
            for name, value in zip(names, (online, resolve_s, offline, resolve_s + offline, plan),
                                   strict=True):
                rows[name].append(value)
            print(f"round {round_ + 1}: online {online:.1f} s; resolve {resolve_s:.1f} s "
                  f"({said.strip()}); offline build {offline:.1f} s; plan {plan:.1f} s",
                  flush=True)
            for p in folder.glob(f"*-{round_}*"):
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink()
    print(f"\nderived {'SIF' if args.sif else 'sandbox'} build from {image.name} adding "
          f"{packages}, {args.repeat} round(s), seconds: median (range)")
    for name, values in rows.items():
        print(f"  {name:<52} {spread(values, '{:.1f}')}")


if __name__ == "__main__":
    main()
