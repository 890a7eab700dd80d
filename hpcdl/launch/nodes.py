"""The node guard of a job with spare nodes (``hpcdl submit --spares S``).

The allocation has N+S nodes; the training runs on N. Before the first rank and before
every relaunch, a health gate (one short step on every node that is not known bad)
checks that the container starts, that the GPUs the job asked for are visible, that the
shared paths are mounted and the run directory writable, and that node-local scratch
has room. When the training step fails because a node died (it no longer answers, or
Slurm marks it down), or a rank printed a hardware error, that node is excluded and
given back to Slurm, and the training starts again on N healthy nodes from its newest
checkpoint (the requeue contract's ``--resume``), without going back to the queue, at
most ``--max-restarts`` times and while time is left. When too few healthy nodes remain,
the job requeues itself with every bad node excluded (``--requeue``) or ends in one line
naming them and the checkpoint to resume from.

The logic is bash, staged with the run as ``job/bin/hpcdl-nodes`` (templates/
hpcdl-nodes.sh: the batch shell sources it; the gate's step runs it on each node);
this module owns what the job script tells it (``guard_exports``), the words it
looks for, and the name of the hang watchdog's relaunch request it reads (written by
hpcdl.jobside.hangwatch.request_relaunch). Pure.
"""

from __future__ import annotations

from hpcdl.core.resources import templates_dir
from hpcdl.core.templating import shell_join
from hpcdl.profiles.schema import Profile

NODES_FILE = "bin/hpcdl-nodes"
_SOURCE = "hpcdl-nodes.sh"
# Where the job records what the guard found (hpcdl.jobs.recoveries reads both).
BAD_NODES_NAME = "bad-nodes.tsv"
RECOVERIES_NAME = "recoveries.tsv"
# The hang watchdog's request (hpcdl.jobside.hangwatch.request_relaunch, which the job's
# watchdog calls; its RELAUNCH_REQUEST_NAME, spelt here too so that planning a job does
# not import the watchdog: tests/unit/jobs/test_watchdog.py checks they agree): end the
# step, relaunch, without the node it names.
RELAUNCH_REQUEST_NAME = "relaunch.request"
# The --probe-first step's slow nodes (hpcdl.jobside.probe_worker --slow-nodes-out), which the
# guard excludes before the first rank.
PROBE_SLOW_NAME = "probe-slow-nodes.tsv"

# Free space node-local scratch must have for a node to pass the gate.
GATE_MIN_LOCAL_MB = 256
# After a rank ended, how long srun may go on before the guard asks the step's nodes
# (srun waits for a dead node's tasks until Slurm declares the node down: minutes).
STUCK_S = 10
# Nothing in the run directory changed for this long: ask the step's nodes whether one
# died (MPI ranks wait for a dead peer without end; a healthy node answering costs a
# short step, nothing else). Only while the heartbeat (below) is silent: it finds a dead
# node in HEARTBEAT_DEAD_S.
STALL_S = 30
# No relaunch with less time than this left: the job would end before a step.
MIN_LEFT_S = 60
# A node whose heartbeat (a line a second from a step of its own, through srun) stayed
# away this long while the other nodes' came died: excluded at once, without a gate's step
# to it (which waits Slurm's MessageTimeout, 10 s by default). 5 beats missed: a loaded
# node or a slow slurmstepd does not lose a node to the job, a dead one costs 5-6 s.
HEARTBEAT_DEAD_S = 5

# srun's own line when a task of the step ended (Slurm's words, every version since 2.x).
SRUN_TASK_ENDED = r"^srun: error: [^:]+: tasks? [0-9,-]+: (Exited|Killed|Terminated)"
# What a rank prints when its node's hardware failed (the driver's and CUDA's words), or
# a script's own verdict in hpcdl's words: the node is excluded, not the code blamed.
HARDWARE_ERRORS = (
    "fallen off the bus",
    "uncorrectable ECC",
    "ECC error",
    "Xid [0-9]+",
    "CUDA error: unspecified launch failure",
    "hpcdl: this node is bad",
)


# The part of hpcdl-nodes the requeue block of a job without spares carries too: bounded
# Slurm calls and the one reading of squeue's time left (between these two lines).
GUARD_CALLS_BEGIN = "# ---- Slurm's commands, bounded (job.sbatch's requeue block carries this part too) ----"
GUARD_CALLS_END = "# ---- end of the part the requeue block carries ----"


def nodes_file_text() -> str:
    """The staged job/bin/hpcdl-nodes, as it is in the package."""
    return (templates_dir() / _SOURCE).read_text()


def guard_calls_text() -> str:
    """hpcdl-nodes' bounded Slurm calls and time-left reading (hpcdl_slurm,
    hpcdl_left_seconds, hpcdl_time_left), markers included: one definition, rendered
    into the requeue block of a job that does not source hpcdl-nodes."""
    text = nodes_file_text()
    start = text.index(GUARD_CALLS_BEGIN)
    end = text.index(GUARD_CALLS_END, start) + len(GUARD_CALLS_END)
    return text[start:end]


def probe_slow_path(run_dir: str | None) -> str:
    """Where the --probe-first step of a job with spares writes the nodes it found slow."""
    return f"{run_dir}/{PROBE_SLOW_NAME}" if run_dir else PROBE_SLOW_NAME


def guard_exports(profile: Profile, *, tasks_per_node: int, gpus: int, max_relaunches: int,
                  nodes_file: str, image: bool, master_addr: bool,
                  probe_slow: str | None = None) -> list[tuple[str, str]]:
    """(name, rendered value) of what job.sbatch exports for hpcdl-nodes: sizes, the
    gate's checks, the words to look for. Values are quoted here (shell_join)."""
    local = profile.paths.local_scratch
    exports = [
        ("HPCDL_NODES_FILE", shell_join([nodes_file])),
        ("HPCDL_TASKS_PER_NODE", str(tasks_per_node)),
        ("HPCDL_MAX_RELAUNCHES", str(max_relaunches)),
        ("HPCDL_GATE_TIMEOUT", str(profile.scheduler.gate_timeout)),
        ("HPCDL_GATE_GPUS", str(gpus)),
        ("HPCDL_GATE_PATHS", shell_join(["\n".join(profile.paths.shared)])),
        ("HPCDL_STUCK_S", str(STUCK_S)),
        ("HPCDL_STALL_S", str(STALL_S)),
        ("HPCDL_MIN_LEFT_S", str(MIN_LEFT_S)),
        ("HPCDL_HB_DEAD_S", str(HEARTBEAT_DEAD_S)),
        ("HPCDL_TASK_ENDED", shell_join([SRUN_TASK_ENDED])),
        ("HPCDL_HW_PATTERN", shell_join(["|".join(HARDWARE_ERRORS)])),
    ]
    if local:
        # (a staged image's own size is checked by the staging block)
        exports += [("HPCDL_GATE_LOCAL", shell_join([local])),
                    ("HPCDL_GATE_MIN_MB", str(GATE_MIN_LOCAL_MB))]
    if image:
        runtime = profile.container.binary or profile.container.runtime
        exports.append(("HPCDL_GATE_RUNTIME", shell_join([runtime])))
        if profile.container.nv:
            exports.append(("HPCDL_GATE_NV", "1"))
    if master_addr:
        exports.append(("HPCDL_SET_MASTER_ADDR", "1"))
    if probe_slow:
        exports.append(("HPCDL_PROBE_SLOW", shell_join([probe_slow])))
    return exports
