"""Slurm's commands that change something or locate a job: sbatch (its argv too), scancel,
``scontrol show job`` for log paths and ``srun --overlap`` into a running job, with
Slurm's refusals turned into one-line errors with a hint. Returns values and raises hpcdl errors; never prints.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hpcdl.core import proc
from hpcdl.errors import HpcdlError, SubmitError, ToolError
from hpcdl.schedulers.base import SubmitOptions
from hpcdl.schedulers.executor import LOCAL, Executor, RemoteInputError
from hpcdl.schedulers.slurm.array import ARRAY_SPEC
from hpcdl.schedulers.slurm.parse import parse_job_id

SBATCH_TIMEOUT = 60
# Every Slurm command hpcdl runs: a profile's scheduler.commands directory serves them all
# (hpcdl.schedulers.executor.CommandDir).
SLURM_COMMANDS = frozenset({"sbatch", "srun", "squeue", "scontrol", "sinfo", "scancel",
                            "sacct", "salloc", "sprio", "sshare", "sstat"})
# What names the cluster's release (hpcdl.schedulers.slurm.releases).
VERSION_ARGV = ("sbatch", "--version")
COMMAND_TIMEOUT = 30
# A step that dumps the stacks of a node's ranks (srun start-up + one py-spy per rank).
OVERLAP_TIMEOUT = 120

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
    """What to do about Slurm's refusal ``message`` (its own words)."""
    for needle, hint in _HINTS:
        if needle.lower() in message.lower():
            return hint
    return "Slurm refused the script as rendered: check it with `hpcdl submit ... --dry-run`"


def unreachable(err: ToolError, profile_name: str | None) -> ToolError:
    """``err`` itself, or, when it says slurmctld cannot be reached, an error that says
    so in one line with the fix (for the sandbox profile: start the sandbox).
    """
    if "unable to contact slurm controller" not in (err.message + err.output).lower():
        return err
    hint = ("start the local sandbox cluster: hpcdl sandbox up" if profile_name == "sandbox"
            else "is slurmctld up? `scontrol ping` says; on a cluster, ask its admins")
    return ToolError(f"Slurm's controller is not reachable (profile {profile_name}): "
                     f"{err.message}", argv=err.argv, returncode=err.returncode,
                     output=err.output, hint=hint)


def sbatch_argv(script: str | Path, job_name: str,
                options: SubmitOptions | None = None) -> list[str]:
    """argv that submits ``script``. The exact job name travels here, not in the
    script (#SBATCH cannot carry every name), and so do the options that are not part
    of the job itself (a serial sweep's singleton, a chain's dependency, an array's
    tasks). Pure; raises SubmitError for an array spec Slurm would not take."""
    options = options or SubmitOptions()
    extra = ["--dependency=singleton"] if options.one_at_a_time else []
    if options.after is not None:
        extra.append(f"--dependency=afterany:{options.after}")
    if options.array is not None:
        if not ARRAY_SPEC.fullmatch(options.array):
            raise SubmitError(f"array: {options.array!r} is not an --array spec (e.g. 0-5%2)")
        extra.append(f"--array={options.array}")
    return ["sbatch", "--parsable", f"--job-name={job_name}", *extra, str(script)]


def not_on_path(ex: Executor = LOCAL) -> HpcdlError:
    """The error for a machine without Slurm's client tools: this one (exit 1), or the
    profile's login node, which then is not the cluster's (exit 2: the profile's to fix)."""
    if ex.remote:
        return RemoteInputError(
            f"login node {ex.target}: Slurm's commands (sbatch, squeue, sacct, "
            f"scontrol) are not on its PATH; is it the cluster's login node? (profile "
            f"login.host)", hint="ssh there and run `command -v sbatch`; a site that needs "
                                 "`module load slurm` wants it in the remote ~/.bashrc")
    return ToolError("sbatch: Slurm's commands are not on PATH",
                     hint="run on a login node, or start the local sandbox: hpcdl sandbox up")


def sbatch(argv: list[str], ex: Executor = LOCAL) -> str:
    """Run sbatch (``--parsable``); return the job id.

    Raises SubmitError with Slurm's message verbatim and a hint when it refuses.
    """
    try:
        res = ex.run(argv, timeout=SBATCH_TIMEOUT, check=False)
    except SubmitError:
        raise
    except ToolError as err:  # missing or timed out: the submission failed
        raise SubmitError(err.message, argv=err.argv, returncode=err.returncode,
                          output=err.output, hint=err.hint) from err
    if not res.ok:
        message = (res.stderr or res.stdout).strip() or f"exit code {res.returncode}"
        raise SubmitError(f"sbatch refused the job: {message}", argv=argv,
                          returncode=res.returncode, output=res.stdout + res.stderr,
                          hint=refusal_hint(message))
    return parse_job_id(res.stdout)


def scancel(job_ids: Sequence[str], *, check: bool = True, ex: Executor = LOCAL) -> None:
    """scancel the jobs (one command for all). Raises ToolError when ``check`` and
    scancel fails."""
    if job_ids:
        ex.run(["scancel", *job_ids], timeout=COMMAND_TIMEOUT, check=check)


def scontrol_log_paths(job_id: str, ex: Executor = LOCAL) -> tuple[Path, Path] | None:
    """(stdout, stderr) from ``scontrol show job`` while slurmctld holds the job."""
    res = ex.run(["scontrol", "-o", "show", "job", job_id], timeout=COMMAND_TIMEOUT,
                   check=False)
    if not res.ok:
        return None
    out = _field_after_state(res.stdout, "StdOut")
    err = _field_after_state(res.stdout, "StdErr")
    return (Path(out), Path(err or out)) if out else None


def _field_after_state(text: str, key: str) -> str | None:
    # StdOut/StdErr come after the (user-controlled) job name: take the last occurrence.
    at = text.rfind(f" {key}=")
    if at < 0:
        return None
    rest = text[at + len(key) + 2:]
    end = rest.find(" StdIn=") if key == "StdErr" else rest.find(" Power=")
    return (rest[:end] if end >= 0 else rest.split(" ", 1)[0]).strip() or None


def run_in_job(job_id: str, node: str, command: Sequence[str], *,
               timeout: float = OVERLAP_TIMEOUT, ex: Executor = LOCAL) -> proc.Result:
    """Run ``command`` on ``node`` of the running job (overlap_argv) and return what it
    printed and its exit code, whatever the code. Raises ToolError when srun is missing
    or the step does not end within ``timeout`` seconds."""
    # One argv for both watchdogs: the job's own builds it too. Imported here, not at the
    # top: a submission, which imports this module, does not need the watchdog's.
    from hpcdl.jobside.hangwatch import overlap_argv

    return ex.run(overlap_argv(job_id, node, command), timeout=timeout, check=False)
