"""hpcdl's command line.

Subcommands live in their own modules and are imported only when used (a lazy
click group), so ``hpcdl --help`` stays fast and never imports torch.
To add a command: write it in ``hpcdl/cli/<module>.py`` and add one line to
``COMMANDS``.
"""

from __future__ import annotations

import importlib
import re
from typing import IO, Any

import click

from hpcdl import __version__
from hpcdl.errors import HpcdlError

# name -> (module:attribute, one-line help shown by `hpcdl --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "submit": ("hpcdl.cli.submit:submit", "Validate, render and submit a training job."),
    "alloc": ("hpcdl.cli.alloc:alloc", "Render (or run) salloc for interactive work."),
    "profiles": ("hpcdl.cli.profiles:profiles", "List, show and validate cluster profiles."),
    "data": ("hpcdl.cli.data:data", "Make, check and pack ImageFolder datasets (make-tiny, check, pack)."),
    "build": ("hpcdl.cli.build:build", "Build an Apptainer/Singularity image from a spec or .def."),
    "push": ("hpcdl.cli.push:push", "Copy an image to a cluster reached over SSH (once per content)."),
    "doctor": ("hpcdl.cli.doctor:doctor", "Check host and image: runtime, Slurm, GPUs, MPI, Horovod."),
    "inspect": ("hpcdl.cli.doctor:inspect", "Show what is inside an image (torch, MPI, horovodrun -cb)."),
    "status": ("hpcdl.cli.jobs:status", "Show a job's state (live, then from accounting) or your recent jobs."),
    "logs": ("hpcdl.cli.jobs:logs", "Print (or follow with -f) a job's stdout/stderr."),
    "cancel": ("hpcdl.cli.jobs:cancel", "Cancel a pending or running job."),
    "probe": ("hpcdl.cli.probe:probe", "Allreduce bandwidth across an allocation; names slow nodes."),
    "scale": ("hpcdl.cli.scale:scale", "Submit a scaling sweep (nodes x GPUs x backend x batch)."),
    "sweep": ("hpcdl.cli.sweep:sweep", "A hyperparameter sweep as one job array (--param lr=0.1,0.05)."),
    "results": ("hpcdl.cli.results:results", "Scaling table, CSV/JSON and plot of a sweep or run."),
    "report": ("hpcdl.cli.report:report", "One self-contained HTML report of a run or sweep."),
    "track": ("hpcdl.cli.track:track", "Export runs to TensorBoard or MLflow (from the login node)."),
    "sandbox": ("hpcdl.cli.sandbox:sandbox", "Start/stop/check the local Slurm sandbox (two nodes, or --nodes N)."),
}


class OneLineUsageError(click.UsageError):
    """click's usage error shown as hpcdl shows every error: one ``error:`` line and a
    ``hint:`` line naming the command's --help (click's own is a 4-line block)."""

    def __init__(self, err: click.UsageError) -> None:
        super().__init__(err.format_message(), err.ctx)

    def show(self, file: IO[Any] | None = None) -> None:
        command = self.ctx.command_path if self.ctx else "hpcdl"
        click.echo(f"error: {one_line(self.format_message())}", err=True)
        click.echo(f"hint: see '{command} --help'", err=True)


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use."""

    def make_context(self, info_name: str | None, args: list[str],
                     parent: click.Context | None = None, **extra: Any) -> click.Context:
        # Usage errors of the top level (`hpcdl --bogus`) come from here.
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as err:
            raise OneLineUsageError(err) from err

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        target, _ = COMMANDS[cmd_name]
        module_name, attr = target.split(":")
        cmd = getattr(importlib.import_module(module_name), attr)
        assert isinstance(cmd, click.Command)
        return cmd

    def invoke(self, ctx: click.Context) -> Any:
        # The one place where library errors become messages and exit codes
        # (2 bad input, 1 failed tool); CliRunner-based tests see the same.
        try:
            return super().invoke(ctx)
        except HpcdlError as err:
            print_error(err)
            ctx.exit(err.exit_code)
        except OneLineUsageError:
            raise
        except click.UsageError as err:  # a subcommand's (missing option, bad value...)
            raise OneLineUsageError(err) from err

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Use the static help strings so `--help` imports no subcommand module.
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hpcdl")
def cli() -> None:
    """hpcdl: distributed deep learning on Slurm clusters in one command.

    Builds Apptainer/Singularity images with PyTorch, Horovod and MPI, renders
    sbatch scripts from YAML cluster profiles, checks each request against the
    cluster's limits before anything is written, submits it and follows it.

    \b
    Typical use:
      hpcdl profiles list
      hpcdl submit --profile neuron --nodes 2 --gpus 4 --dry-run
      hpcdl submit --profile sandbox --nodes 2 --gpus 4 --image img.sif --wait
    """


# Characters that would end or garble a terminal line (C0/C1 controls, DEL, Unicode
# line separators); tab is kept.
_LINE_BREAKING = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(text: str) -> str:
    """``text`` with every line-breaking or control character escaped (``\\n``, ``\\x1b``),
    so an echoed value can never split an error into several lines."""
    return _LINE_BREAKING.sub(lambda m: repr(m.group())[1:-1], text)


def print_error(err: HpcdlError) -> None:
    """Print an hpcdl error as the user should see it: one line, then the hint."""
    click.echo(f"error: {one_line(err.message)}", err=True)
    if err.hint:
        click.echo(f"hint: {one_line(err.hint)}", err=True)


def main(argv: list[str] | None = None) -> Any:
    """Console entry point."""
    return cli.main(args=argv, prog_name="hpcdl")
