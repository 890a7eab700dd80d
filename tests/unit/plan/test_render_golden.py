"""Golden files: every bundled profile x a few requests, rendered to sbatch/salloc text.
A Slurm case's job-side files (the rank wrapper and the port pick the script runs) are
in a second golden beside its script, ``.files``, as --dry-run prints them.

Regenerate after an intended change with:  HPCDL_REGEN_GOLDEN=1 pytest tests/unit/plan/test_render_golden.py
then read the diff before committing it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcdl.cli import cli
from hpcdl.cli.submit import JOB_FILE_HEADER
from hpcdl.core.resources import REPO_ROOT
from hpcdl.errors import ValidationError
from hpcdl.jobs.alloc import build_alloc
from hpcdl.plan import JobPlan, JobRequest, build_plan
from hpcdl.profiles import load_profile

GOLDEN = Path(__file__).resolve().parents[2] / "golden"
REGEN = os.environ.get("HPCDL_REGEN_GOLDEN") == "1"
SLURM_PROFILES = ["generic", "karolina", "neuron", "sandbox", "taurus"]
PBS_PROFILES = ["polaris"]  # scheduler.type: pbs -> templates/pbs.sh.j2

REQUESTS = {
    "2x4-default": JobRequest.of(nodes=2, gpus=4),
    "image-ddp": JobRequest.of(
        nodes=2, gpus=2, image="/scratch/images/pytorch-horovod.sif", backend="ddp",
        env=(("NCCL_SOCKET_IFNAME", "ib0"),), binds=("/scratch/data/imagenet:/imagenet",),
        data="/imagenet", job_name="resnet50 ddp", time="00:20:00",
    ),
    "command": JobRequest.of(
        nodes=1, gpus=1, command=("python3", "train.py", "--lr", "0.1"), job_name="t1",
        run_dir="/scratch/runs/t1",
    ),
    # submit --code (a cluster reached over SSH): the job starts in the run's code/.
    "command-code": JobRequest.of(
        nodes=1, gpus=1, command=("python3", "train.py"), job_name="t2",
        run_dir="/scratch/runs/t2", code_dir="/home/jdoe/project",
    ),
}


def normalise(text: str) -> str:
    # The default example path is absolute in the checkout; goldens must not depend on it.
    return text.replace(str(REPO_ROOT), "<repo>")


def check_golden(path: Path, text: str) -> None:
    text = normalise(text)
    if REGEN:
        path.write_text(text)
    assert path.is_file(), f"missing golden {path}: run with HPCDL_REGEN_GOLDEN=1"
    assert text == path.read_text(), f"{path.name} drifted; HPCDL_REGEN_GOLDEN=1 regenerates"


def job_files_text(plan: JobPlan) -> str:
    """The plan's job-side files under their headers, as a dry run prints them."""
    return "".join(f"{JOB_FILE_HEADER} {path} (written with the run; the script runs it)\n{text}"
                   for path, text in plan.job_script_paths())


@pytest.mark.parametrize("profile", SLURM_PROFILES)
@pytest.mark.parametrize("case", sorted(REQUESTS))
def test_sbatch_golden(profile, case):
    plan = build_plan(load_profile(profile), REQUESTS[case])
    check_golden(GOLDEN / "sbatch" / f"{profile}-{case}.sh", plan.script)
    check_golden(GOLDEN / "sbatch" / f"{profile}-{case}.files", job_files_text(plan))


@pytest.mark.parametrize("profile", PBS_PROFILES)
@pytest.mark.parametrize("case", sorted(REQUESTS))
def test_pbs_golden(profile, case):
    plan = build_plan(load_profile(profile), REQUESTS[case])
    check_golden(GOLDEN / "pbs" / f"{profile}-{case}.sh", plan.script)
    assert plan.files.job_scripts == ()  # qsub'ed by hand: nothing staged, the script has it all


# plan.json (JobPlan.to_dict()) for requests that set every part of a plan: the
# launch, the container and its staging, requeue and chain, the hang watchdog, the
# probe, spare nodes, the run's files. Dumped in to_dict's order (what `submit --dry-run
# --json` prints; the run directory's plan.json is the same keys sorted).
PLAN_JSON_CASES = {
    "sandbox-command": ("sandbox", REQUESTS["command"]),
    "sandbox-command-code": ("sandbox", REQUESTS["command-code"]),
    "generic-image-ddp": ("generic", REQUESTS["image-ddp"]),
    "polaris-image-ddp": ("polaris", REQUESTS["image-ddp"]),
    "sandbox-requeue": ("sandbox", JobRequest.of(nodes=2, gpus=1, run_dir="/scratch/runs/r1",
                                              requeue=True, max_restarts=2, signal="USR1@60",
                                              hang_timeout=30.0)),
    "sandbox-chain": ("sandbox", JobRequest.of(nodes=1, gpus=0, command=("true",), chain=3,
                                            run_dir="/scratch/runs/c1", launcher="torchrun",
                                            backend="ddp")),
    "sandbox-spares-probe-first": ("sandbox", JobRequest.of(
        nodes=1, gpus=1, spares=1, probe=("--sizes", "4K"), probe_first=True,
        hang_timeout=20.0, run_dir="/scratch/runs/s1", image="/scratch/images/x.sif")),
    "sandbox-probe": ("sandbox", JobRequest.of(nodes=2, gpus=0, probe=("--sizes", "4K"),
                                            run_dir="/scratch/runs/p1")),
    "sandbox-staged": ("sandbox", JobRequest.of(nodes=2, gpus=2, image="/scratch/images/x.sif",
                                             data="/scratch/data/imagenet.sqfs",
                                             stage_image=True, stage_data=True,
                                             run_dir="/scratch/runs/p4", gpu_bind="local-rank")),
}
# How the container runtime runs, for the cases that depend on it (the rest: unknown).
RUNTIME_MODES = {"sandbox-staged": "unprivileged"}


@pytest.mark.parametrize("case", sorted(PLAN_JSON_CASES))
def test_plan_json_golden(case):
    profile, req = PLAN_JSON_CASES[case]
    data = build_plan(load_profile(profile), req, runtime_mode=RUNTIME_MODES.get(case)).to_dict()
    data["hpcdl_version"] = "<version>"  # a release must not drift the golden
    check_golden(GOLDEN / "plan" / f"{case}.json", json.dumps(data, indent=2) + "\n")


def test_polaris_pbs_lines_that_matter():
    plan = build_plan(load_profile("polaris"), REQUESTS["image-ddp"])
    lines = plan.script.splitlines()
    assert not any(line.startswith("#SBATCH") for line in lines)
    # No Slurm variable is read or set under PBS, but in the rank-env wrapper, which
    # knows every launcher's variables (it takes mpiexec's PMI_RANK/PALS_* here).
    wrapper = re.search(r"\nHPCDL_RANK_ENV='.*?'\n", plan.script, re.S)
    assert wrapper and "PALS_LOCAL_RANKID" in wrapper.group()
    assert "SLURM" not in plan.script.replace(wrapper.group(), "\n")
    assert 'export MASTER_ADDR="$(head -n 1 "$PBS_NODEFILE")"' in lines
    assert "MASTER_PORT=$((15000 + ${PBS_JOBID%%.*} % 15000)) hpcdl_tries=0" in lines
    assert "export MASTER_PORT" in lines
    for expected in [
        "#PBS -N resnet50_ddp",
        "#PBS -l select=2:ncpus=16:ngpus=2",
        "#PBS -l place=scatter",
        "#PBS -l walltime=00:20:00",
        "#PBS -q debug",
        "#PBS -A YOUR_PROJECT",
        "#PBS -l filesystems=home:eagle:grand",
        'cd "${PBS_O_WORKDIR:-.}"',
    ]:
        assert expected in lines, expected
    assert lines[-1].startswith("mpiexec -n 4 --ppn 2 --depth 8 --cpu-bind depth apptainer exec --nv ")
    assert ' /bin/sh -c "${HPCDL_RANK_ENV:?}" hpcdl-rank-env python3 ' in lines[-1]
    assert plan.warnings and "untested against a live PBS server" in plan.warnings[0]


def test_pbs_walltime_has_no_days():
    plan = build_plan(load_profile("polaris"), JobRequest.of(nodes=10, gpus=4, partition="prod",
                                                          time="1-00:00:00"))
    assert "#PBS -l walltime=24:00:00" in plan.script.splitlines()


# A newline is refused for every scheduler by the request check (one line per value);
# a space only where the value lands in a #PBS directive.
@pytest.mark.parametrize("run_dir,refusal", [
    ("/scratch/runs/t1", None),
    ("/scratch/runs/with space", "run-dir: .* cannot go into a #PBS directive"),
    ("/scratch/runs/a\nb", "run-dir: .* control character"),
])
def test_pbs_run_dir_must_be_a_plain_path(run_dir, refusal):
    req = JobRequest.of(nodes=1, gpus=1, command=("true",), run_dir=run_dir.replace("\\n", "\n"))
    if refusal is None:
        assert "#PBS -o /scratch/runs/t1/" in build_plan(load_profile("polaris"), req).script
    else:
        with pytest.raises(ValidationError, match=refusal):
            build_plan(load_profile("polaris"), req)


def test_alloc_refuses_pbs_profiles():
    res = CliRunner().invoke(cli, ["alloc", "-p", "polaris", "-N", "1", "-G", "1", "--dry-run"])
    assert res.exit_code == 2
    assert res.output.strip() == ("error: scheduler: profile polaris uses pbs; hpcdl alloc works "
                                  "with Slurm only (on PBS an interactive job is `qsub -I`)")


def test_submit_refuses_pbs_without_dry_run():
    res = CliRunner().invoke(cli, ["submit", "-p", "polaris", "-N", "1", "-G", "1"])
    assert res.exit_code == 2
    assert res.output.strip() == (
        "error: scheduler: profile polaris uses pbs; hpcdl submit works with Slurm only (use "
        "--dry-run to print the PBS script, then qsub it yourself)")


@pytest.mark.parametrize("profile", SLURM_PROFILES)
def test_salloc_golden(profile):
    plan = build_alloc(load_profile(profile), JobRequest.of(nodes=2, gpus=2, time="2:00:00"))
    check_golden(GOLDEN / "salloc" / f"{profile}.sh", plan.script)


def test_neuron_script_lines_that_matter():
    script = build_plan(load_profile("neuron"), REQUESTS["image-ddp"]).script
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash -l"  # login shell so `module` exists
    for expected in [
        '#SBATCH --job-name="resnet50 ddp"',
        "#SBATCH --partition=cas_v100_2",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=2",
        "#SBATCH --gres=gpu:2",
        "#SBATCH --cpus-per-task=16",
        "#SBATCH --time=00:20:00",
        "#SBATCH --comment=pytorch",
        "module load gcc/10.2.0 cuda/11.4 cudampi/openmpi-4.1.1",
        'export SRUN_CPUS_PER_TASK="${SLURM_CPUS_PER_TASK:-16}"',
        "export NCCL_SOCKET_IFNAME=ib0",
    ]:
        assert expected in lines, expected
    assert normalise(lines[-1]) == (
        "srun --label --kill-on-bad-exit=1 singularity exec --nv -B /scratch -B /apps -B /scratch/data/imagenet:/imagenet "
        "-B <repo>/examples:/hpcdl/examples:ro -B <repo>/hpcdl:/hpcdl/hpcdl:ro --env PYTHONPATH=/hpcdl "
        '/scratch/images/pytorch-horovod.sif /bin/sh ./job/bin/hpcdl-rank-env '
        "python3 /hpcdl/examples/resnet50_imagenet.py --backend ddp --data /imagenet"
    )
    # The first node is the rendezvous host; the port follows the job id.
    assert 'export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"' in lines
    assert "MASTER_PORT=$(/bin/sh ./job/bin/hpcdl-master-port)" in lines
    assert "export MASTER_PORT" in lines


def test_karolina_uses_gpus_per_node_and_account():
    script = build_plan(load_profile("karolina"), REQUESTS["2x4-default"]).script
    assert "#SBATCH --gpus-per-node=4" in script
    assert "#SBATCH --account=OPEN-00-00" in script
    assert "srun --label --kill-on-bad-exit=1 --mpi=pmix /bin/sh ./job/bin/hpcdl-rank-env" in script


def test_template_override(tmp_path):
    custom = tmp_path / "my.sh.j2"
    custom.write_text("#!/bin/sh\n# {{ profile.name }} {{ ntasks }}\n{{ launch_line }}\n")
    plan = build_plan(load_profile("sandbox"), JobRequest.of(nodes=2, gpus=4, template=str(custom),
                                                          command=("hostname",),
                                                          run_dir="/scratch/runs/t2"))
    assert plan.script == ("#!/bin/sh\n# sandbox 8\nsrun --label --kill-on-bad-exit=1 --mpi=pmix "
                           "/bin/sh /scratch/runs/t2/job/bin/hpcdl-rank-env hostname\n")
    # The wrapper is a file of the run whatever the template: staged all the same.
    assert [rel for rel, _ in plan.files.job_scripts] == ["bin/hpcdl-rank-env", "bin/hpcdl-master-port"]


def test_an_edited_template_is_read_again_in_the_same_process(tmp_path):
    # Compiled templates are kept per search path (hpcdl.core.templating): an edit must
    # still show. Jinja compares mtimes, and two writes within one timestamp tick of the
    # filesystem share one, so the edit here is dated a second later.
    custom = tmp_path / "my.sh.j2"
    req = JobRequest.of(nodes=1, gpus=1, template=str(custom), command=("hostname",))
    custom.write_text("#!/bin/sh\n# first {{ ntasks }}\n")
    assert build_plan(load_profile("sandbox"), req).script == "#!/bin/sh\n# first 1\n"
    stat = custom.stat()
    custom.write_text("#!/bin/sh\n# second {{ ntasks }}\n")
    os.utime(custom, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert build_plan(load_profile("sandbox"), req).script == "#!/bin/sh\n# second 1\n"


def test_a_site_template_that_includes_the_inline_block_still_renders(tmp_path):
    # Written for the inline wrapper (before it became a file): the block still renders
    # the same port pick, and the launch line runs the staged file.
    custom = tmp_path / "old.sh.j2"
    custom.write_text('#!/bin/bash\n{% include "rank-env.sh.j2" %}\n{{ launch_line }}\n')
    plan = build_plan(load_profile("sandbox"), JobRequest.of(nodes=1, gpus=1, template=str(custom),
                                                          command=("hostname",)))
    picked = dict(plan.files.job_scripts)["bin/hpcdl-master-port"]
    block = picked.split("rendezvous) must not fail the job: the next free one is taken instead.\n")[1]
    assert block.removesuffix('echo "$MASTER_PORT"\n') + "export MASTER_PORT\n" in plan.script
    assert "\nHPCDL_RANK_ENV='# hpcdl-rank-env" in plan.script
    assert plan.script.endswith("/bin/sh ./job/bin/hpcdl-rank-env hostname\n")


def test_pbs_refuses_torchrun_as_launcher():
    req = JobRequest.of(nodes=2, gpus=2, launcher="torchrun", command=("python3", "ddp.py"))
    with pytest.raises(ValidationError, match="launcher: torchrun starts one agent per node"):
        build_plan(load_profile("polaris"), req)
    plan = build_plan(load_profile("polaris"), JobRequest.of(nodes=2, gpus=2, launcher="mpirun",
                                                          command=("python3", "ddp.py")))
    assert plan.launch.launch_line.startswith("mpiexec -n 4 --ppn 2 ")


# The same sandbox profile on the newer releases (scheduler.release, as `sandbox up
# --slurm` and `profiles detect` write it): what the job script does differently there
# is in these goldens; without the field (every golden above) it is 22.05's, byte for
# byte. 26.05's cluster enables --requeue=expedite.
RELEASE_PROFILES = {"24.11": {}, "26.05": {"requeue_expedite": True}}
RELEASE_REQUESTS = {
    "2x4-default": REQUESTS["2x4-default"],
    "requeue": JobRequest.of(nodes=2, gpus=1, run_dir="/scratch/runs/r1", requeue=True,
                          max_restarts=2, signal="USR1@60"),
}


def release_profile(release: str):
    prof = load_profile("sandbox")
    scheduler = prof.scheduler.model_copy(update={"release": release,
                                                  **RELEASE_PROFILES[release]})
    return prof.model_copy(update={"scheduler": scheduler})


@pytest.mark.parametrize("release", sorted(RELEASE_PROFILES))
@pytest.mark.parametrize("case", sorted(RELEASE_REQUESTS))
def test_sbatch_golden_per_release(release, case):
    plan = build_plan(release_profile(release), RELEASE_REQUESTS[case])
    check_golden(GOLDEN / "sbatch" / f"sandbox-{release}-{case}.sh", plan.script)


@pytest.mark.parametrize("release", sorted(RELEASE_PROFILES))
def test_salloc_golden_per_release(release):
    plan = build_alloc(release_profile(release), JobRequest.of(nodes=2, gpus=2, time="2:00:00"))
    check_golden(GOLDEN / "salloc" / f"sandbox-{release}.sh", plan.script)
