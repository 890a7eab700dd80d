"""``build_plan``: a request, checked against a profile, becomes a frozen JobPlan.

Pure: it decides everything (partition, tasks, CPUs, time, the launch line and the
rendered script) and raises ValidationError naming the field, the value and the limit
before anything is written or submitted. It is a short row of pure stages, each
building one part of the plan from the request and the parts before it (placement,
launcher, the scheduler's JobSpec, staging, container, launch, probe, files, script,
hang); every derived value is computed once, in its stage, and handed on. The
scheduler's dialect (hpcdl.schedulers.dialects) spells the script's header, launcher
and log paths.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import PurePosixPath
from typing import Any, cast

from hpcdl.core.duration import format_time
from hpcdl.core.gpuarch import ImageArchFacts, check_partition
from hpcdl.core.templating import Raw, render_template, shell_join
from hpcdl.data.mount import (
    CONTAINER_MOUNT,
    DATA_VARIABLE,
    STAGED_DATA_VARIABLE,
    native_mount_dir,
)
from hpcdl.hang.actions import DEFAULT_HANG_ACTION, UNWATCHED_NAME, WATCHDOG_PYTHON
from hpcdl.jobside.errors import ValidationError
from hpcdl.jobside.requeue import (
    CHECKPOINT_ENV,
    EXIT_REQUEUE,
    FLAG_ENV,
    FLAG_NAME,
    PROGRESS_ENV,
    PROGRESS_NAME,
    wait_seconds,
)
from hpcdl.jobside.steps import HEARTBEAT_DIR, HEARTBEAT_ENV
from hpcdl.jobside.world import PORT_BASE, PORT_SPAN
from hpcdl.launch.code import CODE_DIR_NAME
from hpcdl.launch.nodes import (
    NODES_FILE,
    guard_calls_text,
    guard_exports,
    nodes_file_text,
    probe_slow_path,
)
from hpcdl.launch.rankenv import (
    PORT_LISTENED,
    PORT_PICK_FILE,
    RANK_ENV_FILE,
    SCRIPT_VARIABLE,
    port_pick_file,
    port_pick_lines,
    rank_env_file,
    rank_env_script,
)
from hpcdl.launch.staging import WATCHDOG_MODULE, job_dir, job_side_files
from hpcdl.plan.command import (
    PORT_TRIES,
    check_shared_paths,
    container_binds,
    default_command,
    example_defaults,
    job_image,
    launch_notes,
    master_values,
    packed_data,
    probe_command,
    rank_tokens,
)
from hpcdl.plan.jobplan import (
    ContainerPart,
    FilesPart,
    HangPart,
    JobPlan,
    LaunchPart,
    ProbePart,
    job_script_path,
)
from hpcdl.plan.partition import (
    choose_partition,
    default_cpus_per_task,
    job_spares,
    job_time,
    tasks_per_node,
)
from hpcdl.plan.request import JobRequest, RuntimeMode, _fail, check_request
from hpcdl.profiles.schema import Backend, GpuBind, Partition, Profile
from hpcdl.schedulers.base import JobSpec, RequeueSpec, ScriptDialect
from hpcdl.schedulers.dialects import dialect_for
from hpcdl.schedulers.launchers import RankLauncher, launcher_for

# Unprivileged Apptainer puts each rank in its own user namespace. There Open MPI's
# single-copy transfer between ranks of a node (CMA, process_vm_readv) fails, and Horovod
# hangs in its first broadcast: ranks copy through shared memory instead. And PMIx's
# shared-memory datastore (gds ds12, locks made by slurmstepd) fails on every rank with
# "PMIX ERROR ... gds_ds12_lock_pthread.c": its hash datastore needs no shared lock.
UNPRIVILEGED_MPI_ENV: tuple[tuple[str, str], ...] = (
    ("OMPI_MCA_btl_vader_single_copy_mechanism", "none"),
    ("PMIX_MCA_gds", "hash"),
)
# The master port's range and how far the batch shell looks for a free one.
_PORT_RANGE = {"base": PORT_BASE, "span": PORT_SPAN, "tries": PORT_TRIES}


def build_plan(profile: Profile, req: JobRequest,
               image_facts: ImageArchFacts | None = None,
               runtime_mode: RuntimeMode | None = None) -> JobPlan:
    """Validate ``req`` against ``profile`` and render its job script.

    ``image_facts`` (from hpcdl.jobs.preflight.image_arch_facts, which reads the image's
    build record) lets the plan refuse a partition whose GPU type the image's torch has
    no kernels for; without it that check is not made. ``runtime_mode``: how the
    container runtime runs on the cluster (the profile's container.mode, or detected on
    this host); "unprivileged" adds what MPI needs across per-rank user namespaces.

    Each stage below is pure and builds one part from the request and the parts before
    it; their order is the order of the checks (the first broken rule is the one named).
    Raises ValidationError (bad value, over a limit, a GPU the image cannot run on) or
    RenderError (template).
    """
    check_request(req)
    dialect = dialect_for(profile.scheduler.type)
    part, reason, arch_warning = _placement(profile, req, image_facts)
    launcher, gpu_bind = _launcher(profile, req, dialect)
    image, image_source = job_image(profile, req)
    check_shared_paths(profile, req, image)
    spec = _spec(profile, req, dialect, part, launcher)
    staged = _staged(profile, req, spec, dialect, image)
    container = _container(profile, req, image, image_source, staged, runtime_mode)
    ranks = _Ranks.of(req, dialect, launcher, gpu_bind, staged)
    launch = _launch(profile, req, spec, dialect, container, ranks)
    probe = _probe(profile, req, spec, dialect, container, ranks)
    files = _files(req, spec, dialect, launch, ranks)
    warnings = (*dialect.warnings(profile), *([arch_warning] if arch_warning else []),
                *_hang_warnings(req, spec.time_seconds))
    hang = _hang(req, spec)
    script = _script(profile, req, spec, dialect, launch, container, staged, ranks, probe,
                     files, hang)
    return JobPlan(spec=spec, partition_reason=reason, launch=launch, container=container,
                   files=files, script=script, warnings=warnings, probe=probe, hang=hang)


def _placement(profile: Profile, req: JobRequest, image_facts: ImageArchFacts | None
               ) -> tuple[Partition, str, str | None]:
    """The partition, why it was chosen, and a warning about its GPUs for the image (or
    None). Raises ValidationError when none fits or the image cannot run on its GPUs."""
    part, reason = choose_partition(profile, req)
    arch = check_partition(part.name, part.gpu_type, req.gpus, image_facts)
    if arch.error:
        raise ValidationError(
            arch.error,
            hint="pick a partition with a GPU type in that list (--partition), or an image "
            "whose torch was built for it (older GPUs need a CUDA 12 build, e.g. the NGC "
            "spec pytorch-horovod-gpu)",
        )
    return part, reason, arch.warning


def _launcher(profile: Profile, req: JobRequest,
              dialect: ScriptDialect) -> tuple[RankLauncher, GpuBind]:
    """The launcher and GPU binding (the request's, else the profile's), refused where
    they cannot start what the job runs."""
    launcher = launcher_for(req.launcher or profile.mpi.launcher)
    # check_request accepted it: it is the schema's word now.
    gpu_bind = cast(GpuBind, req.gpu_bind or profile.mpi.gpu_bind)
    if req.probe is not None and (refused := dialect.unsupported(profile, "probe")):
        raise _fail(refused)
    if refused := launcher.refusal(probe_only=req.probe_only, runs_example=req.runs_example,
                                   backend=req.backend):
        raise _fail(refused)
    return launcher, gpu_bind


def _spec(profile: Profile, req: JobRequest, dialect: ScriptDialect, part: Partition,
          launcher: RankLauncher) -> JobSpec:
    """What the scheduler is asked for: tasks, CPUs, time, name, requeue, spares."""
    time = job_time(profile, part, req)
    requeue = requeue_spec(profile, req, dialect)
    spares = job_spares(profile, req)
    if spares:
        if refused := dialect.unsupported(profile, "spares"):
            raise _fail(refused)
        if refused := launcher.spares_refusal():
            raise _fail(refused)
    return JobSpec(profile=profile, partition=part, nodes=req.nodes, gpus_per_node=req.gpus,
                   tasks_per_node=tasks_per_node(req.gpus),
                   cpus_per_task=req.cpus_per_task or default_cpus_per_task(part, req.gpus),
                   time_seconds=time, job_name=req.job_name or f"hpcdl-{req.backend}",
                   run_dir=req.run_dir, requeue=requeue, spares=spares)


@dataclass(frozen=True)
class _Staged:
    """What the script copies to every node before the ranks start (the template's
    ``stage`` items: image_stage, packed_stage) and how the ranks see a packed dataset
    (data_mount; the template's ``packed`` natively)."""

    image: dict[str, Any] | None
    data: dict[str, Any] | None
    packed: dict[str, str] | None

    @property
    def steps(self) -> list[dict[str, Any]]:
        # Image first: its copy is what every rank starts from.
        return [s for s in (self.image, self.data) if s]


def _staged(profile: Profile, req: JobRequest, spec: JobSpec, dialect: ScriptDialect,
            image: str | None) -> _Staged:
    """The image's copy first (its refusals are named first), then the dataset's."""
    image_copy = image_stage(profile, req, image, spec, dialect)
    data = packed_stage(profile, req, spec, dialect)
    return _Staged(image=image_copy, data=data,
                   packed=data_mount(profile, req, image, dialect, staged=data is not None))


def _container(profile: Profile, req: JobRequest, image: str | None, image_source: str | None,
               staged: _Staged, runtime_mode: RuntimeMode | None) -> ContainerPart:
    """The image, its binds (one list: the one the plan records is the one the ranks
    get; natively the request's), how the runtime runs it, and what is staged (a
    packed dataset is, natively too)."""
    return ContainerPart(
        image=image, image_source=image_source,
        binds=(tuple(container_binds(profile, req, staged_data=staged.data is not None))
               if image else req.binds),
        mode=((runtime_mode if profile.container.mode == "auto" else profile.container.mode)
              if image else None),
        stage="sbcast" if staged.steps else "none",
        staged_image=staged.image["shown"] if staged.image else None,
        staged_data=staged.data["shown"] if staged.data else None)


@dataclass(frozen=True)
class _Ranks:
    """How every rank starts, for the training and the probe step: the launcher, the
    image (or the node's copy, whose path holds the job id and so is only known to the
    script: $HPCDL_IMAGE), the rank-env wrapper (a file of the run for a job hpcdl
    submits, which stages it; inline in a script it does not: PBS, qsub'ed by hand)."""

    launcher: RankLauncher
    gpu_bind: GpuBind
    staged_image: bool
    wrapper_file: str | None
    wrapper_options: dict[str, bool]  # rank_env_script's and rank_env_file's

    @classmethod
    def of(cls, req: JobRequest, dialect: ScriptDialect, launcher: RankLauncher, gpu_bind: GpuBind,
           staged: _Staged) -> _Ranks:
        return cls(launcher=launcher, gpu_bind=gpu_bind, staged_image=staged.image is not None,
                   wrapper_file=(job_script_path(req.run_dir, RANK_ENV_FILE)
                                 if dialect.submits else None),
                   wrapper_options={"gpu_bind": gpu_bind == "local-rank" and req.gpus > 0,
                                    "record_pid": req.hang_timeout is not None})

    def image(self, container: ContainerPart) -> str | None:
        return Raw('"$HPCDL_IMAGE"') if self.staged_image else container.image


def _launch(profile: Profile, req: JobRequest, spec: JobSpec, dialect: ScriptDialect,
            container: ContainerPart, ranks: _Ranks) -> LaunchPart:
    """The command every rank runs, its environment, and the launch line."""
    launcher = ranks.launcher.name
    defaults = example_defaults(profile, req)
    if req.probe_only:
        command = probe_command(profile, req, container.image)
    else:
        # A requeued attempt or a relaunch on other nodes continues from the checkpoint.
        command = list(req.command) or default_command(
            profile, req, container.image, defaults,
            resume=spec.requeue is not None or spec.spares > 0)
    feature = ranks.launcher.feature
    if feature and (refused := dialect.unsupported(profile, feature)):
        raise _fail(refused)
    prefix = dialect.launcher_tokens(spec, launcher)
    if launcher == profile.mpi.launcher:  # the profile's arguments are for its launcher
        prefix += list(profile.mpi.launcher_args)
    line = shell_join(prefix + rank_tokens(profile, req, command, launcher,
                                           ranks.image(container), container.binds,
                                           dialect.job_id_word, ranks.wrapper_file))
    env = tuple(profile.env.vars.items()) + tuple(req.env)
    if container.mode == "unprivileged":  # what the user or profile sets wins
        env += tuple((k, v) for k, v in UNPRIVILEGED_MPI_ENV if k not in dict(env))
    master_addr, master_port = master_values(env, dialect)
    return LaunchPart(
        # check_request accepted it: it is the schema's word now.
        backend=cast(Backend, req.backend), launcher=launcher, gpu_bind=ranks.gpu_bind,
        command=tuple(command), example_defaults=defaults, env=env, launch_line=line,
        master_addr=master_addr or dict(env)["MASTER_ADDR"],
        master_port=master_port or dict(env)["MASTER_PORT"],
        records_steps=bool(req.run_dir) and dialect.submits
                      and (req.runs_example or spec.requeue is not None))


def _probe(profile: Profile, req: JobRequest, spec: JobSpec, dialect: ScriptDialect,
           container: ContainerPart, ranks: _Ranks) -> ProbePart | None:
    """The probe's part; with --probe-first its own srun step with the worker bound in,
    whatever COMMAND's launcher is (a COMMAND has no bind of the bundled files: the
    worker's are added)."""
    if req.probe is None:
        return None
    if not req.probe_first:
        return ProbePart(args=req.probe, first=False, line=None)
    image = container.image
    probe_binds = (tuple(container_binds(profile, _without_command(req),
                                         staged_data=container.staged_data is not None))
                   if image else req.binds)
    worker = probe_command(profile, req, image)
    if spec.spares:
        # Over every node the guard found healthy; the nodes it names slow are
        # excluded as the gate's are (hpcdl-nodes reads the file).
        worker += ["--slow-nodes-out", probe_slow_path(req.run_dir)]
    line = shell_join(dialect.launcher_tokens(spec, "srun", every_healthy_node=bool(spec.spares))
                      + rank_tokens(profile, _without_command(req), worker, "srun",
                                    ranks.image(container), probe_binds, dialect.job_id_word,
                                    ranks.wrapper_file))
    return ProbePart(args=req.probe, first=True, line=line)


def _files(req: JobRequest, spec: JobSpec, dialect: ScriptDialect, launch: LaunchPart,
           ranks: _Ranks) -> FilesPart:
    """The logs, the files written into the run's job/ (the rank wrapper, the port pick,
    the node guard), and the directory the job starts in (--code)."""
    output, error = dialect.log_paths(spec)
    job_scripts: tuple[tuple[str, str], ...] = ()
    if ranks.wrapper_file is not None:
        job_scripts = ((RANK_ENV_FILE, rank_env_file(ranks.launcher.wrapper_mode,
                                                     **ranks.wrapper_options)),)
        if _derived(launch, "MASTER_PORT"):
            job_scripts += ((PORT_PICK_FILE, port_pick_file(launch.master_port,
                                                            **_PORT_RANGE)),)
        if spec.spares:
            job_scripts += ((NODES_FILE, nodes_file_text()),)
    return FilesPart(output=output, error=error,
                     job_files=(job_side_files(watchdog=req.hang_timeout is not None)
                                if req.run_dir else ()),
                     job_scripts=job_scripts, code_dir=req.code_dir,
                     workdir=(f"{req.run_dir}/{CODE_DIR_NAME}" if req.code_dir and req.run_dir
                              else None))


def _derived(launch: LaunchPart, name: str) -> bool:
    """Whether the script derives MASTER_ADDR or MASTER_PORT (master_values) rather than
    exporting the profile's or --env's value."""
    return name not in dict(launch.env)


def _hang(req: JobRequest, spec: JobSpec) -> HangPart | None:
    """The watchdog's part (--hang-timeout), checked last but the template's rendering."""
    if req.hang_timeout is None:
        return None
    return HangPart(timeout=req.hang_timeout, action=_hang_action(req, spec.spares))


def _script(profile: Profile, req: JobRequest, spec: JobSpec, dialect: ScriptDialect,
            launch: LaunchPart, container: ContainerPart, staged: _Staged, ranks: _Ranks,
            probe: ProbePart | None, files: FilesPart, hang: HangPart | None) -> str:
    """The job script: the dialect's template (or --template) filled from the parts."""
    image = container.image
    # The expressions the script evaluates; None where the profile or --env sets them.
    master_addr = launch.master_addr if _derived(launch, "MASTER_ADDR") else None
    master_port = launch.master_port if _derived(launch, "MASTER_PORT") else None
    omp = (spec.cpus_per_task if profile.env.omp_num_threads == "cpus-per-task"
           else profile.env.omp_num_threads)
    exports = [*launch.env, *_hang_exports(req, launch.env, req.run_dir or ".")]
    context = {
        "profile": profile,
        "job_name_q": shell_join([spec.job_name]),
        **dialect.header(spec),
        "nodes": spec.nodes,
        "tasks_per_node": spec.tasks_per_node,
        "ntasks": spec.ntasks,
        "modules": profile.modules,
        "cpus_per_task": spec.cpus_per_task,
        "omp_num_threads": omp,
        "exports": [(k, shell_join([v])) for k, v in exports]
                   + _run_dir_exports(req, image)
                   + ([(DATA_VARIABLE, CONTAINER_MOUNT)] if staged.packed and image else []),
        "backend": req.backend,
        "image_q": shell_join([image]) if image else None,
        "launcher": launch.launcher,
        # What the script sets up for the launcher (horovodrun's host file).
        "launcher_lines": ranks.launcher.script_lines,
        "launch_notes": launch_notes(req, launch.launcher, launch.gpu_bind, image,
                                     container.image_source, master_addr, master_port)
                        + [s["note"] for s in staged.steps]
                        + ([staged.packed["note"]] if staged.packed else []),
        "stage": staged.steps,
        "packed": staged.packed if staged.packed and not image else None,
        "master_addr": master_addr,
        "master_port": master_port,
        "port_base": PORT_BASE,
        "port_span": PORT_SPAN,
        "port_tries": PORT_TRIES,
        "port_listened": PORT_LISTENED,
        "port_pick": (port_pick_lines(master_port, **_PORT_RANGE).rstrip("\n")
                      if master_port else ""),
        "port_pick_path": shell_join([job_script_path(req.run_dir, PORT_PICK_FILE)]),
        "rank_env_variable": SCRIPT_VARIABLE,
        "rank_env_q": shell_join([rank_env_script(ranks.launcher.wrapper_mode, **ranks.wrapper_options)]),
        "launch_line": launch.launch_line,
        "probe_line": probe.line if probe else None,
        "requeue": _requeue_block(spec.requeue, req, dialect),
        "guard": _guard_block(profile, spec, req, image, master_addr, spec.requeue),
        "progress": _progress(req, spec.requeue, dialect),
        "hang": _hang_block(profile, req, hang, image),
        "workdir_q": shell_join([files.workdir]) if files.workdir else None,
    }
    return render_template(
        dialect.template,
        context,
        template_file=req.template,
        template_dirs=[profile.template_dir] if profile.template_dir else (),
    )


def _without_command(req: JobRequest) -> JobRequest:
    return replace(req, command=())


def requeue_spec(profile: Profile, req: JobRequest, dialect: ScriptDialect) -> RequeueSpec | None:
    """How the job checkpoints on a signal: --requeue (or the profile's default, where
    hpcdl submits the job) or a --chain of jobs; None when it does not."""
    wanted = profile.scheduler.requeue if req.requeue is None else req.requeue
    if not (req.chain > 1 or (wanted and dialect.submits)):
        return None
    name, lead = (req.signal or profile.scheduler.requeue_signal).split("@")
    max_restarts = (profile.scheduler.max_restarts if req.max_restarts is None
                    else req.max_restarts)
    return RequeueSpec(signal=name, lead=int(lead), chain=req.chain,
                       max_restarts=max_restarts if req.chain == 1 else 0)


def _requeue_block(requeue: RequeueSpec | None, req: JobRequest,
                   dialect: ScriptDialect) -> dict[str, Any] | None:
    """What the template's requeue block needs (None when the job does not requeue)."""
    if requeue is None:
        return None
    return {
        "signal": requeue.signal, "lead": requeue.lead, "wait_s": wait_seconds(requeue.lead),
        "run_dir": shell_join([req.run_dir]) if req.run_dir else dialect.submit_dir,
        "flag_env": FLAG_ENV, "flag_name": FLAG_NAME,
        "checkpoint_env": CHECKPOINT_ENV, "exit_requeue": EXIT_REQUEUE,
        "progress_env": PROGRESS_ENV,
        "max_restarts": requeue.max_restarts, "chain": requeue.chain,
        # hpcdl_slurm and hpcdl_time_left, from hpcdl-nodes (a job with spares sources it)
        "guard_calls": guard_calls_text(),
    }


def _guard_block(profile: Profile, spec: JobSpec, req: JobRequest, image: str | None,
                 master_addr: str | None, requeue: RequeueSpec | None) -> dict[str, Any] | None:
    """What the template's node guard block needs (None without spares)."""
    if not spec.spares:
        return None
    max_relaunches = (profile.scheduler.max_restarts if req.max_restarts is None
                      else req.max_restarts)
    nodes_file = job_script_path(req.run_dir, NODES_FILE)
    exports = guard_exports(profile, tasks_per_node=spec.tasks_per_node,
                            gpus=spec.gpus_per_node, max_relaunches=max_relaunches,
                            nodes_file=nodes_file, image=bool(image),
                            master_addr=master_addr is not None,
                            probe_slow=probe_slow_path(req.run_dir) if req.probe_first else None)
    if requeue is None and req.run_dir:
        # A relaunch resumes as a requeued attempt does: the contract's checkpoint directory
        # (the requeue block exports it when there is one).
        exports.insert(0, (CHECKPOINT_ENV, shell_join([f"{req.run_dir}/checkpoints"])))
    return {
        "nodes": spec.nodes, "spares": spec.spares, "allocated": spec.allocated_nodes,
        "max_relaunches": max_relaunches, "requeue": requeue is not None,
        "file_q": shell_join([nodes_file]),
        "exports": exports,
    }


def _hang_action(req: JobRequest, spares: int) -> str:
    """What the hang watchdog does: --hang-action, else relaunch for a job with spares
    (its node guard restarts the training) and cancel for the others. Raises
    ValidationError for relaunch without spares."""
    if req.hang_action == "relaunch" and not spares:
        raise _fail("hang-action: relaunch restarts the training inside the job's "
                    "allocation; it needs spare nodes (--spares S)")
    return req.hang_action or ("relaunch" if spares else DEFAULT_HANG_ACTION)


def _progress(req: JobRequest, requeue: RequeueSpec | None,
              dialect: ScriptDialect) -> dict[str, str] | None:
    """Where the job records that an attempt completed its first step
    ($HPCDL_PROGRESS_FILE, hpcdl/jobside/requeue.py): in the run directory (beside attempts.tsv
    when a requeued job has none). Only for jobs hpcdl submits (not a PBS script)."""
    if not dialect.submits:
        return None
    if req.run_dir:
        path = shell_join([f"{req.run_dir}/{PROGRESS_NAME}"])
    elif requeue is not None:
        path = f"{dialect.submit_dir}/{PROGRESS_NAME}"
    else:
        return None
    return {"env": PROGRESS_ENV, "path": path}


def image_stage(profile: Profile, req: JobRequest, image: str | None, spec: JobSpec,
                dialect: ScriptDialect) -> dict[str, Any] | None:
    """How the script copies the image to every node before the ranks start (the
    template's ``stage``, spelled by the dialect), or None.

    --stage-image, else the profile's container.stage. Staging needs an image and the
    profile's node-local scratch; asked for explicitly without them it is refused (a
    profile default simply does not apply to a native run). Raises ValidationError.
    """
    wanted = profile.container.stage == "sbcast" if req.stage_image is None else req.stage_image
    if not wanted:
        return None
    source = "--stage-image" if req.stage_image else "container.stage: sbcast"
    if not image:
        if req.stage_image is None:
            return None
        raise _fail("stage-image: no image to stage (give --image, or a profile with "
                    "container.default_image; --no-image runs natively)")
    local = profile.paths.local_scratch
    if not local:
        raise _fail(f"stage-image: profile {profile.name} has no paths.local_scratch (the "
                    f"node-local directory {source} copies the image to)")
    if refused := dialect.unsupported(profile, "stage"):
        raise _fail(refused)
    return {**dialect.stage_file(spec, local, PurePosixPath(image).name, "image"),
            "what": "image", "shown_what": "the image", "source": Raw('"$HPCDL_IMAGE"'),
            "var": "HPCDL_IMAGE"}


def packed_stage(profile: Profile, req: JobRequest, spec: JobSpec,
                 dialect: ScriptDialect) -> dict[str, Any] | None:
    """How the script copies the packed dataset to every node before the ranks start
    (--stage-data: the same sbcast step as the image's, a template ``stage`` item), or
    None. Only a packed file is staged: a tree would be one sbcast per file, which is
    what packing avoids (--stage-to copies a tree). Raises ValidationError."""
    if not req.stage_data:
        return None
    source = packed_data(profile, req)
    if not source:
        if req.data and not req.synthetic:
            tree = req.data.rstrip("/") or "/"
            raise _fail(f"stage-data: --data {req.data} is not a packed file; --stage-data "
                        f"copies one DATA.sqfs to every node (pack the tree once: hpcdl data "
                        f"pack {tree} -o {tree}.sqfs)")
        raise _fail(f"stage-data: needs a packed --data DATA.sqfs (this job has "
                    f"{'--synthetic' if req.synthetic else 'no --data'})")
    if refused := dialect.unsupported(profile, "stage-data"):
        raise _fail(refused)
    local = profile.paths.local_scratch
    if not local:
        raise _fail(f"stage-data: profile {profile.name} has no paths.local_scratch (the "
                    f"node-local directory --stage-data copies the dataset to)")
    name = f"data-{PurePosixPath(source).name}"
    return {**dialect.stage_file(spec, local, name, "dataset"), "what": "dataset",
            "shown_what": "the packed dataset", "source": shell_join([source]),
            "var": STAGED_DATA_VARIABLE}


def data_mount(profile: Profile, req: JobRequest, image: str | None,
               dialect: ScriptDialect, *, staged: bool = False) -> dict[str, str] | None:
    """How the ranks see a packed dataset (hpcdl.data.mount), or None: in an image a bind
    (container_binds adds it), natively a squashfuse_ll (else squashfuse) mount on every
    node that the script makes before the first rank and removes when it ends (the
    template's ``packed``). ``staged``: from each node's copy ($HPCDL_DATA_FILE,
    packed_stage), not the shared file. Raises ValidationError where the scheduler's
    script has no such block."""
    source = packed_data(profile, req)
    if not source:
        return None
    where = f"each node's copy of {source}" if staged else f"the packed file {source}"
    if image:
        return {"source": source, "note": f"dataset: {where}, mounted by "
                f"the container runtime read-only at {CONTAINER_MOUNT} ($HPCDL_DATA)."}
    if dialect.unsupported(profile, "stage"):
        raise _fail(f"data: natively a packed dataset is mounted by the job script on every "
                    f"node with srun; profile {profile.name} is {profile.scheduler.type}: "
                    f"give --image (the container runtime mounts it)")
    head = native_mount_dir(profile.paths.local_scratch)
    # The note shows the directory as the script names it: the job-id expression bare.
    shown = f"{head}{dialect.job_id_word.strip(chr(34))}"
    return {"source": source,
            "source_q": f'"${STAGED_DATA_VARIABLE}"' if staged else shell_join([source]),
            "mount": shell_join([head]) + dialect.job_id_word,
            "note": f"dataset: {where}, mounted read-only with squashfuse_ll (else "
                    f"squashfuse) on every node at {shown} ($HPCDL_DATA, below), "
                    f"unmounted at the end."}


def _run_dir_exports(req: JobRequest, image: str | None) -> list[tuple[str, str]]:
    """What the job is told of its run directory, rendered: HPCDL_RUN_DIR for any script
    (per-step metrics go there, hpcdl.jobside.steps; the staged job-side files are in its
    job/); and for the bundled example or the probe run natively, those staged files on
    PYTHONPATH ahead of whatever the job has (the nodes need not see the hpcdl that
    submitted)."""
    if not req.run_dir:
        return []
    exports = [("HPCDL_RUN_DIR", shell_join([req.run_dir]))]
    if not image and not req.command:
        exports.append(("PYTHONPATH",
                        shell_join([job_dir(req.run_dir)]) + "${PYTHONPATH:+:$PYTHONPATH}"))
    return exports


def _hang_block(profile: Profile, req: JobRequest, hang: HangPart | None,
                image: str | None) -> dict[str, Any] | None:
    """What the script's hang watchdog block needs (templates/sbatch.sh.j2): the
    watchdog's arguments but the job id (the script's $SLURM_JOB_ID), quoted, and where
    its modules are (RUN_DIR/job, as the batch host sees it). None without one."""
    if hang is None:
        return None
    run_dir = req.run_dir or "."
    args = ["--run-dir", run_dir, "--timeout", f"{hang.timeout:g}", "--action", hang.action]
    if image:  # py-spy runs in the ranks' image (hpcdl.jobside.hangdiag.node_command)
        args += ["--runtime", profile.container.binary or profile.container.runtime,
                 "--image", image]
    return {"timeout": f"{hang.timeout:g}", "action": hang.action,
            "module": WATCHDOG_MODULE, "min_python": ".".join(map(str, WATCHDOG_PYTHON)),
            "min_python_tuple": ", ".join(map(str, WATCHDOG_PYTHON)),
            "args_q": shell_join(args), "job_dir_q": shell_join([job_dir(run_dir)]),
            "unwatched_q": shell_join([f"{run_dir}/{UNWATCHED_NAME}"])}


def _hang_exports(req: JobRequest, env: tuple[tuple[str, str], ...],
                  log_dir: str) -> list[tuple[str, str]]:
    """With --hang-timeout: where the rank wrapper records the ranks' pids, where the
    ranks write their heartbeats (hpcdl.jobside.steps.beat), and PYTHONUNBUFFERED (a
    Python rank's prints must reach the log as they happen: for a script without
    heartbeats, the log growing is progress)."""
    if req.hang_timeout is None:
        return []
    exports = [("HPCDL_PID_DIR", f"{log_dir}/pids"),
               (HEARTBEAT_ENV, f"{log_dir}/{HEARTBEAT_DIR}")]
    if "PYTHONUNBUFFERED" not in dict(env):
        exports.append(("PYTHONUNBUFFERED", "1"))
    return exports


def _hang_warnings(req: JobRequest, limit: int | None) -> list[str]:
    """A warning when the job's time limit comes before the watchdog could fire."""
    if req.hang_timeout is None or limit is None or req.hang_timeout < limit:
        return []
    return [f"hang-timeout: {req.hang_timeout:g} s is not shorter than the job's "
            f"time limit {format_time(limit)}: the watchdog cannot fire before it"]
