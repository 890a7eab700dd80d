"""The suite's durations, in the open: at the end of a session that ran the whole `tests`
tree (`make test`), write its slowest tests and each tier's time to
docs/generated/test-durations.md (shown in docs/testing.md) and a .json beside it.

Only a whole run writes them: a `-k`/`-m` subset, one file, `--lf`, a `-x` stop or an
interrupted session would replace the suite's numbers with a part's. A session with
failures still writes (its times are real; the file gives the outcome counts). Written
atomically, so a reader (mkdocs, git) never sees half a file. The set-up and lint times
come from the Makefile (HPCDL_SETUP_SECONDS, HPCDL_LINT_SECONDS): pytest cannot see
them.
"""

from __future__ import annotations

import os
import platform
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from hpcdl.core.atomic import write_atomic, write_json_atomic

SLOWEST = 40
# The page lists this many files by summed time (the json has every file).
FILES_SHOWN = 30
# A test's group when it has none: under xdist it runs wherever a worker is free.
FREE = "(free)"
NAME = "test-durations"
# Where the files go, relative to the rootdir; an ini value moves them (the plugin's own
# tests write into pytester's folder).
DEFAULT_DIR = "docs/generated"
# The stages outside pytest the Makefile times and hands over.
STAGE_ENV = {"set-up (scripts/setup.sh)": "HPCDL_SETUP_SECONDS",
             "lint (ruff + mypy)": "HPCDL_LINT_SECONDS"}
XDIST_GROUP = re.compile(r"@[A-Za-z0-9_.-]+$")
SECONDS = re.compile(r"[0-9]{1,7}(\.[0-9]{1,6})?")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("hpcdl_durations_dir", "where a whole run writes test-durations.md/.json "
                  "(relative to the rootdir)", default=DEFAULT_DIR)


def whole_suite(config: pytest.Config) -> bool:
    """Did the command line ask for the whole tests tree, with no selection?"""
    opt = config.option
    if opt.keyword or opt.markexpr or getattr(opt, "deselect", None) \
            or getattr(opt, "ignore", None) or getattr(opt, "ignore_glob", None) \
            or getattr(opt, "lf", False) or getattr(opt, "stepwise", False):
        return False
    tests = (config.rootpath / "tests").resolve()
    args = config.args or ["tests"]
    for arg in args:
        if "::" in arg:
            return False
        path = Path(arg) if Path(arg).is_absolute() else config.invocation_params.dir / arg
        if path.resolve() not in (tests, config.rootpath.resolve()):
            return False
    return True


def plain_id(nodeid: str) -> str:
    """The test's id without the ``@GROUP`` xdist's loadgroup appends (tests/parallel.py)."""
    return XDIST_GROUP.sub("", nodeid)


def group_of(nodeid: str) -> str:
    """The xdist group loadgroup appended to the id (``...::t@sandbox`` -> "sandbox"),
    or FREE: the group's tests run one after another in one worker, so the biggest
    group's summed time is the least the session can take (tests/parallel.py)."""
    found = XDIST_GROUP.search(nodeid)
    return found.group(0)[1:] if found else FREE


def file_of(nodeid: str) -> str:
    """tests/unit/x/test_y.py::t[a::b] -> tests/unit/x/test_y.py."""
    return nodeid.split("::", 1)[0]


def sums_by(seconds: dict[str, float], key: dict[str, str]) -> dict[str, dict[str, Any]]:
    """{key: {"tests": n, "seconds": summed}} over ``seconds`` (by test id), the biggest
    first; ``key`` maps a test id to its key."""
    out: dict[str, dict[str, Any]] = {}
    for nodeid, s in seconds.items():
        row = out.setdefault(key[nodeid], {"tests": 0, "seconds": 0.0})
        row["tests"] += 1
        row["seconds"] += s
    for row in out.values():
        row["seconds"] = round(row["seconds"], 1)
    return dict(sorted(out.items(), key=lambda kv: (-kv[1]["seconds"], kv[0])))


def tier_of(nodeid: str) -> str:
    """tests/unit/x/test_y.py::t -> "unit"; the tier is the folder under tests/."""
    parts = nodeid.split("::", 1)[0].split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[0]


def stage_seconds(env: dict[str, str]) -> dict[str, float]:
    """The Makefile's stage times, where given and a plain number of seconds."""
    out = {}
    for label, var in STAGE_ENV.items():
        value = env.get(var, "")
        if SECONDS.fullmatch(value):
            out[label] = float(value)
    return out


def fmt_seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"


def machine_line() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = ""
    try:
        load = ", load average at the end " + Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        pass
    return (f"{platform.node()}: {cpu}, {os.cpu_count()} cores, "
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}{load}")


def render_markdown(data: dict[str, Any]) -> str:
    """The page docs/testing.md includes: the stages, the tiers, the slowest tests."""
    counts = ", ".join(f"{n:,} {k}" for k, n in sorted(data["outcomes"].items()))
    lines = [
        "<!-- Written by tests/durations.py at the end of a whole `make test` run; "
        "not edited by hand. -->",
        f"Last whole run: {data['finished']} on {data['machine']}; "
        f"`{data['command']}`: {counts} in {fmt_seconds(data['session_seconds'])}"
        f"{' (CI=true)' if data['ci'] else ''}, {data.get('workers', 1)} worker(s): "
        "a tier's time is its tests' own, summed; the session's is the wall clock.",
        "",
        "| stage | tests | time |",
        "|---|---|---|",
    ]
    for label, seconds in data["stages"].items():
        lines.append(f"| {label} | | {fmt_seconds(seconds)} |")
    for tier, t in data["tiers"].items():
        lines.append(f"| tests/{tier} | {t['tests']:,} | {fmt_seconds(t['seconds'])} |")
    lines.append(f"| pytest session in all | {sum(t['tests'] for t in data['tiers'].values()):,} "
                 f"| {fmt_seconds(data['session_seconds'])} |")
    lines += ["", f"The {len(data['slowest'])} slowest tests (set-up + call + teardown; a "
              "session fixture's set-up counts in the first test that uses it):", "",
              "| # | test | seconds | outcome |", "|---|---|---|---|"]
    for i, t in enumerate(data["slowest"], 1):
        # A backtick in a parametrized id would end the code span early.
        nodeid = t["nodeid"].replace("`", "'")
        lines.append(f"| {i} | `{nodeid}` | {t['seconds']:.1f} | {t['outcome']} |")
    lines += render_balance(data)
    return "\n".join(lines) + "\n"


def render_balance(data: dict[str, Any]) -> list[str]:
    """The xdist groups and the files by summed time: what the next balancing of
    tests/parallel.py reads (a group runs in one worker, one test after another)."""
    groups = data.get("groups") or []
    if not groups:
        return []
    total = sum(g["seconds"] for g in groups)
    workers = max(int(data.get("workers", 1)), 1)
    lines = ["", f"Summed over every test: {fmt_seconds(total)}; over {workers} worker(s) "
             f"at least {fmt_seconds(total / workers)} each. Each xdist group runs in one "
             f"worker, its tests one after another (tests/parallel.py; {FREE}: anywhere):",
             "", "| xdist group | tests | summed time |", "|---|---|---|"]
    for g in groups:
        lines.append(f"| {g['group']} | {g['tests']:,} | {fmt_seconds(g['seconds'])} |")
    files = data.get("files") or []
    lines += ["", f"The {min(len(files), FILES_SHOWN)} files of the most summed time (the "
              f"json has all {len(files)}):", "",
              "| file | xdist group | tests | summed time |", "|---|---|---|---|"]
    for f in files[:FILES_SHOWN]:
        lines.append(f"| `{f['file']}` | {f['group']} | {f['tests']:,} "
                     f"| {fmt_seconds(f['seconds'])} |")
    return lines


@dataclass(eq=False)  # a plugin object must hash (pluggy keeps a set of them)
class Durations:
    """Collects each test's phases; writes the files when a whole run ends."""

    config: pytest.Config
    started: float = field(default_factory=time.monotonic)
    seconds: dict[str, float] = field(default_factory=dict)
    outcome: dict[str, str] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)
    group: dict[str, str] = field(default_factory=dict)
    collected: set[str] = field(default_factory=set)
    deselected: int = 0

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        self.deselected += len(items)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.collected = {plain_id(item.nodeid) for item in session.items}

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: object, ids: list[str]) -> None:
        # Under xdist the controller collects nothing itself: every worker reports the
        # same ids (xdist refuses to run otherwise).
        self.collected = {plain_id(i) for i in ids}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        nodeid = plain_id(report.nodeid)
        self.group[nodeid] = group_of(report.nodeid)
        self.seconds[nodeid] = self.seconds.get(nodeid, 0.0) + report.duration
        # The test's outcome is its call's, unless set-up or teardown failed or skipped it.
        if report.when == "call" or report.outcome != "passed":
            if self.outcome.get(nodeid) in (None, "passed"):
                xfail = hasattr(report, "wasxfail")
                self.outcome[nodeid] = ("xfailed" if report.skipped else "xpassed") \
                    if xfail else report.outcome
        if report.when == "teardown":
            self.finished.add(nodeid)

    def complete(self, session: pytest.Session, exitstatus: int) -> bool:
        """A whole run that ran every collected test to its teardown."""
        return (whole_suite(self.config) and not self.deselected and bool(self.collected)
                and self.collected <= self.finished and not session.shouldstop
                and not session.shouldfail
                and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED))

    def summary(self) -> dict[str, Any]:
        tiers: dict[str, dict[str, Any]] = {}
        for nodeid, s in self.seconds.items():
            t = tiers.setdefault(tier_of(nodeid), {"tests": 0, "seconds": 0.0})
            t["tests"] += 1
            t["seconds"] = round(t["seconds"] + s, 1)
        outcomes: dict[str, int] = {}
        for o in self.outcome.values():
            outcomes[o] = outcomes.get(o, 0) + 1
        # Lists, the biggest first (the json's objects are written with sorted keys).
        groups = [{"group": name, **row} for name, row in sums_by(self.seconds, self.group).items()]
        # A file's tests may be in more than one group (a release's cases): "a, b".
        file_groups: dict[str, set[str]] = {}
        for nodeid in self.seconds:
            file_groups.setdefault(file_of(nodeid), set()).add(self.group[nodeid])
        files = [{"file": name, "group": ", ".join(sorted(file_groups[name])), **row}
                 for name, row in sums_by(self.seconds,
                                          {n: file_of(n) for n in self.seconds}).items()]
        slowest = sorted(self.seconds.items(), key=lambda kv: kv[1], reverse=True)[:SLOWEST]
        params = self.config.invocation_params
        return {
            "finished": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": machine_line(),
            "command": " ".join(["pytest", *params.args]),
            "ci": os.environ.get("CI") == "true",
            "session_seconds": round(time.monotonic() - self.started, 1),
            "workers": int(getattr(self.config.option, "numprocesses", None) or 1),
            "stages": stage_seconds(dict(os.environ)),
            "tiers": dict(sorted(tiers.items())),
            "outcomes": outcomes,
            "groups": groups,
            "files": files,
            "slowest": [{"nodeid": n, "seconds": round(s, 2),
                         "outcome": self.outcome.get(n, "passed")} for n, s in slowest],
        }

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if not self.complete(session, exitstatus):
            return
        data = self.summary()
        folder = self.config.rootpath / str(self.config.getini("hpcdl_durations_dir"))
        folder.mkdir(parents=True, exist_ok=True)
        write_json_atomic(folder / f"{NAME}.json", data)
        write_atomic(folder / f"{NAME}.md", render_markdown(data))


def pytest_configure(config: pytest.Config) -> None:
    # A pytester session inside the suite gets its own config: it writes only where it
    # runs the plugin itself (tests/unit/project/test_durations.py).
    config.pluginmanager.register(Durations(config), "hpcdl-durations")
