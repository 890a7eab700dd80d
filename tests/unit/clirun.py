"""hpcdl's CLI run in the test's own process, answering like ``python -m hpcdl`` does
(tests.integration.conftest_slurm.hpcdl): a CompletedProcess with the exit code, stdout
and stderr apart.

For unit tests that check what the CLI prints and exits with (a dry run, a one-line
refusal): the same click group, error handling and exit codes as the console entry
point (hpcdl.cli.main -> cli.main), without a Python start that imports and, where
bytecode is not written, compiles hpcdl again (0.5-1 s each on a 2-core machine). That
`python -m hpcdl` starts and answers is the integration tests' to check
(tests/integration), and tests/unit/cli/test_cli.py's, which start Python on purpose."""

from __future__ import annotations

import subprocess

from click.testing import CliRunner

from hpcdl.cli import cli


def hpcdl(*args: str) -> subprocess.CompletedProcess[str]:
    """``hpcdl ARGS`` in this process; an exception hpcdl does not turn into an exit code
    fails the test with its traceback (a real process would print it and exit 1)."""
    res = CliRunner().invoke(cli, list(args), prog_name="hpcdl", catch_exceptions=False)
    return subprocess.CompletedProcess(["hpcdl", *args], res.exit_code, res.stdout, res.stderr)
