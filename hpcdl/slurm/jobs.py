"""A job's life through Slurm: submit (run directory, live check, sbatch), follow
to the end, logs, cancel. Called by the CLI (``hpcdl submit``, ``status``, ``logs``,
``cancel``); every Slurm command runs through hpcdl.proc.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from hpcdl import proc, runs
from hpcdl.errors import SubmitError, ToolError
from hpcdl.plan import JobPlan, JobRequest, build_plan
from hpcdl.profiles.schema import Profile
from hpcdl.results import (
    describe_failures,
    failed_ranks,
    format_result_table,
    parse_rank_table,
    parse_result,
)
from hpcdl.slurm import livecheck
from hpcdl.slurm.parse import JobStatus, parse_job_id
from hpcdl.slurm.query import job_status, settled, slurm_available
from hpcdl.slurm.states import COMPLETED, is_final

Echo = Callable[..., None]
SBATCH_TIMEOUT = 60
SKIP_LIVE_CHECK_ENV = "HPCDL_SKIP_LIVE_CHECK"
POLL_S = 0.5

# Slurm's refusal (its own words) -> what the user can do about it.
_HINTS = (
    ("Requested node configuration is not available",
     "the nodes have fewer GPUs/CPUs than requested: compare `sinfo -o '%P %G %c'` with the "
     "profile (hpcdl profiles show NAME)"),
    ("Node count specification invalid",
     "more nodes than the partition allows: see MaxNodes in `scontrol show partition`"),
    ("Requested time limit is invalid",
     "--time exceeds the partition's MaxTime: see `scontrol show partition`"),
    ("invalid partition",
     "the partition does not exist on this cluster: see `sinfo -s`"),
    ("Invalid generic resource",
     "the cluster has no such GRES: see `sinfo -o '%P %G'`"),
    ("Invalid account",
     "set scheduler.account in the profile to an account you belong to (sacctmgr show assoc)"),
    ("Invalid qos",
     "set scheduler.qos in the profile to a QOS you may use (sacctmgr show assoc)"),
)


def refusal_hint(message: str) -> str:
    for needle, hint in _HINTS:
        if needle.lower() in message.lower():
            return hint
    return "Slurm refused the script as rendered: check it with `hpcdl submit ... --dry-run`"


def _echo(message: str = "", err: bool = False, nl: bool = True) -> None:
    click.echo(message, err=err, nl=nl)


def unreachable(err: ToolError, profile: Profile) -> ToolError:
    """``err`` itself, or, when it says slurmctld cannot be reached, an error that says
    so in one line with the fix (for the sandbox profile: start the sandbox).
    """
    if "unable to contact slurm controller" not in (err.message + err.output).lower():
        return err
    hint = ("start the local sandbox cluster: hpcdl sandbox up" if profile.name == "sandbox"
            else "is slurmctld up? `scontrol ping` says; on a cluster, ask its admins")
    return ToolError(f"Slurm's controller is not reachable (profile {profile.name}): "
                     f"{err.message}", argv=err.argv, returncode=err.returncode,
                     output=err.output, hint=hint)


def sbatch(argv: list[str]) -> str:
    """Run sbatch (``--parsable``); return the job id.

    Raises SubmitError with Slurm's message verbatim and a hint when it refuses.
    """
    res = proc.run(argv, timeout=SBATCH_TIMEOUT, check=False, error_cls=SubmitError)
    if not res.ok:
        message = (res.stderr or res.stdout).strip() or f"exit code {res.returncode}"
        raise SubmitError(f"sbatch refused the job: {message}", argv=argv,
                          returncode=res.returncode, output=res.stdout + res.stderr,
                          hint=refusal_hint(message))
    return parse_job_id(res.stdout)


@dataclasses.dataclass(frozen=True)
class Submitted:
    job_id: str
    run_dir: Path
    plan: JobPlan
    warnings: tuple[str, ...] = ()


def submit_plan(profile: Profile, request: JobRequest, plan: JobPlan, *,
                live_check: bool | None = None, runs_under: Path | None = None,
                run_name: str | None = None, sbatch_options: tuple[str, ...] = ()) -> Submitted:
    """Live check, run directory, sbatch. Returns the job id and run directory.

    ``plan`` was validated with ``run_dir=None``; it is planned again with the run
    directory so #SBATCH --output/--error point into it. The run directory goes
    under ``runs_under`` (default: runs_root()) and is named after ``run_name``
    (default: the job name); ``sbatch_options`` go on sbatch's command line (a
    sweep's --dependency=singleton). Raises ValidationError (live check),
    SubmitError (sbatch refused), ToolError (Slurm unreachable).
    """
    if not slurm_available():
        raise ToolError("sbatch: Slurm's commands are not on PATH",
                        hint="run on a login node, or start the local sandbox: hpcdl sandbox up")
    if live_check is None:
        live_check = os.environ.get(SKIP_LIVE_CHECK_ENV, "") not in ("1", "true", "yes")
    warnings: list[str] = []
    if live_check:
        try:
            warnings = livecheck.check_plan(profile, plan)
        except ToolError as err:
            raise unreachable(err, profile) from err
    run_dir = runs.create_run_dir(run_name or plan.job_name, root=runs_under)
    final = build_plan(profile, dataclasses.replace(request, run_dir=str(run_dir)))
    script = runs.write_plan(run_dir, final.script, final.to_dict())
    runs.record_inputs(run_dir, profile.model_dump(mode="json"), final.image)
    argv = final.sbatch_argv(script, sbatch_options)
    try:
        job_id = sbatch(argv)
    except SubmitError as err:
        runs.write_result(run_dir, {"state": "REFUSED", "message": err.message, "argv": argv})
        raise unreachable(err, profile) from err
    runs.record_submission(run_dir, job_id, argv)
    return Submitted(job_id, run_dir, final, tuple(warnings))


def follow(job_id: str, *, echo: Echo = _echo, timeout: float | None = None,
           live: bool | None = None) -> JobStatus:
    """Poll until the job ends; show one status line (rewritten in place on a tty).

    Returns the final status, with the exit code. Raises ToolError when
    ``timeout`` seconds pass first.
    """
    live = sys.stderr.isatty() if live is None else live
    deadline = None if timeout is None else time.monotonic() + timeout
    start = time.monotonic()
    last = ""
    polls = 0
    while True:
        status = job_status(job_id)
        if is_final(status.state):
            break
        line = (f"job {job_id}: {status.state}"
                f"{' (' + status.reason + ')' if status.reason else ''}"
                f"{' on ' + status.nodes if status.nodes else ''} "
                f"[{time.monotonic() - start:.0f} s]")
        if live:
            echo("\r\033[K" + line, err=True, nl=False)
        elif line.split(" [")[0] != last.split(" [")[0]:
            echo(line, err=True)
        last = line
        polls += 1
        if deadline is not None and time.monotonic() > deadline:
            if live:
                echo("", err=True)
            raise ToolError(f"job {job_id}: still {status.state} after {timeout:g} s",
                            hint=f"hpcdl status {job_id}; hpcdl cancel {job_id}")
        # Short jobs end within seconds: poll fast at first, then every POLL_S.
        time.sleep(0.1 if polls < 20 else POLL_S)
    if live and last:
        echo("", err=True)
    return settled(status)


def exit_status(status: JobStatus) -> int:
    """The process exit code that reflects a finished job (shell convention for signals)."""
    if status.exit_code:
        return status.exit_code
    if status.signal:
        return 128 + status.signal
    return 0 if status.state == COMPLETED else 1


@dataclasses.dataclass(frozen=True)
class JobLogs:
    """A finished job's stdout and stderr, read once for result.json and the report."""

    out_path: Path
    err_path: Path
    out: str
    err: str

    @classmethod
    def read(cls, run_dir: Path, job_id: str) -> JobLogs:
        out, err = runs.log_paths(run_dir, job_id)
        return cls(out, err, _read(out), _read(err))


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def result_record(status: JobStatus, logs: JobLogs) -> dict[str, Any]:
    """result.json: the final status, the example's hpcdl_result line and rank table
    (if any), and the ranks srun saw fail.
    """
    return {**status.to_dict(), "stdout": str(logs.out_path), "stderr": str(logs.err_path),
            "hpcdl_result": parse_result(logs.out), "ranks": parse_rank_table(logs.out),
            "failed_ranks": failed_ranks(logs.err)}


def record_result(run_dir: Path, status: JobStatus) -> tuple[dict[str, Any], JobLogs]:
    """An ended job's result.json, written from its status and logs; returns it and
    the logs (read once)."""
    logs = JobLogs.read(run_dir, status.job_id)
    record = result_record(status, logs)
    runs.write_result(run_dir, record)
    return record, logs


def report(status: JobStatus, run_dir: Path, logs: JobLogs, record: dict[str, Any],
           echo: Echo, tail_lines: int = 20) -> None:
    """What a user reads once the job ended: state and exit code, the log's tail, which
    rank crashed and its last lines (on failure), and the result table (on success).
    """
    echo(f"job {status.job_id}: {status.state} (Slurm {status.slurm_state}), "
         f"exit code {status.exit_code if status.exit_code is not None else '?'}"
         f"{', signal ' + str(status.signal) if status.signal else ''}, elapsed {status.elapsed}")
    crashed = [] if status.state == COMPLETED else describe_failures(logs.out, logs.err)
    for label, path, text in (("stdout", logs.out_path, logs.out),
                              ("stderr", logs.err_path, logs.err)):
        lines = text.splitlines()[-tail_lines:]
        if lines and (label == "stdout" or (status.state != COMPLETED and not crashed)):
            echo(f"--- last {len(lines)} lines of {label} ({path}) ---")
            for line in lines:
                echo(line)
    if crashed:
        echo(f"--- the job failed: {crashed[0]} ---")
        for line in crashed[1:]:
            echo(line)
        echo(f"full logs: hpcdl logs {status.job_id} (or {logs.err_path})")
    if record.get("hpcdl_result"):
        echo(f"--- result ({run_dir / 'result.json'}) ---")
        echo(format_result_table(record["hpcdl_result"], record.get("ranks")))
    echo(f"run directory: {run_dir}")


def submit_request(profile: Profile, request: JobRequest, plan: JobPlan, *, wait: bool,
                   as_json: bool, echo: Echo = _echo, timeout: float | None = None) -> int:
    """`hpcdl submit` without --dry-run: submit, print the job id, optionally follow.

    Returns the process exit code (0 once submitted; with ``wait`` the job's).
    Raises ValidationError, SubmitError, ToolError (see submit_plan, follow).
    """
    sub = submit_plan(profile, request, plan)
    for warning in (*plan.warnings, *sub.warnings):
        echo(f"warning: {warning}", err=True)
    info = {"job_id": sub.job_id, "run_dir": str(sub.run_dir), "partition": sub.plan.partition,
            "nodes": sub.plan.nodes, "ntasks": sub.plan.ntasks, "job_name": sub.plan.job_name}
    if not as_json:
        echo(f"Submitted job {sub.job_id} to partition {sub.plan.partition} "
             f"({sub.plan.nodes} nodes x {sub.plan.tasks_per_node} ranks); run dir {sub.run_dir}")
    if not wait:
        if as_json:
            echo(json.dumps(info))
        return 0
    final = follow(sub.job_id, echo=echo if not as_json else _quiet, timeout=timeout)
    record, logs = record_result(sub.run_dir, final)
    code = exit_status(final)
    if as_json:
        echo(json.dumps({**info, **record, "exit_status": code}))
        return code
    report(final, sub.run_dir, logs, record, echo)
    return code


def _quiet(*_args: Any, **_kwargs: Any) -> None:
    return None


def log_files(job_id: str) -> tuple[Path, Path]:
    """(stdout, stderr) paths of a job: from its run directory, else from scontrol.

    Raises ToolError when neither knows the job.
    """
    run_dir = runs.find_run(job_id)
    if run_dir is not None:
        return runs.log_paths(run_dir, job_id)
    res = proc.run(["scontrol", "-o", "show", "job", job_id], timeout=30, check=False)
    if res.ok:
        out = _field_after_state(res.stdout, "StdOut")
        err = _field_after_state(res.stdout, "StdErr")
        if out:
            return Path(out), Path(err or out)
    raise ToolError(f"job {job_id}: no run directory under {runs.runs_root()} and Slurm "
                    f"no longer knows its log paths",
                    hint="run from the directory you submitted from, or set HPCDL_RUNS")


def _field_after_state(text: str, key: str) -> str | None:
    # StdOut/StdErr come after the (user-controlled) job name: take the last occurrence.
    at = text.rfind(f" {key}=")
    if at < 0:
        return None
    rest = text[at + len(key) + 2:]
    end = rest.find(" StdIn=") if key == "StdErr" else rest.find(" Power=")
    return (rest[:end] if end >= 0 else rest.split(" ", 1)[0]).strip() or None


def stream_logs(job_id: str, *, follow_job: bool, echo: Echo = _echo,
                timeout: float | None = None) -> None:
    """Print the job's stdout (and stderr, to stderr); with ``follow_job``, keep
    printing new output until the job has ended and its files stop growing.
    """
    out, err = log_files(job_id)
    offsets = {out: 0, err: 0}
    deadline = None if timeout is None else time.monotonic() + timeout

    def pump() -> bool:
        grew = False
        for path in (out, err) if err != out else (out,):
            try:
                with path.open("rb") as fh:
                    fh.seek(offsets[path])
                    chunk = fh.read()
            except OSError:
                continue
            if chunk:
                grew = True
                offsets[path] += len(chunk)
                echo(chunk.decode("utf-8", errors="replace"), err=path == err and err != out,
                     nl=False)
        return grew

    pump()
    if not follow_job:
        if not out.exists() and not err.exists():
            echo(f"(job {job_id} has written no output yet: {out})", err=True)
        return
    while True:
        state = job_status(job_id).state
        pump()
        if is_final(state):
            time.sleep(POLL_S)
            while pump():
                time.sleep(POLL_S)
            return
        if deadline is not None and time.monotonic() > deadline:
            raise ToolError(f"job {job_id}: still {state} after {timeout:g} s")
        time.sleep(POLL_S)


def cancel(job_id: str) -> JobStatus:
    """scancel the job; return its status afterwards. Raises ToolError for an unknown
    or already finished job (scancel itself says nothing in that case).
    """
    before = job_status(job_id)
    if is_final(before.state):
        raise ToolError(f"job {job_id} already ended ({before.state}); nothing to cancel")
    proc.run(["scancel", job_id], timeout=30)
    deadline = time.monotonic() + 30
    status = job_status(job_id)
    while not is_final(status.state) and time.monotonic() < deadline:
        time.sleep(POLL_S)
        status = job_status(job_id)
    if is_final(status.state):
        return job_status(job_id, settle_s=10)
    return status  # still ending (COMPLETING): the caller reports what Slurm says
