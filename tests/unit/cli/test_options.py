"""hpcdl.cli.options: the options of submit, sweep, scale, probe and alloc declared once,
each in the section of --help that names the part of the request it sets (issue 45)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from hpcdl.cli import cli
from hpcdl.cli.options import ORDER, Output, ProbeFirst, fold
from hpcdl.cli.scale import ScaleAxes
from hpcdl.plan import DataRequest, FilesRequest, HangRequest, LaunchRequest, PlacementRequest

CLI = Path(__file__).resolve().parents[3] / "hpcdl" / "cli"


def sections(command: str) -> dict[str, list[str]]:
    """{section title: its options' first names} of ``hpcdl COMMAND --help``."""
    res = CliRunner().invoke(cli, [command, "--help"], terminal_width=80)
    assert res.exit_code == 0, res.output
    out: dict[str, list[str]] = {}
    title = None
    for line in res.output.splitlines():
        if m := re.fullmatch(r"(\S.*) options:", line):
            title = m.group(1)
            out[title] = []
        elif title and (m := re.match(r"  (-\w, )?(--[\w-]+)", line)):
            out[title].append(m.group(2))
    return out


def test_submit_help_reads_in_sections_in_the_declared_order() -> None:
    shown = sections("submit")
    assert list(shown) == [t for t in ORDER if t in shown]
    assert shown["Resilience"] == ["--requeue", "--max-restarts", "--signal", "--spares",
                                   "--chain"]
    assert shown["Hang watchdog"] == ["--hang-timeout", "--hang-action"]
    assert shown["Data"] == ["--data", "--synthetic", "--stage-data"]
    assert "--help" in shown["Output"]


@pytest.mark.parametrize(("command", "absent"), [
    # What a command cannot honour, it does not offer.
    ("sweep", {"--chain", "--hang-timeout", "--hang-action", "--probe-first", "--run-dir"}),
    ("probe", {"--data", "--synthetic", "--example-arg", "--requeue", "--spares"}),
    ("alloc", {"--template", "--image", "--wait"}),
])
def test_a_command_offers_only_what_it_honours(command: str, absent: set[str]) -> None:
    offered = {name for names in sections(command).values() for name in names}
    assert offered and not offered & absent


@pytest.mark.parametrize("flag", ["--spares", "--requeue/--no-requeue", "--max-restarts",
                                  "--signal", "--data", "--image", "--profile"])
def test_a_shared_option_is_declared_once(flag: str) -> None:
    # In the commands that build a job plan (other commands have a --profile of their own).
    files = [CLI / f"{name}.py" for name in ("options", "submit", "sweep", "scale", "probe")]
    declared = [p.name for p in files for line in p.read_text().splitlines()
                if re.search(rf"""(click\.option|opt)\("{re.escape(flag)}\"""", line)]
    assert declared == ["options.py"], declared


# --- each part's options folded into that part (SectionedCommand.invoke) ---------------

# The least each command parses (its required options).
MINIMAL = {"submit": ["-G", "1"], "sweep": [], "scale": ["-G", "1"], "probe": [],
           "alloc": ["-G", "1"]}


def folded(command: str, args: list[str]) -> dict[str, object]:
    """What ``hpcdl COMMAND ARGS`` hands its callback: click's values, each part folded."""
    cmd = cli.get_command(click.Context(cli), command)
    assert cmd is not None
    ctx = cmd.make_context(command, list(args))
    return fold(cmd.get_params(ctx), ctx.params)


@pytest.mark.parametrize("command", sorted(MINIMAL))
def test_every_option_folds_into_a_keyword_its_command_takes(command: str) -> None:
    # A mis-tagged option (a field its part lacks, a part the command does not take)
    # fails here, not on a user's command line.
    cmd = cli.get_command(click.Context(cli), command)
    assert cmd is not None and cmd.callback is not None
    taken = set(inspect.signature(cmd.callback).parameters)
    assert set(folded(command, MINIMAL[command])) == taken


def test_submit_options_build_their_parts() -> None:
    got = folded("submit", ["-N", "2", "-G", "4", "--spares", "1", "--data", "/d.sqfs",
                            "--stage-data", "--job-name", "j", "--run-dir", "runs/r",
                            "-e", "A=b=c", "--hang-timeout", "120", "--hang-action", "leave",
                            "--code", ".", "--json", "--", "python3", "t.py"])
    assert got["placement"] == PlacementRequest(nodes=2, gpus=4, spares=1)
    assert got["data"] == DataRequest(path="/d.sqfs", stage=True)
    assert got["launch"] == LaunchRequest(env=(("A", "b=c"),))
    assert got["files"] == FilesRequest(job_name="j", run_dir=str(Path("runs/r").resolve()),
                                        code_dir=".")
    assert got["hang"] == HangRequest(timeout=120.0, action="leave")
    assert got["output"] == Output(as_json=True)
    assert got["probe_first"] == ProbeFirst()
    assert got["command"] == ("python3", "t.py")  # the argument is the command's own


def test_scale_folds_its_lists_into_axes() -> None:
    got = folded("scale", ["-N", "1,2", "-G", "1,4", "--backend", "horovod,ddp",
                           "--batch-size", "32,64", "--concurrent", "-t", "10"])
    assert got["axes"] == ScaleAxes(nodes=(1, 2), gpus=(1, 4), backends=("horovod", "ddp"),
                                    batches=(32, 64), concurrent=True)
    assert got["placement"] == PlacementRequest(time="10")


@pytest.mark.parametrize(("args", "message"), [
    (["--env", "A"], "env: 'A' is not KEY=VALUE"),
    (["--hang-timeout", "soon"], "hang-timeout: "),
])
def test_a_part_that_cannot_be_made_refuses_in_one_line(args: list[str], message: str) -> None:
    res = CliRunner().invoke(cli, ["submit", "-p", "sandbox", "-G", "1", *args, "--dry-run"])
    assert res.exit_code == 2 and res.output.startswith(f"error: {message}"), res.output
