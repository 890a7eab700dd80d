"""Property-based proof that no profile, image-spec or request value can run a command.

For EVERY string field of the profile and image-spec schemas (found by walking the
pydantic models, so a new field is covered without touching this file) and every
string option of a request, hypothesis generates hostile values: newlines (also
trailing), ``;``, ``$(...)``, backticks, quotes, ``%post``, NUL, Unicode line
separators..., most of them trying to ``touch PWNED``. Each value is either

* refused: a ConfigError/ValidationError/RenderError whose message is one line; or
* accepted, and then rendered and checked:
  - sbatch and salloc scripts run with bash in an empty folder, with ``srun``,
    ``mpirun``, ``horovodrun``, ``salloc``, ``module``, ``scontrol`` and the container
    runtimes replaced by stubs on PATH that record their argv and environment: the
    script must exit 0, no PWNED file may appear, the script has exactly as many lines
    as with a harmless value in the same field, and env values / launcher args /
    commands reach the launcher byte for byte;
  - a definition file keeps the same header keys, the same ``%sections``, and the same
    number of lines per section as with a harmless value (``%help`` is word-wrapped:
    none of its lines may start with ``%``); its ``%environment`` is run by bash and
    must not create PWNED, and env values arrive verbatim.

Deterministic (derandomize, no example database); MAX_EXAMPLES hostile values per
field, after the classic injections and one harmless value. Each field counts the values
it accepted (and so rendered and ran through the checks above) and fails when it
accepted none: a field that refused everything, the harmless value included, would
otherwise pass without one rendering check having run.
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hpcdl.container.definition import RenderContext, render_definition
from hpcdl.container.spec import ImageSpec, parse_spec
from hpcdl.core.duration import parse_time
from hpcdl.core.resources import REPO_ROOT, containers_dir
from hpcdl.core.tokens import CONTROL, KINDS, TEXT, Kind, check_token
from hpcdl.core.yamlmodel import parse_yaml_model
from hpcdl.errors import UserInputError
from hpcdl.jobs.alloc import build_alloc
from hpcdl.plan import DEFAULT_EXAMPLE, JobPlan, JobRequest, build_plan
from hpcdl.plan.request import FLAT_FIELDS
from hpcdl.profiles.schema import Profile
from tests.unit.jobfiles import stage_job_scripts

# Generated values per test. `make unit` loads the hypothesis profile "unit"
# (tests/unit/conftest.py), whose smaller max_examples then wins; `make test` and a plain
# pytest run use these counts.
MAX_EXAMPLES = min(40, settings.default.max_examples)
FILE_EXAMPLES = min(150, settings.default.max_examples)
MARK = "PWNED"
PROPERTY = settings(max_examples=MAX_EXAMPLES, derandomize=True, database=None, deadline=None,
                    suppress_health_check=list(HealthCheck))

INJECTIONS = [
    f"\ntouch {MARK}", f"\ntouch {MARK}\n", f"; touch {MARK}", f"$(touch {MARK})",
    f"`touch {MARK}`", f"' ; touch {MARK} ; '", f'" ; touch {MARK} ; "', f"&& touch {MARK}",
    f"| touch {MARK}", f"\r\ntouch {MARK}", f"\u2028touch {MARK}", f"\u2029touch {MARK}",
    f"\x85touch {MARK}", f"\x00touch {MARK}", f"\x0btouch {MARK}", f"\\\ntouch {MARK}",
    f"${{IFS}}touch${{IFS}}{MARK}", f"\n%post\n    touch {MARK}", f"\n%setup\ntouch {MARK}",
    f"\n%environment\ntouch {MARK}", f"\n#SBATCH --wrap='touch {MARK}'", f" %post touch {MARK}",
    f"%post\ntouch {MARK}", f"\"\ntouch {MARK}\n\"", f"'\ntouch {MARK}\n'", f"\x1b[2J$(touch {MARK})",
    f"$'\\ntouch {MARK}'", f"<(touch {MARK})", f">{MARK}", f"\n>{MARK}",
]
# Tried first in every field whatever the number of generated examples: a new line, a
# command substitution, a command separator, backquotes.
CLASSIC = [f"\ntouch {MARK}", f"$(touch {MARK})", f"; touch {MARK}", f"`touch {MARK}`"]
PREFIXES = ["", "ok", "a b", "x.y-1", "/p/q", "%post", "#", "-x"]
SUFFIXES = ["", "\n", "\r\n", " ", "\n ", "\u2028", "\x00", "\t"]
DANGER = list("\n\r\x00\x0b\x1b\u2028\u2029\x85;&|$`'\"\\(){}<>#%*? \t=,:@/") + list("ab1.-")

hostile_strings = st.one_of(
    st.builds(lambda p, i, s: p + i + s, st.sampled_from(PREFIXES), st.sampled_from(INJECTIONS),
              st.sampled_from(SUFFIXES)),
    st.text(alphabet=st.sampled_from(DANGER), min_size=1, max_size=16),
    st.text(min_size=1, max_size=16),
)


def classics(**fixed: Any) -> Any:
    """Decorator: CLASSIC as explicit examples (hypothesis runs those before any value it
    generates, and max_examples does not count them); ``fixed``: the test's other
    arguments."""
    def add(test: Any) -> Any:
        for value in CLASSIC:
            test = example(value=value, **fixed)(test)
        return test
    return add


# --- walking the schemas -------------------------------------------------------------


@dataclass(frozen=True)
class Slot:
    """One string field: where in the document, and how a value goes in.

    ``how``: 'value' (the field itself), 'item' (appended to a list), 'key' (a new
    dict key), 'dict-value' (a dict value under a harmless key), 'dict-item' (the one
    item of a list that is a dict value under a harmless key)."""

    loc: tuple[Any, ...]
    how: str
    kind: Kind | None
    key_kind: Kind | None = None
    # What a new dict key holds: a harmless string, or an empty list for dicts of lists.
    key_filler: Any = "1"

    @property
    def name(self) -> str:
        dotted = ".".join(str(p) for p in self.loc)
        return {"value": dotted, "item": f"{dotted}[]", "key": f"{dotted}{{key}}",
                "dict-value": f"{dotted}{{value}}", "dict-item": f"{dotted}{{value}}[]"}[self.how]


def _kind(annotation: Any, metadata: list[Any] = ()) -> Kind | None:  # type: ignore[assignment]
    found = [m for m in metadata if isinstance(m, Kind)]
    if typing.get_origin(annotation) is typing.Annotated:
        found += [m for m in typing.get_args(annotation)[1:] if isinstance(m, Kind)]
    return found[0] if found else None


def _is_str(annotation: Any) -> bool:
    if annotation is str:
        return True
    return typing.get_origin(annotation) is typing.Annotated and typing.get_args(annotation)[0] is str


def _strip_optional(annotation: Any) -> list[Any]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(annotation) if a is not type(None)]
    return [annotation]


def string_slots(model: type[pydantic.BaseModel], loc: tuple[Any, ...] = ()) -> list[Slot]:
    """Every string-carrying field of ``model`` and its nested models."""
    out: list[Slot] = []
    for name, info in model.model_fields.items():
        for ann in _strip_optional(info.annotation):
            here = (*loc, name)
            origin = typing.get_origin(ann)
            if isinstance(ann, type) and issubclass(ann, pydantic.BaseModel):
                out += string_slots(ann, here)
            elif _is_str(ann):
                out.append(Slot(here, "value", _kind(ann, info.metadata)))
            elif origin is list:
                (item,) = typing.get_args(ann)
                if isinstance(item, type) and issubclass(item, pydantic.BaseModel):
                    out += string_slots(item, (*here, 0))
                elif _is_str(item):
                    out.append(Slot(here, "item", _kind(item)))
            elif origin is dict:
                key, value = typing.get_args(ann)
                items = typing.get_args(value) if typing.get_origin(value) is list else ()
                if _is_str(key):
                    out.append(Slot(here, "key", _kind(key), _kind(key), [] if items else "1"))
                if _is_str(value):
                    out.append(Slot(here, "dict-value", _kind(value), _kind(key)))
                elif items and _is_str(items[0]):
                    out.append(Slot(here, "dict-item", _kind(items[0]), _kind(key)))
    return out


PROFILE_SLOTS = string_slots(Profile)
SPEC_SLOTS = string_slots(ImageSpec)


def _get(doc: Any, loc: tuple[Any, ...]) -> Any:
    for part in loc:
        doc = doc[part] if isinstance(part, int) else doc.setdefault(part, {})
    return doc


def with_value(base: dict[str, Any], slot: Slot, value: str, benign_key: str) -> dict[str, Any]:
    doc = copy.deepcopy(base)
    parent = _get(doc, slot.loc[:-1])
    last = slot.loc[-1]
    if slot.how == "value":
        parent[last] = value
    elif slot.how == "item":
        parent[last] = [*parent.get(last, []), value]
    elif slot.how == "key":
        parent.setdefault(last, {})[value] = slot.key_filler
    elif slot.how == "dict-item":
        parent.setdefault(last, {})[benign_key] = [value]
    else:
        parent.setdefault(last, {})[benign_key] = value
    return doc


# Dict keys that a validator limits to a closed set (a bundled example's file name).
BENIGN_KEYS: dict[tuple[Any, ...], str] = {("examples", "per_example"): DEFAULT_EXAMPLE}


def benign(base: dict[str, Any], slot: Slot) -> tuple[str, str]:
    """(a harmless valid value for ``slot``, a harmless key for dict slots)."""
    key = BENIGN_KEYS.get(slot.loc) or (
        slot.key_kind.example if slot.key_kind and slot.key_kind.example else "HPCDL_X")
    if slot.how == "key" and slot.loc in BENIGN_KEYS:
        return key, key
    if slot.how == "value":
        parent = _get(copy.deepcopy(base), slot.loc[:-1])
        if isinstance(parent.get(slot.loc[-1]), str):
            return parent[slot.loc[-1]], key
    for candidate in ("benign", slot.kind.example if slot.kind else ""):
        try:
            return check_token(candidate, slot.kind or TEXT), key
        except ValueError:
            continue
    raise AssertionError(f"no harmless value for {slot.name}")


def assert_one_line_refusal(exc: UserInputError) -> None:
    assert not CONTROL.search(exc.message), f"message is not one line: {exc.message!r}"
    if exc.hint:
        assert not CONTROL.search(exc.hint)


# --- base documents --------------------------------------------------------------------

PROFILE_BASE: dict[str, Any] = {
    "name": "hostile",
    "description": "a profile with every field set",
    "scheduler": {"account": "proj", "qos": "normal", "extra_options": {"comment": "pytorch"},
                  "gpu_request": "gres", "default_time": "00:10:00"},
    "partitions": [
        {"name": "debug", "nodes": 2, "gpus_per_node": 4, "gpu_type": "fake", "cpus_per_node": 8,
         "max_time": "00:30:00", "default": True, "description": "the small one"},
    ],
    "modules": ["gcc/10.2.0"],
    "container": {"runtime": "apptainer", "binary": "/opt/apptainer/bin/apptainer",
                  "binds": ["/scratch"], "default_image": "/scratch/img/default.sif"},
    "mpi": {"launcher": "srun", "srun_mpi": "pmix", "launcher_args": ["--cpu-bind=cores"]},
    "env": {"vars": {"NCCL_DEBUG": "WARN"}, "omp_num_threads": 1},
    "paths": {"scratch": "/scratch/$USER", "datasets": "/data", "imagenet": "/scratch/data/imagenet"},
    "python": "python3",
    "login": {"host": "login.example.org", "user": "jdoe", "runs": "/scratch/runs",
              "images": "/scratch/images", "jump": "jdoe@gw.example.org"},
}


def _spec_doc(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((containers_dir() / f"{name}.yaml").read_text())
    doc.setdefault("labels", {})["org.example.owner"] = "team"
    doc.setdefault("test", []).append("echo ok")
    doc.setdefault("env", {})["HPCDL_X"] = "1"
    doc["pip"].setdefault("index_url", "https://pypi.org/simple")
    doc["pip"].setdefault("extra_index_urls", ["https://download.pytorch.org/whl/cpu"])
    doc["pip"].setdefault("packages", ["tqdm==4.66.0"])
    doc["pip"].setdefault("target", {"python": "3.11", "glibc": "2.36"})
    doc["base"].setdefault("include", ["ca-certificates"])
    return doc


# debootstrap base (OSVersion, MirrorURL, Include) and docker base (From: image:tag).
SPEC_BASES = {"cpu": _spec_doc("pytorch-horovod-cpu"), "gpu": _spec_doc("pytorch-horovod-gpu")}
RENDER = RenderContext(cache_dir="/cache", project_dir="/project", spec_dir="/specs")


# --- running scripts -----------------------------------------------------------------

RECORDER = """#!/bin/bash
printf '%s\\0' "$@" > "$HPCDL_TEST_OUT/argv.$(basename "$0")"
env -0 > "$HPCDL_TEST_OUT/env.$(basename "$0")"
"""
SCONTROL = "#!/bin/bash\necho n1\n"
STUBS = ("srun", "mpirun", "horovodrun", "salloc", "module", "apptainer", "singularity")


@pytest.fixture(scope="module")
def stub_bin(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("stubs")
    for tool in STUBS:
        (folder / tool).write_text(RECORDER)
    (folder / "scontrol").write_text(SCONTROL)
    for path in folder.iterdir():
        path.chmod(0o755)
    return folder


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory) -> Path:
    """Where the scripts' run directories go, with the job-side files they run (the
    rank wrapper, the MASTER_PORT pick) staged in them: outside the folders searched for
    PWNED (a staged run directory may be named after a hostile value), and deep enough
    that a value with '..' stays inside the test's own folder."""
    root = tmp_path_factory.mktemp("runs").joinpath(*["d"] * 12)
    root.mkdir(parents=True)
    return root


def stage_in(plan: JobPlan, root: Path) -> None:
    """The plan's job-side files, where its script runs them (under ``root``)."""
    for path in stage_job_scripts(plan, root):
        assert Path(os.path.normpath(path)).is_relative_to(root.parents[11]), path


@dataclass
class Ran:
    argv: dict[str, list[str]]
    env: dict[str, dict[str, str]]


def run_bash(script: str, stub_bin: Path, work: Path) -> Ran:
    """Run ``script`` with bash in the empty folder ``work``; assert exit 0 and no PWNED."""
    work.mkdir()
    path = work.parent / f"{work.name}.sh"
    path.write_text(script)
    env = {"PATH": f"{stub_bin}:/usr/bin:/bin", "HPCDL_TEST_OUT": str(work), "HOME": str(work),
           "SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n1", "SLURM_CPUS_PER_TASK": "2",
           "SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "1", "TMPDIR": str(work)}
    done = subprocess.run(["bash", str(path)], cwd=work, env=env, capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    planted = [p for p in work.parent.rglob(f"*{MARK}*")]
    assert not planted, f"a value ran a command: {planted}"
    ran = Ran({}, {})
    for rec in work.glob("argv.*"):
        tool = rec.name.split(".", 1)[1]
        ran.argv[tool] = rec.read_bytes().decode().split("\0")[:-1]
        pairs = (work / f"env.{tool}").read_bytes().decode().split("\0")[:-1]
        ran.env[tool] = dict(p.split("=", 1) for p in pairs)
    return ran


@dataclass
class Tally:
    """How many of the values tried in one field were accepted, and so went through the
    rendering checks: a field that refused every value would otherwise pass having
    checked nothing but its refusals' wording."""

    field: str
    tried: int = 0
    accepted: int = 0

    def refused(self) -> None:
        self.tried += 1

    def checked(self) -> None:
        self.tried += 1
        self.accepted += 1

    def assert_some_accepted(self) -> None:
        assert self.accepted > 0, (f"{self.field}: none of the {self.tried} values tried was "
                                   "accepted, so no rendering check ran")


class Counter:
    """Unique folder names for the examples of one test."""

    def __init__(self, root: Path) -> None:
        self.root, self.n = root, 0

    def next(self) -> Path:
        self.n += 1
        return self.root / f"case{self.n}"


# --- profiles ----------------------------------------------------------------------


def _profile_outputs(profile: Profile, run_dir: Path) -> tuple[str, str, list[str]]:
    plan = build_plan(profile, JobRequest.of(nodes=1, gpus=1, image="/scratch/img/x.sif",
                                          run_dir=str(run_dir)))
    stage_in(plan, run_dir)
    alloc = build_alloc(profile, JobRequest.of(nodes=1, gpus=1, command=("true",)))
    return plan.script, alloc.script, list(alloc.argv)


@pytest.mark.parametrize("slot", PROFILE_SLOTS, ids=lambda s: s.name)
def test_profile_field_cannot_run_a_command(slot, stub_bin, runs_root, tmp_path):
    good, key = benign(PROFILE_BASE, slot)
    reference = Profile.model_validate(with_value(PROFILE_BASE, slot, good, key))
    ref_sbatch, ref_salloc, _ = _profile_outputs(reference, runs_root / "r1")
    cases, tally = Counter(tmp_path), Tally(slot.name)

    @PROPERTY
    @given(value=hostile_strings)
    @classics()
    @example(value=good)
    def check(value: str) -> None:
        text = yaml.safe_dump(with_value(PROFILE_BASE, slot, value, key))
        try:
            profile = parse_yaml_model(text, Profile, source="p.yaml", kind="profile")
            sbatch, salloc, argv = _profile_outputs(profile, runs_root / "r1")
        except UserInputError as exc:
            assert_one_line_refusal(exc)
            tally.refused()
            return
        assert len(sbatch.splitlines()) == len(ref_sbatch.splitlines()), sbatch
        assert len(salloc.splitlines()) == len(ref_salloc.splitlines()), salloc
        ran = run_bash(sbatch, stub_bin, cases.next())
        assert "srun" in ran.argv, "the launch line did not run"
        if slot.loc == ("env", "vars") and slot.how == "dict-value":
            assert ran.env["srun"][key] == value
        if slot.loc == ("mpi", "launcher_args"):
            assert value in ran.argv["srun"]
        if slot.loc == ("paths", "imagenet"):
            assert ran.argv["srun"][ran.argv["srun"].index("--data") + 1] == value
        ran = run_bash(salloc, stub_bin, cases.next())
        assert ran.argv["salloc"] == argv[1:]
        tally.checked()

    check()
    tally.assert_some_accepted()


# --- image specs ---------------------------------------------------------------------


def _sections(text: str) -> tuple[list[str], list[str], dict[str, list[str]]]:
    """(header keys, section names in order, lines of each section)."""
    header: list[str] = []
    names: list[str] = []
    body: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        stripped = line.lstrip()
        if stripped.startswith("%"):
            current = stripped
            names.append(current)
            body[current] = []
        elif current is None:
            m = re.match(r"([A-Za-z]+):", line)
            if m:
                header.append(m.group(1))
        else:
            body[current].append(line)
    return header, names, body


def _spec_bases(slot: Slot) -> list[str]:
    # base.image/base.tag render only on a docker base; the rest on both.
    return ["gpu"] if slot.loc in (("base", "image"), ("base", "tag")) else ["cpu", "gpu"]


@pytest.mark.parametrize("slot", SPEC_SLOTS, ids=lambda s: s.name)
def test_spec_field_cannot_add_a_line_or_section(slot, tmp_path):
    refs = {}
    for name in _spec_bases(slot):
        good, key = benign(SPEC_BASES[name], slot)
        try:  # e.g. pip.local on the GPU spec, which has no wheelhouse
            spec = ImageSpec.model_validate(with_value(SPEC_BASES[name], slot, good, key))
        except pydantic.ValidationError:
            continue
        refs[name] = (_sections(render_definition(spec, RENDER).text), key, good)
    assert refs, f"no base spec takes a harmless {slot.name}"
    cases, tally = Counter(tmp_path), Tally(slot.name)

    first = sorted(refs)[0]

    @PROPERTY
    @given(value=hostile_strings, base=st.sampled_from(sorted(refs)))
    @classics(base=first)
    @example(value=refs[first][2], base=first)
    def check(value: str, base: str) -> None:
        (ref_header, ref_names, ref_body), key, _ = refs[base]
        text = yaml.safe_dump(with_value(SPEC_BASES[base], slot, value, key))
        try:
            definition = render_definition(parse_spec(text, source="s.yaml"), RENDER).text
        except UserInputError as exc:
            assert_one_line_refusal(exc)
            tally.refused()
            return
        header, names, body = _sections(definition)
        assert header == ref_header and names == ref_names, definition
        for name in names:
            if name == "%help":  # word-wrapped free text: no line may become a section
                assert not any(line.lstrip().startswith("%") for line in body[name])
            else:
                assert len(body[name]) == len(ref_body[name]), (name, definition)
        environment = "\n".join(body["%environment"]) + '\nenv -0 > "$HPCDL_TEST_OUT/env.x"\n'
        work = cases.next()
        run_bash(environment, Path("/nonexistent"), work)  # no stubs needed: exports only
        if slot.loc == ("env",) and slot.how == "dict-value":
            pairs = (work / "env.x").read_bytes().decode().split("\0")[:-1]
            assert dict(p.split("=", 1) for p in pairs)[key] == value
        tally.checked()

    check()
    tally.assert_some_accepted()


def test_every_string_field_is_walked_and_typed():
    """A new string field is covered by the tests above and carries a token type."""
    names = {s.name for s in PROFILE_SLOTS + SPEC_SLOTS}
    for expected in ("scheduler.account", "scheduler.extra_options{key}", "modules[]",
                     "env.vars{value}", "partitions.0.name", "base.os_version", "base.image",
                     "apt_packages[]", "labels{value}", "test[]", "pip.packages[]"):
        assert expected in names
    untyped = [s.name for s in PROFILE_SLOTS + SPEC_SLOTS if s.kind is None]
    assert not untyped, f"string fields without a token type: {untyped}"


# --- request options ---------------------------------------------------------------

REQUEST_BASE = JobRequest.of(nodes=1, gpus=1, image="/scratch/img/x.sif", env=(("HPCDL_X", "1"),),
                          binds=("/data",), run_dir="/scratch/runs/r1")
# Every flat field of the request (JobRequest.of's, each routed to its part).
REQUEST_FIELDS = [name for name in FLAT_FIELDS
                  if name not in ("nodes", "gpus", "cpus_per_task", "synthetic", "no_image",
                                    "requeue", "max_restarts", "chain", "probe_first",
                                    "hang_timeout", "stage_image", "stage_data", "spares",
                                    # a local directory: the script names RUN_DIR/code
                                    "code_dir")]


def _request_with(name: str, value: str, runs_root: Path) -> JobRequest:
    # The run directory goes under runs_root, where the script's job-side files are
    # staged; a hostile --run-dir is taken below it, whole.
    base = REQUEST_BASE.amended(run_dir=f"{runs_root}/r1")
    if name == "run_dir":
        return base.amended(run_dir=f"{runs_root}/{value}")
    return _request_from(base, name, value)


def _request_from(base: JobRequest, name: str, value: str) -> JobRequest:
    if name == "env":
        return base.amended(env=(("HPCDL_X", value),))
    if name == "env_key":
        return base.amended(env=((value, "1"),))
    if name == "probe":  # a probe job (2 nodes) whose worker gets the value as an argument
        return base.amended(nodes=2, probe=("--sizes", value))
    if name == "hang_action":  # an action without a timeout is refused whatever it is
        return base.amended(hang_timeout=60.0, hang_action=value)
    part, field = FLAT_FIELDS[name]
    current = getattr(getattr(base, part), field)
    if isinstance(current, tuple):
        return base.amended(**{name: (*current, value)})
    return base.amended(**{name: value})


# A harmless value of each request option: tried first, so every option's rendering
# checks run at least once even where it refuses every generated value (`make unit`
# tries 4 per option).
REQUEST_BENIGN = {
    "partition": "debug", "time": "00:05:00", "job_name": "train", "image": "/scratch/img/y.sif",
    "env": "1", "env_key": "HPCDL_Y", "binds": "/scratch", "backend": "ddp",
    "command": "hostname", "data": "/data/x", "example_args": "--epochs",
    "template": str(REPO_ROOT / "templates" / "sbatch.sh.j2"), "run_dir": "r2",
    "launcher": "srun", "gpu_bind": "local-rank", "signal": "USR1@90", "probe": "1M",
    "hang_action": "cancel",
}


def test_request_fields_are_all_covered():
    assert set(REQUEST_FIELDS) == {"partition", "time", "job_name", "image", "env", "binds", "backend",
                                   "command", "data", "example_args", "template", "run_dir",
                                   "launcher", "gpu_bind", "signal", "probe", "hang_action"}
    assert set(REQUEST_BENIGN) == {*REQUEST_FIELDS, "env_key"}


@pytest.mark.parametrize("name", [*REQUEST_FIELDS, "env_key"])
def test_request_option_cannot_run_a_command(name, stub_bin, runs_root, tmp_path):
    profile = Profile.model_validate(PROFILE_BASE)
    cases, tally = Counter(tmp_path), Tally(name)

    @PROPERTY
    @given(value=hostile_strings)
    @classics()
    @example(value=REQUEST_BENIGN[name])
    def check(value: str) -> None:
        req = _request_with(name, value, runs_root)
        try:
            plan = build_plan(profile, req)
        except UserInputError as exc:
            assert_one_line_refusal(exc)
            tally.refused()
            return
        stage_in(plan, runs_root)
        ran = run_bash(plan.script, stub_bin, cases.next())
        argv, env = ran.argv["srun"], ran.env["srun"]
        if name == "env":
            assert env["HPCDL_X"] == value
        if name in ("command", "example_args", "probe"):
            assert argv[-1] == value
        if name == "job_name":
            assert env["HPCDL_JOB_NAME"] == value
        if name == "image":
            assert env["HPCDL_IMAGE"] == value and value in argv
        tally.checked()

    check()
    tally.assert_some_accepted()


# --- every pattern refuses a trailing newline ----------------------------------------


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
@pytest.mark.parametrize("end", ["\n", "\r", "\r\n", "\u2028", "\x00", "\x85"])
def test_every_token_kind_refuses_a_trailing_line_break(kind, end):
    good = kind.example or "x"
    assert check_token(good, kind) == good
    with pytest.raises(ValueError, match="control character"):
        check_token(good + end, kind)
    if kind.pattern is not None and end == "\n":
        assert not kind.pattern.fullmatch(good + end)  # the pattern alone, too


def test_every_kind_in_the_schemas_is_listed():
    walked = {id(s.kind) for s in PROFILE_SLOTS + SPEC_SLOTS}
    assert walked <= {id(k) for k in KINDS}
    assert TEXT in KINDS


def test_slurm_time_refuses_a_trailing_newline():
    assert parse_time("01:00:00") == 3600
    for bad in ("01:00:00\n", "30\n", "1-0\n", "infinite\n"):
        with pytest.raises(ValueError):
            parse_time(bad)


def test_no_pattern_in_the_code_base_ends_with_dollar():
    """re's `$` matches before a trailing newline: patterns use fullmatch (or \\Z)."""
    pattern = re.compile(r"""r["'][^"'\n]*(?<!\\)\$["']""")
    offenders = []
    for folder in ("hpcdl", "examples", "bench"):
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                # With re.M, `$` is the end of each line: what such a search wants.
                if pattern.search(line) and "re.M" not in line:
                    offenders.append(f"{path.relative_to(REPO_ROOT)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


# --- any file content: a Profile/ImageSpec or one ConfigError line, nothing else -----

yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | hostile_strings,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(hostile_strings, inner, max_size=3),
    max_leaves=8,
)
file_bytes = st.one_of(
    st.binary(max_size=200),
    st.builds(lambda top, field, value: yaml.safe_dump({**top, field: value}).encode(),
              st.sampled_from([PROFILE_BASE, SPEC_BASES["cpu"]]),
              st.sampled_from(sorted({*PROFILE_BASE, *SPEC_BASES["cpu"]})), yaml_values),
)


@pytest.mark.parametrize("model", [Profile, ImageSpec], ids=["profile", "spec"])
def test_any_file_content_is_a_model_or_one_error_line(model, tmp_path):
    from hpcdl.core.yamlmodel import load_yaml_model
    from hpcdl.errors import ConfigError

    path = tmp_path / "f.yaml"

    @settings(max_examples=FILE_EXAMPLES, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(data=file_bytes)
    def check(data: bytes) -> None:
        path.write_bytes(data)
        try:
            load_yaml_model(path, model, kind="file")
        except ConfigError as exc:
            assert_one_line_refusal(exc)

    check()
