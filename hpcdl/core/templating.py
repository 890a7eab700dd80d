"""Jinja2 rendering of job scripts: pure functions, no I/O beyond reading templates.

Everything a user supplies reaches a shell only through ``shlex.quote``: the
plan builder quotes values in Python (see ``shell_join``), and templates get a
``q`` filter for any value they add themselves.

Templates render in Jinja's sandbox: a user template (``--template``, a profile's
``template_dir``) decides what the script says, but rendering it (a dry run) cannot
reach Python internals (``__class__``, ``__globals__``...), call unsafe methods or
run anything.
"""

from __future__ import annotations

import functools
import shlex
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import jinja2
import jinja2.bccache
import jinja2.sandbox

from hpcdl import __version__
from hpcdl.core.atomic import write_atomic
from hpcdl.core.resources import templates_dir, user_cache
from hpcdl.errors import RenderError


class Raw(str):
    """A shell token written by hpcdl itself (e.g. ``"$SLURM_NTASKS"``): not quoted.

    Only code in this package creates Raw tokens; user values are plain str and
    are always quoted.
    """


def shell_join(tokens: Iterable[str]) -> str:
    """Join argv tokens into one shell line, quoting every non-Raw token."""
    return " ".join(t if isinstance(t, Raw) else shlex.quote(t) for t in tokens)


class CompiledTemplates(jinja2.BytecodeCache):
    """Jinja's compiled templates kept between processes, in the user's cache: compiling
    the job template is ~10 ms of every `hpcdl submit` (issue 43), loading it back
    ~0.5 ms. Pure input, pure output: an entry is the template's name and file (the
    key) and its source's SHA-1 (Jinja checks it and compiles again on any change), in
    a folder per Jinja and Python version (the code's format), written whole (a
    reader never sees half of one). Only this module's one environment configuration
    (the sandbox's, below) writes here. Best effort: an unreadable or unwritable cache
    compiles as before. The folder is looked up at each use, not at import (the
    unit tests' sealed HOME)."""

    def _path(self, bucket: jinja2.bccache.Bucket) -> Path:
        version = f"jinja{jinja2.__version__}-py{sys.version_info[0]}.{sys.version_info[1]}"
        return Path(user_cache()) / "templates" / version / f"{bucket.key}.cache"

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            data = self._path(bucket).read_bytes()
        except OSError:
            return
        try:
            bucket.bytecode_from_string(data)  # a stale entry leaves the code unset
        except Exception:  # a damaged one: whatever reading it raised, compile again
            bucket.reset()

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        path = self._path(bucket)
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            write_atomic(path, bucket.bytecode_to_string(), mode=0o600)
        except OSError:
            pass


@functools.lru_cache(maxsize=32)
def _environment(search_path: tuple[str, ...]) -> jinja2.Environment:
    """One environment per search path, kept: Jinja then compiles a template once per
    process instead of at every render (~15 ms, most of a plan's build time; a sweep or
    a test renders hundreds). Its loader still checks each file's mtime before reusing
    the compiled form (auto_reload), so an edited user template is read again."""
    env = jinja2.sandbox.SandboxedEnvironment(
        loader=jinja2.FileSystemLoader(list(search_path)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # shell scripts, not HTML  # noqa: S701
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        bytecode_cache=CompiledTemplates(),
    )
    env.filters["q"] = lambda v: shlex.quote(str(v))
    return env


def render_template(
    name: str,
    context: Mapping[str, Any],
    *,
    template_file: str | Path | None = None,
    template_dirs: Iterable[str | Path] = (),
) -> str:
    """Render template ``name`` (e.g. ``sbatch.sh.j2``).

    ``template_file`` replaces the template outright (``--template FILE``);
    ``template_dirs`` (a profile's template_dir) are searched before the bundled
    templates. Raises RenderError naming the template and the problem.
    """
    search = [Path(d).expanduser() for d in template_dirs] + [templates_dir()]
    if template_file is not None:
        path = Path(template_file).expanduser()
        if path.is_dir():
            raise RenderError(f"template: {str(path)!r} is a directory, not a template file")
        if not path.is_file():
            raise RenderError(f"template: file {str(path)!r} does not exist")
        search = [path.parent, *search]
        name = path.name
    env = _environment(tuple(str(p) for p in search))
    try:
        template = env.get_template(name)
        return template.render(hpcdl_version=__version__, **context)
    except jinja2.TemplateNotFound as exc:
        raise RenderError(f"template: {name!r} not found in {', '.join(map(str, search))}") from exc
    except jinja2.TemplateError as exc:
        where = f"{exc.filename}:{exc.lineno}" if getattr(exc, "lineno", None) else name  # type: ignore[attr-defined]
        refused = "refused by the sandbox: " if isinstance(exc, jinja2.sandbox.SecurityError) else ""
        raise RenderError(f"template {where}: {refused}{exc.message}") from exc
    except UnicodeDecodeError as exc:
        raise RenderError(f"template {name}: not UTF-8 text (offset {exc.start})") from exc
    except Exception as exc:  # a user template is code: whatever it raises is its error
        raise RenderError(f"template {name}: {type(exc).__name__}: {exc}") from exc
