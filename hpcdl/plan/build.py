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

from dataclasses import dataclass
from typing import Any, cast

from hpcdl.core.gpuarch import ImageArchFacts, check_partition
from hpcdl.core.templating import Raw, render_template, shell_join
from hpcdl.data.mount import CONTAINER_MOUNT, DATA_VARIABLE
from hpcdl.errors import ValidationError
from hpcdl.jobside.requeue import cause_words
from hpcdl.jobside.world import PORT_BASE, PORT_SPAN
from hpcdl.launch.code import CODE_DIR_NAME
from hpcdl.launch.nodes import (
    NODES_FILE,
    nodes_file_text,
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
from hpcdl.launch.staging import job_dir, job_side_files
from hpcdl.plan import rules
from hpcdl.plan.command import (
    PORT_TRIES,
    LaunchRequest,
    default_command,
    example_defaults,
    launch_notes,
    master_values,
    probe_command,
    rank_tokens,
)
from hpcdl.plan.container import ContainerRequest, container_binds, image_stage, job_image
from hpcdl.plan.data import DataPart, data_mount, data_stage, decide_data
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
    guard_block,
    job_spares,
    job_time,
    tasks_per_node,
)
from hpcdl.plan.probe import ProbeRequest, probe_part
from hpcdl.plan.request import JobRequest, RuntimeMode, check_request
from hpcdl.plan.resilience import (
    HangRequest,
    ResilienceRequest,
    hang_block,
    hang_exports,
    hang_part,
    hang_warnings,
    max_restarts,
    progress_block,
    requeue_block,
    requeue_spec,
)
from hpcdl.profiles.schema import Backend, GpuBind, Partition, Profile
from hpcdl.schedulers.base import JobSpec, ScriptDialect
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
    # The request's parts, each handed to the stages that plan it (and to those that
    # depend on it); the rules between parts are hpcdl.plan.rules's.
    placement, resilience, hang_req = req.placement, req.resilience, req.hang
    files_req, container_req, launch_req = req.files, req.container, req.launch
    probe_req, data_req = req.probe, req.data
    dialect = dialect_for(profile.scheduler.type)
    data = decide_data(profile.paths.imagenet, data_req)
    part, reason, arch_warning = _placement(profile, placement, image_facts)
    launcher, gpu_bind = _launcher(profile, launch_req, probe_req, dialect)
    image, image_source = job_image(profile, container_req)
    rules.check_shared_paths(profile, files_req.run_dir, container_req.binds, image, data)
    spec = _spec(profile, placement, resilience, files_req, launch_req, dialect, part, launcher)
    staged = _staged(profile, container_req, data, spec, dialect, image)
    container = _container(profile, container_req, launch_req, data, spec, image, image_source,
                           staged, runtime_mode)
    ranks = _Ranks.of(spec, hang_req, dialect, launcher, gpu_bind, staged)
    launch = _launch(profile, launch_req, data, spec, dialect, container, ranks, probe_req.args)
    probe = probe_part(profile, probe_req, spec, dialect, container_req, data_req, container,
                       ranks.image(container), ranks.wrapper_file)
    files = _files(files_req, spec, dialect, launch, ranks, watchdog=hang_req.timeout is not None)
    warnings = (*dialect.warnings(profile), *([arch_warning] if arch_warning else []),
                *hang_warnings(hang_req, spec.time_seconds))
    # checked last but the template's rendering
    hang = hang_part(hang_req, rules.hang_action(hang_req.action, spec.spares))
    script = _script(profile, _Asked(files_req, launch_req, resilience, hang_req), spec,
                     dialect, launch, container, staged, ranks, probe, files, hang)
    return JobPlan(spec=spec, partition_reason=reason, launch=launch, container=container,
                   data=data, files=files, script=script, warnings=warnings, probe=probe,
                   hang=hang)


def _placement(profile: Profile, req: PlacementRequest, image_facts: ImageArchFacts | None
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


def _launcher(profile: Profile, req: LaunchRequest, probe: ProbeRequest,
              dialect: ScriptDialect) -> tuple[RankLauncher, GpuBind]:
    """The launcher and GPU binding (the request's, else the profile's), refused where
    they cannot start what the job runs."""
    launcher = launcher_for(req.launcher or profile.mpi.launcher)
    # check_request accepted it: it is the schema's word now.
    gpu_bind = cast(GpuBind, req.gpu_bind or profile.mpi.gpu_bind)
    rules.launcher_runs_job(profile, dialect, launcher, probe=probe.args is not None,
                            probe_only=req.probe_only, runs_example=req.runs_example,
                            backend=req.backend)
    return launcher, gpu_bind


def _spec(profile: Profile, req: PlacementRequest, resilience: ResilienceRequest,
          files: FilesRequest, launch: LaunchRequest, dialect: ScriptDialect, part: Partition,
          launcher: RankLauncher) -> JobSpec:
    """What the scheduler is asked for: tasks, CPUs, time, name, requeue, spares."""
    time = job_time(profile, part, req)
    requeue = requeue_spec(profile, resilience, dialect)
    spares = job_spares(profile, req)
    if spares:
        rules.spares_supported(profile, dialect, launcher)
    return JobSpec(profile=profile, partition=part, nodes=req.nodes, gpus_per_node=req.gpus,
                   tasks_per_node=tasks_per_node(req.gpus),
                   cpus_per_task=req.cpus_per_task or default_cpus_per_task(part, req.gpus),
                   time_seconds=time, job_name=files.job_name or f"hpcdl-{launch.backend}",
                   run_dir=files.run_dir, requeue=requeue, spares=spares)


@dataclass(frozen=True)
class _Staged:
    """What the script copies to every node before the ranks start (the template's
    ``stage`` items: image_stage, data_stage) and how the ranks see a packed dataset
    (data_mount; the template's ``packed`` natively)."""

    image: dict[str, Any] | None
    data: dict[str, Any] | None
    packed: dict[str, str] | None

    @property
    def steps(self) -> list[dict[str, Any]]:
        # Image first: its copy is what every rank starts from.
        return [s for s in (self.image, self.data) if s]


def _staged(profile: Profile, req: ContainerRequest, data: DataPart, spec: JobSpec,
            dialect: ScriptDialect, image: str | None) -> _Staged:
    """The image's copy first (its refusals are named first), then the dataset's."""
    image_copy = image_stage(profile, req, image, spec, dialect)
    copy = data_stage(profile, data, spec, dialect)
    return _Staged(image=image_copy, data=copy,
                   packed=data_mount(profile, data, image, dialect, staged=copy is not None))


def _container(profile: Profile, req: ContainerRequest, launch: LaunchRequest, data: DataPart,
               spec: JobSpec, image: str | None, image_source: str | None, staged: _Staged,
               runtime_mode: RuntimeMode | None) -> ContainerPart:
    """The image, its binds (one list: the one the plan records is the one the ranks
    get; natively the request's), how the runtime runs it, and what is staged (a
    packed dataset is, natively too)."""
    return ContainerPart(
        image=image, image_source=image_source,
        binds=(tuple(container_binds(profile, req, spec.run_dir,
                                     data.image_binds(staged=staged.data is not None),
                                     project=not launch.command))
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
    def of(cls, spec: JobSpec, hang: HangRequest, dialect: ScriptDialect,
           launcher: RankLauncher, gpu_bind: GpuBind, staged: _Staged) -> _Ranks:
        return cls(launcher=launcher, gpu_bind=gpu_bind, staged_image=staged.image is not None,
                   wrapper_file=(job_script_path(spec.run_dir, RANK_ENV_FILE)
                                 if dialect.submits else None),
                   wrapper_options={"gpu_bind": gpu_bind == "local-rank" and spec.gpus_per_node > 0,
                                    "record_pid": hang.timeout is not None})

    def image(self, container: ContainerPart) -> str | None:
        return Raw('"$HPCDL_IMAGE"') if self.staged_image else container.image


def _launch(profile: Profile, req: LaunchRequest, data: DataPart, spec: JobSpec,
            dialect: ScriptDialect, container: ContainerPart, ranks: _Ranks,
            probe_args: tuple[str, ...] | None) -> LaunchPart:
    """The command every rank runs, its environment, and the launch line."""
    launcher = ranks.launcher.name
    defaults = example_defaults(profile, req)
    if req.probe_only:
        command = probe_command(profile, probe_args or (), spec.run_dir, container.image)
    else:
        # A requeued attempt or a relaunch on other nodes continues from the checkpoint.
        command = list(req.command) or default_command(
            profile, req, spec.run_dir, container.image, defaults,
            resume=spec.requeue is not None or spec.spares > 0,
            data_args=data.example_args(container.image))
    rules.launcher_on_scheduler(profile, dialect, ranks.launcher)
    prefix = dialect.launcher_tokens(spec, launcher)
    if launcher == profile.mpi.launcher:  # the profile's arguments are for its launcher
        prefix += list(profile.mpi.launcher_args)
    line = shell_join(prefix + rank_tokens(profile, spec, command, launcher,
                                           ranks.image(container), container.binds,
                                           dialect.job_id_word, ranks.wrapper_file,
                                           project=not req.command))
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
        records_steps=bool(spec.run_dir) and dialect.submits
                      and (req.runs_example or spec.requeue is not None))


def _files(req: FilesRequest, spec: JobSpec, dialect: ScriptDialect, launch: LaunchPart,
           ranks: _Ranks, *, watchdog: bool) -> FilesPart:
    """The logs, the files written into the run's job/ (the rank wrapper, the port pick,
    the node guard; the hang watchdog's modules with ``watchdog``), and the directory the
    job starts in (--code)."""
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
                     job_files=job_side_files(watchdog=watchdog) if req.run_dir else (),
                     job_scripts=job_scripts, code_dir=req.code_dir,
                     workdir=(f"{req.run_dir}/{CODE_DIR_NAME}" if req.code_dir and req.run_dir
                              else None))


def _derived(launch: LaunchPart, name: str) -> bool:
    """Whether the script derives MASTER_ADDR or MASTER_PORT (master_values) rather than
    exporting the profile's or --env's value."""
    return name not in dict(launch.env)


@dataclass(frozen=True)
class _Asked:
    """The request's parts the script reads beside the plan's."""

    files: FilesRequest
    launch: LaunchRequest
    resilience: ResilienceRequest
    hang: HangRequest


def _script(profile: Profile, asked: _Asked, spec: JobSpec, dialect: ScriptDialect,
            launch: LaunchPart, container: ContainerPart, staged: _Staged, ranks: _Ranks,
            probe: ProbePart | None, files: FilesPart, hang: HangPart | None) -> str:
    """The job script: the dialect's template (or --template) filled from the parts
    (``asked``: the request's; ``launch``: the plan's launch part)."""
    req, launch_req = asked.files, asked.launch
    image = container.image
    # The expressions the script evaluates; None where the profile or --env sets them.
    master_addr = launch.master_addr if _derived(launch, "MASTER_ADDR") else None
    master_port = launch.master_port if _derived(launch, "MASTER_PORT") else None
    omp = (spec.cpus_per_task if profile.env.omp_num_threads == "cpus-per-task"
           else profile.env.omp_num_threads)
    exports = [*launch.env, *hang_exports(asked.hang, launch.env, req.run_dir or ".")]
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
                   + _run_dir_exports(req.run_dir, image, project=not launch_req.command)
                   + ([(DATA_VARIABLE, CONTAINER_MOUNT)] if staged.packed and image else []),
        "backend": launch.backend,
        "image_q": shell_join([image]) if image else None,
        "launcher": launch.launcher,
        # What the script sets up for the launcher (horovodrun's host file).
        "launcher_lines": ranks.launcher.script_lines,
        "launch_notes": launch_notes(launch_req, spec.gpus_per_node, req.run_dir, launch.launcher,
                                     launch.gpu_bind, image, container.image_source,
                                     master_addr, master_port)
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
        # The words $hpcdl_cause takes (hpcdl.jobside.requeue: attempts.tsv is read with them)
        "cause": cause_words(),
        "requeue": requeue_block(spec.requeue, req.run_dir, dialect),
        "guard": guard_block(profile, spec, max_restarts(profile, asked.resilience),
                             req.run_dir, image=bool(image), master_addr=master_addr is not None,
                             probe_first=probe is not None and probe.first),
        "progress": progress_block(req.run_dir, spec.requeue, dialect),
        "hang": hang_block(profile, req.run_dir, hang, image),
        "workdir_q": shell_join([files.workdir]) if files.workdir else None,
    }
    return render_template(
        dialect.template,
        context,
        template_file=req.template,
        template_dirs=[profile.template_dir] if profile.template_dir else (),
    )


def _run_dir_exports(run_dir: str | None, image: str | None, *,
                     project: bool) -> list[tuple[str, str]]:
    """What the job is told of its run directory, rendered: HPCDL_RUN_DIR for any script
    (per-step metrics go there, hpcdl.jobside.steps; the staged job-side files are in its
    job/); and for the bundled example or the probe run natively, those staged files on
    PYTHONPATH ahead of whatever the job has (the nodes need not see the hpcdl that
    submitted)."""
    if not run_dir:
        return []
    exports = [("HPCDL_RUN_DIR", shell_join([run_dir]))]
    if not image and project:
        exports.append(("PYTHONPATH",
                        shell_join([job_dir(run_dir)]) + "${PYTHONPATH:+:$PYTHONPATH}"))
    return exports
