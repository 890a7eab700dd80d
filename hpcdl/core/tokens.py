"""Strict string types for every value that lands in a script or a definition file.

A value read from a profile, an image spec or a request ends up in a job script,
an ``#SBATCH`` line, a salloc argv or an Apptainer definition. Values that a
template renders unquoted (module names, package names, image references,
versions, Slurm option values) must be single tokens of their kind; values that
are free text by nature (env values, commands, descriptions) are quoted where
they land and must still be one line, so they can never start a new script line
or a new ``%section`` of a definition.

Every type here is ``Annotated[str, Strict(), checker(KIND), KIND]`` around one
check, :func:`check_token`: no control characters (``\\n``, ``\\r``, NUL, ``\\x1b``,
...), no Unicode line separators, then the kind's pattern with ``re.fullmatch``
(never ``$``, which matches before a trailing newline). Strict: a YAML number is not
silently a string. ``check_token`` also serves plain code (the request checks in
hpcdl.plan); the ``Kind`` in the metadata lets tests find every typed field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated

from pydantic import AfterValidator, Field, Strict

from hpcdl.errors import ValidationError
from hpcdl.jobside.protocol import IFNAME_SPEC

# C0 and C1 control characters, DEL, and the Unicode line/paragraph separators
# (some parsers, e.g. Python's str.splitlines, end a line there).
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# Free text may hold a tab; nothing else from CONTROL.
_TEXT_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")


@dataclass(frozen=True)
class Kind:
    """What a token type accepts: a name for messages, a pattern (None: free text),
    and an example shown when a value is refused."""

    name: str
    pattern: re.Pattern[str] | None
    example: str = ""


def check_token(value: str, kind: Kind) -> str:
    """Return ``value`` when it is one line (no control characters) matching ``kind``.

    Raises ValueError naming the kind, the value (as repr, so it stays one line) and
    what is accepted.
    """
    bad = (_TEXT_CONTROL if kind.pattern is None else CONTROL).search(value)
    if bad:
        raise ValueError(
            f"{value!r} is not {_a(kind.name)}: control character "
            f"{bad.group()!r} (a value must be one line)"
        )
    if kind.pattern is not None and not kind.pattern.fullmatch(value):
        example = f", e.g. {kind.example!r}" if kind.example else ""
        raise ValueError(f"{value!r} is not {_a(kind.name)}{example}")
    return value


def check_field(field_name: str, value: str, kind: Kind) -> None:
    """``check_token`` as a request's refusal: ValidationError "FIELD: why" (one line)."""
    try:
        check_token(value, kind)
    except ValueError as exc:
        raise ValidationError(f"{field_name}: {exc}") from exc


def _a(noun: str) -> str:
    return f"an {noun}" if noun[0] in "aeioAEIO" else f"a {noun}"


def checker(kind: Kind) -> AfterValidator:
    """The pydantic validator of a token type: :func:`check_token` for ``kind``."""

    def validate(value: str) -> str:
        return check_token(value, kind)

    return AfterValidator(validate)


def _kind(name: str, pattern: str | None, example: str = "", flags: int = 0) -> Kind:
    return Kind(name, re.compile(pattern, flags) if pattern is not None else None, example)


# --- the kinds ------------------------------------------------------------------
# A Slurm name (partition, profile name): sbatch and squeue take it as it is.
NAME = _kind("name", r"[A-Za-z0-9_.\-]+", "gpu_a100")
# A value of a Slurm option (account, qos, extra_options): words of safe characters,
# single spaces between them (an #SBATCH line double-quotes such a value).
SLURM_VALUE = _kind("Slurm option value", r"[A-Za-z0-9_.,:@%+=/\-]+( [A-Za-z0-9_.,:@%+=/\-]+)*",
                    "END,FAIL")
# The long name of an sbatch option, without the leading '--'.
OPTION_KEY = _kind("Slurm option name", r"[a-z][a-z0-9\-]*", "mail-type")
# Slurm time: minutes, MM:SS, HH:MM:SS, D-HH[:MM[:SS]], or infinite/UNLIMITED.
SLURM_TIME = _kind("Slurm time", r"\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2}|infinite|unlimited",
                   "2-00:00:00", re.IGNORECASE)
# One default argument of a bundled example: "--name" or "--name=value", one token of
# printable ASCII (no spaces; quotes are kept verbatim): the option name is what a
# user's -X for the same option replaces (hpcdl.plan.example_defaults).
EXAMPLE_ARG = _kind("example argument ('--option' or '--option=value', no spaces)",
                    r"--[A-Za-z0-9][A-Za-z0-9_-]*(?:=[!-~]*)?", "--epochs=2")
# A PBS filesystem name ('-l filesystems=home:eagle').
FILESYSTEM = _kind("filesystem name", r"[a-z][a-z0-9_]*", "eagle")
# An environment-module name as `module load` takes it (rendered unquoted).
MODULE = _kind("module name", r"[A-Za-z0-9_.+/@\-]+", "OpenMPI/4.1.4-GCC-11.3.0")
ENV_NAME = _kind("environment variable name", r"[A-Za-z_][A-Za-z0-9_]*", "NCCL_DEBUG")
# The signal Slurm sends the batch shell before the time limit or at preemption, and the
# lead time in seconds ('--signal=B:SIG@LEAD'): a few named signals only (SIGKILL and
# SIGSTOP cannot be trapped; SIGUSR1 is what some NCCL versions take for themselves,
# but it reaches the batch shell only, so it is allowed).
REQUEUE_SIGNAL = _kind("signal SIG@SECONDS", r"(USR1|USR2|TERM|INT|HUP|ALRM|URG)@\d{1,5}",
                       "USR2@120")
# A program name or path rendered unquoted in a definition (python).
EXECUTABLE = _kind("executable", r"[A-Za-z0-9_./+\-]+", "python3")
# A host path (quoted wherever it lands); may use $VARS the job's shell expands.
PATH = _kind("path", r"[^\x00-\x1f\x7f]+", "/scratch/$USER")
# A directory the compute nodes share, compared with paths on the submitting host (never
# expanded or rendered): absolute, no $VARS.
SHARED_DIR = _kind("absolute directory", r"/[^$\x00-\x1f\x7f]*", "/")
# A path that becomes an Apptainer bind source (the run directory, node-local scratch):
# a ':' would start its destination, a ',' another bind.
BIND_SOURCE = _kind("path usable as a bind source (no ':' or ',')", r"[^,:\x00-\x1f\x7f]+",
                    "/scratch/runs")
# A container bind SRC[:DST[:OPTS]]: a comma would start another bind.
BIND = _kind("bind (SRC[:DST])", r"[^,:\x00-\x1f\x7f]+(:[^,:\x00-\x1f\x7f]+){0,2}", "/scratch")
# Image name of a spec (file names, labels).
IMAGE_NAME = _kind("image name", r"[A-Za-z0-9][A-Za-z0-9_.\-]*", "pytorch-horovod-cpu")
# A base image: docker repository (registry/name) or a local image path.
IMAGE_REF = _kind("image reference", r"[A-Za-z0-9_./:@+\-]+", "nvcr.io/nvidia/pytorch")
IMAGE_TAG = _kind("image tag", r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}", "24.10-py3")
OS_VERSION = _kind("OS version", r"[A-Za-z0-9][A-Za-z0-9_.\-]*", "bookworm")
VERSION = _kind("version", r"[0-9][0-9A-Za-z.\-]*", "4.1.4")
DEB_PACKAGE = _kind("Debian package name", r"[a-z0-9][a-z0-9+.\-]*(=[A-Za-z0-9.+~:\-]+)?",
                    "python3-pip")
# A pip requirement as hpcdl accepts it: name, optional extras, optional version spec.
REQUIREMENT = _kind(
    "pip requirement (name[extras][==version])",
    r"(?P<name>[A-Za-z0-9][A-Za-z0-9._\-]*)(\[[A-Za-z0-9_,\-]+\])?"
    r"(?P<spec>(==|>=|<=|~=|!=|<|>)[A-Za-z0-9.*+!\-]+(,(==|>=|<=|~=|!=|<|>)[A-Za-z0-9.*+!\-]+)*)?",
    "torch==2.5.1",
)
URL = _kind("URL", r"(https?|file)://[^\s\"'\\`]+", "https://download.pytorch.org/whl/cpu")
# The image's python and platform for resolving wheels on the host (pip download
# --python-version / --platform; hpcdl.container.wheels).
PY_VERSION = _kind("python version (3.X)", r"3\.\d{1,2}", "3.11")
GLIBC_VERSION = _kind("glibc version (2.X)", r"2\.\d{1,2}", "2.36")
# A Slurm release, year.month (hpcdl/schedulers/slurm/releases.py knows which).
SLURM_RELEASE = _kind("Slurm release (YY.MM)", r"\d{2}\.\d{2}", "24.11")
MACHINE = _kind("machine", r"x86_64|aarch64|ppc64le|s390x", "x86_64")
LABEL_KEY = _kind("label name", r"[A-Za-z0-9_.\-]+", "org.example.owner")
# Free text (env values, commands, descriptions): quoted where it lands, one line.
# A network interface list in NCCL_SOCKET_IFNAME's syntax (prefixes, '=' exact, '^'
# excluded); the probe worker owns the pattern (it checks it in the job, stdlib only).
IFNAME = _kind("interface name list (NCCL_SOCKET_IFNAME syntax)", IFNAME_SPEC.pattern, "ib0")
# The login node: none may start with '-' (ssh would read an option).
SSH_HOST = _kind("host name for ssh (an alias from ~/.ssh/config, a DNS name or an IPv4 address)",
                 r"[A-Za-z0-9][A-Za-z0-9_.\-]*", "login.cluster.example.org")
SSH_USER = _kind("user name", r"[A-Za-z_][A-Za-z0-9_.\-]*", "jdoe")
SSH_JUMP = _kind("jump host list ([USER@]HOST[:PORT],...)",
                 r"([A-Za-z_][A-Za-z0-9_.\-]*@)?[A-Za-z0-9][A-Za-z0-9_.\-]*(:\d{1,5})?"
                 r"(,([A-Za-z_][A-Za-z0-9_.\-]*@)?[A-Za-z0-9][A-Za-z0-9_.\-]*(:\d{1,5})?)*",
                 "jdoe@gateway.example.org")
TEXT = _kind("one-line text", None)
# Free text rendered inside a definition file (%help, %test): it must not start a
# word with '%', which a wrapped or indented line could turn into a new section.
DEF_TEXT = _kind("definition text (no word may start with %)", r"(?!(.*\s)?%).*", "")

Name = Annotated[str, Strict(), checker(NAME), NAME]
SlurmValue = Annotated[str, Strict(), checker(SLURM_VALUE), SLURM_VALUE]
OptionKey = Annotated[str, Strict(), checker(OPTION_KEY), OPTION_KEY]
SlurmTime = Annotated[str, Strict(), checker(SLURM_TIME), SLURM_TIME]
SlurmRelease = Annotated[str, Strict(), checker(SLURM_RELEASE), SLURM_RELEASE]
ExampleArg = Annotated[str, Strict(), checker(EXAMPLE_ARG), EXAMPLE_ARG]
Filesystem = Annotated[str, Strict(), checker(FILESYSTEM), FILESYSTEM]
Module = Annotated[str, Strict(), checker(MODULE), MODULE]
EnvName = Annotated[str, Strict(), checker(ENV_NAME), ENV_NAME]
RequeueSignal = Annotated[str, Strict(), checker(REQUEUE_SIGNAL), REQUEUE_SIGNAL]
Executable = Annotated[str, Strict(), checker(EXECUTABLE), EXECUTABLE]
HostPath = Annotated[str, Strict(), checker(PATH), PATH]
SharedDir = Annotated[str, Strict(), checker(SHARED_DIR), SHARED_DIR]
BindSource = Annotated[str, Strict(), checker(BIND_SOURCE), BIND_SOURCE]
Bind = Annotated[str, Strict(), checker(BIND), BIND]
ImageName = Annotated[str, Strict(), checker(IMAGE_NAME), IMAGE_NAME]
ImageRef = Annotated[str, Strict(), checker(IMAGE_REF), IMAGE_REF]
ImageTag = Annotated[str, Strict(), checker(IMAGE_TAG), IMAGE_TAG]
OsVersion = Annotated[str, Strict(), checker(OS_VERSION), OS_VERSION]
Version = Annotated[str, Strict(), checker(VERSION), VERSION]
DebPackage = Annotated[str, Strict(), checker(DEB_PACKAGE), DEB_PACKAGE]
Requirement = Annotated[str, Strict(), checker(REQUIREMENT), REQUIREMENT]
Url = Annotated[str, Strict(), checker(URL), URL]
PyVersion = Annotated[str, Strict(), checker(PY_VERSION), PY_VERSION]
GlibcVersion = Annotated[str, Strict(), checker(GLIBC_VERSION), GLIBC_VERSION]
Machine = Annotated[str, Strict(), checker(MACHINE), MACHINE]
LabelKey = Annotated[str, Strict(), checker(LABEL_KEY), LABEL_KEY]
Text = Annotated[str, Strict(), checker(TEXT), TEXT]
SshHost = Annotated[str, Strict(), checker(SSH_HOST), SSH_HOST]
SshUser = Annotated[str, Strict(), checker(SSH_USER), SSH_USER]
SshJump = Annotated[str, Strict(), checker(SSH_JUMP), SSH_JUMP]
IfName = Annotated[str, Strict(), checker(IFNAME), IFNAME]
DefText = Annotated[str, Strict(), checker(DEF_TEXT), DEF_TEXT]

# A count from a file: a YAML `true` or `-5` is refused, never read as 1 or kept.
PositiveInt = Annotated[int, Strict(), Field(ge=1)]
NonNegativeInt = Annotated[int, Strict(), Field(ge=0)]

KINDS: tuple[Kind, ...] = (
    NAME, SLURM_VALUE, OPTION_KEY, SLURM_TIME, EXAMPLE_ARG, FILESYSTEM, MODULE, ENV_NAME, REQUEUE_SIGNAL, EXECUTABLE, PATH, SHARED_DIR, BIND_SOURCE, BIND,
    IMAGE_NAME, IMAGE_REF, IMAGE_TAG, OS_VERSION, VERSION, DEB_PACKAGE, REQUIREMENT, URL,
    LABEL_KEY, TEXT, DEF_TEXT, IFNAME, SSH_HOST, SSH_USER, SSH_JUMP, PY_VERSION, GLIBC_VERSION, SLURM_RELEASE,
    MACHINE,
)
