"""--stage-data: the packed dataset copied to every node by the same staging step as the
image (goldens: HPCDL_REGEN_GOLDEN=1 regenerates), what the plan refuses, the rendered
script run by bash against stand-ins for srun, sbcast, df, apptainer, squashfuse and
fusermount (two "nodes", each with its own free space): the ranks read the node's copy
(bound in the image, mounted natively), a node without room stops the job in one line
before any rank, every copy is removed at the end. And the warning at submit for a
dataset tree of many files on a shared path. tests/integration/test_data_packed_jobs.py
runs the same on the real sandbox."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hpcdl.errors import ValidationError
from hpcdl.jobs.preflight import MANY_FILES, count_files, many_files_warning
from hpcdl.plan import DataPart, JobPlan, JobRequest, build_plan, decide_data
from hpcdl.profiles import load_profile
from tests.unit.clirun import hpcdl
from tests.unit.jobfiles import stage_job_scripts
from tests.unit.plan.test_image_stage import FAKES, profile
from tests.unit.plan.test_render_golden import GOLDEN, check_golden

DATA = "/scratch/data/imagenet.sqfs"
IMAGE = "/scratch/images/pytorch-horovod.sif"


@pytest.mark.parametrize("case, req", [
    ("packed-native-staged", JobRequest.of(nodes=2, gpus=2, no_image=True, data=DATA,
                                        stage_data=True, run_dir="/scratch/runs/p3")),
    ("packed-image-staged", JobRequest.of(nodes=2, gpus=2, image=IMAGE, data=DATA,
                                       stage_image=True, stage_data=True,
                                       run_dir="/scratch/runs/p4")),
])
def test_stage_data_golden(case: str, req: JobRequest) -> None:
    plan = build_plan(load_profile("sandbox"), req)
    check_golden(GOLDEN / "sbatch" / f"sandbox-{case}.sh", plan.script)
    copy = "/local/hpcdl-$SLURM_JOB_ID-data-imagenet.sqfs"
    assert (plan.container.stage, plan.container.staged_data) == ("sbcast", copy)
    assert json.loads(json.dumps(plan.to_dict()))["staged_data"] == copy  # plan.json
    script = plan.script
    assert (f"hpcdl_stage dataset {DATA} /local/hpcdl-\"$SLURM_JOB_ID\"-data-imagenet.sqfs "
            f"/local\n") in script
    assert script.index("hpcdl_stage dataset") < script.index(plan.launch.launch_line)
    assert DATA not in plan.launch.launch_line
    if req.container.image:
        # The image first, then the dataset; the bind reads the node's copy.
        assert script.index("hpcdl_stage image") < script.index("hpcdl_stage dataset")
        assert ' -B "$HPCDL_DATA_FILE":/data:image-src=/,ro ' in plan.launch.launch_line
        assert plan.container.binds[-1] == '"$HPCDL_DATA_FILE":/data:image-src=/,ro'
    else:
        assert 'hpcdl_data_src="$HPCDL_DATA_FILE"' in script
        # The mount's trap replaces staging's: it removes the copy after unmounting.
        unmount = script[script.index("hpcdl_data_unmount() {"):]
        assert unmount.index("fusermount -u") < unmount.index("  hpcdl_unstage")


@pytest.mark.parametrize("req, message", [
    ({"data": "/scratch/inet/", "no_image": True},
     "stage-data: --data /scratch/inet/ is not a packed file; --stage-data copies one "
     "DATA.sqfs to every node (pack the tree once: hpcdl data pack /scratch/inet -o "
     "/scratch/inet.sqfs)"),
    ({"synthetic": True, "no_image": True},
     "stage-data: needs a packed --data DATA.sqfs (this job has --synthetic)"),
    ({"no_image": True}, "stage-data: needs a packed --data DATA.sqfs (this job has no --data)"),
])
def test_stage_data_without_a_packed_file_is_refused(req: dict, message: str) -> None:
    with pytest.raises(ValidationError) as err:
        build_plan(load_profile("sandbox"), JobRequest.of(nodes=2, gpus=0, stage_data=True, **req))
    assert str(err.value) == message


def test_stage_data_needs_local_scratch_and_slurm() -> None:
    with pytest.raises(ValidationError, match=r"^stage-data: profile sandbox has no "
                                              r"paths.local_scratch"):
        build_plan(profile(local=None), JobRequest.of(nodes=2, gpus=0, no_image=True, data=DATA,
                                                   stage_data=True))
    with pytest.raises(ValidationError, match="^stage-data: staging uses Slurm's sbcast; "
                                              "profile polaris is pbs"):
        build_plan(load_profile("polaris"), JobRequest.of(nodes=1, gpus=1, image=IMAGE, data=DATA,
                                                       stage_data=True))


def test_the_cli_refuses_in_one_line_and_dry_run_shows_the_staging() -> None:
    res = hpcdl("submit", "-p", "sandbox", "-N", "2", "-G", "0", "--no-image", "--synthetic",
                "--stage-data", "--dry-run")
    assert res.returncode == 2, res.stdout + res.stderr
    assert [line for line in res.stderr.splitlines() if line.strip()] == [
        "error: stage-data: needs a packed --data DATA.sqfs (this job has --synthetic)"]
    assert res.stdout == ""
    res = hpcdl("submit", "-p", "sandbox", "-N", "2", "-G", "0", "--no-image", "--data", DATA,
                "--stage-data", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert ("# dataset staged with sbcast to each node's "
            "/local/hpcdl-$SLURM_JOB_ID-data-imagenet.sqfs; the ranks read that copy"
            ) in res.stderr
    assert "hpcdl_stage dataset /scratch/data/imagenet.sqfs " in res.stdout


def test_with_spares_every_allocated_node_gets_a_copy() -> None:
    plan = build_plan(load_profile("sandbox"), JobRequest.of(
        nodes=1, gpus=1, no_image=True, data=DATA, stage_data=True, spares=1,
        run_dir="/scratch/runs/p5"))
    # $SLURM_JOB_NUM_NODES: the allocation, spares included (a spare may replace a node).
    assert "hpcdl_nodes=$SLURM_JOB_NUM_NODES" in plan.script
    assert plan.script.index("hpcdl_stage dataset") < plan.script.index("hpcdl_nodes_init")


# ---- the staging block, run ---------------------------------------------------------
# Beside test_image_stage's stand-ins: apptainer prints the dataset bind it was given
# (with the bound file's size); squashfuse "mounts" by writing the source's name into
# the mount point (the srun of the mount step then stays up, as the real one does);
# fusermount -u empties it.
DATA_FAKES = {
    **FAKES,
    # The mount step lasts until its mount point is emptied (the nodes share it here).
    "srun": FAKES["srun"].replace("exit $rc", 'if [[ $* == *squashfuse* ]]; then\n'
                                  '  while [[ -e ${@: -1}/source ]]; do sleep 0.1; done\n'
                                  'fi\nexit $rc'),
    "apptainer": """#!/bin/bash
shift  # exec
bind=""
while :; do case $1 in --nv) shift ;; -B) [[ $2 == *:/data:* ]] && bind=${2%%:*}; shift 2 ;;
  --env) shift 2 ;; *) break ;; esac; done
echo "rank on $SLURMD_NODENAME runs $1 with data $bind ($(stat -c %s "$bind") bytes)"
""",
    "squashfuse": """#!/bin/bash
echo "squashfuse $*" >> "$FAKE_LOG"
mkdir -p "$3/train" && echo "$2 ($(stat -c %s "$2") bytes)" > "$3/source"
""",
    "squashfuse_ll": """#!/bin/bash
echo "squashfuse_ll $*" >> "$FAKE_LOG"
mkdir -p "$3/train" && echo "$2 ($(stat -c %s "$2") bytes)" > "$3/source"
""",
    "fusermount": """#!/bin/bash
rm -rf "$2/train" "$2/source"
""",
    # The block polls every node for the mounted train/ each `sleep 1`; the stand-in
    # mounts take milliseconds, so a tenth of it (still 6 s for the block's 60 tries).
    "sleep": """#!/bin/bash
[[ $1 == 1 ]] && exec /bin/sleep 0.1
exec /bin/sleep "$@"
""",
}
NATIVE_RANK = ('echo "rank on $SLURMD_NODENAME reads $(cat "$HPCDL_DATA/source") at '
               '$HPCDL_DATA"')


def without(name: str, into: Path) -> str:
    """A PATH with everything on this one but ``name``: ``into`` filled with links to
    every other command (a node without that command)."""
    into.mkdir()
    for d in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(d):
            continue
        for entry in os.scandir(d):
            if entry.name != name and not (into / entry.name).exists():
                (into / entry.name).symlink_to(entry.path)
    return str(into)


def run_staged(tmp_path: Path, free_kib: dict[str, int], *, image: bool, ll: bool = True
               ) -> tuple[subprocess.CompletedProcess[str], Path, str, JobPlan]:
    """A --stage-data plan's script (with --stage-image in an image), run by bash with
    the stand-ins first on PATH: the exit, the local scratch and the srun/sbcast calls.
    ``ll=False``: the nodes have no squashfuse_ll (neither the stand-in nor this
    machine's)."""
    bin_dir, local = tmp_path / "bin", tmp_path / "local"
    bin_dir.mkdir()
    local.mkdir()
    for name, text in DATA_FAKES.items():
        if name == "squashfuse_ll" and not ll:
            continue
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    path = os.environ["PATH"] if ll else without("squashfuse_ll", tmp_path / "sys")
    img, data = tmp_path / "img.sif", tmp_path / "d.sqfs"
    img.write_bytes(b"\0" * (1 << 20))  # 1 MiB
    data.write_bytes(b"hsqs" + b"\0" * ((3 << 20) - 4))  # 3 MiB
    req = JobRequest.of(nodes=2, gpus=0, data=str(data), stage_data=True,
                     **({"image": str(img), "stage_image": True, "command": ("true",)} if image
                        else {"no_image": True, "command": ("sh", "-c", NATIVE_RANK)}))
    plan = build_plan(profile(local=str(local)), req)
    stage_job_scripts(plan, tmp_path)
    log = tmp_path / "log"
    env = {**os.environ, "PATH": f"{bin_dir}:{path}", "FAKE_LOG": str(log),
           "FAKE_NODES": " ".join(free_kib), "SLURM_JOB_ID": "78",
           "SLURM_JOB_NUM_NODES": str(len(free_kib)), "SLURM_JOB_NODELIST": ",".join(free_kib),
           **{f"FAKE_FREE_{n}": str(k) for n, k in free_kib.items()}}
    res = subprocess.run(["bash", "-c", plan.script], capture_output=True, text=True, env=env,
                         timeout=60, cwd=tmp_path)
    return res, local, log.read_text() if log.exists() else "", plan


def test_in_the_image_both_are_staged_and_removed(tmp_path: Path) -> None:
    res, local, log, _ = run_staged(tmp_path, {"f1": 1 << 20, "f2": 1 << 20}, image=True)
    assert res.returncode == 0, res.stdout + res.stderr
    img, data = f"{local}/hpcdl-78-img.sif", f"{local}/hpcdl-78-data-d.sqfs"
    assert f"sbcast --compress --force {tmp_path}/img.sif {img}" in log
    assert f"sbcast --compress --force {tmp_path}/d.sqfs {data}" in log
    ranks = [line for line in res.stdout.splitlines() if line.startswith("rank on")]
    assert ranks == [f"rank on {n} runs {img} with data {data} ({3 << 20} bytes)"
                     for n in ("f1", "f2")]
    assert f"rm -f {img} {data}" in log and not list(local.iterdir())  # the EXIT trap


@pytest.mark.parametrize("ll", [True, False])
def test_natively_the_copy_is_mounted_then_unmounted_and_removed(
        tmp_path: Path, ll: bool) -> None:
    # squashfuse_ll where a node has it, else squashfuse: each node says which.
    res, local, log, _ = run_staged(tmp_path, {"f1": 1 << 20, "f2": 1 << 20}, image=False,
                                    ll=ll)
    assert res.returncode == 0, res.stdout + res.stderr
    data = f"{local}/hpcdl-78-data-d.sqfs"
    ranks = [line for line in res.stdout.splitlines() if line.startswith("rank on")]
    assert ranks == [f"rank on {n} reads {data} ({3 << 20} bytes) at {local}/hpcdl-data-78"
                     for n in ("f1", "f2")], res.stdout + res.stderr
    mounter = "squashfuse_ll" if ll else "squashfuse"
    said = [line for line in res.stdout.splitlines() if " mounts the dataset with " in line]
    assert said == [f"hpcdl: node {n} mounts the dataset with {mounter}"
                    for n in ("f1", "f2")], res.stdout
    mounts = [line for line in log.splitlines() if line.startswith("squashfuse")]
    assert mounts == [f"{mounter} -f {data} {local}/hpcdl-data-78"] * 2, log
    assert f"rm -f {data}" in log and not list(local.iterdir())


@pytest.mark.parametrize("image", [True, False])
def test_a_node_without_room_for_the_dataset_stops_the_job_in_one_line(
        tmp_path: Path, image: bool) -> None:
    # Room for the 1 MiB image on f2, not for the 3 MiB dataset.
    res, local, log, _ = run_staged(tmp_path, {"f1": 1 << 20, "f2": 2048}, image=image)
    assert res.returncode == 1
    errors = [line for line in res.stderr.splitlines() if line.strip()]
    assert errors == [f"hpcdl: dataset staging: no room for {tmp_path}/d.sqfs (3 MiB) in "
                      f"{local} on f2 (2 MiB free); no rank was started"], res.stderr
    assert "d.sqfs" not in "".join(line for line in log.splitlines() if "sbcast" in line)
    assert "rank on" not in res.stdout and "squashfuse" not in log
    assert not list(local.iterdir())  # the image's copy too


# ---- the warning at submit -----------------------------------------------------------

def tree(root: Path, files: int) -> Path:
    for i in range(files):
        path = root / "train" / f"c{i % 3}" / f"{i}.JPEG"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
    return root


def test_count_files_stops_at_the_limit(tmp_path: Path) -> None:
    tree(tmp_path, 12)
    assert count_files(tmp_path, 100) == 12
    assert count_files(tmp_path, 5) == 5
    assert MANY_FILES == 10_000


def decided(prof: Any, req: JobRequest) -> DataPart:
    """The data part build_plan decides for ``req`` (what many_files_warning reads)."""
    return decide_data(prof.paths.imagenet, req.data)


def test_a_crowded_tree_on_a_shared_path_is_warned_about_once(tmp_path: Path) -> None:
    root = tree(tmp_path / "inet", 6)
    shared = profile().model_copy(update={"paths": profile().paths.model_copy(
        update={"shared": [str(tmp_path)]})})
    req = JobRequest.of(nodes=1, gpus=0, no_image=True, data=str(root))
    assert many_files_warning(shared, decided(shared, req), limit=5) == (
        f"data: {root} is a directory tree of more than 5 files on a shared path: every rank "
        f"opens each of them every epoch through the filesystem's metadata servers; pack it "
        f"once and pass the file: hpcdl data pack {root} -o {root}.sqfs")
    assert many_files_warning(shared, decided(shared, req), limit=6) is None  # not more than the limit
    # Not for --synthetic, a packed file, a tree off the shared paths.
    assert many_files_warning(shared, decided(shared, JobRequest.of(nodes=1, gpus=0, synthetic=True)),
                              limit=1) is None
    sqfs = tmp_path / "inet.sqfs"
    sqfs.write_bytes(b"hsqs")
    assert many_files_warning(shared, decided(shared, JobRequest.of(nodes=1, gpus=0, data=str(sqfs))),
                              limit=0) is None
    elsewhere = profile().model_copy(update={"paths": profile().paths.model_copy(
        update={"shared": ["/nowhere"]})})
    assert many_files_warning(elsewhere, decided(elsewhere, req), limit=1) is None


def test_the_warning_is_one_line_at_submit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    from click.testing import CliRunner

    from hpcdl.cli import cli
    from hpcdl.jobs import preflight

    root = tree(tmp_path / "inet", 4)
    prof = tmp_path / "p.yaml"
    data = profile().model_dump(mode="json", exclude_none=True)
    data.update(name="wide", paths={**data["paths"], "shared": [str(tmp_path)]})
    prof.write_text(json.dumps(data))
    monkeypatch.setattr(preflight, "MANY_FILES", 3)
    monkeypatch.setattr(preflight.many_files_warning, "__kwdefaults__", {"limit": 3})
    res = CliRunner().invoke(cli, ["submit", "-p", str(prof), "-N", "1", "-G", "0",
                                   "--no-image", "--data", str(root), "--dry-run",
                                   "--run-dir", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    warned = [line for line in res.output.splitlines() if line.startswith("warning: data:")]
    assert warned == [f"warning: data: {root} is a directory tree of more than 3 files on a "
                      f"shared path: every rank opens each of them every epoch through the "
                      f"filesystem's metadata servers; pack it once and pass the file: hpcdl "
                      f"data pack {root} -o {root}.sqfs"]


def test_odd_dataset_names_stay_one_quoted_word() -> None:
    data = "/scratch/my data/it's $(reboot).sqfs"
    plan = build_plan(profile(local="/local dir/$HOME"), JobRequest.of(
        nodes=2, gpus=0, no_image=True, data=data, stage_data=True, command=("true",)))
    assert ("hpcdl_stage dataset '/scratch/my data/it'\"'\"'s $(reboot).sqfs' "
            "'/local dir/$HOME/hpcdl-'\"$SLURM_JOB_ID\"'-data-it'\"'\"'s $(reboot).sqfs' "
            "'/local dir/$HOME'\n") in plan.script
    subprocess.run(["bash", "-n"], input=plan.script, text=True, check=True, timeout=30)


PACKED_DEFAULT = "/scratch/data/imagenet.sqfs"


@pytest.mark.parametrize("kw,expected", [
    # The bundled example reads --data, else the profile's paths.imagenet.
    ({"data": "/scratch/data/x"}, ("example", "/scratch/data/x", "--data", None)),
    ({}, ("example", PACKED_DEFAULT, "profile paths.imagenet", PACKED_DEFAULT)),
    # --synthetic: generated data, whatever the profile names.
    ({"synthetic": True}, ("example", None, None, None)),
    # A COMMAND reads only its own --data (mounted when packed), never the profile's.
    ({"command": ("true",)}, ("command", None, None, None)),
    ({"command": ("true",), "data": "/scratch/d.sqfs"},
     ("command", "/scratch/d.sqfs", "--data", "/scratch/d.sqfs")),
    # The probe job reads no dataset, even one given.
    ({"probe": ("--sizes", "4K"), "data": "/scratch/d.sqfs"}, ("probe", None, None, None)),
])
def test_the_dataset_is_decided_once_and_recorded(kw: dict[str, Any],
                                                  expected: tuple[Any, ...]) -> None:
    prof = load_profile("sandbox")
    prof = prof.model_copy(update={"paths": prof.paths.model_copy(
        update={"imagenet": PACKED_DEFAULT})})
    plan = build_plan(prof, JobRequest.of(nodes=2, gpus=1, run_dir="/scratch/runs/d1", **kw))
    data = plan.data
    assert (data.reader, data.source, data.origin, data.packed) == expected
    assert plan.to_dict()["data"] == data.to_dict()
    # What the example is told is what was decided: the mount of a packed file, the
    # directory of a tree, or --synthetic.
    if data.reader == "example":
        line = plan.launch.launch_line
        assert ("--synthetic" in line.split()) == data.generated
        assert ("--data /scratch/data/x" in line) == (data.source == "/scratch/data/x")
        assert ('--data "$HPCDL_DATA"' in line) == (data.packed is not None)
