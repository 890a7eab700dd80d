"""Where a scheduler adapter's commands run. An adapter is given an ``Executor`` and
runs every command (sbatch, squeue, qsub, ...) through it; ``LocalExecutor`` runs
them here, through hpcdl.proc (the one subprocess gateway). Running the same adapter
against a remote login node is another Executor (one that carries the argv over a
connection), not another adapter.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from hpcdl import proc
from hpcdl.errors import ToolError


class Executor(Protocol):
    """Runs one command to completion: an argv list (never a shell string), a timeout,
    captured output."""

    def run(self, argv: Sequence[str], *, timeout: float, check: bool = True,
            error_cls: type[ToolError] = ToolError) -> proc.Result:
        """Run ``argv``; raise ``error_cls`` when it is missing, times out, or (with
        ``check``) exits non-zero."""
        ...

    def which(self, name: str) -> str | None:
        """Where the command ``name`` is found, or None."""
        ...


class LocalExecutor:
    """Commands run on this machine, through hpcdl.proc."""

    def run(self, argv: Sequence[str], *, timeout: float, check: bool = True,
            error_cls: type[ToolError] = ToolError) -> proc.Result:
        return proc.run(argv, timeout=timeout, check=check, error_cls=error_cls)

    def which(self, name: str) -> str | None:
        return proc.which(name)


LOCAL = LocalExecutor()
