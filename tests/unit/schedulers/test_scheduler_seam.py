"""The scheduler seam: the Slurm adapter runs every command through the executor it
is given (a remote login node would be another executor, not another adapter), owns
its submit argv and wording, and the job lifecycle above it names no scheduler."""

from __future__ import annotations

import ast
import json
import re
import shlex
from collections.abc import Sequence
from pathlib import Path

import pytest

from hpcdl.core import proc
from hpcdl.errors import SubmitError, ToolError, UserInputError
from hpcdl.jobs.follow import Watcher
from hpcdl.schedulers.base import JobState, JobStatus, SubmitOptions
from hpcdl.schedulers.executor import LocalExecutor
from hpcdl.schedulers.registry import scheduler_for
from hpcdl.schedulers.slurm.adapter import SlurmScheduler

ROOT = Path(__file__).resolve().parents[3] / "hpcdl"


class Recording(LocalExecutor):
    """An executor of this machine's kind (LocalExecutor's transport facts) that answers
    from a table (tool -> (rc, stdout, stderr)) and remembers every argv; nothing runs."""

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


CAPTURED_CONFIG = Path(__file__).resolve().parents[1] / "slurm_outputs" / "sandbox" / "config.txt"


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
LIFECYCLE = ["sweep/run.py", "sweep/flow.py", "results/read.py", "jobs/watchdog.py",
             "schedulers/base.py", "schedulers/executor.py",
             *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "jobs").glob("*.py"))]
# Words that look like a scheduler's and are not a call to it, each with why:
NEUTRAL_WORDS = {
    # The record key of the native state, kept for the records already written.
    "slurm_state": "NATIVE_STATE_KEY",
}


def _scheduler_words(module: str) -> list[str]:
    words = _code_words((ROOT / module).read_text())
    return [w for w in words
            if re.search(r"\b(sbatch|squeue|sacct|scontrol|scancel|qsub|qstat|SBATCH)\b", w)
            or "schedulers.slurm" in w or "schedulers.pbs" in w
            or ("slurm" in w.lower() and w not in NEUTRAL_WORDS)]


# The planning layer and the command line, over the same seam: they pick a dialect or an
# adapter through hpcdl.schedulers.dialects / .registry and word nothing of a scheduler's.
FRONT = sorted(str(p.relative_to(ROOT)) for d in ("plan", "cli") for p in (ROOT / d).glob("*.py"))
# Modules of the command line left out whole, each with why:
FRONT_EXEMPT_MODULES = {
    # `hpcdl sandbox` starts, stops and writes the configuration of a local Slurm
    # cluster: Slurm (slurm.conf, SLURM_CONF) is its subject, not a seam it crosses.
    "cli/sandbox.py": "a local Slurm cluster is what it manages",
}
# Single words of the command line that name Slurm to the user, each (module, how the
# word begins) with why. Help text that explains a Slurm mechanism a flag turns on is
# the user's documentation; a column or a field that carries Slurm's own word is output
# scripts already read. Anything else goes behind the seam.
FRONT_EXEMPT_WORDS = {
    ("cli/__init__.py", "Check host and image: runtime, Slurm"):
        "doctor's one-line help: it checks this host's Slurm client tools",
    ("cli/__init__.py", "Start/stop/check the local Slurm sandbox"):
        "sandbox's one-line help: the sandbox is a Slurm cluster",
    ("cli/doctor.py", "  slurm             : "):
        "doctor's report line of the host's Slurm tools (hpcdl.doctor's HostFacts)",
    ("cli/doctor.py", "slurm_version"): "hpcdl.doctor's HostFacts field, printed on that line",
    ("cli/doctor.py", "slurm_tools"): "hpcdl.doctor's HostFacts field, printed on that line",
    ("cli/doctor.py", "slurm_commands"): "hpcdl.doctor's HostFacts field, printed on that line",
    ("cli/doctor.py", "slurm_release"): "hpcdl.doctor's HostFacts field: the release's line",
    ("cli/doctor.py", "  slurm release     : "):
        "doctor's report line of the release and what hpcdl does differently there",
    ("cli/display.py", "SLURM"):
        "the attempts table's column of the native state, as scripts and docs read it",
    ("cli/jobs.py", "SLURM"):
        "the status table's column of the native state, as scripts and docs read it",
    ("cli/jobs.py", "Without JOBID: list finished jobs since this time (sacct -S"):
        "--since takes Slurm's accounting time syntax, which the help names",
}


def _front_hits(module: str) -> list[str]:
    return [w for w in _scheduler_words(module)
            if not any(module == m and w.startswith(start) for m, start in FRONT_EXEMPT_WORDS)]


@pytest.mark.parametrize("module", LIFECYCLE + [m for m in FRONT
                                                if m not in FRONT_EXEMPT_MODULES])
def test_the_lifecycle_code_names_no_scheduler(module: str) -> None:
    # Code, not prose: a docstring or comment may explain with Slurm as the example; the
    # code may not spell a scheduler's commands or import an adapter. (The record key
    # slurm_state is kept for the records already written: NATIVE_STATE_KEY.) The plan
    # and cli modules have their few named exemptions above.
    hits = _front_hits(module)
    assert not hits, hits


def test_every_front_exemption_is_still_needed() -> None:
    assert all((ROOT / m).is_file() for m in FRONT_EXEMPT_MODULES)
    stale = [(m, start) for m, start in FRONT_EXEMPT_WORDS
             if not any(w.startswith(start) for w in _scheduler_words(m))]
    assert not stale, stale


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

    plan = build_alloc(load_profile("sandbox"), JobRequest.of(nodes=1, gpus=0, command=("true",)))
    assert plan.argv[0] == "salloc" and plan.argv[-1] == "true"
    assert dict(plan.env) == {"SRUN_CPUS_PER_TASK": next(
        a.split("=", 1)[1] for a in plan.argv if a.startswith("--cpus-per-task="))}
    with pytest.raises(UserInputError, match=r"^scheduler: profile polaris uses pbs; hpcdl "
                                             r"alloc works with Slurm only \(on PBS an "
                                             r"interactive job is `qsub -I`\)$"):
        build_alloc(load_profile("polaris"), JobRequest.of(nodes=1, gpus=1))


def test_an_allocation_of_a_login_profile_runs_there_over_ssh_t(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from hpcdl.jobs.alloc import alloc_command, build_alloc, run_alloc
    from hpcdl.plan import JobRequest
    from hpcdl.profiles import load_profile
    from hpcdl.remote.ssh import LoginNode, SshExecutor

    plan = build_alloc(load_profile("sandbox-remote"), JobRequest.of(
        nodes=1, gpus=1, job_name="it's me", command=("sh", "-c", "echo $HOSTNAME; hostname")))
    login = SshExecutor(LoginNode("10.77.0.250", user="jdoe", port=2222),
                        Path("/run/user/1000/hpcdl/ssh"))
    argv, env = alloc_command(plan, login)
    # The master connection every other command of this login node rides on.
    master = next(a for a in login.ssh_argv(["true"]) if a.startswith("ControlPath="))
    remote = ("env SRUN_CPUS_PER_TASK=2 salloc '--job-name=it'\"'\"'s me' --partition=debug "
              "--nodes=1 --ntasks-per-node=1 --gres=gpu:1 --cpus-per-task=2 --time=00:10:00 "
              "sh -c 'echo $HOSTNAME; hostname'")
    assert argv == ["ssh", "-t", "-o", "ControlMaster=auto", "-o", master,
                    "-o", "ControlPersist=300", "-o", "ConnectTimeout=15",
                    "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=3",
                    "-o", "BatchMode=no", "-l", "jdoe", "-p", "2222", "10.77.0.250", "--",
                    remote]
    assert shlex.split(remote) == ["env", "SRUN_CPUS_PER_TASK=2", *plan.argv]
    assert env == {}  # the environment goes by `env` there; ssh carries none
    # Here, without a login node: the dialect's argv and environment as they are.
    assert alloc_command(plan) == (list(plan.argv), {"SRUN_CPUS_PER_TASK": "2"})

    ran: list[object] = []
    monkeypatch.setattr(SshExecutor, "connect", lambda self, **kw: ran.append("connect"))
    monkeypatch.setattr(proc, "interactive", lambda a, env=None: ran.append((a, env)) or 7)
    assert run_alloc(plan, login) == 7
    assert ran == ["connect", (argv, {})]


def test_a_dry_run_alloc_of_a_login_profile_says_where_it_runs() -> None:
    from click.testing import CliRunner

    from hpcdl.cli import cli

    res = CliRunner().invoke(cli, ["alloc", "-p", "sandbox-remote", "-N", "1", "-G", "1",
                                   "--dry-run", "--", "hostname"])
    assert res.exit_code == 0, res.output
    assert "# runs on the login node 10.77.0.250 (ssh -t)" in res.output
