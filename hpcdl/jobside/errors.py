"""The exception hierarchy of hpcdl, defined here, in the job-side layer, because the
job side raises it too (this module is staged into every run: standard library only).
The rest of hpcdl imports it as hpcdl.errors; the staged code (hpcdl/jobside, examples/)
imports it from here, where a job finds it.

The library raises these; only the CLI turns them into messages and exit codes
(``exit_code`` 2 for bad input, 1 for a failed tool). Messages are one line a
user can act on: which field, which value, which limit.
"""

from __future__ import annotations


class HpcdlError(Exception):
    """Base of every error hpcdl reports to a user."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class UserInputError(HpcdlError):
    """The request itself cannot run (bad value, over a limit): exit 2."""

    exit_code = 2


class ConfigError(UserInputError):
    """A profile or spec file is malformed (syntax, unknown key, wrong type)."""


class ValidationError(UserInputError):
    """A request exceeds what the cluster profile allows."""


class RenderError(UserInputError):
    """A template could not be rendered (syntax, undefined variable, missing file,
    refused by the sandbox): the template is user input, so exit 2."""


class ToolError(HpcdlError):
    """An external tool (sbatch, apptainer, mpirun...) failed or is missing."""

    def __init__(
        self,
        message: str,
        *,
        argv: list[str] | None = None,
        returncode: int | None = None,
        output: str = "",
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint)
        self.argv = argv or []
        self.returncode = returncode
        self.output = output


class SubmitError(ToolError):
    """Slurm refused or lost a job."""


class BuildError(ToolError):
    """An image build failed."""
