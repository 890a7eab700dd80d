"""For tests that run a rendered job script outside Slurm: the job-side files the script
runs (the rank wrapper, the MASTER_PORT pick: the plan's job_scripts), written where the
script names them, as hpcdl.jobs.submit stages them into the run directory."""

from __future__ import annotations

import os
from pathlib import Path

from hpcdl.plan import JobPlan


def stage_job_scripts(plan: JobPlan, cwd: Path) -> list[Path]:
    """Write ``plan``'s job-side files (relative paths: under ``cwd``, where the script
    runs); returns where they went."""
    written = []
    for path, text in plan.job_script_paths():
        target = Path(path) if os.path.isabs(path) else cwd / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        target.chmod(0o755)
        written.append(target)
    return written
