"""Image staging with sbcast (--stage-image, the profile's container.stage): what the
plan decides and refuses, and the rendered script's staging block run by bash against
stand-ins for srun, sbcast, df, scontrol and apptainer (two "nodes", each with its own
free space): the ranks get the node's copy, a node without room stops the job in one
line that names it and its free space before any copy or rank, the copy is removed at
the end. tests/integration/test_image_stage.py runs the same on a real cluster."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from hpcdl.errors import ValidationError
from hpcdl.plan import JobPlan, JobRequest, build_plan
from hpcdl.profiles import load_profile
from hpcdl.profiles.schema import Profile
from tests.unit.clirun import hpcdl
from tests.unit.jobfiles import stage_job_scripts

IMAGE = "/scratch/images/pytorch-horovod-cpu.sif"


def profile(*, local: str | None = "/local", stage: str = "none", name: str = "sandbox",
            default_image: str | None = None) -> Profile:
    base = load_profile(name)
    return base.model_copy(update={
        "paths": base.paths.model_copy(update={"local_scratch": local}),
        "container": base.container.model_copy(update={"stage": stage,
                                                       "default_image": default_image}),
    })


def staged(prof: Profile, **req: object) -> JobPlan:
    return build_plan(prof, JobRequest.of(**{"nodes": 2, "gpus": 0, "command": ("true",), **req}))


def test_stage_image_copies_with_sbcast_and_the_ranks_run_the_copy() -> None:
    plan = staged(profile(), image=IMAGE, stage_image=True)
    assert (plan.container.stage, plan.container.staged_image) == (
        "sbcast", "/local/hpcdl-$SLURM_JOB_ID-pytorch-horovod-cpu.sif")
    assert plan.container.image == IMAGE  # the source, which submit checks and records
    data = json.loads(json.dumps(plan.to_dict()))  # plan.json
    assert (data["stage"], data["staged_image"]) == ("sbcast", plan.container.staged_image)
    script = plan.script
    assert 'export HPCDL_IMAGE=/local/hpcdl-"$SLURM_JOB_ID"-pytorch-horovod-cpu.sif' in script
    assert 'sbcast --compress --force "$src" "$dest"' in script
    assert ('hpcdl_stage image "$HPCDL_IMAGE" /local/hpcdl-"$SLURM_JOB_ID"-'
            'pytorch-horovod-cpu.sif /local\n') in script
    assert "trap hpcdl_unstage EXIT" in script
    # The ranks' image is the variable, set before the launch line, never the shared path.
    assert ' "$HPCDL_IMAGE" /bin/sh ./job/bin/hpcdl-rank-env' in plan.launch.launch_line
    assert IMAGE not in plan.launch.launch_line
    assert script.index("sbcast --compress") < script.index(plan.launch.launch_line)


def test_the_probe_first_step_runs_the_copy_too() -> None:
    plan = staged(profile(), image=IMAGE, stage_image=True, probe=("--sizes", "64K"),
                  probe_first=True)
    probe_line = plan.probe.line if plan.probe else None
    assert probe_line and ' "$HPCDL_IMAGE" /bin/sh ./job/bin/hpcdl-rank-env' in probe_line
    assert plan.script.index("sbcast --compress") < plan.script.index(probe_line)


def test_the_profile_default_stages_and_the_flag_overrides_it() -> None:
    prof = profile(stage="sbcast", default_image=IMAGE)
    assert staged(prof).container.stage == "sbcast"
    off = staged(prof, stage_image=False)
    assert (off.container.stage, off.container.staged_image) == ("none", None)
    assert "sbcast" not in off.script and IMAGE in off.launch.launch_line
    # A native run has nothing to stage: the profile's default does not apply to it.
    native = staged(prof, no_image=True)
    assert native.container.stage == "none" and "sbcast" not in native.script


def test_without_staging_nothing_changes() -> None:
    plan = staged(profile(), image=IMAGE)
    assert plan.container.stage == "none" and "sbcast" not in plan.script
    assert f" {IMAGE} /bin/sh ./job/bin/hpcdl-rank-env" in plan.launch.launch_line


@pytest.mark.parametrize("prof, req, message", [
    (profile(local=None), {"image": IMAGE},
     "stage-image: profile sandbox has no paths.local_scratch (the node-local directory "
     "--stage-image copies the image to)"),
    (profile(), {"no_image": True}, "stage-image: no image to stage"),
    (profile(), {}, "stage-image: no image to stage"),
    (profile(name="polaris"), {"image": IMAGE},
     "stage-image: staging uses Slurm's sbcast; profile polaris is pbs"),
])
def test_staging_is_refused_at_plan_time(prof: Profile, req: dict, message: str) -> None:
    if prof.name == "polaris":
        req = {**req, "gpus": 4}
    with pytest.raises(ValidationError) as err:
        staged(prof, stage_image=True, **req)
    assert str(err.value).startswith(message)


def test_the_cli_refuses_in_one_line_with_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "nolocal.yaml"
    data = profile(local=None).model_dump(mode="json", exclude_none=True)
    data["name"] = "nolocal"
    path.write_text(yaml.safe_dump(data))
    res = hpcdl("submit", "-p", str(path), "-N", "2", "-G", "0", "--image", IMAGE,
                "--stage-image", "--dry-run", "--", "true")
    assert res.returncode == 2, res.stdout + res.stderr
    errors = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "paths.local_scratch" in errors[0], res.stderr
    assert res.stdout == ""


def test_dry_run_shows_the_staging(tmp_path: Path) -> None:
    res = hpcdl("submit", "-p", "sandbox", "-N", "2", "-G", "0", "--image", IMAGE,
                "--stage-image", "--dry-run", "--", "true")
    assert res.returncode == 0, res.stderr
    assert ("# image staged with sbcast to each node's "
            "/local/hpcdl-$SLURM_JOB_ID-pytorch-horovod-cpu.sif") in res.stderr
    assert 'hpcdl_stage image "$HPCDL_IMAGE" /local/hpcdl-' in res.stdout
    js = hpcdl("submit", "-p", "sandbox", "-N", "2", "-G", "0", "--image", IMAGE,
               "--stage-image", "--dry-run", "--json", "--", "true")
    assert json.loads(js.stdout)["stage"] == "sbcast"


def test_odd_names_stay_one_quoted_word() -> None:
    image = "/scratch/my images/it's $(reboot).sif"
    plan = staged(profile(local="/local dir/$HOME"), image=image, stage_image=True)
    assert ("export HPCDL_IMAGE='/local dir/$HOME/hpcdl-'\"$SLURM_JOB_ID\"'-it'\"'\"'s "
            "$(reboot).sif'") in plan.script
    subprocess.run(["bash", "-n"], input=plan.script, text=True, check=True, timeout=30)


# ---- the staging block, run --------------------------------------------------------
# srun runs its command once per node of $FAKE_NODES (SLURMD_NODENAME set); df reports
# that node's $FAKE_FREE_<node> KiB available; sbcast copies (recording its argv);
# apptainer prints the image it was given and that file's size.
FAKES = {
    "srun": """#!/bin/bash
echo "srun $*" >> "$FAKE_LOG"
while [[ $1 == --* ]]; do shift; done
rc=0
for node in $FAKE_NODES; do SLURMD_NODENAME=$node "$@" || rc=$?; done
exit $rc
""",
    "df": """#!/bin/bash
var=FAKE_FREE_$SLURMD_NODENAME
echo "Filesystem 1024-blocks Used Available Capacity Mounted on"
echo "tmpfs 999999 0 ${!var} 1% ${@: -1}"
""",
    "sbcast": """#!/bin/bash
echo "sbcast $*" >> "$FAKE_LOG"
cp "${@: -2:1}" "${@: -1}"
""",
    "scontrol": """#!/bin/bash
for node in $FAKE_NODES; do echo "$node"; done
""",
    "apptainer": """#!/bin/bash
shift  # exec
while :; do case $1 in --nv) shift ;; -B|--env) shift 2 ;; *) break ;; esac; done
echo "rank on $SLURMD_NODENAME runs $1 ($(stat -c %s "$1") bytes)"
""",
}


def run_script(tmp_path: Path, free_kib: dict[str, int], *, df: str | None = None
               ) -> tuple[subprocess.CompletedProcess[str], Path, str]:
    """The plan's script, run by bash with the stand-ins first on PATH (``df`` replaces
    the df one); the exit, the local scratch directory and the srun/sbcast calls."""
    bin_dir, local = tmp_path / "bin", tmp_path / "local"
    bin_dir.mkdir()
    local.mkdir()
    for name, text in {**FAKES, **({"df": df} if df else {})}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    image = tmp_path / "img.sif"
    image.write_bytes(b"\0" * (3 << 20))  # 3 MiB
    plan = staged(profile(local=str(local)), image=str(image), stage_image=True)
    stage_job_scripts(plan, tmp_path)  # the port pick and rank wrapper the script runs
    log = tmp_path / "log"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_LOG": str(log),
           "FAKE_NODES": " ".join(free_kib), "SLURM_JOB_ID": "77",
           "SLURM_JOB_NUM_NODES": str(len(free_kib)), "SLURM_JOB_NODELIST": ",".join(free_kib),
           **{f"FAKE_FREE_{n}": str(k) for n, k in free_kib.items()}}
    res = subprocess.run(["bash", "-c", plan.script], capture_output=True, text=True, env=env,
                         timeout=60, cwd=tmp_path)
    return res, local, log.read_text() if log.exists() else ""


def test_the_ranks_run_each_nodes_copy_which_is_removed_at_the_end(tmp_path: Path) -> None:
    res, local, log = run_script(tmp_path, {"f1": 1 << 20, "f2": 1 << 20})
    assert res.returncode == 0, res.stdout + res.stderr
    copy = f"{local}/hpcdl-77-img.sif"
    assert f"sbcast --compress --force {tmp_path}/img.sif {copy}" in log
    ranks = [line for line in res.stdout.splitlines() if line.startswith("rank on")]
    assert ranks == [f"rank on {n} runs {copy} ({3 << 20} bytes)" for n in ("f1", "f2")]
    assert f"rm -f {copy}" in log and not list(local.iterdir())  # the EXIT trap


def test_a_node_without_room_stops_the_job_in_one_line(tmp_path: Path) -> None:
    res, local, log = run_script(tmp_path, {"f1": 1 << 20, "f2": 2048})
    assert res.returncode == 1
    errors = [line for line in res.stderr.splitlines() if line.strip()]
    assert errors == [f"hpcdl: image staging: no room for {tmp_path}/img.sif (3 MiB) in "
                      f"{local} on f2 (2 MiB free); no rank was started"], res.stderr
    assert "sbcast" not in log and "rank on" not in res.stdout


def test_a_node_whose_free_space_cannot_be_read_stops_the_job(tmp_path: Path) -> None:
    df = FAKES["df"].replace("var=", "[[ $SLURMD_NODENAME == f2 ]] && exit 1\nvar=")
    res, _, log = run_script(tmp_path, {"f1": 1 << 20, "f2": 1 << 20}, df=df)
    assert res.returncode == 1
    assert res.stderr.strip().endswith(
        "on 1 of 2 nodes (free space unreadable); no rank was started"), res.stderr
    assert "sbcast" not in log
