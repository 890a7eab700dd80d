"""The Slurm dialect of a job array: the one batch script whose ``$SLURM_ARRAY_TASK_ID``
picks a point, the ``--array`` spec, and the task ids (``123_4``) Slurm prints. Pure.

Each point keeps its own job script (job.sbatch in its run directory, rendered by the
ordinary planner, byte for byte what ``hpcdl submit`` of that point would write); the
array script carries the #SBATCH lines the points share and runs the chosen point's
script with bash, where its own #SBATCH lines are comments. So the array adds no
second way to render a job: a point behaves in its task as it would alone.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from hpcdl.core.templating import shell_join
from hpcdl.errors import ValidationError
from hpcdl.schedulers.slurm.script import sbatch_value

# "0-5", "3,5", "0-999" with an optional "%M" throttle: what sbatch --array takes.
ARRAY_SPEC = re.compile(r"[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*(%[0-9]+)?")
# An array task as squeue -r / sacct print it.
TASK_ID = re.compile(r"([0-9]+)_([0-9]+)")
# The #SBATCH options that differ per point (the array sets its own).
_PER_POINT = ("--output=", "--error=")


def array_spec(indices: Sequence[int], max_concurrent: int | None) -> str:
    """``--array``'s value: ``0-K`` for a run of indices, else ``3,5``; ``%M`` when
    ``max_concurrent`` is below the number of tasks. Raises ValidationError."""
    if not indices:
        raise ValidationError("array: no task to submit")
    ordered = sorted(set(indices))
    if ordered == list(range(ordered[0], ordered[-1] + 1)) and len(ordered) > 1:
        text = f"{ordered[0]}-{ordered[-1]}"
    else:
        text = ",".join(str(i) for i in ordered)
    if max_concurrent is not None:
        if max_concurrent < 1:
            raise ValidationError(f"max-concurrent: {max_concurrent} must be 1 or more")
        if max_concurrent < len(ordered):
            text += f"%{max_concurrent}"
    return text


def task_id(array_job_id: str, index: int) -> str:
    """Slurm's id of one task: ``123_4``."""
    return f"{array_job_id}_{index}"


def split_task_id(job_id: str) -> tuple[str, int] | None:
    """(array job id, index) of ``123_4``; None for a plain job id."""
    m = TASK_ID.fullmatch(job_id)
    return (m.group(1), int(m.group(2))) if m else None


def shared_header(scripts: Sequence[str]) -> list[str]:
    """The #SBATCH lines every point's script has (bar --output/--error), from the
    first; raises ValidationError naming the first point whose job shape differs (one
    array, one allocation shape)."""
    def lines(text: str) -> list[str]:
        return [ln for ln in text.splitlines() if ln.startswith("#SBATCH ")
                and not ln.split(" ", 1)[1].startswith(_PER_POINT)]

    first = lines(scripts[0])
    for i, text in enumerate(scripts[1:], start=1):
        if lines(text) != first:
            diff = sorted(set(lines(text)) ^ set(first))
            raise ValidationError(f"point {i}: its job differs from point 0's ({'; '.join(diff)}); "
                                  f"one array runs one job shape")
    return first


def array_script(scripts: Sequence[str], point_scripts: Sequence[str],
                 descriptions: Sequence[str], *, log_dir_pattern: str) -> str:
    """The array's batch script. ``scripts``: each point's rendered job script (for the
    shared #SBATCH lines); ``point_scripts``: where each one lies (absolute, as the
    nodes see it); ``descriptions``: each point's values, one line each (comments);
    ``log_dir_pattern``: the points' run directory with Slurm's zero-padded task index
    (``/runs/sweep-x/point-%3a``). Raises ValidationError."""
    header = shared_header(scripts)
    out = sbatch_value(f"{log_dir_pattern}/slurm-%A_%a.out")
    err = sbatch_value(f"{log_dir_pattern}/slurm-%A_%a.err")
    lines = ["#!/bin/bash", *header, f"#SBATCH --output={out}", f"#SBATCH --error={err}",
             "# hpcdl sweep: one array task per point. The task's own job script (its run",
             "# directory's job.sbatch, what `hpcdl submit` of that point would run) runs",
             "# under bash; its #SBATCH lines are comments there, the lines above apply.",
             'case "${SLURM_ARRAY_TASK_ID:-}" in']
    for i, (path, text) in enumerate(zip(point_scripts, descriptions, strict=True)):
        if "\n" in text or "\r" in text:
            raise ValidationError(f"point {i}: its description is not one line")
        lines.append(f"  {i}) exec bash {shell_join([path])} ;;  # {text}")
    lines += ['  *) echo "hpcdl: array task ${SLURM_ARRAY_TASK_ID:-unset} is not a point of '
              'this sweep" >&2; exit 2 ;;', "esac", ""]
    return "\n".join(lines)
