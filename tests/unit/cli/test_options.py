"""hpcdl.cli.options: the options of submit, sweep, scale, probe and alloc declared once,
each in the section of --help that names the part of the request it sets (issue 45)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcdl.cli import cli
from hpcdl.cli.options import ORDER

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
