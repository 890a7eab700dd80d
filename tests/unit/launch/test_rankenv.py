"""The rank-env wrapper, run by the real /bin/sh (dash on Debian) and by bash: the
torchrun variables it derives from Slurm's, Open MPI's and Horovod's, GPU narrowing,
torchrun mode, and its two one-line checks (missing command, port in use)."""

from __future__ import annotations

import shutil
import socket
import subprocess

import pytest

from hpcdl.jobside.world import detect_world
from hpcdl.launch.rankenv import WRAPPER_NAME, rank_env_script

SHELLS = [s for s in ("/bin/sh", shutil.which("bash"), shutil.which("dash")) if s]
SHOW = ["env"]


def run(env: dict[str, str], *command: str, shell: str = "/bin/sh", mode: str = "ranks",
        gpu_bind: bool = False) -> subprocess.CompletedProcess[str]:
    script = rank_env_script(mode, gpu_bind=gpu_bind)  # type: ignore[arg-type]
    return subprocess.run([shell, "-c", script, WRAPPER_NAME, *(command or SHOW)],
                          capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin", **env})


def exported(env: dict[str, str], **kw: object) -> dict[str, str]:
    res = run(env, **kw)  # type: ignore[arg-type]
    assert res.returncode == 0, res.stderr
    return dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)


SLURM = {"SLURM_PROCID": "5", "SLURM_NTASKS": "6", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
         "SLURM_NNODES": "3", "SLURM_STEP_TASKS_PER_NODE": "2(x3)", "SLURM_JOB_ID": "77"}


@pytest.mark.parametrize("shell", SHELLS)
def test_srun_task_gets_torchrun_variables(shell):
    out = exported(SLURM, shell=shell)
    assert {k: out[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                "NODE_RANK", "GROUP_RANK", "GROUP_WORLD_SIZE")} == {
        "RANK": "5", "WORLD_SIZE": "6", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
        "NODE_RANK": "2", "GROUP_RANK": "2", "GROUP_WORLD_SIZE": "3"}
    assert out["HPCDL_RANK_FROM"] == "slurm"
    # hpcdl's own examples read the same answer and still name the launcher.
    world = detect_world({**out, "MASTER_ADDR": "n1", "MASTER_PORT": "15077"})
    assert (world.rank, world.world_size, world.local_rank, world.local_size, world.nodes,
            world.launcher) == (5, 6, 1, 2, 3, "slurm")


@pytest.mark.parametrize(("per_node", "node", "expected"), [
    ("3,1", "0", "3"), ("3,1", "1", "1"), ("2(x2),1", "2", "1"), ("4(x2)", "1", "4"), ("", "0", "3"),
])
def test_uneven_tasks_per_node(per_node, node, expected):
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "6", "SLURM_NNODES": "2", "SLURM_NODEID": node,
           "SLURM_STEP_TASKS_PER_NODE": per_node}
    assert exported(env)["LOCAL_WORLD_SIZE"] == expected


def test_mpirun_variables_win_over_the_batch_steps_slurm_ones():
    env = {**SLURM, "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
           "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
           "OMPI_COMM_WORLD_NODE_RANK": "0"}  # counts processes: not the node
    out = exported(env)
    assert (out["RANK"], out["WORLD_SIZE"], out["LOCAL_RANK"], out["NODE_RANK"],
            out["GROUP_WORLD_SIZE"], out["HPCDL_RANK_FROM"]) == ("3", "4", "1", "1", "2", "openmpi")


def test_horovodrun_and_single_process():
    out = exported({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "1",
                    "HOROVOD_LOCAL_SIZE": "2", "HOROVOD_CROSS_RANK": "0", "HOROVOD_CROSS_SIZE": "1"})
    assert (out["RANK"], out["LOCAL_WORLD_SIZE"], out["HPCDL_RANK_FROM"]) == ("1", "2", "horovod")
    single = exported({})
    assert (single["RANK"], single["WORLD_SIZE"], single["HPCDL_RANK_FROM"]) == ("0", "1", "single")


def test_gpu_binding_narrows_only_when_asked_and_when_the_task_sees_several():
    env = {**SLURM, "CUDA_VISIBLE_DEVICES": "4,5"}
    assert exported(env)["CUDA_VISIBLE_DEVICES"] == "4,5"
    narrowed = exported(env, gpu_bind=True)
    assert (narrowed["CUDA_VISIBLE_DEVICES"], narrowed["HPCDL_NODE_GPUS"]) == ("5", "4,5")
    one = exported({**SLURM, "CUDA_VISIBLE_DEVICES": "7"}, gpu_bind=True)
    assert one["CUDA_VISIBLE_DEVICES"] == "7" and "HPCDL_NODE_GPUS" not in one


def test_torchrun_mode_leaves_ranks_to_torchrun_and_hosts_on_node_zero():
    node0 = exported({"SLURM_NODEID": "0", "SLURM_PROCID": "0", "MASTER_ADDR": "10.0.0.1"},
                     mode="torchrun")
    assert node0["PET_RDZV_CONF"] == "is_host=1" and node0["PET_LOCAL_ADDR"] == "10.0.0.1"
    assert "RANK" not in node0 and "WORLD_SIZE" not in node0
    node1 = exported({"SLURM_NODEID": "1", "SLURM_PROCID": "1", "MASTER_ADDR": "10.0.0.1"},
                     mode="torchrun")
    assert node1["PET_RDZV_CONF"] == "is_host=0" and "PET_LOCAL_ADDR" not in node1


def test_arguments_pass_verbatim():
    odd = ["a b", "$(touch /nonexistent/x)", "'q'", "", "*"]
    res = run(SLURM, "printf", "[%s]", *odd)
    assert res.returncode == 0 and res.stdout == "".join(f"[{a}]" for a in odd)


def test_missing_command_is_one_line():
    res = run({**SLURM, "SLURMD_NODENAME": "n3", "HPCDL_IMAGE": "/i.sif"}, "nosuchtool", "-x")
    assert res.returncode == 127
    assert res.stderr == "hpcdl: command not found: nosuchtool (rank 5 on n3, in image /i.sif)\n"


def test_port_in_use_is_one_line_on_the_rendezvous_rank_only():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = str(held.getsockname()[1])
        env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_NODEID": "0",
               "SLURM_LOCALID": "0", "SLURMD_NODENAME": "n1", "MASTER_PORT": port}
        res = run(env, "true")
        assert res.returncode == 98
        assert res.stderr == (f"hpcdl: MASTER_PORT {port} is already in use on n1 (another job "
                              "or process listens on it): choose a free one with --env "
                              "MASTER_PORT=PORT\n")
        # Rank 1 does not host the rendezvous: the port is none of its business.
        assert run({**env, "SLURM_PROCID": "1", "SLURM_LOCALID": "1"}, "true").returncode == 0
        assert run({**env, "SLURM_NODEID": "1", "SLURM_PROCID": "1"}, "true",
                   mode="torchrun").returncode == 0
        assert run(env, "true", mode="torchrun").returncode == 98
    assert run(env, "true").returncode == 0  # released


def test_the_script_holds_no_single_quote():
    for mode in ("ranks", "torchrun"):
        for bind in (False, True):
            assert "'" not in rank_env_script(mode, gpu_bind=bind)  # type: ignore[arg-type]


def test_port_check_without_grep_in_the_image(tmp_path):
    # A PATH with sh's helpers but no grep: the sh fallback reads /proc/net/tcp itself.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("printf", "uname", "true"):
        found = shutil.which(tool)
        assert found
        (bin_dir / tool).symlink_to(found)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = str(held.getsockname()[1])
        env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "MASTER_PORT": port, "PATH": str(bin_dir)}
        script = rank_env_script()
        res = subprocess.run(["/bin/sh", "-c", script, WRAPPER_NAME, "true"], env=env,
                             capture_output=True, text=True, timeout=30)
        assert res.returncode == 98 and f"MASTER_PORT {port} is already in use" in res.stderr
    res = subprocess.run(["/bin/sh", "-c", script, WRAPPER_NAME, "true"], env=env,
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr


def test_mpich_style_mpiexec_and_srun_pmi2():
    pals = exported({"PMI_RANK": "5", "PMI_SIZE": "8", "PALS_LOCAL_RANKID": "1",
                     "PMI_LOCAL_SIZE": "4", "PALS_NODEID": "1"})
    assert (pals["RANK"], pals["WORLD_SIZE"], pals["LOCAL_RANK"], pals["LOCAL_WORLD_SIZE"],
            pals["NODE_RANK"], pals["GROUP_WORLD_SIZE"], pals["HPCDL_RANK_FROM"]) == (
        "5", "8", "1", "4", "1", "2", "pmi")
    hydra = exported({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1",
                      "MPI_LOCALNRANKS": "2"})
    assert (hydra["LOCAL_RANK"], hydra["NODE_RANK"]) == ("1", "1")
    # srun --mpi=pmi2 sets PMI_RANK but no local rank: Slurm's variables answer.
    pmi2 = exported({**SLURM, "PMI_RANK": "5", "PMI_SIZE": "6"})
    assert (pmi2["LOCAL_RANK"], pmi2["HPCDL_RANK_FROM"]) == ("1", "slurm")
