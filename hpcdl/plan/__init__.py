"""Planning: a user's request, checked against a cluster profile, becomes a frozen
JobPlan whose script is exactly what gets submitted. Pure: nothing here runs a tool.

The request is made of parts (JobRequest's placement, container, data, launch,
resilience, hang, probe and files: the CLI builds each from its options), and
build_plan is a row of stages, each planning one part handed only that part and the parts it depends on.
Modules, in the order a plan is made: ``request`` (JobRequest and the checks that need
no profile), ``data`` (the dataset the job reads, decided once: DataPart),
``partition`` (the placement part: which partition, tasks, CPUs, time, spares),
``container`` (the image, its binds, its copy to every node), ``resilience`` (requeue
or chain, the node guard of spares, the hang watchdog), ``command`` (the launch part:
what every rank runs, the rank-env wrapper, torchrun, the master address and port),
``probe`` (the --probe-first step), ``rules`` (the rules between two parts, in one
place), ``build`` (build_plan: the row of part stages, the scheduler's dialect for the
script's header, launcher and log paths) and ``jobplan`` (the JobPlan it returns: the
scheduler's JobSpec and the launch, container, data, files, probe and hang parts;
plan.json flattens them, but for data, one object). The names
callers use are re-exported here.
"""

from hpcdl.plan.build import UNPRIVILEGED_MPI_ENV, build_plan
from hpcdl.plan.command import (
    DEFAULT_EXAMPLE,
    PORT_TRIES,
    LaunchRequest,
    example_defaults,
    launch_notes,
    master_values,
)
from hpcdl.plan.container import (
    JOB_PROJECT_DIR,
    ContainerRequest,
    container_binds,
    image_stage,
    job_image,
)
from hpcdl.plan.data import DataPart, DataRequest, decide_data
from hpcdl.plan.jobplan import (
    ContainerPart,
    FilesPart,
    FilesRequest,
    HangPart,
    JobPlan,
    LaunchPart,
    ProbePart,
    job_script_path,
)
from hpcdl.plan.partition import (
    PlacementRequest,
    choose_partition,
    default_cpus_per_task,
    job_time,
    tasks_per_node,
)
from hpcdl.plan.probe import ProbeRequest
from hpcdl.plan.request import (
    BACKENDS,
    GPU_BINDS,
    LAUNCHERS,
    JobRequest,
    RuntimeMode,
    check_request,
)
from hpcdl.plan.resilience import HangRequest, ResilienceRequest, requeue_spec
from hpcdl.plan.rules import check_shared_paths, on_shared_path

__all__ = [
    "BACKENDS", "DEFAULT_EXAMPLE", "GPU_BINDS", "JOB_PROJECT_DIR", "LAUNCHERS", "PORT_TRIES",
    "UNPRIVILEGED_MPI_ENV", "ContainerPart", "ContainerRequest", "DataPart", "DataRequest", "FilesPart", "FilesRequest", "HangRequest", "LaunchRequest", "ProbeRequest", "PlacementRequest", "ResilienceRequest", "HangPart", "JobPlan", "LaunchPart",
    "ProbePart", "JobRequest", "RuntimeMode", "build_plan",
    "check_request", "check_shared_paths", "choose_partition", "container_binds", "decide_data",
    "default_cpus_per_task", "example_defaults", "image_stage", "job_image", "job_script_path", "job_time",
    "launch_notes", "master_values", "on_shared_path", "requeue_spec", "tasks_per_node",
]
