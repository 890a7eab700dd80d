"""The one place where hpcdl runs external programs.

Every call takes an argv list (never a shell string, never ``shell=True``), a
timeout, and captures output, so that errors can carry the argv, the exit code
and the tool's own message.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from hpcdl.errors import ToolError


@dataclass(frozen=True)
class Result:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def which(name: str) -> str | None:
    """Path of an executable on PATH, or None."""
    return shutil.which(name)


def _env(extra: Mapping[str, str] | None) -> dict[str, str] | None:
    if not extra:
        return None
    env = dict(os.environ)
    env.update(extra)
    return env


def run(
    argv: Sequence[str],
    *,
    timeout: float = 60,
    check: bool = True,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    input: str | None = None,
    error_cls: type[ToolError] = ToolError,
) -> Result:
    """Run ``argv`` to completion and capture its output.

    Raises ``error_cls`` (a ToolError) when the program is missing, times out,
    or (with ``check``) exits non-zero; the message holds the tool's stderr.
    """
    argv = [str(a) for a in argv]
    try:
        cp = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=_env(env),
            cwd=cwd,
            input=input,
            check=False,
        )
    except FileNotFoundError as exc:
        raise error_cls(f"{argv[0]}: command not found", argv=argv, returncode=127) from exc
    except subprocess.TimeoutExpired as exc:
        raise error_cls(
            f"{argv[0]} did not finish within {timeout:g} s", argv=argv, returncode=124
        ) from exc
    result = Result(tuple(argv), cp.returncode, cp.stdout, cp.stderr)
    if check and not result.ok:
        message = (cp.stderr or cp.stdout).strip() or f"exit code {cp.returncode}"
        raise error_cls(
            f"{argv[0]} failed (exit {cp.returncode}): {message}",
            argv=argv,
            returncode=cp.returncode,
            output=cp.stdout + cp.stderr,
        )
    return result


def stream(
    argv: Sequence[str],
    *,
    on_line: Callable[[str], None] | None = None,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    error_cls: type[ToolError] = ToolError,
) -> Result:
    """Run ``argv``, handing each output line (stdout and stderr merged) to ``on_line``.

    Used for long jobs (image builds) where the user wants progress. Raises
    ``error_cls`` on a non-zero exit with the last lines of output.
    """
    argv = [str(a) for a in argv]
    lines: list[str] = []
    try:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=_env(env),
            cwd=cwd,
            bufsize=1,
            # Its own process group, so an interrupt can stop everything it started
            # (a build's helpers, a shell's background jobs), not only the direct child.
            start_new_session=True,
        )
    except FileNotFoundError as exc:
        raise error_cls(f"{argv[0]}: command not found", argv=argv, returncode=127) from exc
    assert proc.stdout is not None
    try:
        for line in _lines(proc.stdout):
            lines.append(line)
            if on_line:
                on_line(line)
        rc = proc.wait(timeout=timeout)
    except BaseException:
        # Interrupted (Ctrl-C, timeout, a failing callback): never leave anything running.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    output = "".join(lines)
    if rc != 0:
        tail = "".join(lines[-15:]).strip()
        raise error_cls(
            f"{argv[0]} failed (exit {rc}):\n{tail}", argv=argv, returncode=rc, output=output
        )
    return Result(tuple(argv), rc, output, "")


def _lines(fh) -> Iterator[str]:  # type: ignore[no-untyped-def]
    yield from iter(fh.readline, "")


def interactive(argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> int:
    """Run ``argv`` attached to the user's terminal (salloc, shells); return its exit code.

    Output is not captured: the user interacts with the program directly.
    Raises ToolError when the program does not exist.
    """
    argv = [str(a) for a in argv]
    try:
        return subprocess.call(argv, env=_env(env))
    except FileNotFoundError as exc:
        raise ToolError(f"{argv[0]}: command not found", argv=argv, returncode=127) from exc
