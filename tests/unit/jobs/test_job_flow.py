"""The job flow outside the CLI (hpcdl/jobs): it returns what happened and prints
nothing, against the fake Slurm; and the layering that keeps it so: hpcdl/jobs never
imports the CLI or prints, and the CLI's modules import one another without a circle
(an import inside a function says why it is there: start-up time, never a circle)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hpcdl.jobs.flow import follow_job, probe_exit, submit_job
from hpcdl.jobs.submit import plan_run
from hpcdl.plan import JobRequest
from hpcdl.profiles import load_profile
from hpcdl.report import write_run_report
from hpcdl.schedulers.base import JobState, JobStatus
from hpcdl.schedulers.slurm.adapter import SlurmScheduler
from tests.fakeslurm.fixture import FakeSlurm
from tests.unit.jobs.test_lifecycle import CRASH_ERR, GOOD_OUT, RESULT

HPCDL = Path(__file__).resolve().parents[3] / "hpcdl"


@pytest.fixture
def fake(fake_slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeSlurm:
    monkeypatch.setenv("HPCDL_SKIP_LIVE_CHECK", "1")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('never run: the fake Slurm runs nothing')\n")
    monkeypatch.setattr("hpcdl.jobs.follow.MIN_INTERVAL_S", 0.01)
    fake_slurm.scenario(
        default={"states": [["PENDING", 1], ["RUNNING", 2], ["COMPLETED", 0]],
                 "stdout": GOOD_OUT},
        jobs={"crash": {"states": [["RUNNING", 2], ["FAILED", 0]], "exit": "1:0",
                        "stdout": "0: epoch 1/1\n", "stderr": CRASH_ERR}},
        sacct_lag=2)
    return fake_slurm


def _run(name: str, polls: list[str]):  # type: ignore[no-untyped-def]
    prof = load_profile("sandbox")
    plan = plan_run(prof, JobRequest.of(nodes=2, gpus=2, cpus_per_task=1, job_name=name,
                                     command=("python3", "train.py")))
    scheduler = SlurmScheduler(prof.name)
    job = submit_job(prof, plan, scheduler=scheduler, watch=True)

    def polled(pending: dict[str, JobStatus], _elapsed: float) -> None:
        polls.extend(s.state for s in pending.values())

    return job, follow_job(prof, job, scheduler=scheduler, on_poll=polled,
                           write_report=write_run_report)


def test_a_followed_job_comes_back_as_an_outcome_and_nothing_is_printed(
        fake: FakeSlurm, capsys: pytest.CaptureFixture[str]) -> None:
    polls: list[str] = []
    job, outcome = _run("good", polls)
    assert capsys.readouterr() == ("", "")
    assert "RUNNING" in polls  # progress went to the caller's callback
    assert outcome.final.state == JobState.COMPLETED and outcome.exit_status == 0
    assert outcome.record["hpcdl_result"] == RESULT
    assert outcome.attempts == [] and outcome.hang is None and outcome.probe_error is None
    assert outcome.report == job.submitted.run.report and outcome.report.is_file()
    assert outcome.report_error is None
    assert (job.submitted.run_dir / "result.json").is_file()


def test_a_crashed_job_has_its_exit_status_and_logs_in_the_outcome(
        fake: FakeSlurm, capsys: pytest.CaptureFixture[str]) -> None:
    _, outcome = _run("crash", [])
    assert capsys.readouterr() == ("", "")
    assert outcome.final.state == JobState.FAILED and outcome.exit_status == 1
    assert "CUDA error: an illegal memory access" in outcome.logs.err


def test_a_probe_that_a_node_refused_exits_2_else_with_the_job() -> None:
    assert probe_exit({"probe": {"error": "no interface ib0"}}, 143) == 2
    assert probe_exit({"probe": {"verdict": {"bad": True}}}, 1) == 1
    assert probe_exit({}, 0) == 0


def _imports(path: Path) -> list[tuple[str, int | None]]:
    """(module, line) for every import in ``path``; line None at module level."""
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    found: list[tuple[str, int | None]] = []
    for node in ast.walk(tree):
        line = None if id(node) in top else node.lineno if isinstance(node, ast.stmt) else None
        if isinstance(node, ast.Import):
            found += [(alias.name, line) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.module, line))
    return found


def _says_why(lines: list[str], line: int) -> bool:
    """Whether the import at ``line`` (1-based) sits under a ``# Lazy...`` comment: the
    first line above it that is neither an import nor blank."""
    for text in reversed(lines[:line - 1]):
        stripped = text.strip()
        if stripped and not stripped.startswith(("from ", "import ")):
            return stripped.startswith("# Lazy")
    return False


def test_the_jobs_layer_never_imports_the_cli_nor_prints() -> None:
    # The jobs layer of hpcdl/__init__.py's table: the flows of jobs/ and those beside
    # their own concern (sweep/flow.py, results/read.py), and what they build on.
    layer = [p for d in ("jobs", "sweep", "results", "report", "track")
             for p in sorted((HPCDL / d).glob("*.py"))]
    assert HPCDL / "sweep" / "flow.py" in layer and HPCDL / "jobs" / "watchdog.py" in layer
    for path in layer:
        modules = {name for name, _ in _imports(path)}
        assert not {m for m in modules if m == "click" or m.startswith(("hpcdl.cli", "rich"))}, path
        calls = {node.func.id for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
        assert "print" not in calls, path


def test_the_cli_modules_import_one_another_without_a_circle() -> None:
    graph: dict[str, set[str]] = {}
    for path in sorted((HPCDL / "cli").glob("*.py")):
        name = "hpcdl.cli" if path.stem == "__init__" else f"hpcdl.cli.{path.stem}"
        lines = path.read_text().splitlines()
        edges = [(m, line) for m, line in _imports(path) if m.startswith("hpcdl.cli")]
        # An import of another CLI module inside a function is how a circle hides; one
        # that keeps start-up fast says so.
        hidden = [(m, line) for m, line in edges if line is not None and not _says_why(lines, line)]
        assert not hidden, (name, hidden)
        graph[name] = {m for m, _ in edges}
    done: set[str] = set()

    def visit(node: str, path: tuple[str, ...]) -> None:
        assert node not in path, " -> ".join((*path, node))
        if node in done:
            return
        for nxt in graph.get(node, ()):
            visit(nxt, (*path, node))
        done.add(node)

    for node in graph:
        visit(node, ())
