#!/usr/bin/env python3
"""The files a reader opens to follow one option of `hpcdl submit` from the command line
to the job script, in reading order, and their count (architecture issue 45's measure).

    python3 scripts/feature_files.py --data      # also --nodes, --spares, or any option
                                                 # of submit that sets a request part

The count is measured, not listed by hand: the script runs `hpcdl submit --dry-run`
in-process twice (a baseline, then with the option at a telling value, FEATURES) and
records what the second run's code does with the value until the job script is
rendered. A file counts when a reader must open it to see what becomes of the value:

1. the file that declares the option (hpcdl/cli), the file that defines the request
   part it sets (its ``part`` and ``field``, hpcdl.cli.options), and the one that
   defines the plan's part carrying it (2.);
2. every file whose code reads the value: the part's field, or a field of the plan's
   part built from it that differs from the baseline's (JobSpec for placement, DataPart
   for data, ...; ``PLAN_PARTS``), or a property of that part whose value differs, or a
   method of it (the part's own logic on its values) -- an attribute read, recorded by
   the caller's file --
   or that receives the value itself as an argument of one of its functions, bare (in
   a list, a command line, it is cargo) (the value is marked: a str or int subclass, so a callee that gets it bare
   is seen too; a rule that decides on it is such a callee; a string field of the plan's
   part derived from it, a normalised path, is the value too). A method of a part
   counts where it returns something (the caller gets the feature's value), not where
   it returns None (a check the part makes of itself: the caller only hands the part
   over). A file that only hands a whole part object on without reading the field is
   not counted;
3. for each template rendered on the way whose context differs from the baseline's:
   the file that assembles that context (render_template's caller) and the template
   files that use a differing key (with those they include).

Not counted: hpcdl/core (tokens, templating, resources: the project's shared language,
read like the standard library), generated dataclass methods and anything outside the
repository, and what runs after the job script is rendered (--dry-run's summary
lines, plan.json). Reads of the value in those are listed after the count as "after
the script", for information.

Order: declaration, part definitions, then the other files in the order the run first
touches them, templates last. The profile is the bundled ``sandbox`` (Slurm, with paths.shared and local scratch); the
requests are FEATURES' (a packed dataset exercises the most --data code).
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# Per option: the baseline's arguments and the run's (both added to BASE).
FEATURES: dict[str, tuple[list[str], list[str]]] = {
    "--data": ([], ["--data", "/scratch/ff/imagenet.sqfs"]),
    "--nodes": (["--nodes", "1"], ["--nodes", "2"]),
    "--spares": ([], ["--spares", "1"]),
}
BASE = ["submit", "-p", "sandbox", "-G", "0", "--dry-run", "--run-dir", "/scratch/ff/run",
        "--requeue"]
# The plan's part each request part is planned into (hpcdl.plan.jobplan.JobPlan).
PLAN_PARTS = {"placement": "JobSpec", "resilience": "JobSpec", "data": "DataPart",
              "container": "ContainerPart", "launch": "LaunchPart", "files": "FilesPart",
              "probe": "ProbePart", "hang": "HangPart"}
SKIP = ("hpcdl/core/",)
_NONE = object()
WHY: list[str] = []


class MarkedStr(str):
    """The option's value, as a str that says it is the one."""


class MarkedInt(int):
    """The option's value, as an int that says it is the one."""


def _mark(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return MarkedInt(value)
    if isinstance(value, str):
        return MarkedStr(value)
    return value


def _rel(filename: str) -> str | None:
    if not os.path.isfile(filename):  # <string>: dataclasses' generated methods
        return None
    try:
        rel = Path(filename).resolve().relative_to(REPO)
    except ValueError:
        return None
    text = rel.as_posix()
    if text.startswith("scripts/") or any(text.startswith(s) for s in SKIP):
        return None
    return text


def _plan_classes() -> dict[str, type]:
    from hpcdl.plan.data import DataPart
    from hpcdl.plan.jobplan import ContainerPart, FilesPart, HangPart, LaunchPart, ProbePart
    from hpcdl.schedulers.base import JobSpec
    return {c.__name__: c for c in (JobSpec, DataPart, ContainerPart, LaunchPart, FilesPart,
                                    ProbePart, HangPart)}


def _fields(obj: Any) -> dict[str, Any]:
    return {f.name: object.__getattribute__(obj, f.name) for f in dataclasses.fields(obj)}


class Run:
    """One in-process `hpcdl submit --dry-run`: the contexts rendered and the last
    instance of each plan part class, and (with ``trace``) what read the value."""

    def __init__(self) -> None:
        self.contexts: dict[str, tuple[dict[str, Any], str | None]] = {}
        self.parts: dict[str, Any] = {}
        self.order: list[str] = []  # files, as first touched
        self.after: list[str] = []  # files reading it after the script
        self.done = False
        self.started = False
        self.why: list[str] = []  # (FEATURE_FILES_WHY=1) what each file did
    def touch(self, filename: str, what: str = "") -> None:
        rel = _rel(filename)
        if rel is None or not self.started:
            return
        if not self.done:
            self.why.append(f"{rel}: {what}")
        target = self.after if self.done else self.order
        if rel not in target:
            target.append(rel)


def _run(args: list[str], *, part: str | None = None, field: str | None = None,
         carriers: dict[str, set[str]] | None = None, derived: frozenset[str] = frozenset()
         ) -> Run:
    from click.testing import CliRunner

    import hpcdl.core.templating as templating
    from hpcdl.cli import cli, options

    run = Run()
    restore: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, value: Any) -> None:
        # A class's own attribute, or none (then removed again: the inherited one shows).
        restore.append((owner, name, owner.__dict__.get(name, _NONE) if isinstance(owner, type)
                        else getattr(owner, name)))
        setattr(owner, name, value)

    original_render = templating.render_template

    def render(name: str, context: Any, **kwargs: Any) -> str:
        caller = sys._getframe(1).f_code.co_filename
        text = original_render(name, context, **kwargs)
        if not run.done:
            run.contexts.setdefault(name, (dict(context), _rel(caller)))
        if name.startswith("sbatch"):
            run.done = True
        return text

    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("hpcdl") and \
                getattr(module, "render_template", None) is original_render:
            patch(module, "render_template", render)

    for name, cls in _plan_classes().items():
        init = cls.__dict__["__init__"]

        def remember(self: Any, *a: Any, _init: Any = init, _name: str = name, **k: Any) -> None:
            _init(self, *a, **k)
            if not run.done:
                run.parts[_name] = self
        patch(cls, "__init__", remember)

    tracer = None
    if part is not None and field is not None and carriers is not None:
        builder = options.BUILDERS[part]

        def marked(*a: Any, _build: Any = builder, **k: Any) -> Any:
            if field in k:
                k[field] = _mark(k[field])
            run.started = True  # the command line is parsed: what follows is the trail
            return _build(*a, **k)
        # SectionOption took its builder when the commands were declared: mark there.
        for param in _submit().params:
            if getattr(param, "part", None) == part and getattr(param, "build", None) is builder:
                patch(param, "build", marked)
        for cls_name, attrs in carriers.items():
            cls = _plan_classes().get(cls_name) or _request_class(part)
            get = cls.__getattribute__

            def spy(self: Any, name: str, _get: Any = get, _attrs: set[str] = attrs) -> Any:
                value = _get(self, name)
                if name not in _attrs:
                    return value
                caller = sys._getframe(1).f_code.co_filename
                if not callable(value):
                    run.touch(caller, f"reads {type(self).__name__}.{name}")
                    return value

                def method(*a: Any, **k: Any) -> Any:
                    # A method that returns nothing is a check the part makes of itself:
                    # its caller hands the part over; one that returns a value hands the
                    # caller the feature's value.
                    out = value(*a, **k)
                    if out is not None:
                        run.touch(caller, f"gets {type(self).__name__}.{name}()")
                    return out
                return method
            patch(cls, "__getattribute__", spy)

        def carries(value: Any) -> bool:
            # Bare only: inside a list (a command line) the value is cargo, not read.
            return isinstance(value, (MarkedStr, MarkedInt)) or (
                isinstance(value, str) and value in derived)

        def tracer(frame: Any, event: str, arg: Any) -> None:  # noqa: F811
            if event != "call":
                return
            code = frame.f_code
            for name in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]:
                if carries(frame.f_locals.get(name)):
                    run.touch(code.co_filename, f"{code.co_name}() takes it as {name}")
                    return

    try:
        if tracer is not None:
            sys.setprofile(tracer)
        # $HPCDL_PROFILE unset: -p names the profile.
        result = CliRunner().invoke(cli, args, catch_exceptions=False,
                                    env={"HPCDL_PROFILE": None})
    finally:
        sys.setprofile(None)
        for owner, name, value in reversed(restore):
            if value is _NONE:
                delattr(owner, name)
            else:
                setattr(owner, name, value)
    if result.exit_code != 0:
        raise SystemExit(f"feature_files: {' '.join(args)} exited {result.exit_code}: "
                         f"{result.output.strip()}")
    return run


def _submit() -> Any:
    import click

    from hpcdl.cli import cli
    return cli.get_command(click.Context(cli), "submit")


def _request_class(part: str) -> type:
    from hpcdl.plan.request import _PARTS
    return _PARTS[part]


def _declaration(option: str) -> tuple[str, str, str]:
    """The option's declaring file and the part and field it sets (submit's)."""

    for param in _submit().params:
        if option in getattr(param, "opts", []):
            part, field = getattr(param, "part", None), getattr(param, "field", None)
            if part is None:
                raise SystemExit(f"feature_files: {option} sets no request part")
            pattern = re.compile(rf"opt\(\s*\"{re.escape(option)}\"")
            for path in sorted((REPO / "hpcdl/cli").glob("*.py")):
                if pattern.search(path.read_text()):
                    return path.relative_to(REPO).as_posix(), str(part), str(field)
    raise SystemExit(f"feature_files: submit has no option {option}")


def _template_files(name: str, keys: set[str]) -> list[str]:
    """``name`` (a bundled template) and the templates it includes, where one uses a key
    of ``keys``."""
    import jinja2
    from jinja2 import meta

    from hpcdl.core.resources import templates_dir
    env = jinja2.Environment()
    found: list[str] = []
    todo = [name]
    while todo:
        current = todo.pop(0)
        path = templates_dir() / current
        source = path.read_text()
        ast = env.parse(source)
        if meta.find_undeclared_variables(ast) & keys:
            found.append(path.resolve().relative_to(REPO).as_posix())
        todo += [t for t in meta.find_referenced_templates(ast) if t]
    return found


def _differs(a: Any, b: Any) -> bool:
    try:
        return bool(a != b)
    except Exception:  # noqa: BLE001 (values that do not compare: count them as changed)
        return True


def follow(option: str) -> tuple[list[str], list[str]]:
    """The files a reader opens for ``option``, in order, and those reading it after the
    script."""
    base_args, args = FEATURES.get(option, ([], []))
    if not args:
        raise SystemExit(f"feature_files: no request for {option}: add one to FEATURES")
    declared, part, field = _declaration(option)
    baseline = _run(BASE + base_args)
    plain = _run(BASE + args)
    plan_class = PLAN_PARTS[part]
    request_class = _request_class(part)
    carriers: dict[str, set[str]] = {request_class.__name__: {field} | {
        name for name, member in vars(request_class).items()
        if callable(member) and not name.startswith("__")}}
    if plan_class in plain.parts and plan_class in baseline.parts:
        new, old = _fields(plain.parts[plan_class]), _fields(baseline.parts[plan_class])
        changed = {k for k in new if _differs(new[k], old.get(k))}
        # The part's own logic on its values: a property whose value differs, and every
        # method (what the part says of its values, e.g. DataPart.example_args).
        for name, member in vars(_plan_classes()[plan_class]).items():
            if isinstance(member, property):
                if _differs(getattr(plain.parts[plan_class], name),
                            getattr(baseline.parts[plan_class], name)):
                    changed.add(name)
            elif callable(member) and not name.startswith("__"):
                changed.add(name)
        if changed:
            carriers.setdefault(plan_class, set()).update(changed)
    # The strings the plan's part derives from the value (a normalised path): passed on
    # bare, they are the value too.
    derived = frozenset(v for k, v in _fields(plain.parts[plan_class]).items()
                        if k in carriers.get(plan_class, ()) and isinstance(v, str)
                        and len(v) >= 4) if plan_class in plain.parts else frozenset()
    traced = _run(BASE + args, part=part, field=field, carriers=carriers, derived=derived)
    WHY[:] = traced.why
    files = [declared, _rel(_source_file(_request_class(part))) or ""]
    if plan_class in carriers:  # the plan's part that carries it: its definition too
        defined = _rel(_source_file(_plan_classes()[plan_class]))
        if defined and defined not in files:
            files.append(defined)
    for rel in traced.order:
        if rel not in files:
            files.append(rel)
    templates: list[str] = []
    for name, (context, caller) in plain.contexts.items():
        old_context = baseline.contexts.get(name, ({}, None))[0]
        keys = {k for k in context if _differs(context[k], old_context.get(k))}
        if not keys:
            continue
        if caller and caller not in files:
            files.append(caller)
        templates += [t for t in _template_files(name, keys) if t not in templates]
    after = [f for f in traced.after if f not in files]
    return files + templates, after


def _source_file(cls: type) -> str:
    import inspect
    return inspect.getsourcefile(cls) or ""


def main(argv: list[str]) -> int:
    # Options are the arguments (--data): argparse would take them for its own.
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    for option in argv:
        files, after = follow(option if option.startswith("-") else f"--{option}")
        print(f"{option}: {len(files)} files")
        for i, path in enumerate(files, 1):
            print(f"  {i:2d}. {path}")
        if after:
            print(f"  after the script (not counted): {', '.join(after)}")
        if os.environ.get("FEATURE_FILES_WHY"):
            seen: set[str] = set()
            for line in WHY:
                if line not in seen:
                    seen.add(line)
                    print(f"    {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
