"""The launchers a job's ranks start with (the profile's ``mpi.launcher``, ``--launcher``):
one small class per launcher, registered by name in ``REGISTRY``; every place that
differs by launcher asks the class (``launcher_for``) instead of comparing names.

A launcher owns what differs: the command line that starts the ranks (``tokens``),
what it runs on each node before the command (torchrun's agent, ``agent_tokens``),
whether a task is a rank or a node's agent (``per_node``: the rank-env wrapper's mode,
the GPUs a rank sees), what the script sets up for it (``script_lines``: horovodrun's
host file), the scheduler feature it needs (``feature``), and what it refuses in a
request (``refusal``, ``spares_refusal``: one line naming the field and the value).

The command lines are Slurm's: there the launcher is the user's choice. A PBS profile
starts every rank with mpiexec whatever it names (hpcdl.schedulers.pbs.script), and
refuses torchrun through ``feature``. Pure: values in, tokens and text out.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import ClassVar, Literal

from hpcdl.core.templating import Raw
from hpcdl.errors import ValidationError
from hpcdl.profiles.schema import Launcher
from hpcdl.schedulers.base import Feature, JobSpec

# The rank-env wrapper's modes (hpcdl.launch.rankenv.Mode): every task a rank, or every
# task a node's torchrun agent.
WrapperMode = Literal["ranks", "torchrun"]


class RankLauncher:
    """What every launcher shares; a subclass sets what differs. Instances hold nothing:
    one per name, in REGISTRY."""

    name: ClassVar[Launcher]
    # One task per node that starts the node's ranks itself (torchrun), not a task per rank.
    per_node: ClassVar[bool] = False
    # Whether the ranks can run on N of an allocation's N+S nodes (--spares): the
    # launcher must take the node list the node guard chose.
    takes_spares: ClassVar[bool] = False
    # Whether it starts the probe's ranks (one rank per task, srun only).
    starts_probe: ClassVar[bool] = False
    # Whether srun is given the profile's mpi.srun_mpi (--mpi=...) for it.
    passes_srun_mpi: ClassVar[bool] = False
    # The scheduler feature it needs (ScriptDialect.unsupported refuses it), if any.
    feature: ClassVar[Feature | None] = None
    # Lines the job script runs before the launch (the environment the launcher reads).
    script_lines: ClassVar[tuple[str, ...]] = ()

    @property
    def wrapper_mode(self) -> WrapperMode:
        return "torchrun" if self.per_node else "ranks"

    def tokens(self, spec: JobSpec, *, every_healthy_node: bool = False) -> list[str]:
        """The command that starts every rank (or agent) under Slurm, up to the
        container and the rank-env wrapper. ``every_healthy_node``: a step of a job with
        spares over every node its guard found healthy, not the training's N."""
        raise NotImplementedError

    def agent_tokens(self, command: list[str], python: str, spec: JobSpec, *,
                     job_id_word: str) -> list[str]:
        """What runs between the rank-env wrapper and ``command`` on each task (over
        ``spec``'s nodes, as ``tokens``): nothing for a launcher whose tasks are the
        ranks."""
        return []

    def note(self, tasks_per_node: int) -> str:
        """The launch note (the comment above the launch line) on how ranks start."""
        return (f"launcher {self.name}: one process per rank; the wrapper derives the "
                "variables from its per-rank variables.")

    def refusal(self, *, probe_only: bool, runs_example: bool, backend: str) -> str | None:
        """The one-line refusal of a request this launcher cannot start, else None."""
        if probe_only and not self.starts_probe:
            return f"launcher: the probe starts one rank per task with srun (got {self.name})"
        return None

    def spares_refusal(self) -> str | None:
        """The one-line refusal of spare nodes, else None."""
        if self.takes_spares:
            return None
        return (f"spares: launcher {self.name} starts ranks on every node of the "
                f"allocation; spare nodes need srun or torchrun (--launcher srun)")


def _srun(spec: JobSpec, options: list[str]) -> list[str]:
    """srun with ``options`` between its own and the node guard's."""
    # --label prefixes every output line with its task id, so a crash can be traced to
    # the rank that printed it (see hpcdl.results). --kill-on-bad-exit: one crashed rank
    # ends the step; without it the other ranks wait in their next collective until the
    # time limit (the classic "my job hangs").
    tokens: list[str] = [Raw("srun"), Raw("--label"), Raw("--kill-on-bad-exit=1"),
                         *(Raw(o) for o in options)]
    if spec.spares:
        # The healthy nodes the node guard chose for this launch (hpcdl-nodes);
        # --overlap: a step a dead node took down stays on the survivors' CPUs until
        # Slurm declares that node dead (minutes), and would block a relaunch without it.
        tokens += [Raw('--nodelist="$HPCDL_NODELIST"'), Raw("--overlap")]
    return tokens


class Srun(RankLauncher):
    """Slurm's srun, one task per rank (Horovod and DDP alike; --mpi from the profile)."""

    name = "srun"
    takes_spares = True
    starts_probe = True
    passes_srun_mpi = True

    def tokens(self, spec: JobSpec, *, every_healthy_node: bool = False) -> list[str]:
        options = []
        if spec.spares and every_healthy_node:  # counted by the guard (hpcdl-nodes)
            options += ['--nodes="$HPCDL_STEP_NODES"', '--ntasks="$HPCDL_STEP_TASKS"']
        elif spec.spares:  # N of the allocation's N+S nodes
            options += [f"--nodes={spec.nodes}", f"--ntasks={spec.ntasks}"]
        if spec.profile.mpi.srun_mpi:
            options.append(f"--mpi={spec.profile.mpi.srun_mpi}")
        return _srun(spec, options)


# A command whose first word is a Python interpreter: torchrun's agent runs with it.
_PYTHON = re.compile(r"python[0-9.]*")


class Torchrun(RankLauncher):
    """One torchrun agent per node, started by srun, each starting its node's ranks;
    c10d rendezvous on the first node."""

    name = "torchrun"
    per_node = True
    takes_spares = True
    feature = "torchrun"

    def tokens(self, spec: JobSpec, *, every_healthy_node: bool = False) -> list[str]:
        # One torchrun per node, with the CPUs of all the ranks it starts.
        return _srun(spec, [f"--nodes={spec.nodes}", f"--ntasks={spec.nodes}",
                            "--ntasks-per-node=1",
                            f"--cpus-per-task={spec.cpus_per_task * spec.tasks_per_node}"])

    def agent_tokens(self, command: list[str], python: str, spec: JobSpec, *,
                     job_id_word: str) -> list[str]:
        """``python -m torch.distributed.run`` (= torchrun, without relying on its entry
        point being on PATH) for one node, with the command's own Python when it names
        one (else ``python``); ``--no-python`` runs the command as given in each worker.
        ``job_id_word``: the dialect's shell word for the job id (the rendezvous id)."""
        if _PYTHON.fullmatch(PurePosixPath(command[0]).name):
            python = command[0]
        return [python, "-m", "torch.distributed.run", f"--nnodes={spec.nodes}",
                f"--nproc-per-node={spec.tasks_per_node}", "--rdzv-backend=c10d",
                Raw('--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"'),
                Raw(f"--rdzv-id={job_id_word}"), "--no-python"]

    def note(self, tasks_per_node: int) -> str:
        return (f"launcher torchrun: one torchrun per node (srun --ntasks-per-node=1), each "
                f"starting {tasks_per_node} ranks; c10d rendezvous at $MASTER_ADDR:$MASTER_PORT.")

    def refusal(self, *, probe_only: bool, runs_example: bool, backend: str) -> str | None:
        if refused := super().refusal(probe_only=probe_only, runs_example=runs_example,
                                      backend=backend):
            return refused
        if runs_example and backend == "horovod":
            return ("launcher: torchrun starts ranks without MPI, which the bundled example's "
                    "--backend horovod needs: use --backend ddp, or --launcher srun")
        return None


class Mpirun(RankLauncher):
    """The MPI library's mpirun inside the allocation (it reads the allocation from Slurm)."""

    name = "mpirun"

    def tokens(self, spec: JobSpec, *, every_healthy_node: bool = False) -> list[str]:
        return [Raw("mpirun"), Raw("-np"), Raw('"$SLURM_NTASKS"')]


class Horovodrun(RankLauncher):
    """Horovod's horovodrun: it starts the ranks itself on the hosts of a file the script
    writes from the allocation ($HPCDL_HOSTFILE)."""

    name = "horovodrun"
    script_lines = (
        "# horovodrun starts the ranks itself: give it the allocation's hosts.",
        'export HPCDL_HOSTFILE="${TMPDIR:-/tmp}/hpcdl-hosts-${SLURM_JOB_ID}"',
        'scontrol show hostnames "$SLURM_JOB_NODELIST" | sed "s/\\$/ '
        'slots=${SLURM_NTASKS_PER_NODE%%(*}/" > "$HPCDL_HOSTFILE"',
    )

    def tokens(self, spec: JobSpec, *, every_healthy_node: bool = False) -> list[str]:
        return [Raw("horovodrun"), Raw("-np"), Raw('"$SLURM_NTASKS"'),
                Raw("--hostfile"), Raw('"$HPCDL_HOSTFILE"')]


# Every launcher by name, in the order --launcher and its refusal list them.
REGISTRY: dict[str, RankLauncher] = {
    cls.name: cls() for cls in (Srun, Torchrun, Mpirun, Horovodrun)}


def launcher_for(name: str) -> RankLauncher:
    """The launcher called ``name``. Raises ValidationError (one line naming the value
    and the choices) for a name no launcher has."""
    found = REGISTRY.get(name)
    if found is None:
        raise ValidationError(f"launcher: {name!r} is not one of {', '.join(REGISTRY)}")
    return found
