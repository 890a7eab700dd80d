"""What every rank runs and how it is started, in hpcdl's words: the command (a user's
COMMAND, the bundled example with the profile's defaults, or the probe worker), the
image and its binds, the rank-env wrapper, torchrun, the master address and port, and
the notes that explain the launch line. The scheduler's own launcher (srun, mpiexec)
comes from its dialect (hpcdl.schedulers.*.script). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from hpcdl.core.resources import PACKAGE_DIR, examples_dir
from hpcdl.core.templating import Raw
from hpcdl.jobside.world import PORT_BASE, PORT_SPAN
from hpcdl.launch.rankenv import SCRIPT_VARIABLE, WRAPPER_NAME
from hpcdl.launch.staging import job_dir
from hpcdl.plan.container import JOB_PROJECT_DIR
from hpcdl.plan.partition import tasks_per_node
from hpcdl.probe.request import worker_path
from hpcdl.profiles.schema import Profile
from hpcdl.schedulers.base import JobSpec, ScriptDialect
from hpcdl.schedulers.launchers import launcher_for

DEFAULT_EXAMPLE = "resnet50_imagenet.py"


@dataclass(frozen=True)
class LaunchRequest:
    """The request's launch part, as given: what every rank runs (a COMMAND, or the
    bundled example with -X arguments; the probe worker for a probe job) and how the
    ranks start (None: the profile's mpi.launcher, mpi.gpu_bind)."""

    backend: str = "horovod"
    launcher: str | None = None
    gpu_bind: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    command: tuple[str, ...] = ()
    example_args: tuple[str, ...] = ()
    probe_only: bool = False  # the job is `hpcdl probe`: the probe worker runs

    @property
    def runs_example(self) -> bool:
        """The job's command is the bundled example (no COMMAND, not a probe job)."""
        return not self.command and not self.probe_only


def _option_name(arg: str) -> str | None:
    """``--lr`` for "--lr" and "--lr=0.1"; None for a value ("0.1")."""
    return arg.split("=", 1)[0] if arg.startswith("--") else None


def example_defaults(profile: Profile, req: LaunchRequest,
                     example: str = DEFAULT_EXAMPLE) -> tuple[str, ...]:
    """The profile's default arguments for the bundled ``example`` that stay on its
    command line: ``examples.args``, then ``examples.per_example[example]`` (which
    replaces an option args also sets), minus every option the user's -X sets again.

    Dropping them, rather than relying on argparse's "the last one wins", keeps the
    launch line honest and also lets -X replace a flag default. Empty for a COMMAND
    and for a probe job.
    """
    if not req.runs_example:
        return ()
    per_example = tuple(profile.examples.per_example.get(example, ()))
    specific = {_option_name(a) for a in per_example}
    shared = tuple(a for a in profile.examples.args if _option_name(a) not in specific)
    user = {_option_name(a) for a in req.example_args}
    return tuple(a for a in shared + per_example if _option_name(a) not in user)


def default_command(profile: Profile, req: LaunchRequest, run_dir: str | None,
                    image: str | None, defaults: tuple[str, ...], resume: bool,
                    data_args: list[str]) -> list[str]:
    """The bundled example's command line: hpcdl's options, the dataset's (``data_args``,
    hpcdl.plan.data.DataPart.example_args), the profile's ``defaults``
    (example_defaults), the user's -X;
    ``resume``: every attempt of a requeued or chained job continues where the last one
    stopped."""
    base = (JOB_PROJECT_DIR / "examples" if image else
            PurePosixPath(job_dir(run_dir)) / "examples" if run_dir else examples_dir())
    cmd = [profile.python, str(base / DEFAULT_EXAMPLE), "--backend", req.backend]
    cmd += data_args
    if run_dir:  # checkpoints belong with the run that wrote them
        cmd += ["--checkpoint-dir", f"{run_dir}/checkpoints"]
    if resume:
        cmd += ["--resume"]
    # The user's -X last: after the profile's defaults, so argparse's "last one wins"
    # agrees with example_defaults() having dropped the defaults they replace.
    return cmd + list(defaults) + list(req.example_args)


def probe_command(profile: Profile, args: tuple[str, ...], run_dir: str | None,
                  image: str | None) -> list[str]:
    """The probe worker with its arguments ``args``, where the job sees it."""
    package = job_dir(run_dir) + "/hpcdl" if run_dir else str(PACKAGE_DIR)
    return [profile.python, worker_path(bool(image), package, JOB_PROJECT_DIR), *args]


def rank_tokens(profile: Profile, spec: JobSpec, command: list[str], launcher: str,
                image: str | None, binds: tuple[str, ...], job_id_word: str,
                wrapper_file: str | None, *, project: bool) -> list[str]:
    """What the launcher starts on every rank: the container (if any) with ``binds``
    (container_binds, the same the plan records; ``project``: the bundled files are on
    its PYTHONPATH), the rank-env wrapper (``wrapper_file``, a file of the run; None:
    inline in the script), the launcher's agent (torchrun's, over ``spec``'s nodes) and
    the command."""
    tokens: list[str] = []
    if image:
        runtime = profile.container.binary or profile.container.runtime
        tokens += [runtime, "exec"]
        if profile.container.nv:
            tokens.append("--nv")
        for bind in binds:
            tokens += ["-B", bind]
        if project:
            tokens += ["--env", f"PYTHONPATH={JOB_PROJECT_DIR}"]
        tokens.append(image)
    # Every rank (or torchrun agent) starts through the rank-env wrapper. A file of the run
    # is seen at the same path in a container (the run directory is bound) or read from
    # ./job without a run directory. A script hpcdl does not submit (PBS) carries it in a
    # variable; ${...:?}: a custom template that does not define it fails loudly instead
    # of running `sh -c ""` (nothing) successfully.
    if wrapper_file is None:
        tokens += [Raw("/bin/sh"), Raw("-c"), Raw(f'"${{{SCRIPT_VARIABLE}:?}}"'), Raw(WRAPPER_NAME)]
    else:
        tokens += [Raw("/bin/sh"), wrapper_file]
    tokens += launcher_for(launcher).agent_tokens(command, profile.python, spec,
                                                  job_id_word=job_id_word)
    return tokens + command


# How many ports after the derived MASTER_PORT the batch shell tries when that one is
# taken on the first node (a service, another job): enough for any real node.
PORT_TRIES = 64


def master_values(env: tuple[tuple[str, str], ...],
                  dialect: ScriptDialect) -> tuple[str | None, str | None]:
    """Shell expressions for MASTER_ADDR and MASTER_PORT, None where the profile or
    --env sets the variable (an explicit value wins).

    MASTER_ADDR: the first node of the allocation (the batch shell runs there; the name
    resolves on real clusters). MASTER_PORT: PORT_BASE + job id % PORT_SPAN, so jobs
    sharing a node use different ports (the same rule as hpcdl.jobside.world). The
    ``dialect`` says how its scheduler names the first node and the job id.
    """
    names = {k for k, _ in env}
    addr = None if "MASTER_ADDR" in names else dialect.first_node
    port = (None if "MASTER_PORT" in names
            else f"$(({PORT_BASE} + {dialect.job_id_arith} % {PORT_SPAN}))")
    return addr, port


def launch_notes(req: LaunchRequest, gpus: int, run_dir: str | None, launcher: str,
                 gpu_bind: str, image: str | None, image_source: str | None,
                 addr: str | None, port: str | None) -> list[str]:
    """What the launch line does, for the comment above it (shown by --dry-run).
    ``addr``/``port``: master_values() (None where the profile or --env sets them)."""
    starter = launcher_for(launcher)
    notes = [starter.note(tasks_per_node(gpus))]
    notes.append("MASTER_ADDR: " + ("the first node of the allocation." if addr else
                                    "set by the profile or --env (it wins)."))
    notes.append("MASTER_PORT: " + (f"{PORT_BASE} + job id % {PORT_SPAN}, so jobs sharing a "
                                    "node do not collide (below the ephemeral port range); "
                                    "the next free one if something on the first node "
                                    "listens on it."
                                    if port else "set by the profile or --env (it wins)."))
    if not gpus:
        notes.append("GPUs: none requested.")
    elif starter.per_node or gpu_bind == "none":  # a node's agent starts ranks on all its GPUs
        notes.append(f"GPUs: every rank sees the {gpus} GPUs of its node and uses GPU "
                     "LOCAL_RANK (torch.cuda.set_device(LOCAL_RANK), as torchrun and Horovod "
                     "scripts do).")
    else:
        notes.append(f"GPUs: each rank sees one GPU, number LOCAL_RANK of its node's {gpus} "
                     "(CUDA_VISIBLE_DEVICES narrowed by the wrapper; --gpu-bind none keeps all).")
    if image:
        origin = ("the profile's container.default_image; --image overrides, --no-image "
                  "runs natively" if image_source == "profile default_image" else "--image")
        notes.append(f"image: {image} ({origin}).")
        origin = "the run directory's copy (job/)" if run_dir else "the host"
        if req.probe_only:
            notes.append(f"the probe worker (hpcdl/jobside/probe_worker.py: stdlib + torch) comes from "
                         f"{origin}, bound read-only at {JOB_PROJECT_DIR} (the image needs no "
                         f"copy of hpcdl).")
        elif not req.command:
            notes.append(f"the bundled example comes from {origin}, bound read-only at "
                         f"{JOB_PROJECT_DIR} (the image needs no copy of hpcdl).")
    return notes
