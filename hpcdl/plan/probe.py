"""The request's probe part (hpcdl.probe.request.worker_args's arguments) planned: the
probe is the job itself (`hpcdl probe`: the launch part runs the worker) or, with
``first``, a step before COMMAND that stops the job on a bad node (`hpcdl submit
--probe-first`): its own srun line with the worker bound in. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hpcdl.core.templating import shell_join
from hpcdl.launch.nodes import probe_slow_path
from hpcdl.plan.command import probe_command, rank_tokens
from hpcdl.plan.container import ContainerRequest, container_binds
from hpcdl.plan.data import DataRequest, decide_data
from hpcdl.plan.jobplan import ContainerPart, ProbePart
from hpcdl.profiles.schema import Profile
from hpcdl.schedulers.base import JobSpec, ScriptDialect


@dataclass(frozen=True)
class ProbeRequest:
    """The request's probe part, as given: the worker's arguments (None: no probe) and
    whether it is a first step before COMMAND."""

    args: tuple[str, ...] | None = None
    first: bool = False


def probe_part(profile: Profile, req: ProbeRequest, spec: JobSpec, dialect: ScriptDialect,
               container_req: ContainerRequest, data_req: DataRequest,
               container: ContainerPart, image: str | None,
               wrapper_file: str | None) -> ProbePart | None:
    """The probe's part; with --probe-first its own srun step with the worker bound in,
    whatever COMMAND's launcher is (a COMMAND has no bind of the bundled files: the
    worker's are added). ``image``: as the ranks name it (the node's copy when staged);
    ``wrapper_file``: the rank-env wrapper's (None: inline)."""
    if req.args is None:
        return None
    if not req.first:
        return ProbePart(args=req.args, first=False, line=None)
    run_dir = spec.run_dir
    # The step's binds are the bundled example's (the worker's files bound in): with the
    # example's dataset too, as they always were.
    example_data = decide_data(profile.paths.imagenet, replace(data_req, reader="example"))
    binds = (tuple(container_binds(
        profile, container_req, run_dir,
        example_data.image_binds(staged=container.staged_data is not None), project=True))
        if container.image else container_req.binds)
    worker = probe_command(profile, req.args, run_dir, container.image)
    if spec.spares:
        # Over every node the guard found healthy; the nodes it names slow are
        # excluded as the gate's are (hpcdl-nodes reads the file).
        worker += ["--slow-nodes-out", probe_slow_path(run_dir)]
    line = shell_join(dialect.launcher_tokens(spec, "srun", every_healthy_node=bool(spec.spares))
                      + rank_tokens(profile, spec, worker, "srun", image, binds,
                                    dialect.job_id_word, wrapper_file, project=True))
    return ProbePart(args=req.args, first=True, line=line)
