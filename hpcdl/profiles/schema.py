"""The typed schema of a cluster profile.

Profiles are YAML files describing one cluster: scheduler defaults,
partitions and their limits, modules, container runtime, MPI launcher,
environment and paths. Every model forbids unknown keys, so a typo in a
profile is an error naming the file and the field, not a silent default.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hpcdl.resources import examples_dir
from hpcdl.slurmtime import parse_time
from hpcdl.tokens import (
    Bind,
    BindSource,
    EnvName,
    ExampleArg,
    Executable,
    Filesystem,
    HostPath,
    IfName,
    Module,
    Name,
    NonNegativeInt,
    OptionKey,
    PositiveInt,
    RequeueSignal,
    SharedDir,
    SlurmTime,
    SlurmValue,
    Text,
)

# Options hpcdl itself puts on the bundled example's command line (from --backend,
# --data/--synthetic and the run directory): a profile default must not fight them.
EXAMPLE_OPTIONS_SET_BY_HPCDL = ("--backend", "--data", "--synthetic", "--checkpoint-dir",
                                "--resume")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Partition(_Strict):
    """One Slurm partition and the limits hpcdl checks before submitting."""

    name: Name
    nodes: PositiveInt = Field(description="nodes in the partition")
    gpus_per_node: NonNegativeInt
    gpu_type: Text | None = None
    cpus_per_node: PositiveInt
    mem_per_node_gb: PositiveInt | None = None
    max_nodes_per_job: PositiveInt | None = Field(
        default=None, description="defaults to the partition's node count"
    )
    max_time: SlurmTime = Field(description="Slurm time: D-HH:MM:SS, HH:MM:SS or 'infinite'")
    default: bool = False
    max_jobs_per_user: PositiveInt | None = None
    max_gpus_per_user: PositiveInt | None = None
    description: Text | None = None

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
        default="slurm", description="pbs: hpcdl renders a PBS Pro script for --dry-run only"
    )
    account: SlurmValue | None = None
    qos: SlurmValue | None = None
    extra_options: dict[OptionKey, SlurmValue] = Field(default_factory=dict)
    gpu_request: Literal["gres", "gpus-per-node"] = "gres"
    default_time: SlurmTime = "01:00:00"
    filesystems: list[Filesystem] = Field(
        default_factory=list,
        description="PBS only: '-l filesystems=a:b' (ALCF: the filesystems the job needs up)",
    )
    requeue: bool = Field(
        default=False,
        description="submit --requeue by default: checkpoint on a signal, requeue, resume",
    )
    max_restarts: NonNegativeInt = Field(
        default=3, description="requeues hpcdl asks for before it lets a job end (--max-restarts)"
    )
    requeue_signal: RequeueSignal = Field(
        default="USR2@120", description="--signal: SIG@SECONDS before the time limit"
    )

    @field_validator("default_time")
    @classmethod
    def _time(cls, v: str) -> str:
        parse_time(v)
        return v


class Container(_Strict):
    runtime: Literal["apptainer", "singularity"] = "apptainer"
    binary: HostPath | None = Field(default=None, description="path; default: the runtime on PATH")
    binds: list[Bind] = Field(default_factory=list)
    nv: bool = Field(default=True, description="pass --nv (NVIDIA GPUs into the container)")
    default_image: HostPath | None = None
    mode: Literal["auto", "setuid", "unprivileged"] = Field(
        default="auto",
        description="how the runtime runs on the compute nodes: setuid (the setuid starter) "
                    "or unprivileged (user namespaces, squashfuse); auto: as detected on the "
                    "host hpcdl runs on. Unprivileged ranks each get their own user "
                    "namespace, which Open MPI's shared-memory transport must be told")
    stage: Literal["sbcast", "none"] = Field(
        default="none",
        description="sbcast: the job copies the image to every node's paths.local_scratch "
                    "with Slurm's sbcast before its ranks start, and runs them from there "
                    "(hpcdl submit --stage-image / --no-stage-image override); none: the "
                    "ranks read the image where it is")


class Mpi(_Strict):
    """How ranks start. ``launcher``: srun (one task per rank), mpirun, horovodrun, or
    torchrun (one torchrun per node via srun, c10d rendezvous on the first node)."""

    launcher: Literal["srun", "mpirun", "horovodrun", "torchrun"] = "srun"
    srun_mpi: Literal["pmix", "pmi2", "none"] | None = Field(
        default="pmix", description="srun --mpi=...; null leaves the site's MpiDefault"
    )
    launcher_args: list[Text] = Field(default_factory=list)
    gpu_bind: Literal["none", "local-rank"] = Field(
        default="none",
        description="local-rank: narrow CUDA_VISIBLE_DEVICES to the rank's GPU; none: every "
        "rank sees all GPUs of its node and picks GPU LOCAL_RANK (torch.cuda.set_device)",
    )


class Environment(_Strict):
    vars: dict[EnvName, Text] = Field(default_factory=dict)
    omp_num_threads: Literal["cpus-per-task"] | PositiveInt = Field(
        default="cpus-per-task",
        description="OMP_NUM_THREADS: follow --cpus-per-task, or a fixed number",
    )


class Interconnect(_Strict):
    """The network between nodes, as the site documents it: `hpcdl probe` reports its
    measurements against ``expected_busbw_gbs`` and, with two nodes, calls the one link
    slow below --slow-ratio of it."""

    name: Text | None = Field(default=None, description="e.g. 'InfiniBand HDR 4x200 Gb/s'")
    expected_busbw_gbs: float | None = Field(
        default=None, gt=0,
        description="allreduce bus bandwidth between nodes in GB/s (10^9 bytes/s), as "
                    "nccl-tests and `hpcdl probe` report it (busbw = algbw x 2(n-1)/n)")
    socket_ifname: IfName | None = Field(
        default=None,
        description="the interface NCCL and Gloo should use (NCCL_SOCKET_IFNAME syntax); "
                    "`hpcdl probe`'s default --ifname")


class Paths(_Strict):
    """Where things live on the cluster, as the compute nodes see them."""

    scratch: HostPath | None = None
    shared: list[SharedDir] = Field(
        default_factory=list,
        description="directories the compute nodes share with the host hpcdl runs on "
                    "(e.g. /home, /scratch); when set, a run directory, image, dataset or "
                    "--bind source outside them is refused before submission")
    local_scratch: BindSource | None = Field(
        default=None,
        description="node-local scratch directory (each node its own, e.g. /local or "
                    "/tmp): where image staging and --stage-to copy to")
    datasets: HostPath | None = None
    imagenet: HostPath | None = None


def _example_args(where: str, args: list[str]) -> list[str]:
    for arg in args:
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

    args: list[ExampleArg] = Field(
        default_factory=list, description="for every bundled example hpcdl runs"
    )
    per_example: dict[Name, list[ExampleArg]] = Field(
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

    name: Name
    description: Text = ""
    scheduler: Scheduler = Field(default_factory=Scheduler)
    partitions: list[Partition] = Field(min_length=1)
    modules: list[Module] = Field(default_factory=list)
    container: Container = Field(default_factory=Container)
    mpi: Mpi = Field(default_factory=Mpi)
    env: Environment = Field(default_factory=Environment)
    paths: Paths = Field(default_factory=Paths)
    interconnect: Interconnect = Field(default_factory=Interconnect)
    python: Executable = "python3"
    examples: Examples = Field(default_factory=Examples)
    template_dir: HostPath | None = Field(
        default=None, description="a folder whose templates override the bundled ones"
    )

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
