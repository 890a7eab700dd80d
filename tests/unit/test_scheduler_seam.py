"""The scheduler seam: the Slurm adapter runs every command through the executor it
is given (a remote login node would be another executor, not another adapter), owns
its submit argv and wording, and the job lifecycle above it names no scheduler."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from pathlib import Path

import pytest

from hpcdl.core import proc
from hpcdl.core.errors import SubmitError, ToolError, UserInputError
from hpcdl.jobs.follow import Watcher
from hpcdl.schedulers.base import JobState, JobStatus, SubmitOptions
from hpcdl.schedulers.registry import scheduler_for
from hpcdl.schedulers.slurm.adapter import SlurmScheduler

ROOT = Path(__file__).resolve().parents[2] / "hpcdl"


class Recording:
    """An executor that answers from a table (tool -> (rc, stdout, stderr)) and
    remembers every argv; nothing runs."""

    def __init__(self, answers: dict[str, tuple[int, str, str]],
                 tools: tuple[str, ...] = ("sbatch", "squeue", "sacct", "scontrol")) -> None:
        self.answers = answers
        self.tools = tools
        self.argvs: list[list[str]] = []

    def run(self, argv: Sequence[str], *, timeout: float, check: bool = True) -> proc.Result:
        self.argvs.append(list(argv))
        rc, out, err = self.answers.get(argv[0], (127, "", f"{argv[0]}: not found"))
        if check and rc:
            raise ToolError(f"{argv[0]} failed (exit {rc}): {err}", argv=list(argv),
                            returncode=rc)
        return proc.Result(tuple(argv), rc, out, err)

    def which(self, name: str) -> str | None:
        return f"/remote/bin/{name}" if name in self.tools else None

    def which_all(self, names: Sequence[str]) -> dict[str, str | None]:
        return {name: self.which(name) for name in names}


@pytest.fixture
def no_local_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"ran a local command: {args}")

    monkeypatch.setattr(proc, "run", refuse)
    monkeypatch.setattr(proc, "which", refuse)


def test_the_adapter_submits_and_follows_through_its_executor(no_local_commands: None) -> None:
    ex = Recording({
        "sbatch": (0, "4242;cluster\n", ""),
        # squeue has forgotten the job; sacct has its final row.
        "squeue": (1, "", "slurm_load_jobs error: Invalid job id specified"),
        "sacct": (0, "4242|COMPLETED|0:0|n1|00:00:09|00:10:00|debug|train\n", ""),
    })
    slurm = SlurmScheduler("sandbox", ex)
    assert slurm.available()
    argv = slurm.submit_argv("/scratch/r/job.sbatch", "train", SubmitOptions(after="41"))
    assert argv == ["sbatch", "--parsable", "--job-name=train", "--dependency=afterany:41",
                    "/scratch/r/job.sbatch"]
    assert slurm.submit(argv) == "4242"
    done = Watcher(slurm, sleep=lambda s: None).watch(["4242"])
    assert done["4242"].state is JobState.COMPLETED and done["4242"].exit_code == 0
    assert [a[0] for a in ex.argvs] == ["sbatch", "squeue", "sacct"]


def test_a_refusal_and_a_missing_scheduler_are_worded_by_the_adapter(
        no_local_commands: None) -> None:
    refusing = SlurmScheduler("sandbox", Recording(
        {"sbatch": (1, "", "sbatch: error: invalid partition specified: nope")}))
    with pytest.raises(SubmitError) as err:
        refusing.submit(["sbatch", "--parsable", "x.sbatch"])
    assert err.value.message.startswith("sbatch refused the job: sbatch: error: invalid "
                                        "partition")
    assert err.value.hint and "sinfo -s" in err.value.hint
    absent = SlurmScheduler("sandbox", Recording({}, tools=()))
    assert not absent.available()
    with pytest.raises(ToolError, match="^sbatch: Slurm's commands are not on PATH$"):
        absent.require()


CAPTURED_CONFIG = Path(__file__).resolve().parent / "slurm_outputs" / "sandbox" / "config.txt"


def test_max_array_size_is_read_from_scontrol_show_config_once(no_local_commands: None) -> None:
    ex = Recording({"scontrol": (0, CAPTURED_CONFIG.read_text(), "")})
    slurm = SlurmScheduler("sandbox", ex)
    assert slurm.max_array_size() == 1001 and slurm.max_array_size() == 1001
    assert ex.argvs == [["scontrol", "show", "config"]]  # remembered, like available()
    off = Recording({"scontrol": (0, "MaxArraySize            = 0\n", "")})
    assert SlurmScheduler("sandbox", off).max_array_size() == 0  # arrays switched off
    silent = Recording({"scontrol": (0, "ClusterName = x\n", "")})
    assert SlurmScheduler("sandbox", silent).max_array_size() is None
    down = SlurmScheduler("sandbox", Recording({"scontrol": (
        1, "", "slurm_load_ctl_conf error: Unable to contact slurm controller")}))
    with pytest.raises(ToolError, match="^Slurm's controller is not reachable") as err:
        down.max_array_size()
    assert err.value.hint and "sandbox up" in err.value.hint


def test_the_registry_picks_the_adapter_by_the_profile_type() -> None:
    ex = Recording({})
    slurm = scheduler_for("sandbox", "slurm", ex)
    assert isinstance(slurm, SlurmScheduler) and slurm.executor is ex
    with pytest.raises(UserInputError, match="hpcdl submits to slurm only .*: pbs"):
        scheduler_for("polaris", "pbs")


def test_job_states_read_as_their_names() -> None:
    assert f"{JobState.TIMEOUT:<9}|" == "TIMEOUT  |"
    assert json.dumps({"state": JobState.FAILED}) == '{"state": "FAILED"}'
    assert JobState("RUNNING") == "RUNNING" and "COMPLETED" in {JobState.COMPLETED}


def _code_words(source: str) -> list[str]:
    """Every import, name and string constant of ``source``, docstrings left out."""
    tree = ast.parse(source)
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr)}
    words: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            words.append(node.module)
        elif isinstance(node, ast.Import):
            words += [alias.name for alias in node.names]
        elif isinstance(node, ast.Name):
            words.append(node.id)
        elif isinstance(node, ast.Attribute):
            words.append(node.attr)
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in docs):
            words.append(node.value)
    return words


# The job lifecycle: hpcdl's flows (and the jobs layer, where there is one) over the seam.
LIFECYCLE = ["sweep/run.py", "hang/watchdog.py", "schedulers/base.py",
             "schedulers/executor.py",
             *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "jobs").glob("*.py"))]
# Words that look like a scheduler's and are not a call to it, each with why:
NEUTRAL_WORDS = {
    # The record key of the native state, kept for the records already written.
    "slurm_state": "NATIVE_STATE_KEY",
    # hpcdl's own --time syntax (D-HH:MM:SS) is Slurm's, parsed in core; the PBS
    # dialect converts it too. The module's name says where the syntax comes from.
    "hpcdl.core.slurmtime": "hpcdl's duration syntax",
}


def _scheduler_words(module: str) -> list[str]:
    words = _code_words((ROOT / module).read_text())
    return [w for w in words
            if re.search(r"\b(sbatch|squeue|sacct|scontrol|scancel|qsub|qstat|SBATCH)\b", w)
            or "schedulers.slurm" in w or "schedulers.pbs" in w
            or ("slurm" in w.lower() and w not in NEUTRAL_WORDS)]


@pytest.mark.parametrize("module", LIFECYCLE)
def test_the_lifecycle_code_names_no_scheduler(module: str) -> None:
    # Code, not prose: a docstring or comment may explain with Slurm as the example; the
    # code may not spell a scheduler's commands or import an adapter. (The record key
    # slurm_state is kept for the records already written: NATIVE_STATE_KEY.)
    hits = _scheduler_words(module)
    assert not hits, hits


def test_the_adapter_words_attempts_time_limits_and_its_run_files() -> None:
    slurm = SlurmScheduler()
    assert slurm.attempt_reason("BOOT_FAIL", last=True, script_cause=None) == "NODE_FAIL"
    assert slurm.attempt_reason("NODE_FAIL", last=False, script_cause="FAILED") == "NODE_FAIL"
    assert slurm.attempt_reason("CANCELLED by 0", last=True, script_cause="TIMEOUT") == "TIMEOUT"
    assert slurm.attempt_reason("REQUEUED", last=False, script_cause=None) == "REQUEUED"
    assert slurm.attempt_reason("RUNNING", last=False, script_cause=None) == "REQUEUED"
    assert slurm.attempt_reason("RUNNING", last=True, script_cause=None) == "RUNNING"
    ended = JobStatus("7", "j", JobState.CANCELLED, "CANCELLED by 0")
    assert slurm.time_ran_out(ended) is None
    assert slurm.time_ran_out(ended, "slurmstepd: *** JOB 7 CANCELLED DUE TO TIME LIMIT") == "limit"
    assert slurm.time_ran_out(JobStatus("7", "j", JobState.TIMEOUT, "DEADLINE")) == "deadline"
    assert slurm.run_files.script == "job.sbatch"
    assert slurm.run_files.logs("7") == ("slurm-7.out", "slurm-7.err")


def test_an_interactive_allocation_is_the_dialects_or_its_refusal() -> None:
    from hpcdl.jobs.alloc import build_alloc
    from hpcdl.plan import JobRequest
    from hpcdl.profiles import load_profile

    plan = build_alloc(load_profile("sandbox"), JobRequest(nodes=1, gpus=0, command=("true",)))
    assert plan.argv[0] == "salloc" and plan.argv[-1] == "true"
    assert dict(plan.env) == {"SRUN_CPUS_PER_TASK": next(
        a.split("=", 1)[1] for a in plan.argv if a.startswith("--cpus-per-task="))}
    with pytest.raises(UserInputError, match=r"^scheduler: profile polaris uses pbs; hpcdl "
                                             r"alloc works with Slurm only \(on PBS an "
                                             r"interactive job is `qsub -I`\)$"):
        build_alloc(load_profile("polaris"), JobRequest(nodes=1, gpus=1))
