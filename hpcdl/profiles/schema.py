"""The typed schema of a cluster profile.

Profiles are YAML files describing one cluster: scheduler defaults,
partitions and their limits, modules, container runtime, MPI launcher,
environment and paths. Every model forbids unknown keys, so a typo in a
profile is an error naming the file and the field, not a silent default.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hpcdl.core.duration import parse_time
from hpcdl.core.resources import examples_dir
from hpcdl.core.tokens import (
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
    SlurmRelease,
    SlurmTime,
    SlurmValue,
    SshHost,
    SshJump,
    SshUser,
    Text,
)

# Options hpcdl itself puts on the bundled example's command line (from --backend,
# --data/--synthetic and the run directory): a profile default must not fight them.
EXAMPLE_OPTIONS_SET_BY_HPCDL = ("--backend", "--data", "--synthetic", "--checkpoint-dir",
                                "--resume")


# The words a profile and a request share (hpcdl.plan types its fields with these).
SchedulerType = Literal["slurm", "pbs"]
Launcher = Literal["srun", "mpirun", "horovodrun", "torchrun"]
GpuBind = Literal["none", "local-rank"]
# The bundled example's distributed backends (submit --backend).
Backend = Literal["horovod", "ddp"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Partition(_Strict):
    """One Slurm partition and the limits hpcdl checks before submitting."""

    name: Name = Field(description="the Slurm partition's name (sbatch --partition)")
    nodes: PositiveInt = Field(description="nodes in the partition")
    gpus_per_node: NonNegativeInt = Field(
        description="GPUs per node (0: CPU-only); a request for more is refused")
    gpu_type: Text | None = Field(
        default=None,
        description="GPU model, e.g. A100: submit checks it against the GPU architectures "
                    "the image's torch was built for")
    cpus_per_node: PositiveInt = Field(
        description="CPU cores per node; the ranks per node x --cpus-per-task must fit")
    mem_per_node_gb: PositiveInt | None = Field(
        default=None, description="memory per node in GB (for people and templates; not checked)")
    max_nodes_per_job: PositiveInt | None = Field(
        default=None, description="defaults to the partition's node count"
    )
    max_time: SlurmTime = Field(description="Slurm time: D-HH:MM:SS, HH:MM:SS or 'infinite'")
    default: bool = Field(
        default=False,
        description="Slurm's default partition; among partitions that fit equally, hpcdl "
                    "picks it first (at most one per profile)")
    max_jobs_per_user: PositiveInt | None = Field(
        default=None, description="the QOS's per-user job limit (recorded, not checked)")
    max_gpus_per_user: PositiveInt | None = Field(
        default=None,
        description="the QOS's per-user GPU limit: a request for more GPUs in all is refused")
    max_array_size: PositiveInt | None = Field(
        default=None,
        description="Slurm's MaxArraySize (slurm.conf): a job array's indices run 0 to this "
                    "minus 1, so `hpcdl sweep` refuses more points (nothing submitted). The "
                    "live check reads the cluster's own value (scontrol show config) and "
                    "both count; this one alone where the cluster cannot be asked "
                    "(a dry run away from it)")
    max_submit_jobs: PositiveInt | None = Field(
        default=None,
        description="the QOS's MaxSubmitJobs per user: every array task counts as a job, so "
                    "`hpcdl sweep` refuses more points than this (nothing submitted)")
    description: Text | None = Field(default=None, description="free text for people")

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
        """max_time in seconds (None: unlimited), what planning and the checks compare;
        max_time keeps the profile's text for messages. (Read from the validated field,
        not cached: a model_copy(update=...) skips the validators.)"""
        return parse_time(self.max_time)


class Scheduler(_Strict):
    """Scheduler defaults. ``extra_options`` become ``#SBATCH --key=value`` lines."""

    type: SchedulerType = Field(
        default="slurm", description="pbs: hpcdl renders a PBS Pro script for --dry-run only"
    )
    account: SlurmValue | None = Field(
        default=None, description="the account to charge (--account)")
    qos: SlurmValue | None = Field(default=None, description="the quality of service (--qos)")
    extra_options: dict[OptionKey, SlurmValue] = Field(
        default_factory=dict, description="more sbatch options, each '--key=value'")
    commands: SharedDir | None = Field(
        default=None,
        description="the directory of this cluster's Slurm commands (sbatch, srun, squeue, "
        "...) where hpcdl runs them, when it is not the first on PATH: a site's `module load "
        "slurm/24.11` directory, or a release sandbox's (hpcdl sandbox up --slurm 24.11); "
        "the job's own srun comes from the job's PATH (put the module in `modules`)")
    release: SlurmRelease | None = Field(
        default=None,
        description="the cluster's Slurm release (YY.MM, e.g. '24.11'), written by `hpcdl "
        "profiles detect` and `hpcdl sandbox up --slurm`: the rendered script follows it "
        "(hpcdl/schedulers/slurm/releases.py) without asking Slurm; unset: 22.05's "
        "behaviour, the oldest hpcdl knows")
    requeue_expedite: bool = Field(
        default=False,
        description="the cluster's slurm.conf has SlurmctldParameters=enable_expedited_requeue "
        "(profiles detect reads it): on a release with --requeue=expedite (25.11 on), a "
        "requeued job goes back at the front of the queue")
    gpu_request: Literal["gres", "gpus-per-node"] = Field(
        default="gres",
        description="how GPUs are asked for: --gres=gpu:N or --gpus-per-node=N")
    default_time: SlurmTime = Field(
        default="01:00:00",
        description="the time limit without --time (capped at the partition's max_time)")
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
    spares: NonNegativeInt = Field(
        default=0, description="submit --spares by default: nodes allocated beyond --nodes that "
        "replace a failed one inside the job (the training job's; not the probe's)")
    gate_timeout: int = Field(
        default=90, ge=15, le=3600,
        description="seconds the node guard's health gate (--spares) may take on every node "
        "together; a node that has not answered by then is excluded (a dead node's launch "
        "fails after Slurm's MessageTimeout, 10 s by default; a container start from a slow "
        "shared filesystem may take a minute)")
    probe_first: bool = Field(
        default=False, description="submit --probe-first by default (jobs of 2 or more nodes, "
        "spares counted): the allreduce probe before the first rank; with spares a slow node "
        "is swapped for one, without it stops the job")

    @field_validator("default_time")
    @classmethod
    def _time(cls, v: str) -> str:
        parse_time(v)
        return v

    @property
    def default_seconds(self) -> int | None:
        """default_time in seconds (None: unlimited)."""
        return parse_time(self.default_time)


class Container(_Strict):
    """The container runtime on the compute nodes and what every container gets."""

    runtime: Literal["apptainer", "singularity"] = Field(
        default="apptainer", description="the runtime the ranks start under")
    binary: HostPath | None = Field(default=None, description="path; default: the runtime on PATH")
    binds: list[Bind] = Field(
        default_factory=list, description="binds every container gets (-B SRC[:DST[:OPTS]])")
    nv: bool = Field(default=True, description="pass --nv (NVIDIA GPUs into the container)")
    default_image: HostPath | None = Field(
        default=None, description="the image when submit has no --image (--no-image: native)")
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

    launcher: Launcher = Field(
        default="srun", description="the default of submit --launcher")
    srun_mpi: Literal["pmix", "pmi2", "none"] | None = Field(
        default="pmix", description="srun --mpi=...; null leaves the site's MpiDefault"
    )
    launcher_args: list[Text] = Field(
        default_factory=list, description="extra arguments after the launcher's own")
    gpu_bind: GpuBind = Field(
        default="none",
        description="local-rank: narrow CUDA_VISIBLE_DEVICES to the rank's GPU; none: every "
        "rank sees all GPUs of its node and picks GPU LOCAL_RANK (torch.cuda.set_device)",
    )


class Environment(_Strict):
    """What the job script exports before it starts the ranks."""

    vars: dict[EnvName, Text] = Field(
        default_factory=dict, description="exported in the job script (submit --env wins)")
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

    scratch: HostPath | None = Field(
        default=None,
        description="the site's scratch directory; hpcdl reads it nowhere, templates may "
                    "(profile.paths.scratch)")
    shared: list[SharedDir] = Field(
        default_factory=list,
        description="directories the compute nodes share with the host hpcdl runs on "
                    "(e.g. /home, /scratch); when set, a run directory, image, dataset or "
                    "--bind source outside them is refused before submission")
    local_scratch: BindSource | None = Field(
        default=None,
        description="node-local scratch directory (each node its own, e.g. /local or "
                    "/tmp): where image staging and --stage-to copy to")
    datasets: HostPath | None = Field(
        default=None,
        description="where the site keeps datasets; hpcdl reads it nowhere, templates may")
    imagenet: HostPath | None = Field(
        default=None,
        description="an ImageNet-format dataset: the bundled example's --data when submit "
                    "has neither --data nor --synthetic")


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


class Login(_Strict):
    """The cluster's login node, when hpcdl runs elsewhere (a laptop): every scheduler
    command runs there over one SSH connection and run directories are copied there
    with rsync. Values left out come from the user's ~/.ssh/config for ``host``."""

    host: SshHost = Field(description="host name, address or ~/.ssh/config alias")
    user: SshUser | None = Field(default=None, description="remote user (default: ssh's)")
    port: int | None = Field(default=None, ge=1, le=65535, description="SSH port")
    identity: SharedDir | None = Field(
        default=None, description="private key file (absolute path on this machine)")
    jump: SshJump | None = Field(default=None, description="ProxyJump host(s): [USER@]HOST[:PORT]")
    runs: SharedDir | None = Field(
        default=None, description="run directories on the cluster (absolute; default: "
                                  "hpcdl-runs in the remote home); the nodes must see it")
    images: SharedDir | None = Field(
        default=None, description="where `hpcdl push` puts images on the cluster (absolute; "
                                  "default: hpcdl-images in the remote home)")
    code_limit_mb: PositiveInt = Field(
        default=200, description="the most a --code directory may hold (MB) before submit "
                                 "refuses to copy it")


class Profile(_Strict):
    """A cluster profile; see hpcdl/profiles/bundled/*.yaml for examples."""

    name: Name = Field(description="the profile's name (submit --profile NAME)")
    description: Text = Field(default="", description="one line for `hpcdl profiles list`")
    scheduler: Scheduler = Field(default_factory=Scheduler, description="scheduler defaults")
    partitions: list[Partition] = Field(
        min_length=1, description="at least one; names unique")
    modules: list[Module] = Field(
        default_factory=list, description="environment modules the job script loads")
    container: Container = Field(default_factory=Container, description="container runtime")
    mpi: Mpi = Field(default_factory=Mpi, description="how ranks start")
    env: Environment = Field(default_factory=Environment, description="the job's environment")
    paths: Paths = Field(default_factory=Paths, description="where things live on the cluster")
    interconnect: Interconnect = Field(
        default_factory=Interconnect, description="the network between nodes (hpcdl probe)")
    python: Executable = Field(
        default="python3", description="the python that runs the bundled examples and the probe")
    examples: Examples = Field(
        default_factory=Examples, description="default arguments for the bundled examples")
    template_dir: HostPath | None = Field(
        default=None, description="a folder whose templates override the bundled ones"
    )
    login: Login | None = Field(
        default=None, description="the login node to reach the cluster through over SSH, "
                                  "when hpcdl runs off the cluster (a laptop)")

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

    @property
    def code_limit_bytes(self) -> int:
        """The most a --code directory may hold: the login: block's code_limit_mb, else
        that field's default (without login: the job starts where the user submits and
        nothing is copied, but a library caller may still scan a code directory)."""
        mb = self.login.code_limit_mb if self.login else Login.model_fields["code_limit_mb"].default
        return int(mb) * 1_000_000
