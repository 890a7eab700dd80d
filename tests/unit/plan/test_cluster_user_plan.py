"""What a cluster user's job is planned with: the job-side files staged into the run
directory (never bound from the install), the paths the compute nodes share, and what
an unprivileged container runtime needs."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pydantic
import pytest

from hpcdl.container.runtime import RuntimeFacts
from hpcdl.core.resources import PACKAGE_DIR
from hpcdl.errors import ValidationError
from hpcdl.jobs.preflight import runtime_mode
from hpcdl.launch.staging import job_side_files, source_of, stage
from hpcdl.plan import JobRequest, build_plan, on_shared_path
from hpcdl.profiles import load_profile
from hpcdl.profiles.schema import Profile

IMAGE = "/scratch/images/cpu.sif"
RUN = "/scratch/runs/r1"


def test_the_job_side_files_are_the_examples_and_the_stdlib_modules_they_import() -> None:
    files = job_side_files()
    assert "examples/resnet50_imagenet.py" in files and "examples/trainkit/loop.py" in files
    assert "hpcdl/jobside/probe_worker.py" in files and "hpcdl/jobside/world.py" in files
    assert "hpcdl/jobside/protocol.py" in files and "hpcdl/__init__.py" in files
    # The hpcdl files are the job-side package (its __init__ included), and the top
    # package's __init__: nothing of the planning side travels. The hang watchdog's two
    # modules only with a watchdog (--hang-timeout): whole then.
    jobside = {f"hpcdl/jobside/{p.name}" for p in (PACKAGE_DIR / "jobside").glob("*.py")}
    watchdog = {"hpcdl/jobside/hangwatch.py", "hpcdl/jobside/hangdiag.py"}
    assert {f for f in files if f.startswith("hpcdl/")} == {"hpcdl/__init__.py"} | jobside - watchdog
    assert set(job_side_files(watchdog=True)) == set(files) | watchdog
    assert not {"hpcdl/plan/build.py", "hpcdl/cli/__init__.py", "hpcdl/profiles/schema.py"} & set(files)
    assert all(source_of(f).is_file() for f in files)


def test_the_staged_modules_import_with_the_standard_library_alone(tmp_path: Path) -> None:
    files = job_side_files(watchdog=True)
    copied = stage(tmp_path, files)
    job = tmp_path / "job"
    assert copied == sum((job / f).stat().st_size for f in files)
    assert {p.relative_to(job).as_posix() for p in job.rglob("*.py")} == set(files)
    modules = sorted(f[:-3].replace("/", ".").removesuffix(".__init__") for f in files
                     if f.startswith("hpcdl/") and "jobside/probe_worker" not in f)
    # -S: no site-packages at all (no pydantic, yaml, jinja2, torch): stdlib + the copy.
    code = (f"import sys; sys.path.insert(0, {str(job)!r}); "
            f"import {', '.join(modules)}; "
            "import hpcdl; assert hpcdl.__file__.startswith(sys.path[0]), hpcdl.__file__; "
            "print('ok')")
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    assert (job / "hpcdl" / "jobside" / "errors.py").stat().st_mode & 0o777 == 0o644
    with pytest.raises(FileExistsError):  # a run directory is staged once
        stage(tmp_path, job_side_files())
    assert [p.name for p in tmp_path.iterdir()] == ["job"]  # no temporary left behind


def test_the_plans_sh_files_are_staged_executable_beside_the_copy(tmp_path: Path) -> None:
    plan = build_plan(load_profile("sandbox"), JobRequest.of(nodes=2, gpus=4, run_dir=str(tmp_path)))
    copied = stage(tmp_path, plan.files.job_files, plan.files.job_scripts)
    for path, text in plan.job_script_paths():
        assert Path(path).read_text() == text and Path(path).stat().st_mode & 0o777 == 0o755
        assert path.startswith(f"{tmp_path}/job/bin/")
    assert copied == sum(f.stat().st_size for f in (tmp_path / "job").rglob("*") if f.is_file())
    # The rank wrapper runs from there as the script runs it: the variables, then COMMAND.
    out = subprocess.run(["/bin/sh", f"{tmp_path}/job/bin/hpcdl-rank-env", "sh", "-c",
                          'echo "$RANK/$WORLD_SIZE $LOCAL_RANK/$LOCAL_WORLD_SIZE $HPCDL_RANK_FROM"'],
                         env={"PATH": "/usr/bin:/bin", "SLURM_PROCID": "5", "SLURM_NTASKS": "8",
                              "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_NNODES": "2",
                              "SLURM_TASKS_PER_NODE": "4(x2)"},
                         capture_output=True, text=True, timeout=30)
    assert out.stdout == "5/8 1/4 slurm\n", out.stderr


@pytest.mark.parametrize("rel", ["../x", "/bin/x", "bin/../../x"])
def test_a_script_path_that_leaves_job_is_refused_and_nothing_staged(tmp_path: Path,
                                                                    rel: str) -> None:
    with pytest.raises(ValueError, match="not a job-side script path"):
        stage(tmp_path, (), (("bin/ok", "#!/bin/sh\n"), (rel, "#!/bin/sh\n")))
    assert list(tmp_path.iterdir()) == []  # all or nothing: no job/, no temporary


def test_an_image_run_binds_the_run_directorys_copy_not_the_install() -> None:
    plan = build_plan(load_profile("sandbox"), JobRequest.of(nodes=2, gpus=4, image=IMAGE,
                                                          run_dir=RUN))
    assert f"-B {RUN}/job:/hpcdl:ro" in plan.launch.launch_line
    assert str(PACKAGE_DIR) not in plan.script
    assert "python3 /hpcdl/examples/resnet50_imagenet.py" in plan.launch.launch_line
    assert plan.container.binds[-2:] == (RUN, f"{RUN}/job:/hpcdl:ro")  # what the launch line binds
    assert plan.files.job_files == job_side_files()
    assert f"export HPCDL_RUN_DIR={RUN}\n" in plan.script


def test_a_native_run_reads_the_copy_through_pythonpath() -> None:
    plan = build_plan(load_profile("sandbox"), JobRequest.of(nodes=1, gpus=1, run_dir=RUN))
    assert f"python3 {RUN}/job/examples/resnet50_imagenet.py" in plan.launch.launch_line
    assert f"export PYTHONPATH={RUN}/job${{PYTHONPATH:+:$PYTHONPATH}}\n" in plan.script
    assert str(PACKAGE_DIR) not in plan.script
    probe = build_plan(load_profile("sandbox"), JobRequest.of(nodes=2, gpus=1, run_dir=RUN,
                                                           probe=("--sizes", "4K")))
    assert f"python3 {RUN}/job/hpcdl/jobside/probe_worker.py --sizes 4K" in probe.launch.launch_line


def test_a_users_command_finds_the_copy_but_not_on_its_path() -> None:
    plan = build_plan(load_profile("sandbox"), JobRequest.of(nodes=1, gpus=1, run_dir=RUN,
                                                          command=("python3", "t.py")))
    assert f"export HPCDL_RUN_DIR={RUN}\n" in plan.script
    assert "PYTHONPATH" not in plan.script


@pytest.mark.parametrize("field, request_kw, path", [
    ("--run-dir", {"run_dir": "/opt/runs/x"}, "/opt/runs/x"),
    ("--run-dir", {"run_dir": "/scratch/../root/x"}, "/scratch/../root/x"),
    ("--image", {"image": "/var/cache/hpcdl/images/cpu.sif"}, "/var/cache/hpcdl/images/cpu.sif"),
    ("--bind", {"binds": ("/work/data:/data",), "image": IMAGE}, "/work/data"),
    ("--data", {"data": "/var/tmp/imagenet"}, "/var/tmp/imagenet"),
])
def test_what_the_nodes_cannot_see_is_one_line(field: str, request_kw: dict, path: str) -> None:
    with pytest.raises(ValidationError) as err:
        build_plan(load_profile("sandbox"), JobRequest.of(nodes=1, gpus=1, **request_kw))
    assert err.value.message == (f"{field}: {path} is not on a path the compute nodes share "
                                 "(profile sandbox: paths.shared = /home, /scratch): the nodes "
                                 "cannot see it")


def test_shared_paths_and_what_is_not_checked() -> None:
    assert on_shared_path("/scratch", ["/scratch"]) and on_shared_path("/home/u/r", ["/home"])
    assert not on_shared_path("/scratchy/x", ["/scratch"])
    sandbox = load_profile("sandbox")
    # In a container --data is the container's own path (a bind brings it).
    build_plan(sandbox, JobRequest.of(nodes=1, gpus=1, image=IMAGE, data="/imagenet",
                                   binds=("/scratch/imagenet:/imagenet",)))
    # A profile that names no shared paths checks nothing (the bundled real clusters).
    build_plan(load_profile("neuron"), JobRequest.of(nodes=1, gpus=1, run_dir="/anywhere/r"))


FACTS = RuntimeFacts(euid=1000, runtime="apptainer", runtime_path="/usr/bin/apptainer",
                     allow_setuid=True, max_user_namespaces=1000, squashfuse="/usr/bin/squashfuse",
                     unsquashfs="/usr/bin/unsquashfs", fuse_mode="0666")


def test_the_runtime_mode_on_this_host_decides_the_plans() -> None:
    assert runtime_mode(None, facts=FACTS) == (None, None)
    assert runtime_mode(IMAGE, facts=FACTS) == ("unprivileged", None)
    assert runtime_mode(IMAGE, facts=dataclasses.replace(FACTS, euid=0)) == ("root", None)
    setuid = dataclasses.replace(FACTS, suid_starter="/s", suid_starter_owner=0,
                                 suid_starter_setuid=True)
    assert runtime_mode(IMAGE, facts=setuid) == ("setuid", None)
    assert runtime_mode(IMAGE, facts=dataclasses.replace(FACTS, runtime=None)) == (None, None)
    mode, warning = runtime_mode(IMAGE, facts=dataclasses.replace(
        FACTS, fuse_mode="0600", fuse_error="Permission denied"))
    assert mode == "unprivileged" and warning and "/dev/fuse is 0600" in warning
    assert "hpcdl doctor" in warning


def test_unprivileged_ranks_get_what_mpi_needs_and_others_nothing() -> None:
    sandbox = load_profile("sandbox")
    req = JobRequest.of(nodes=2, gpus=4, image=IMAGE, run_dir=RUN)
    plan = build_plan(sandbox, req, runtime_mode="unprivileged")
    assert plan.container.mode == "unprivileged"
    assert "export OMPI_MCA_btl_vader_single_copy_mechanism=none\n" in plan.script
    assert "export PMIX_MCA_gds=hash\n" in plan.script
    for mode in ("setuid", "root", None):
        other = build_plan(sandbox, req, runtime_mode=mode)
        assert other.container.mode == mode and "single_copy" not in other.script
    native = build_plan(sandbox, req.amended(image=None), runtime_mode="unprivileged")
    assert native.container.mode is None and "single_copy" not in native.script
    # What the user sets wins; a profile that says how its nodes run wins over detection.
    mine = build_plan(sandbox, req.amended(
        env=(("OMPI_MCA_btl_vader_single_copy_mechanism", "cma"),)), runtime_mode="unprivileged")
    assert dict(mine.launch.env)["OMPI_MCA_btl_vader_single_copy_mechanism"] == "cma"
    site = sandbox.model_copy(update={"container": sandbox.container.model_copy(
        update={"mode": "setuid"})})
    assert build_plan(site, req, runtime_mode="unprivileged").container.mode == "setuid"


@pytest.mark.parametrize("run_dir", ["/scratch/runs/a:b", "/scratch/runs/a,b"])
def test_a_run_directory_that_cannot_be_a_bind_source_is_refused(run_dir: str) -> None:
    """The run directory (and its job/) is bound into the container: a ':' would start
    the bind's destination, a ',' another bind."""
    with pytest.raises(ValidationError) as err:
        build_plan(load_profile("sandbox"), JobRequest.of(nodes=1, gpus=1, image=IMAGE,
                                                       run_dir=run_dir))
    assert err.value.message.startswith(f"run-dir: {run_dir!r} is not a path usable as a bind "
                                        "source (no ':' or ',')")


def test_node_local_scratch_must_be_a_bind_source() -> None:
    sandbox = load_profile("sandbox").model_dump(mode="json")
    sandbox["paths"]["local_scratch"] = "/local:/etc"
    with pytest.raises(pydantic.ValidationError, match="bind source"):
        Profile.model_validate(sandbox)
