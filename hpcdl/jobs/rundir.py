"""The run directory: one per submitted job, holding what was submitted and what came back.

    runs/<job-name>-<YYYYmmdd-HHMMSS>-<xxxx>/
        job.sbatch     the exact script given to sbatch (the scheduler's RunFiles.script)
        plan.json      the validated plan (JobPlan.to_dict())
        job.json       job id, sbatch argv, submission time
        profile.yaml   the cluster profile as validated and used (all defaults filled in)
        image.json     the image's path, size and content hash (from `hpcdl build`'s record)
        image.def      the definition the image was built from (when hpcdl built it)
        slurm-<id>.out / slurm-<id>.err   the job's stdout / stderr (written by Slurm;
                       the scheduler's RunFiles.stdout / .stderr)
        result.json    final state, exit code and the example's hpcdl_result (after --wait)
        checkpoints/   the bundled example's checkpoints (written by the job)
        attempts.tsv   with --requeue/--chain: one line per attempt, by the batch script
                       (job id, SLURM_RESTART_COUNT, start, end, exit code, cause)
        attempts.json  every attempt, Slurm's view joined with the script's (after --wait)
        requeue.flag   created by the batch shell on Slurm's signal: the ranks stop
        progress       created by the job once an attempt completed its first training
                       step (hpcdl/jobside/requeue.py); removed before each attempt of a requeued
                       job. None there: no step (for a job whose plan.json records_steps)
        pids/          with --hang-timeout: rank-R (or node-N under torchrun) = "NODE PID",
                       written by the rank wrapper before it execs the command
        heartbeat/     with --hang-timeout: rank-R, rewritten by each rank at most once a
                       second after a step (hpcdl.jobside.steps.beat): the watchdog's progress
        hang/          what the job's hang watchdog collected: stacks-<node>.txt (py-spy's
                       dumps), diagnosis.json and diagnosis.txt
        hang-unwatched with --hang-timeout: the batch host had no python3 to run the
                       watchdog (one line; a --wait follower watches instead)
        metrics/       per-step metrics, rank-RRRRR.jsonl per rank (written by the job via
                       $HPCDL_RUN_DIR; hpcdl.jobside.steps owns the format)
        probe-error.R  `hpcdl probe`: rank R's report that it refused its input (written by
                       the job; hpcdl.jobside.protocol owns the line)
        report.html    `hpcdl report` (and the end of `submit --wait`): hpcdl.report
        job/           the job-side files the script runs (hpcdl.launch.staging)
        code/          submit --code: the user's code directory, where the job starts

For a cluster reached over SSH (a profile's login:) this directory is written on the
submitting machine and copied to the same name under login.runs on the cluster, which
the plan's paths name; what the job writes is pulled back (hpcdl.jobs.place).

``RunDir`` owns these paths and reads and writes the records (plan.json read as a
PlanRecord, job.json as a JobRecord, result.json as hpcdl.jobs.result.ResultRecord,
profile.yaml, image.json and image.def). What other files hold is their owners' to read
and write: attempts.tsv/.json hpcdl.jobs.attempts, progress hpcdl.jobs.timelimit
(run_steps_seen), pids/, heartbeat/, hang/ and relaunch.request hpcdl.jobside.hangwatch
(the job's watchdog; hpcdl.jobs.watchdog reads them on the follow side), job/ hpcdl.launch.staging, code/ hpcdl.launch.code, probe-error.R
hpcdl.jobside.protocol, image.json's content hpcdl.container.hashing (image_record). The job script names
two of them itself, its logs (``slurm-%j.out/.err``) and ``checkpoints/`` (hpcdl.plan
renders them; RunDir.logs and RunDir.checkpoints follow the same names): the script's
and the logs' names are the scheduler's (``RunFiles``, hpcdl.schedulers.registry.run_files). The root is ``$HPCDL_RUNS`` or ``./runs``. Every file hpcdl writes here is written
atomically (temp file + rename), so a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hpcdl.container.hashing import image_record
from hpcdl.core.atomic import write_atomic, write_json_atomic
from hpcdl.jobside.requeue import PROGRESS_NAME
from hpcdl.jobside.steps import metrics_dir
from hpcdl.launch.code import CODE_DIR_NAME
from hpcdl.launch.staging import JOB_DIR_NAME
from hpcdl.schedulers.base import RunFiles
from hpcdl.schedulers.registry import run_files

REPORT_NAME = "report.html"
# The script's and the logs' names of the scheduler hpcdl submits to.
RUN_FILES = run_files()

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


def make_run_dir(path: Path) -> RunDir:
    """Create the run directory ``path`` (its parents as needed); it must not exist yet.

    Raises FileExistsError when it does: two submissions never share a directory.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    path.mkdir()
    return RunDir(path)


def create_run_dir(job_name: str, root: Path | None = None) -> RunDir:
    """Make a new, empty, uniquely named run directory.

    Safe under concurrency: the random suffix plus ``mkdir`` (which fails when the
    name exists) means two submissions never share a directory.
    """
    for _ in range(100):
        try:
            return make_run_dir(new_run_path(job_name, root))
        except FileExistsError:
            continue
    raise OSError(f"could not create a unique run directory under {(root or runs_root())}")


@dataclass(frozen=True)
class PlanRecord:
    """plan.json as it is read back: the submitted JobPlan's ``to_dict()`` (hpcdl.plan
    writes it). The shape of the job is typed and checked; ``data`` keeps the whole
    object for anything else (older or newer hpcdl versions may differ in other keys)."""

    nodes: int
    gpus_per_node: int
    ntasks: int
    job_name: str = ""
    backend: str = ""
    profile: str = ""
    partition: str = ""
    image: str | None = None
    # The run directory as the cluster sees it (another path than this one's when the
    # cluster was reached over SSH).
    run_dir: str = ""
    data: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: Any) -> PlanRecord:
        """Raises ValueError naming the key when ``data`` is not a plan record."""
        if not isinstance(data, dict):
            raise ValueError("not a plan record (not a JSON object)")

        def count(key: str) -> int:
            value = data.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{key}: {value!r} is not a count")
            return value

        def text(key: str) -> str:
            value = data.get(key, "")
            if not isinstance(value, str):
                raise ValueError(f"{key}: {value!r} is not a string")
            return value

        image = data.get("image")
        if image is not None and not isinstance(image, str):
            raise ValueError(f"image: {image!r} is not a string")
        return cls(nodes=count("nodes"), gpus_per_node=count("gpus_per_node"),
                   ntasks=count("ntasks"), job_name=text("job_name"), backend=text("backend"),
                   profile=text("profile"), partition=text("partition"), image=image,
                   run_dir=text("run_dir") if data.get("run_dir") is not None else "",
                   data=dict(data))


@dataclass(frozen=True)
class JobRecord:
    """job.json: what was submitted, when, and the id the scheduler gave it."""

    job_id: str
    argv: list[str]
    submitted_at: str
    # --chain N: every job of the chain, first to last (job_id is the first).
    chain: tuple[str, ...] = ()

    @classmethod
    def now(cls, job_id: str, argv: list[str], chain: tuple[str, ...] = ()) -> JobRecord:
        return cls(job_id, list(argv), time.strftime("%Y-%m-%dT%H:%M:%S%z"), tuple(chain))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobRecord:
        """Raises ValueError when ``data`` is not a job record."""
        if not isinstance(data, dict) or not data.get("job_id"):
            raise ValueError("not a job record (no job_id)")
        return cls(str(data["job_id"]), list(data.get("argv") or []),
                   str(data.get("submitted_at", "")),
                   tuple(str(j) for j in data.get("chain") or ()))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if not self.chain:
            del data["chain"]
        else:
            data["chain"] = list(self.chain)
        return data


@dataclass(frozen=True)
class RunDir:
    """One run directory: every path in it, and reading and writing its records.
    ``files``: the script's and the logs' names, as the scheduler's job script writes them."""

    path: Path
    files: RunFiles = RUN_FILES

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def script(self) -> Path:
        return self.path / self.files.script

    @property
    def plan_file(self) -> Path:
        return self.path / "plan.json"

    @property
    def job_file(self) -> Path:
        return self.path / "job.json"

    @property
    def result_file(self) -> Path:
        return self.path / "result.json"

    @property
    def profile_file(self) -> Path:
        return self.path / "profile.yaml"

    @property
    def image_file(self) -> Path:
        return self.path / "image.json"

    @property
    def image_def(self) -> Path:
        return self.path / "image.def"

    @property
    def checkpoints(self) -> Path:
        """Where the bundled example keeps checkpoints (plan.py passes it to the job)."""
        return self.path / "checkpoints"

    @property
    def attempts_log(self) -> Path:
        """attempts.tsv: written by the batch script (templates/sbatch.sh.j2)."""
        return self.path / "attempts.tsv"

    @property
    def attempts_file(self) -> Path:
        return self.path / "attempts.json"

    @property
    def progress(self) -> Path:
        """progress: the job's mark that its attempt completed a step (hpcdl/jobside/requeue.py)."""
        return self.path / PROGRESS_NAME

    @property
    def pids(self) -> Path:
        """pids/: one file per rank, written by the rank wrapper (hpcdl.launch.rankenv)."""
        return self.path / "pids"

    @property
    def hang_dir(self) -> Path:
        return self.path / "hang"

    @property
    def hang_json(self) -> Path:
        return self.hang_dir / "diagnosis.json"

    @property
    def hang_text(self) -> Path:
        return self.hang_dir / "diagnosis.txt"

    @property
    def metrics(self) -> Path:
        """metrics/: one file per rank (hpcdl.jobside.steps, which the job writes with)."""
        return metrics_dir(self.path)

    @property
    def report(self) -> Path:
        """report.html: the run's HTML report (hpcdl.report)."""
        return self.path / REPORT_NAME

    def logs(self, job_id: str) -> tuple[Path, Path]:
        """(stdout, stderr) of job ``job_id`` (the plan's log names, e.g. slurm-%j.out/.err)."""
        out, err = self.files.logs(job_id)
        return self.path / out, self.path / err

    @property
    def job_dir(self) -> Path:
        """job/: the job-side files staged at submission (hpcdl.launch.staging)."""
        return self.path / JOB_DIR_NAME

    @property
    def code_dir(self) -> Path:
        """code/: the copy of the user's --code directory the job starts in."""
        return self.path / CODE_DIR_NAME

    def write_plan(self, script: str, plan: dict[str, Any]) -> Path:
        """The job script (exactly ``script``) + plan.json; returns the script's path."""
        write_atomic(self.script, script, mode=0o755)
        write_json_atomic(self.plan_file, plan)
        return self.script

    def read_plan(self) -> PlanRecord:
        """plan.json as a PlanRecord. Raises OSError (unreadable), ValueError (not JSON,
        or not a plan record; the message names the file and the key)."""
        data = json.loads(self.plan_file.read_text(encoding="utf-8"))
        try:
            return PlanRecord.from_dict(data)
        except ValueError as exc:
            raise ValueError(f"{self.plan_file}: {exc}") from None

    def record_inputs(self, profile: dict[str, Any], image: str | None) -> None:
        """profile.yaml, and for a containerised job image.json (+ image.def): with the
        script and plan, what it takes to run the same job again.
        """
        write_atomic(self.profile_file, yaml.safe_dump(profile, sort_keys=False))
        if not image:
            return
        info, definition = image_record(image)
        write_json_atomic(self.image_file, info)
        if definition is not None:
            write_atomic(self.image_def, definition.read_text(encoding="utf-8"))

    def write_job(self, record: JobRecord) -> None:
        write_json_atomic(self.job_file, record.to_dict())

    def read_job(self) -> JobRecord | None:
        """job.json, or None when the job was never submitted (or the file is unreadable)."""
        try:
            return JobRecord.from_dict(json.loads(self.job_file.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            return None

    def write_result(self, result: dict[str, Any]) -> None:
        """result.json (hpcdl.jobs.result.ResultRecord, or a refusal's record)."""
        write_json_atomic(self.result_file, result)

    def read_result(self) -> dict[str, Any] | None:
        """result.json, or None while there is none. Raises ValueError for broken JSON."""
        if not self.result_file.is_file():
            return None
        data = json.loads(self.result_file.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError(f"{self.result_file}: not a JSON object")
        return data


def find_run(job_id: str, root: Path | None = None) -> RunDir | None:
    """The run directory whose job.json names ``job_id``, or None: a run of the runs
    root, or a point of a sweep directory in it (an array task, ``123_4``, included)."""
    base = root or runs_root()
    if not base.is_dir():
        return None
    for meta in _job_files(base):
        run = RunDir(meta.parent)
        record = run.read_job()
        if record is not None and (record.job_id == job_id or job_id in record.chain):
            return run
    return None


def find_array_runs(array_job_id: str, root: Path | None = None) -> list[RunDir]:
    """The run directories of the tasks of array ``array_job_id`` (job.json ``123_4``)."""
    base = root or runs_root()
    found = []
    if base.is_dir() and array_job_id.isdigit():
        for meta in _job_files(base):
            record = RunDir(meta.parent).read_job()
            if record is not None and record.job_id.startswith(f"{array_job_id}_"):
                found.append(RunDir(meta.parent))
    return found


def _job_files(base: Path) -> Iterator[Path]:
    # Sweep points live one level down (runs/sweep-x/point-003/job.json).
    yield from base.glob("*/job.json")
    yield from base.glob("*/*/job.json")
