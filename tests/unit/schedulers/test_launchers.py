"""The launchers (srun, torchrun, mpirun, horovodrun): one job script per launcher on
the sandbox profile, kept as goldens beside the bundled profiles' (tests/golden/sbatch/
sandbox-launcher-*), so a launcher's script cannot drift unseen; the bundled profiles'
goldens all use their default launcher (srun, or mpiexec under PBS).

Regenerate after an intended change with:
HPCDL_REGEN_GOLDEN=1 pytest tests/unit/schedulers/test_launchers.py, then read the diff.
"""

from __future__ import annotations

import pytest

from hpcdl.plan import JobRequest, build_plan
from hpcdl.profiles import load_profile
from tests.unit.plan.test_render_golden import GOLDEN, check_golden, job_files_text

# One request per launcher, and the two launchers that run on N of N+S nodes with a
# spare (srun's probe-first step included).
LAUNCHER_REQUESTS = {
    "srun-spares-probe-first": JobRequest(
        nodes=1, gpus=1, spares=1, probe=("--sizes", "4K"), probe_first=True,
        command=("python3", "train.py"), run_dir="/scratch/runs/s1", hang_timeout=20.0),
    "torchrun": JobRequest(nodes=2, gpus=2, launcher="torchrun", backend="ddp",
                           image="/scratch/images/x.sif", run_dir="/scratch/runs/t1"),
    "torchrun-spares": JobRequest(nodes=1, gpus=2, launcher="torchrun", spares=1,
                                  command=("python3", "ddp.py"), run_dir="/scratch/runs/t2",
                                  hang_timeout=30.0),
    "mpirun": JobRequest(nodes=2, gpus=2, launcher="mpirun", command=("python3", "x.py"),
                         run_dir="/scratch/runs/m1", gpu_bind="local-rank"),
    "horovodrun": JobRequest(nodes=2, gpus=2, launcher="horovodrun",
                             image="/scratch/images/x.sif", run_dir="/scratch/runs/h1"),
}


@pytest.mark.parametrize("case", sorted(LAUNCHER_REQUESTS))
def test_launcher_golden(case):
    plan = build_plan(load_profile("sandbox"), LAUNCHER_REQUESTS[case])
    check_golden(GOLDEN / "sbatch" / f"sandbox-launcher-{case}.sh", plan.script)
    check_golden(GOLDEN / "sbatch" / f"sandbox-launcher-{case}.files", job_files_text(plan))
