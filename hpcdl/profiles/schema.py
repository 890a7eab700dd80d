"""The typed schema of a cluster profile.

Profiles are YAML files describing one cluster: scheduler defaults,
partitions and their limits, modules, container runtime, MPI launcher,
environment and paths. Every model forbids unknown keys, so a typo in a
profile is an error naming the file and the field, not a silent default.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hpcdl.resources import examples_dir
from hpcdl.slurmtime import parse_time

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MODULE = re.compile(r"^[A-Za-z0-9_.+/\-]+$")
_OPTION = re.compile(r"^[a-z][a-z0-9-]*$")
# One default argument of a bundled example: "--name" or "--name=value", one token of
# printable ASCII (no spaces, quotes are kept verbatim): the option name is what a
# user's -X for the same option replaces (hpcdl.plan.example_defaults).
_EXAMPLE_ARG = re.compile(r"--[A-Za-z0-9][A-Za-z0-9_-]*(?:=[!-~]*)?")
# Options hpcdl itself puts on the bundled example's command line (from --backend,
# --data/--synthetic and the run directory): a profile default must not fight them.
EXAMPLE_OPTIONS_SET_BY_HPCDL = ("--backend", "--data", "--synthetic", "--checkpoint-dir")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Partition(_Strict):
    """One Slurm partition and the limits hpcdl checks before submitting."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$")
    nodes: int = Field(ge=1, description="nodes in the partition")
    gpus_per_node: int = Field(ge=0)
    gpu_type: str | None = None
    cpus_per_node: int = Field(ge=1)
    mem_per_node_gb: int | None = Field(default=None, ge=1)
    max_nodes_per_job: int | None = Field(
        default=None, ge=1, description="defaults to the partition's node count"
    )
    max_time: str = Field(description="Slurm time: D-HH:MM:SS, HH:MM:SS or 'infinite'")
    default: bool = False
    max_jobs_per_user: int | None = Field(default=None, ge=1)
    max_gpus_per_user: int | None = Field(default=None, ge=1)
    description: str | None = None

    @field_validator("max_time")
    @classmethod
    def _time(cls, v: str) -> str:
        parse_time(v)
        return v

    @model_validator(mode="after")
    def _nodes_limit(self) -> Partition:
        if self.max_nodes_per_job is not None and self.max_nodes_per_job > self.nodes:
            raise ValueError(
                f"max_nodes_per_job ({self.max_nodes_per_job}) exceeds the partition's "
                f"{self.nodes} nodes"
            )
        return self

    @property
    def node_limit(self) -> int:
        return self.max_nodes_per_job or self.nodes

    @property
    def max_seconds(self) -> int | None:
        return parse_time(self.max_time)


class Scheduler(_Strict):
    """Scheduler defaults. ``extra_options`` become ``#SBATCH --key=value`` lines."""

    type: Literal["slurm", "pbs"] = Field(
        default="slurm", description="pbs: hpcdl renders Slurm scripts only; dry-run only"
    )
    account: str | None = None
    qos: str | None = None
    extra_options: dict[str, str] = Field(default_factory=dict)
    gpu_request: Literal["gres", "gpus-per-node"] = "gres"
    default_time: str = "01:00:00"

    @field_validator("extra_options")
    @classmethod
    def _options(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not _OPTION.match(key):
                raise ValueError(f"option name '{key}' must look like 'comment' or 'mail-type'")
        return v

    @field_validator("default_time")
    @classmethod
    def _time(cls, v: str) -> str:
        parse_time(v)
        return v


class Container(_Strict):
    runtime: Literal["apptainer", "singularity"] = "apptainer"
    binary: str | None = Field(default=None, description="path; default: the runtime on PATH")
    binds: list[str] = Field(default_factory=list)
    nv: bool = Field(default=True, description="pass --nv (NVIDIA GPUs into the container)")
    default_image: str | None = None


class Mpi(_Strict):
    launcher: Literal["srun", "mpirun", "horovodrun"] = "srun"
    srun_mpi: Literal["pmix", "pmi2", "none"] | None = Field(
        default="pmix", description="srun --mpi=...; null leaves the site's MpiDefault"
    )
    launcher_args: list[str] = Field(default_factory=list)


class Environment(_Strict):
    vars: dict[str, str] = Field(default_factory=dict)
    omp_num_threads: Literal["cpus-per-task"] | int = Field(
        default="cpus-per-task",
        description="OMP_NUM_THREADS: follow --cpus-per-task, or a fixed number",
    )

    @field_validator("vars")
    @classmethod
    def _names(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not _ENV_NAME.match(key):
                raise ValueError(f"'{key}' is not a valid environment variable name")
        return v


class Paths(_Strict):
    scratch: str | None = None
    datasets: str | None = None
    imagenet: str | None = None


def _example_args(where: str, args: list[str]) -> list[str]:
    for arg in args:
        if not _EXAMPLE_ARG.fullmatch(arg):
            raise ValueError(
                f"{where}: {arg!r} is not one '--option' or '--option=value' token "
                f"(printable ASCII, no spaces; write '--epochs=2', not '--epochs 2')"
            )
        if arg.split("=", 1)[0] in EXAMPLE_OPTIONS_SET_BY_HPCDL:
            raise ValueError(
                f"{where}: {arg.split('=', 1)[0]} is set by hpcdl itself (submit --backend, "
                f"--data/--synthetic, the run directory); it cannot be a profile default"
            )
    return args


def bundled_example_names() -> tuple[str, ...]:
    """The bundled example scripts (examples/*.py), by file name."""
    return tuple(sorted(p.name for p in examples_dir().glob("*.py")))


class Examples(_Strict):
    """Default arguments for the bundled examples, for the clusters where their own
    defaults (sized for real GPU nodes) do not fit, e.g. the CPU-only sandbox.

    They go on the example's command line before the user's ``-X`` arguments; a
    ``-X`` for the same option replaces the default (``hpcdl submit --dry-run``
    shows what is left).
    """

    args: list[str] = Field(
        default_factory=list, description="for every bundled example hpcdl runs"
    )
    per_example: dict[str, list[str]] = Field(
        default_factory=dict,
        description="by example file name (e.g. resnet50_imagenet.py); after args, and "
                    "replacing an option args also sets",
    )

    @field_validator("args")
    @classmethod
    def _args(cls, v: list[str]) -> list[str]:
        return _example_args("args", v)

    @field_validator("per_example")
    @classmethod
    def _per_example(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        known = bundled_example_names()
        for name, args in v.items():
            if name not in known:
                raise ValueError(
                    f"'{name}' is not a bundled example (bundled: {', '.join(known)})"
                )
            _example_args(name, args)
        return v


class Profile(_Strict):
    """A cluster profile; see hpcdl/profiles/bundled/*.yaml for examples."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str = ""
    scheduler: Scheduler = Field(default_factory=Scheduler)
    partitions: list[Partition] = Field(min_length=1)
    modules: list[str] = Field(default_factory=list)
    container: Container = Field(default_factory=Container)
    mpi: Mpi = Field(default_factory=Mpi)
    env: Environment = Field(default_factory=Environment)
    paths: Paths = Field(default_factory=Paths)
    python: str = "python3"
    examples: Examples = Field(default_factory=Examples)
    template_dir: str | None = Field(
        default=None, description="a folder whose templates override the bundled ones"
    )

    @field_validator("modules")
    @classmethod
    def _modules(cls, v: list[str]) -> list[str]:
        for module in v:
            if not _MODULE.match(module):
                raise ValueError(f"'{module}' is not a module name")
        return v

    @model_validator(mode="after")
    def _unique(self) -> Profile:
        names = [p.name for p in self.partitions]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate partition names: {', '.join(dupes)}")
        if sum(p.default for p in self.partitions) > 1:
            raise ValueError("more than one partition is marked default")
        return self

    def partition(self, name: str) -> Partition | None:
        return next((p for p in self.partitions if p.name == name), None)

    @property
    def default_partition(self) -> Partition | None:
        return next((p for p in self.partitions if p.default), None)
