#!/usr/bin/env python3
"""What an ordinary user pays for `apptainer exec --unsquash` (the way out when /dev/fuse
is closed and there is no setuid starter), and optionally their image build vs root's.

Measured as the ordinary user `hpcuser` (created if missing), alternating A B / B A:
  exec      `apptainer exec IMAGE python3 -c pass` (squashfuse mount; needs /dev/fuse
            open to the user, as it is while the sandbox runs)
  unsquash  `apptainer exec --unsquash IMAGE python3 -c pass` (extracts the whole SIF
            to a temporary sandbox under APPTAINER_TMPDIR, then removes it)
plus the peak size of that temporary sandbox (polled every 0.2 s).
--builds: also `hpcdl build pytorch-horovod-cpu --force` as root and as the user, one
after the other (minutes each; the user's reads the site wheelhouse and writes to a
folder of their own). Run as root:

    python3 bench/bench_unsquash.py [--image IMG] [--pairs 3] [--builds] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.machine import describe, facts_line  # noqa: E402
from tests.integration.conftest_user import ensure_user  # noqa: E402

IMAGE = "/var/cache/hpcdl/images/pytorch-horovod-cpu.sif"
USER = "hpcuser"


def as_user(argv: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    home = f"/home/{USER}"
    base = {"HOME": home, "USER": USER, "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    command = ["runuser", "-u", USER, "--", "env", "-i",
               *(f"{k}={v}" for k, v in {**base, **env}.items()), *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=home,
                          check=False)


def folder_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def timed(image: str, unsquash: bool, tmpdir: Path) -> tuple[float, int]:
    """Seconds for one `python3 -c pass` and the peak bytes under APPTAINER_TMPDIR."""
    peak = [0]
    done = threading.Event()

    def poll() -> None:
        while not done.wait(0.2):
            peak[0] = max(peak[0], folder_bytes(tmpdir))

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    argv = ["apptainer", "exec", *(["--unsquash"] if unsquash else []), image, "python3", "-c",
            "pass"]
    start = time.monotonic()
    r = as_user(argv, {"APPTAINER_TMPDIR": str(tmpdir)}, timeout=600)
    wall = time.monotonic() - start
    done.set()
    watcher.join()
    if r.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed as {USER} (exit {r.returncode}): "
                 f"{(r.stderr or r.stdout).strip().splitlines()[-1:]}")
    return wall, peak[0]


def build(as_root: bool, out: Path) -> float:
    """Seconds for `hpcdl build pytorch-horovod-cpu --force -o OUT` (this checkout's
    hpcdl; the user's runs with the python of the venv tests/integration installs)."""
    python = sys.executable if as_root else "/opt/hpcdl-user/venv/bin/python"
    argv = [python, "-m", "hpcdl", "build", "pytorch-horovod-cpu", "--force", "-o", str(out)]
    start = time.monotonic()
    if as_root:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=1800, cwd=REPO,
                           check=False)
    else:
        r = as_user(argv, {"PYTHONPATH": str(REPO)}, timeout=1800)
    wall = time.monotonic() - start
    if r.returncode != 0:
        sys.exit(f"build as {'root' if as_root else USER} failed: {r.stderr.strip()[-400:]}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image", default=IMAGE)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--builds", action="store_true", help="also time root's and the user's build")
    ap.add_argument("--json", dest="json_out", type=Path)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root (it runs the measured commands as the ordinary user)")
    if not shutil.which("apptainer"):
        sys.exit("no apptainer (scripts/install-apptainer.sh)")
    ensure_user(USER)
    figures: dict = {"machine": facts_line(describe(tools=("apptainer",))), "image": args.image,
                     "image_bytes": os.stat(args.image).st_size, "user": USER}
    fuse = os.stat("/dev/fuse")
    figures["dev_fuse_mode"] = f"{fuse.st_mode & 0o777:04o}"
    runs: dict[str, list[float]] = {"exec": [], "unsquash": []}
    peak = 0
    with tempfile.TemporaryDirectory(prefix="hpcdl-unsquash-", dir="/tmp") as tmp:
        shutil.chown(tmp, USER)
        for i in range(args.pairs):
            order = (False, True) if i % 2 == 0 else (True, False)
            for unsquash in order:
                wall, used = timed(args.image, unsquash, Path(tmp))
                runs["unsquash" if unsquash else "exec"].append(wall)
                if unsquash:
                    peak = max(peak, used)
    for key, xs in runs.items():
        figures[f"{key}_s"] = {"median": round(statistics.median(xs), 2),
                               "min": round(min(xs), 2), "max": round(max(xs), 2), "n": len(xs)}
    figures["unsquash_tmp_peak_mib"] = round(peak / 2**20)
    if args.builds:
        with tempfile.TemporaryDirectory(prefix="hpcdl-build-", dir=f"/home/{USER}") as tmp:
            shutil.chown(tmp, USER)
            figures["build_root_s"] = round(build(True, Path(tmp) / "root.sif"), 1)
            figures["build_user_s"] = round(build(False, Path(tmp) / "user.sif"), 1)
    print(f"machine: {figures['machine']}")
    print(f"measured as {USER}: `python3 -c pass` in {args.image} "
          f"({figures['image_bytes'] / 2**20:.0f} MiB), /dev/fuse {figures['dev_fuse_mode']}")
    print(f"  apptainer exec            median {figures['exec_s']['median']:.2f} s "
          f"(min {figures['exec_s']['min']:.2f}, max {figures['exec_s']['max']:.2f})")
    print(f"  apptainer exec --unsquash median {figures['unsquash_s']['median']:.2f} s "
          f"(min {figures['unsquash_s']['min']:.2f}, max {figures['unsquash_s']['max']:.2f}), "
          f"peak temporary sandbox {figures['unsquash_tmp_peak_mib']} MiB")
    if args.builds:
        print(f"  hpcdl build --force: root {figures['build_root_s']} s, "
              f"{USER} {figures['build_user_s']} s")
    print("rerun: python3 bench/bench_unsquash.py" + (" --builds" if args.builds else ""))
    if args.json_out:
        args.json_out.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
