"""The run directory: one per submitted job, holding what was submitted and what came back.

    runs/<job-name>-<YYYYmmdd-HHMMSS>-<xxxx>/
        job.sbatch     the exact script given to sbatch
        plan.json      the validated plan (JobPlan.to_dict())
        job.json       job id, sbatch argv, submission time
        profile.yaml   the cluster profile as validated and used (all defaults filled in)
        image.json     the image's path, size and content hash (from `hpcdl build`'s record)
        image.def      the definition the image was built from (when hpcdl built it)
        slurm-<id>.out / slurm-<id>.err   the job's stdout / stderr (written by Slurm)
        result.json    final state, exit code and the example's hpcdl_result (after --wait)

The root is ``$HPCDL_RUNS`` or ``./runs``. Every file hpcdl writes here is written
atomically (temp file + rename), so a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any

import yaml

from hpcdl.atomic import write_atomic, write_json_atomic
from hpcdl.container.hashing import read_record, sidecar

_UNSAFE = re.compile(r"[^A-Za-z0-9_.+-]+")


def runs_root() -> Path:
    """Where run directories go: ``$HPCDL_RUNS`` or ``./runs``."""
    return Path(os.environ.get("HPCDL_RUNS") or "runs").expanduser()


def safe_name(job_name: str) -> str:
    """A file-name-safe form of a job name (the exact name is kept in plan.json)."""
    name = _UNSAFE.sub("-", job_name).strip("-.")
    return name[:48] or "job"


def new_run_path(job_name: str, root: Path | None = None) -> Path:
    """A fresh run directory's absolute path (not created): ``<root>/<name>-<stamp>-<hex>``.

    Pure apart from reading the clock and the random source: the path is decided
    before the job is planned, so the plan (its #SBATCH --output, checkpoint
    directory and binds) is made once, with the directory it will really use.
    """
    base = (root or runs_root()).resolve()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return base / f"{safe_name(job_name)}-{stamp}-{secrets.token_hex(3)}"


def make_run_dir(path: Path) -> Path:
    """Create the run directory ``path`` (its parents as needed); it must not exist yet.

    Raises FileExistsError when it does: two submissions never share a directory.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    path.mkdir()
    return path


def create_run_dir(job_name: str, root: Path | None = None) -> Path:
    """Make a new, empty, uniquely named run directory and return its absolute path.

    Safe under concurrency: the random suffix plus ``mkdir`` (which fails when the
    name exists) means two submissions never share a directory.
    """
    for _ in range(100):
        try:
            return make_run_dir(new_run_path(job_name, root))
        except FileExistsError:
            continue
    raise OSError(f"could not create a unique run directory under {(root or runs_root())}")


def write_plan(run_dir: Path, script: str, plan: dict[str, Any]) -> Path:
    """job.sbatch + plan.json; returns the script's path."""
    script_path = run_dir / "job.sbatch"
    write_atomic(script_path, script, mode=0o755)
    write_json_atomic(run_dir / "plan.json", plan)
    return script_path


def record_inputs(run_dir: Path, profile: dict[str, Any], image: str | None) -> None:
    """profile.yaml, and for a containerised job image.json (+ image.def): with the
    script and plan, what it takes to run the same job again.
    """
    write_atomic(run_dir / "profile.yaml", yaml.safe_dump(profile, sort_keys=False))
    if not image:
        return
    path = Path(image).expanduser().resolve()
    info: dict[str, Any] = {"path": str(path)}
    try:
        st = path.stat()
        info.update(size=st.st_size, mtime=time.strftime("%Y-%m-%dT%H:%M:%S%z",
                                                         time.localtime(st.st_mtime)))
    except OSError as exc:
        info["error"] = f"cannot stat the image: {exc.strerror}"
    record = read_record(sidecar(path, ".hash"))
    if record:
        info.update({k: record.get(k) for k in (
            "spec", "built_at", "runtime", "definition_sha256")}, content_hash=record.get("hash"))
    else:
        info["content_hash"] = None
        info["note"] = ("no `hpcdl build` record beside the image; "
                        "`apptainer inspect --deffile IMAGE` shows its definition")
    write_json_atomic(run_dir / "image.json", info)
    definition = sidecar(path, ".def")
    if record and definition.is_file():
        write_atomic(run_dir / "image.def", definition.read_text(encoding="utf-8"))


def record_submission(run_dir: Path, job_id: str, argv: list[str]) -> None:
    write_json_atomic(run_dir / "job.json", {
        "job_id": job_id,
        "argv": argv,
        "submitted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    })


def write_result(run_dir: Path, result: dict[str, Any]) -> None:
    write_json_atomic(run_dir / "result.json", result)


def log_paths(run_dir: Path, job_id: str) -> tuple[Path, Path]:
    """(stdout, stderr) of job ``job_id`` in ``run_dir`` (the plan's slurm-%j.out/.err)."""
    return run_dir / f"slurm-{job_id}.out", run_dir / f"slurm-{job_id}.err"


def find_run(job_id: str, root: Path | None = None) -> Path | None:
    """The run directory whose job.json names ``job_id``, or None."""
    base = root or runs_root()
    if not base.is_dir():
        return None
    for meta in base.glob("*/job.json"):
        try:
            if json.loads(meta.read_text(encoding="utf-8")).get("job_id") == job_id:
                return meta.parent
        except (OSError, ValueError):
            continue
    return None
