"""The validation matrix: what each request against each limit turns into."""

from __future__ import annotations

import pytest

from hpcdl.errors import ValidationError
from hpcdl.launch.rankenv import rank_env_script
from hpcdl.plan import JobRequest, build_plan, choose_partition
from hpcdl.profiles import load_profile
from hpcdl.profiles.schema import Profile
from hpcdl.schedulers.base import SubmitOptions
from hpcdl.schedulers.pbs.script import walltime
from hpcdl.schedulers.slurm.adapter import SlurmScheduler
from hpcdl.schedulers.slurm.script import slurm_time


@pytest.fixture(scope="module")
def neuron():
    return load_profile("neuron")


@pytest.fixture(scope="module")
def sandbox():
    return load_profile("sandbox")


def refused(profile, **kw) -> str:
    with pytest.raises(ValidationError) as err:
        build_plan(profile, JobRequest.of(**kw))
    assert err.value.exit_code == 2
    assert "\n" not in err.value.message  # one line
    return err.value.message


def test_two_by_four_on_neuron_picks_smallest_4gpu_partition(neuron):
    plan = build_plan(neuron, JobRequest.of(nodes=2, gpus=4))
    assert plan.spec.partition.name == "cas_v100nv_4"
    assert plan.partition_reason.startswith("smallest partition that fits")
    assert (plan.spec.ntasks, plan.spec.tasks_per_node, plan.spec.cpus_per_task) == (8, 4, 10)
    assert "#SBATCH --gres=gpu:4" in plan.script
    assert "#SBATCH --comment=pytorch" in plan.script


def test_eight_gpus_goes_to_an_eight_gpu_partition(neuron):
    assert build_plan(neuron, JobRequest.of(nodes=2, gpus=8)).spec.partition.name == "cas_v100nv_8"
    assert build_plan(neuron, JobRequest.of(nodes=6, gpus=8)).spec.partition.name == "amd_a100nv_8"


def test_gpus_over_partition(neuron):
    msg = refused(neuron, nodes=2, gpus=9, partition="amd_a100nv_8")
    assert msg == ("gpus: 9 GPUs per node exceeds partition amd_a100nv_8's 8 GPUs per node "
                   "(partitions that fit: none)")


def test_gpus_over_every_partition(neuron):
    # Names the largest nodes that exist and where, not the closest partition's 4 GPUs.
    msg = refused(neuron, nodes=1, gpus=9)
    assert msg == ("gpus: 9 GPUs per node exceeds the largest nodes of profile neuron, "
                   "8 GPUs per node (partitions cas_v100nv_8, amd_a100nv_8)")


@pytest.mark.parametrize("word", ["infinite", "UNLIMITED"])
def test_unlimited_time_is_checked_against_the_partition(neuron, word):
    msg = refused(neuron, nodes=1, gpus=4, time=word, partition="cas_v100_4")
    assert msg == ("time: infinite exceeds partition cas_v100_4's max time 2-00:00:00 "
                   "(partitions that fit: none)")


def test_unlimited_time_fits_an_unlimited_partition():
    profile = Profile.model_validate({
        "name": "t", "partitions": [
            {"name": "short", "nodes": 1, "gpus_per_node": 0, "cpus_per_node": 4, "max_time": "1:00:00"},
            {"name": "long", "nodes": 1, "gpus_per_node": 0, "cpus_per_node": 4, "max_time": "UNLIMITED"},
        ]})
    plan = build_plan(profile, JobRequest.of(time="infinite", command=("true",)))
    assert (plan.spec.partition.name, plan.time) == ("long", "infinite")


def test_nodes_over_max(neuron):
    msg = refused(neuron, nodes=99, gpus=4)
    assert msg.startswith("nodes: 99 exceeds partition cas_v100_4's limit of 15 nodes per job")


def test_nodes_over_named_partition_lists_those_that_fit(neuron):
    msg = refused(neuron, nodes=3, gpus=4, partition="amd_a100_4")
    assert msg.startswith("nodes: 3 exceeds partition amd_a100_4's limit of 2 nodes per job")
    assert "(partitions that fit: cas_v100nv_8, cas_v100nv_4, cas_v100_4, amd_a100nv_8)" in msg


def test_time_over_max(sandbox):
    msg = refused(sandbox, nodes=1, gpus=1, partition="short", time="00:06:00")
    assert msg.startswith("time: 00:06:00 exceeds partition short's max time 00:05:00")
    assert "partitions that fit: debug, gpu" in msg


def test_time_picks_a_partition_that_allows_it(sandbox):
    assert build_plan(sandbox, JobRequest.of(nodes=1, gpus=1, time="1:00:00")).spec.partition.name == "gpu"
    assert build_plan(sandbox, JobRequest.of(nodes=1, gpus=1)).spec.partition.name == "debug"


def test_cpus_times_tasks_over_node(sandbox):
    msg = refused(sandbox, nodes=1, gpus=4, cpus_per_task=3, partition="debug")
    assert msg.startswith("cpus-per-task: 3 x 4 tasks per node = 12 exceeds partition debug's 8 CPUs")


def test_per_user_gpu_limit(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(
        "name: limited\npartitions:\n"
        '  - {name: g4, nodes: 4, gpus_per_node: 4, cpus_per_node: 16, max_time: "1:00:00", '
        "max_gpus_per_user: 8}\n"
    )
    prof = load_profile(str(path))
    assert build_plan(prof, JobRequest.of(nodes=2, gpus=4)).spec.ntasks == 8  # exactly the limit
    msg = refused(prof, nodes=3, gpus=4)
    assert msg.startswith("gpus: 3 nodes x 4 GPUs = 12 exceeds partition g4's per-user limit of 8 GPUs")


def test_unknown_partition(neuron):
    msg = refused(neuron, nodes=1, gpus=1, partition="gpu")
    assert msg.startswith("partition: 'gpu' is not a partition of profile neuron (partitions: cas_v100nv_8")


@pytest.mark.parametrize(
    ("kw", "start"),
    [
        ({"nodes": 0, "gpus": 1}, "nodes: must be at least 1 (got 0)"),
        ({"nodes": 1, "gpus": -1}, "gpus: must be 0 or more"),
        ({"nodes": 1, "gpus": 1, "cpus_per_task": 0}, "cpus-per-task: must be at least 1"),
        ({"nodes": 1, "gpus": 1, "time": "tomorrow"}, "time: 'tomorrow' is not a Slurm time"),
        ({"nodes": 1, "gpus": 1, "backend": "mpi"}, "backend: 'mpi' is not one of horovod, ddp"),
        ({"nodes": 1, "gpus": 1, "job_name": "a\nb"}, "job-name: control characters"),
        ({"nodes": 1, "gpus": 1, "job_name": "  "}, "job-name: must not be empty"),
        ({"nodes": 1, "gpus": 1, "env": (("1BAD", "x"),)}, "env: '1BAD' is not a valid variable name"),
        ({"nodes": 1, "gpus": 1, "binds": ("a,b",)}, "bind: 'a,b' is not SRC[:DST]"),
    ],
)
def test_malformed_values(sandbox, kw, start):
    assert refused(sandbox, **kw).startswith(start)


def test_default_time_is_clipped_to_partition(sandbox):
    plan = build_plan(sandbox, JobRequest.of(nodes=1, gpus=1, partition="short"))
    assert plan.time == "00:05:00"


def test_the_plan_carries_seconds_and_each_dialect_spells_them(sandbox):
    # --time is parsed once (the request); the plan holds seconds, plan.json keeps its
    # "time" text in its place, and the Slurm and PBS dialects each format the seconds.
    plan = build_plan(sandbox, JobRequest.of(nodes=1, gpus=1, time="62:03", command=("true",)))
    assert plan.spec.time_seconds == 3723 and plan.time == "01:02:03"
    data = plan.to_dict()
    keys = list(data)
    assert data["time"] == "01:02:03" and "time_seconds" not in data
    assert keys[keys.index("cpus_per_task") + 1] == "time"
    assert "#SBATCH --time=01:02:03" in plan.script
    assert slurm_time(93780) == "1-02:03:00" and slurm_time(None) == "infinite"
    assert walltime(93780) == "26:03:00"
    with pytest.raises(ValidationError, match="PBS needs a finite walltime"):
        walltime(None)


def test_choose_partition_prefers_default_on_ties(sandbox):
    part, reason = choose_partition(sandbox, JobRequest.of(nodes=2, gpus=4).placement)
    assert part.name == "debug"
    assert "candidates: debug, gpu" in reason


def test_cpu_only_job_runs_one_task_per_node(neuron):
    plan = build_plan(neuron, JobRequest.of(nodes=2, gpus=0))
    assert plan.spec.partition.name == "skl"
    assert plan.spec.tasks_per_node == 1
    assert "--gres" not in plan.script


def test_pbs_profile_warns(tmp_path):
    plan = build_plan(load_profile("polaris"), JobRequest.of(nodes=2, gpus=4))
    assert plan.spec.profile.scheduler.type == "pbs"
    assert any("does not submit it" in w for w in plan.warnings)
    # PBS Pro's own launcher, not the Slurm one the profile's mpi section names.
    assert ('mpiexec -n 8 --ppn 4 --depth 8 --cpu-bind depth /bin/sh -c "${HPCDL_RANK_ENV:?}" '
            'hpcdl-rank-env python3 ') in plan.script
    assert '-np "$SLURM_NTASKS"' not in plan.script


def test_plan_json_roundtrip(sandbox):
    plan = build_plan(sandbox, JobRequest.of(nodes=2, gpus=4, env=(("A", "1"),)))
    data = plan.to_dict()
    assert data["ntasks"] == 8 and data["env"]["A"] == "1" and data["script"] == plan.script
    slurm = SlurmScheduler()
    assert slurm.submit_argv("/scratch/r/job.sbatch", plan.spec.job_name) == [
        "sbatch", "--parsable", f"--job-name={plan.spec.job_name}", "/scratch/r/job.sbatch"]
    assert slurm.submit_argv("/scratch/r/job.sbatch", plan.spec.job_name,
                             SubmitOptions(one_at_a_time=True, after="41"))[-4:] == [
        f"--job-name={plan.spec.job_name}", "--dependency=singleton", "--dependency=afterany:41",
        "/scratch/r/job.sbatch"]


def test_example_args_follow_the_bundled_example(sandbox):
    plan = build_plan(sandbox, JobRequest.of(nodes=1, gpus=1, example_args=("--arch=resnet18", "a b")))
    assert plan.launch.command[-2:] == ("--arch=resnet18", "a b")
    # After the profile's example defaults (tests/unit/plan/test_example_defaults.py).
    assert plan.launch.launch_line.endswith(" --num-classes=10 --arch=resnet18 'a b'")
    assert refused(sandbox, nodes=1, gpus=1, example_args=("-x",), command=("true",)).startswith(
        "example-arg: only applies to the bundled example")


def test_run_dir_holds_logs_and_checkpoints_and_is_bound(sandbox):
    plan = build_plan(sandbox, JobRequest.of(nodes=2, gpus=2, image="/scratch/i.sif", run_dir="/scratch/r/run1"))
    assert "#SBATCH --output=/scratch/r/run1/slurm-%j.out" in plan.script
    at = plan.launch.command.index("--checkpoint-dir")
    assert plan.launch.command[at + 1] == "/scratch/r/run1/checkpoints"
    assert "-B /var/lib/hpcdl-sandbox/tmp -B /scratch -B /local -B /scratch/r/run1 -B " in plan.launch.launch_line


# --- bring your own workload: launchers, images, rendezvous variables ---------------

def test_every_rank_starts_through_the_rank_env_wrapper(sandbox):
    plan = build_plan(sandbox, JobRequest.of(nodes=2, gpus=2, command=("python3", "t.py")))
    assert plan.launch.launch_line == ('srun --label --kill-on-bad-exit=1 --mpi=pmix /bin/sh '
                                './job/bin/hpcdl-rank-env python3 t.py')
    # The wrapper is a file of the run (./job without a run directory), not in the script.
    assert "HPCDL_RANK_ENV" not in plan.script
    assert dict(plan.files.job_scripts)["bin/hpcdl-rank-env"] == "#!/bin/sh\n" + rank_env_script()
    in_run = build_plan(sandbox, JobRequest.of(nodes=2, gpus=2, command=("python3", "t.py"),
                                            run_dir="/scratch/runs/a b"))
    assert in_run.launch.launch_line.endswith(" /bin/sh '/scratch/runs/a b/job/bin/hpcdl-rank-env' "
                                       "python3 t.py")
    assert ("MASTER_PORT=$(/bin/sh '/scratch/runs/a b/job/bin/hpcdl-master-port')"
            in in_run.script.splitlines())
    assert [p for p, _ in in_run.job_script_paths()] == [
        "/scratch/runs/a b/job/bin/hpcdl-rank-env", "/scratch/runs/a b/job/bin/hpcdl-master-port"]
    assert (plan.launch.launcher, plan.launch.gpu_bind, plan.container.image) == ("srun", "none", None)
    # The sandbox's node names resolve (a network namespace each): MASTER_ADDR is the
    # allocation's first node, as on a real cluster; the port follows the job id.
    assert plan.launch.master_addr == '"$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"'
    assert plan.launch.master_port == "$((15000 + SLURM_JOB_ID % 15000))"
    assert "127.0.0.1" not in plan.script


def test_master_addr_is_the_first_node_unless_set(neuron):
    plan = build_plan(neuron, JobRequest.of(nodes=2, gpus=2, command=("x",), no_image=True))
    assert ('\nexport MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"\n'
            in plan.script)
    mine = build_plan(neuron, JobRequest.of(nodes=2, gpus=2, command=("x",), no_image=True,
                                         env=(("MASTER_ADDR", "ib-n1"), ("MASTER_PORT", "1234"))))
    assert "scontrol show hostnames" not in mine.script and "SLURM_JOB_ID %" not in mine.script
    assert (mine.launch.master_addr, mine.launch.master_port) == ("ib-n1", "1234")


def test_torchrun_is_one_per_node_with_c10d_on_the_first(sandbox):
    plan = build_plan(sandbox, JobRequest.of(nodes=2, gpus=4, cpus_per_task=2, launcher="torchrun",
                                          command=("python3", "-u", "ddp.py", "--lr", "0.1")))
    assert plan.launch.launch_line == (
        'srun --label --kill-on-bad-exit=1 --nodes=2 --ntasks=2 --ntasks-per-node=1 '
        '--cpus-per-task=8 /bin/sh ./job/bin/hpcdl-rank-env python3 -m '
        'torch.distributed.run --nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d '
        '--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv-id="$SLURM_JOB_ID" --no-python '
        'python3 -u ddp.py --lr 0.1')
    assert "# - launcher torchrun: one torchrun per node" in plan.script
    wrapper = dict(plan.files.job_scripts)["bin/hpcdl-rank-env"]
    assert "PET_RDZV_CONF" in wrapper and "OMPI_COMM_WORLD_RANK" not in wrapper
    other = build_plan(sandbox, JobRequest.of(nodes=1, gpus=1, launcher="torchrun",
                                           command=("./train.sh",)))
    assert "python3 -m torch.distributed.run" in other.launch.launch_line  # the profile's python


def test_torchrun_refuses_the_bundled_example_on_horovod(sandbox):
    with pytest.raises(ValidationError, match="launcher: torchrun starts ranks without MPI"):
        build_plan(sandbox, JobRequest.of(nodes=2, gpus=2, launcher="torchrun"))
    plan = build_plan(sandbox, JobRequest.of(nodes=2, gpus=2, launcher="torchrun", backend="ddp"))
    assert "resnet50_imagenet.py --backend ddp" in plan.launch.launch_line


def test_mpirun_launcher_ignores_the_srun_profiles_arguments(sandbox):
    plan = build_plan(sandbox, JobRequest.of(nodes=2, gpus=2, launcher="mpirun", command=("x",)))
    assert plan.launch.launch_line.startswith('mpirun -np "$SLURM_NTASKS" /bin/sh ./job/bin/hpcdl-rank-env')


def test_default_image_and_no_image(neuron):
    plan = build_plan(neuron, JobRequest.of(nodes=1, gpus=2))
    image = neuron.container.default_image
    assert plan.container.image == image and plan.container.image_source == "profile default_image"
    assert f" {image} /bin/sh ./job/bin/hpcdl-rank-env" in plan.launch.launch_line
    assert "the profile's container.default_image; --image overrides" in plan.script
    # The bundled example comes from the host, read-only, whatever the image holds.
    assert "/examples:/hpcdl/examples:ro -B " in plan.launch.launch_line
    assert "--env PYTHONPATH=/hpcdl " in plan.launch.launch_line
    assert "python3 /hpcdl/examples/resnet50_imagenet.py" in plan.launch.launch_line
    native = build_plan(neuron, JobRequest.of(nodes=1, gpus=2, no_image=True))
    assert native.container.image is None and "singularity exec" not in native.launch.launch_line
    assert "/examples/resnet50_imagenet.py" in native.launch.launch_line
    mine = build_plan(neuron, JobRequest.of(nodes=1, gpus=2, image="/my.sif"))
    assert mine.container.image_source == "--image"
    with pytest.raises(ValidationError, match="no-image: --no-image and --image '/my.sif'"):
        build_plan(neuron, JobRequest.of(nodes=1, gpus=2, image="/my.sif", no_image=True))


def test_a_users_command_gets_no_project_binds(sandbox):
    plan = build_plan(sandbox, JobRequest.of(nodes=1, gpus=1, image="/scratch/i.sif", command=("x",)))
    assert ":/hpcdl/" not in plan.launch.launch_line and "PYTHONPATH" not in plan.launch.launch_line


def test_gpu_bind_is_documented_in_the_script(sandbox):
    narrow = build_plan(sandbox, JobRequest.of(nodes=1, gpus=4, gpu_bind="local-rank", command=("x",)))
    assert "# - GPUs: each rank sees one GPU, number LOCAL_RANK of its node's 4" in narrow.script
    assert "HPCDL_NODE_GPUS" in dict(narrow.files.job_scripts)["bin/hpcdl-rank-env"]
    keep = build_plan(sandbox, JobRequest.of(nodes=1, gpus=4, command=("x",)))
    assert "# - GPUs: every rank sees the 4 GPUs of its node and uses GPU LOCAL_RANK" in keep.script
    assert "HPCDL_NODE_GPUS" not in dict(keep.files.job_scripts)["bin/hpcdl-rank-env"]


@pytest.mark.parametrize(("kw", "message"), [
    ({"launcher": "ssh"}, "launcher: 'ssh' is not one of srun, torchrun, mpirun, horovodrun"),
    ({"gpu_bind": "all"}, "gpu-bind: 'all' is not one of none, local-rank"),
])
def test_bad_launch_values_are_refused(sandbox, kw, message):
    with pytest.raises(ValidationError, match=message):
        build_plan(sandbox, JobRequest.of(nodes=1, gpus=1, command=("x",), **kw))
