"""The launchers (hpcdl.schedulers.launchers), tested over the registry: every
registered launcher renders a job script whose launch line is its own command, is
accepted where its class says it can start the job, and refuses the rest with one line
naming the field and the value (the CLI: exit 2, nothing else printed). Also one job
script per launcher on the sandbox profile, kept as goldens beside the bundled
profiles' (tests/golden/sbatch/sandbox-launcher-*), so a launcher's script cannot drift
unseen; the bundled profiles' goldens all use their default launcher (srun, or mpiexec
under PBS).

Regenerate after an intended change with:
HPCDL_REGEN_GOLDEN=1 pytest tests/unit/schedulers/test_launchers.py, then read the diff.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import get_args

import pytest

from hpcdl.core.templating import shell_join
from hpcdl.errors import ValidationError
from hpcdl.plan import LAUNCHERS, JobRequest, build_plan
from hpcdl.profiles import load_profile
from hpcdl.profiles.schema import Launcher
from hpcdl.schedulers.launchers import REGISTRY, RankLauncher, Torchrun, launcher_for
from tests.unit.clirun import hpcdl
from tests.unit.plan.test_render_golden import GOLDEN, check_golden, job_files_text

SLURM_PROFILES = ["generic", "karolina", "neuron", "sandbox", "taurus"]
NAMES = sorted(REGISTRY)


def test_the_registry_holds_every_launcher_the_schema_and_the_cli_name():
    assert set(REGISTRY) == set(get_args(Launcher))
    assert LAUNCHERS == tuple(REGISTRY)  # check_request's and --launcher's order
    assert all(name == launcher.name for name, launcher in REGISTRY.items())
    for command in ("submit", "scale", "sweep"):
        assert f"--launcher [{'|'.join(REGISTRY)}]" in hpcdl(command, "--help").stdout, command


def test_an_unknown_name_is_refused_in_one_line_naming_it():
    with pytest.raises(ValidationError) as caught:
        launcher_for("mpiexec")
    assert str(caught.value) == ("launcher: 'mpiexec' is not one of srun, torchrun, mpirun, "
                                 "horovodrun")
    with pytest.raises(ValidationError, match="^launcher: 'bogus' is not one of"):
        build_plan(load_profile("sandbox"), JobRequest.of(launcher="bogus"))


def _plan(profile: str, name: str, **extra):
    req = JobRequest.of(nodes=2, gpus=2, launcher=name, backend="ddp",
                     command=("python3", "train.py"), run_dir="/scratch/runs/l1", **extra)
    return build_plan(load_profile(profile), req)


@pytest.mark.parametrize("profile", SLURM_PROFILES)
@pytest.mark.parametrize("name", NAMES)
def test_every_launcher_renders_its_own_command(profile, name):
    launcher = launcher_for(name)
    plan = _plan(profile, name)
    spec = plan.spec
    prefix = shell_join(launcher.tokens(spec))
    assert plan.launch.launcher == name
    assert plan.launch.launch_line.startswith(prefix + " ")
    assert plan.script.rstrip("\n").endswith(plan.launch.launch_line)
    # Between the rank-env wrapper and the command: the launcher's agent, if any.
    agent = launcher.agent_tokens(["python3", "train.py"], "python3", spec,
                                  job_id_word='"$SLURM_JOB_ID"')
    assert plan.launch.launch_line.endswith(
        "/bin/sh /scratch/runs/l1/job/bin/hpcdl-rank-env "
        + shell_join([*agent, "python3", "train.py"]))
    assert bool(agent) == launcher.per_node
    # srun starts a task per node for a per-node agent, a task per rank otherwise.
    if prefix.startswith("srun "):
        tasks = spec.nodes if launcher.per_node else spec.ntasks
        assert ("--ntasks" not in prefix) or f"--ntasks={tasks}" in prefix
    mpi = load_profile(profile).mpi.srun_mpi
    assert (f"--mpi={mpi}" in prefix) == bool(launcher.passes_srun_mpi and mpi)
    # The launch note says how ranks start; the script sets up what the launcher reads.
    assert f"# - {launcher.note(2)}" in plan.script.splitlines()
    for line in launcher.script_lines:
        assert line in plan.script.splitlines()
    for variable in re.findall(r"\$\{?(HPCDL_[A-Z_]+)", prefix):
        assert f"export {variable}=" in plan.script, (name, variable)


@pytest.mark.parametrize("name", NAMES)
def test_a_per_node_launcher_starts_the_wrapper_as_the_nodes_agent(name):
    # A task is a node's agent (its pid file is per node) or a rank; an agent's ranks
    # see all the node's GPUs even when --gpu-bind local-rank narrows a rank's to one.
    plan = _plan("sandbox", name, hang_timeout=30.0, gpu_bind="local-rank")
    wrapper = dict(plan.files.job_scripts)["bin/hpcdl-rank-env"]
    per_node = launcher_for(name).per_node
    assert ("node-$NODE_RANK" if per_node else "rank-$RANK") in wrapper
    gpus = "every rank sees the 2 GPUs" if per_node else "each rank sees one GPU"
    assert f"# - GPUs: {gpus}" in plan.script


def _refusal(profile: str, req: JobRequest) -> str | None:
    try:
        build_plan(load_profile(profile), req)
    except ValidationError as exc:
        message = str(exc)
        assert "\n" not in message
        return message
    return None


# What a launcher's class says it can start, and the request that asks for it: the
# probe as the job, spare nodes, the bundled example with --backend horovod, a PBS
# profile (where a launcher that needs a scheduler feature is refused).
CAPABILITIES = {
    "starts_probe": ("sandbox", JobRequest.of(nodes=2, gpus=0, probe=("--sizes", "4K"))),
    "takes_spares": ("sandbox", JobRequest.of(nodes=1, gpus=1, spares=1, backend="ddp",
                                           command=("python3", "train.py"))),
    "horovod_example": ("sandbox", JobRequest.of(nodes=2, gpus=1, backend="horovod")),
    "feature": ("polaris", JobRequest.of(nodes=2, gpus=1, command=("python3", "train.py"))),
}


def _can(launcher: RankLauncher, capability: str) -> bool:
    if capability == "horovod_example":
        return launcher.refusal(probe_only=False, runs_example=True, backend="horovod") is None
    if capability == "feature":
        return launcher.feature is None
    return bool(getattr(launcher, capability))


@pytest.mark.parametrize("capability", sorted(CAPABILITIES))
@pytest.mark.parametrize("name", NAMES)
def test_every_launcher_is_accepted_or_refused_as_its_class_says(name, capability):
    profile, req = CAPABILITIES[capability]
    req = req.amended(launcher=name)
    refused = _refusal(profile, req)
    if _can(launcher_for(name), capability):
        assert refused is None, refused
    else:  # one line: the field, then the launcher's name
        assert refused is not None and re.match(r"[a-z-]+: ", refused), refused
        assert name in refused


# What each launcher cannot start, as the user meets it: the classes must say so (the
# test above then checks that the plan refuses exactly that). srun starts everything.
CANNOT = {
    "srun": set(),
    "torchrun": {"starts_probe", "horovod_example", "feature"},
    "mpirun": {"starts_probe", "takes_spares"},
    "horovodrun": {"starts_probe", "takes_spares"},
}


def test_what_each_launcher_cannot_start():
    assert {name: {c for c in CAPABILITIES if not _can(launcher, c)}
            for name, launcher in REGISTRY.items()} == CANNOT


@pytest.mark.parametrize("name", [n for n in NAMES if not REGISTRY[n].takes_spares])
def test_the_cli_refuses_spares_for_a_launcher_without_a_node_list(name):
    res = hpcdl("submit", "-p", "sandbox", "-N", "1", "-G", "1", "--spares", "1",
                "--launcher", name, "--backend", "ddp", "--dry-run", "--", "python3", "t.py")
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr == (f"error: spares: launcher {name} starts ranks on every node of the "
                          f"allocation; spare nodes need srun or torchrun (--launcher srun)\n")


@pytest.mark.parametrize("command, python", [
    (["python3", "x.py"], "python3"),
    (["/opt/py/bin/python3.11", "-u", "x.py"], "/opt/py/bin/python3.11"),
    (["bash", "x.sh"], "/usr/bin/python3"),  # not a Python: the profile's runs the agent
])
def test_torchrun_runs_its_agent_with_the_commands_python(command, python):
    spec = replace(_plan("generic", "torchrun").spec, nodes=3, tasks_per_node=4)
    tokens = Torchrun().agent_tokens(command, "/usr/bin/python3", spec,
                                     job_id_word='"$SLURM_JOB_ID"')
    assert tokens[:3] == [python, "-m", "torch.distributed.run"]
    assert "--nnodes=3" in tokens and "--nproc-per-node=4" in tokens
    assert tokens[-1] == "--no-python"

# One request per launcher, and the two launchers that run on N of N+S nodes with a
# spare (srun's probe-first step included).
LAUNCHER_REQUESTS = {
    "srun-spares-probe-first": JobRequest.of(
        nodes=1, gpus=1, spares=1, probe=("--sizes", "4K"), probe_first=True,
        command=("python3", "train.py"), run_dir="/scratch/runs/s1", hang_timeout=20.0),
    "torchrun": JobRequest.of(nodes=2, gpus=2, launcher="torchrun", backend="ddp",
                           image="/scratch/images/x.sif", run_dir="/scratch/runs/t1"),
    "torchrun-spares": JobRequest.of(nodes=1, gpus=2, launcher="torchrun", spares=1,
                                  command=("python3", "ddp.py"), run_dir="/scratch/runs/t2",
                                  hang_timeout=30.0),
    "mpirun": JobRequest.of(nodes=2, gpus=2, launcher="mpirun", command=("python3", "x.py"),
                         run_dir="/scratch/runs/m1", gpu_bind="local-rank"),
    "horovodrun": JobRequest.of(nodes=2, gpus=2, launcher="horovodrun",
                             image="/scratch/images/x.sif", run_dir="/scratch/runs/h1"),
}


@pytest.mark.parametrize("case", sorted(LAUNCHER_REQUESTS))
def test_launcher_golden(case):
    plan = build_plan(load_profile("sandbox"), LAUNCHER_REQUESTS[case])
    check_golden(GOLDEN / "sbatch" / f"sandbox-launcher-{case}.sh", plan.script)
    check_golden(GOLDEN / "sbatch" / f"sandbox-launcher-{case}.files", job_files_text(plan))
