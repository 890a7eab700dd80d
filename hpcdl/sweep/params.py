"""A hyperparameter sweep's points: the grid (cartesian product) of ``--param
NAME=v1,v2`` lists, a YAML list of points, or ``--random N`` samples from ranges, and
what each point changes in the training command. Pure, apart from reading the
example's source and a points file.

For the bundled example a point's ``NAME=v`` becomes ``--NAME=v`` among its arguments,
and NAME must be one of the example's own options (read from its argparse calls, so
the list cannot drift from the example). For a user's ``-- COMMAND`` a ``{NAME}``
placeholder in a COMMAND token is replaced by the value; a parameter no token names is
appended as ``--NAME=v``. Values are single tokens of a small alphabet: they are also
quoted where they land (the job script's shell_join), so the check is a second wall,
and it keeps labels, sweep.json and the tracker's parameters plain.
"""

from __future__ import annotations

import ast
import itertools
import math
import random
import re
from dataclasses import dataclass
from pathlib import Path

from hpcdl.core.resources import examples_dir
from hpcdl.errors import ValidationError

# A parameter's name: an argparse long option without its dashes, or a placeholder.
PARAM_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
# A value: numbers (1e-4, -0.5), words, simple paths; no spaces, quotes, $, ;, commas.
PARAM_VALUE = re.compile(r"[A-Za-z0-9_.+\-:/@%]{1,200}")
# Options hpcdl itself sets on the example's command line: a sweep cannot vary them
# (the backend is the job shape's; data, checkpoints and resume are the run's).
RESERVED = frozenset({"backend", "data", "synthetic", "checkpoint-dir", "resume"})
EXAMPLE = "resnet50_imagenet.py"
# Points in one sweep, whatever the partition says: sweep.json, the array script's
# case and the fake/real squeue output stay a reasonable size.
MAX_POINTS = 10_000


@dataclass(frozen=True)
class Point:
    """One point: its index in the array and its values, in the parameters' order."""

    index: int
    values: tuple[tuple[str, str], ...]

    @property
    def params(self) -> dict[str, str]:
        return dict(self.values)

    def describe(self) -> str:
        """``lr=0.1 wd=1e-4``: one line, every value a checked token."""
        return " ".join(f"{k}={v}" for k, v in self.values)


def example_options(example: str = EXAMPLE) -> frozenset[str]:
    """The long options (without ``--``) the bundled example's argparse accepts, read
    from its source (no import: it needs torch). Raises ValidationError when the
    example cannot be read."""
    path = examples_dir() / example
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError) as exc:
        raise ValidationError(f"param: cannot read the example's options from {path}: {exc}") from exc
    names = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) \
                        and arg.value.startswith("--"):
                    names.add(arg.value[2:])
    return frozenset(names)


def check_name(name: str, *, known: frozenset[str] | None) -> str:
    """``name`` when it may be swept (``known``: the example's options; None for a
    COMMAND). Raises ValidationError naming the parameter and what is accepted."""
    if not PARAM_NAME.fullmatch(name):
        raise ValidationError(f"param: name {name!r} is not a plain name (letters, digits, "
                              f"- and _, e.g. lr)")
    if known is not None:
        if name in RESERVED:
            raise ValidationError(f"param: --{name} is set by hpcdl for every point "
                                  f"(backend: --backend; data: --data/--synthetic); "
                                  f"it cannot be swept")
        if name not in known:
            raise ValidationError(f"param: {name!r} is not an option of the bundled example "
                                  f"{EXAMPLE}; its options: {', '.join(sorted(known - RESERVED))}")
    return name


def check_value(name: str, value: str) -> str:
    """``value`` when it is one plain token. Raises ValidationError."""
    if not PARAM_VALUE.fullmatch(value):
        raise ValidationError(f"param {name}: value {value!r} is not one plain token "
                              f"(letters, digits and . + - : / @ % _, at most 200)")
    return value


def parse_param(text: str, *, known: frozenset[str] | None) -> tuple[str, tuple[str, ...]]:
    """``"lr=0.1,0.05"`` -> ("lr", ("0.1", "0.05")), duplicates dropped. Raises
    ValidationError for a missing '=', an empty list or item, a bad name or value."""
    name, sep, rest = text.partition("=")
    name = name.strip().removeprefix("--")
    if not sep:
        raise ValidationError(f"param: {text!r} is not NAME=v1,v2 (e.g. lr=0.1,0.05)")
    check_name(name, known=known)
    if not rest.strip():
        raise ValidationError(f"param {name}: empty list of values (write e.g. {name}=0.1,0.05)")
    values: list[str] = []
    for item in (part.strip() for part in rest.split(",")):
        if not item:
            raise ValidationError(f"param {name}: an empty value in {rest!r}")
        if check_value(name, item) not in values:
            values.append(item)
    return name, tuple(values)


def grid(params: list[tuple[str, tuple[str, ...]]]) -> list[Point]:
    """Every combination, the last parameter varying fastest. Raises ValidationError
    for a parameter given twice or a grid over MAX_POINTS."""
    names = [name for name, _ in params]
    for name in names:
        if names.count(name) > 1:
            raise ValidationError(f"param: {name!r} given twice; list its values once "
                                  f"({name}=a,b)")
    size = math.prod(len(values) for _, values in params)
    if size > MAX_POINTS:
        raise ValidationError(f"param: the grid has {size} points; at most {MAX_POINTS}")
    return [Point(i, tuple(zip(names, combo, strict=True)))
            for i, combo in enumerate(itertools.product(*(v for _, v in params)))]


def parse_range(text: str) -> tuple[str, str, float, float]:
    """``"lr=log:1e-4:1e-1"`` or ``"lr=lin:0:1"`` -> (name, kind, low, high). Raises
    ValidationError."""
    name, _, spec = text.partition("=")
    name = name.strip().removeprefix("--")
    kind, _, bounds = spec.partition(":")
    low_text, _, high_text = bounds.partition(":")
    try:
        low, high = float(low_text), float(high_text)
    except ValueError:
        raise ValidationError(f"param {name}: {spec!r} is not log:LOW:HIGH or lin:LOW:HIGH "
                              f"(with --random)") from None
    if kind not in ("log", "lin") or not low < high or not (math.isfinite(low)
                                                            and math.isfinite(high)):
        raise ValidationError(f"param {name}: {spec!r} is not log:LOW:HIGH or lin:LOW:HIGH "
                              f"with LOW < HIGH (with --random)")
    if kind == "log" and low <= 0:
        raise ValidationError(f"param {name}: log:{low_text}:{high_text} needs LOW > 0")
    return name, kind, low, high


def sample(texts: list[str], count: int, seed: int, *,
           known: frozenset[str] | None) -> list[Point]:
    """``count`` points drawn from ``texts``: each a range (log:/lin:, see parse_range)
    or a list (NAME=a,b: one drawn uniformly). Reproducible for a ``seed``. Raises
    ValidationError."""
    if not 1 <= count <= MAX_POINTS:
        raise ValidationError(f"random: {count} points; between 1 and {MAX_POINTS}")
    rng = random.Random(seed)
    ranges: dict[str, tuple[str, float, float]] = {}
    lists: dict[str, tuple[str, ...]] = {}
    order: list[str] = []
    for text in texts:
        if text.partition("=")[2].startswith(("log:", "lin:")):
            name, kind, low, high = parse_range(text)
            ranges[check_name(name, known=known)] = (kind, low, high)
        else:
            name, choices = parse_param(text, known=known)
            lists[name] = choices
        if name in order:
            raise ValidationError(f"param: {name!r} given twice")
        order.append(name)
    points = []
    for i in range(count):
        values = []
        for name in order:
            if name in ranges:
                kind, low, high = ranges[name]
                x = (math.exp(rng.uniform(math.log(low), math.log(high))) if kind == "log"
                     else rng.uniform(low, high))
                values.append((name, f"{x:.4g}"))
            else:
                values.append((name, rng.choice(lists[name])))
        points.append(Point(i, tuple(values)))
    return points


def load_points(path: Path, *, known: frozenset[str] | None) -> list[Point]:
    """A YAML file holding a list of points, each a mapping NAME: value (scalars).
    Every point must name the same parameters. Raises ValidationError naming the
    file, the point and the field."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ValidationError(f"points {path}: cannot read it ({str(exc).splitlines()[0]})") from exc
    if not isinstance(data, list) or not data:
        raise ValidationError(f"points {path}: expected a non-empty list of mappings "
                              f"(- {{lr: 0.1, wd: 1e-4}})")
    if len(data) > MAX_POINTS:
        raise ValidationError(f"points {path}: {len(data)} points; at most {MAX_POINTS}")
    points: list[Point] = []
    names: list[str] | None = None
    for i, item in enumerate(data):
        if not isinstance(item, dict) or not item:
            raise ValidationError(f"points {path}: point {i} is not a mapping NAME: value")
        values = []
        for key, value in item.items():
            name = check_name(str(key), known=known)
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise ValidationError(f"points {path}: point {i}, {name}: {value!r} is not a "
                                      f"number or a word")
            values.append((name, check_value(name, str(value))))
        if names is None:
            names = [k for k, _ in values]
        elif sorted(names) != sorted(k for k, _ in values):
            raise ValidationError(f"points {path}: point {i} names {sorted(k for k, _ in values)}"
                                  f", point 0 {sorted(names)}; every point names the same ones")
        points.append(Point(i, tuple(values)))
    return points


def example_args(base: tuple[str, ...], point: Point) -> tuple[str, ...]:
    """The example's -X arguments of ``point``: the shared ones without an option the
    point sets (so argparse's "last one wins" is not relied on), then ``--NAME=v``."""
    mine = {f"--{k}" for k, _ in point.values}
    kept = tuple(a for a in base if a.split("=", 1)[0] not in mine)
    return kept + tuple(f"--{k}={v}" for k, v in point.values)


def command_args(command: tuple[str, ...], point: Point) -> tuple[str, ...]:
    """COMMAND for ``point``: each ``{NAME}`` replaced by its value; a parameter no
    token names is appended as ``--NAME=v``."""
    out = list(command)
    for name, value in point.values:
        marker = "{" + name + "}"
        if any(marker in token for token in command):
            out = [token.replace(marker, value) for token in out]
        else:
            out.append(f"--{name}={value}")
    return tuple(out)
