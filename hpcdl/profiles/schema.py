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

from hpcdl.slurmtime import parse_time

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MODULE = re.compile(r"^[A-Za-z0-9_.+/\-]+$")
_OPTION = re.compile(r"^[a-z][a-z0-9-]*$")


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
    """How ranks start. ``launcher``: srun (one task per rank), mpirun, horovodrun, or
    torchrun (one torchrun per node via srun, c10d rendezvous on the first node)."""

    launcher: Literal["srun", "mpirun", "horovodrun", "torchrun"] = "srun"
    srun_mpi: Literal["pmix", "pmi2", "none"] | None = Field(
        default="pmix", description="srun --mpi=...; null leaves the site's MpiDefault"
    )
    launcher_args: list[str] = Field(default_factory=list)
    gpu_bind: Literal["none", "local-rank"] = Field(
        default="none",
        description="local-rank: narrow CUDA_VISIBLE_DEVICES to the rank's GPU; none: every "
        "rank sees all GPUs of its node and picks GPU LOCAL_RANK (torch.cuda.set_device)",
    )


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
