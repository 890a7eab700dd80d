"""hpcdl.jobside.world: rank/world from crafted launcher environments (pure, no processes)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hpcdl.errors import ConfigError
from hpcdl.jobside.world import (
    DEFAULT_PORT,
    PORT_BASE,
    PORT_SPAN,
    World,
    detect_world,
    expand_hostlist,
    export_torch_env,
    parse_tasks_per_node,
    port_from_job_id,
)


@pytest.mark.parametrize(
    ("spec", "hosts"),
    [
        ("n1", ["n1"]),
        ("n[1-2]", ["n1", "n2"]),
        ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
        ("a1,b[2-3]", ["a1", "b2", "b3"]),
        ("node[098-101]", ["node098", "node099", "node100", "node101"]),
        ("x[1-2]-ib", ["x1-ib", "x2-ib"]),
        ("r[1-2]-n[1-2]", ["r1-n1", "r1-n2", "r2-n1", "r2-n2"]),
        ("c[1,3],d5,e[7]", ["c1", "c3", "d5", "e7"]),
        ("", []),
    ],
)
def test_expand_hostlist(spec: str, hosts: list[str]) -> None:
    assert expand_hostlist(spec) == hosts


@pytest.mark.parametrize("spec", ["n[1-2", "n1-2]", "n[a-b]", "n[3-1]", "n[[1]]", "n[1-]"])
def test_expand_hostlist_rejects_malformed(spec: str) -> None:
    with pytest.raises(ConfigError, match="hostlist"):
        expand_hostlist(spec)


def test_tasks_per_node() -> None:
    assert parse_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert parse_tasks_per_node("4") == [4]
    with pytest.raises(ConfigError):
        parse_tasks_per_node("2(y3)")


def test_port_from_job_id_in_safe_range_and_stable() -> None:
    ports = {port_from_job_id(j) for j in range(1, 5000)}
    assert all(PORT_BASE <= p < PORT_BASE + PORT_SPAN for p in ports)
    assert port_from_job_id("1234") == port_from_job_id(1234) == PORT_BASE + 1234
    assert port_from_job_id(17) != port_from_job_id(18)
    # Array jobs: "123_4" still yields a port.
    assert PORT_BASE <= port_from_job_id("123_4") < PORT_BASE + PORT_SPAN
    with pytest.raises(ConfigError):
        port_from_job_id("abc")


def test_single_process_default() -> None:
    assert detect_world({}) == World(0, 1, 0, 1, 1, "127.0.0.1", DEFAULT_PORT, "single")


def test_torchrun() -> None:
    env = {
        "RANK": "3",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "10.0.0.5",
        "MASTER_PORT": "29400",
        "GROUP_WORLD_SIZE": "4",
    }
    assert detect_world(env) == World(3, 8, 1, 2, 4, "10.0.0.5", 29400, "torchrun")


def test_torchrun_wins_over_slurm() -> None:
    # torchrun started under srun: torchrun's variables describe this process.
    env = {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29501",
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "1",
    }
    w = detect_world(env)
    assert (w.launcher, w.rank, w.world_size) == ("torchrun", 1, 2)


def test_openmpi_single_node() -> None:
    env = {
        "OMPI_COMM_WORLD_RANK": "1",
        "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "OMPI_MCA_ess_base_jobid": "2718367745",
    }
    w = detect_world(env)
    assert (w.rank, w.world_size, w.local_rank, w.local_size, w.nodes) == (1, 2, 1, 2, 1)
    assert w.master_addr == "127.0.0.1"
    assert w.launcher == "openmpi"
    assert w.master_port == port_from_job_id("2718367745")


def test_openmpi_inside_slurm_uses_first_node_and_job_port() -> None:
    env = {
        "OMPI_COMM_WORLD_RANK": "5",
        "OMPI_COMM_WORLD_SIZE": "8",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "1",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
        "SLURM_JOB_ID": "4242",
    }
    w = detect_world(env)
    assert w == World(5, 8, 1, 4, 2, "gpu07", port_from_job_id(4242), "openmpi")


def test_openmpi_multi_node_without_master_addr_is_an_error() -> None:
    env = {
        "OMPI_COMM_WORLD_RANK": "0",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    }
    with pytest.raises(ConfigError, match="MASTER_ADDR"):
        detect_world(env)


def test_horovod_gloo() -> None:
    env = {
        "HOROVOD_RANK": "1",
        "HOROVOD_SIZE": "2",
        "HOROVOD_LOCAL_RANK": "1",
        "HOROVOD_LOCAL_SIZE": "2",
        "HOROVOD_CROSS_SIZE": "1",
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": "192.168.1.2",
        "HOROVOD_GLOO_RENDEZVOUS_PORT": "12345",
    }
    w = detect_world(env)
    assert w == World(1, 2, 1, 2, 1, "192.168.1.2", DEFAULT_PORT, "horovod")


def test_slurm_srun_two_nodes() -> None:
    env = {
        "SLURM_PROCID": "6",
        "SLURM_NTASKS": "8",
        "SLURM_LOCALID": "2",
        "SLURM_NODEID": "1",
        "SLURM_NTASKS_PER_NODE": "4",
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_JOB_ID": "77",
    }
    assert detect_world(env) == World(6, 8, 2, 4, 2, "n1", PORT_BASE + 77, "slurm")


def test_slurm_uneven_tasks_per_node() -> None:
    env = {
        "SLURM_PROCID": "4",
        "SLURM_NTASKS": "5",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "2",
        "SLURM_TASKS_PER_NODE": "2(x2),1",
        "SLURM_JOB_NUM_NODES": "3",
        "SLURM_JOB_NODELIST": "a1,b[2-3]",
        "SLURM_JOB_ID": "9",
    }
    w = detect_world(env)
    assert (w.local_size, w.nodes, w.master_addr) == (1, 3, "a1")


def test_slurm_master_addr_and_port_overrides() -> None:
    env = {
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_LOCALID": "0",
        "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_NNODES": "1",
        "SLURM_JOB_NODELIST": "n1",
        "SLURM_JOB_ID": "77",
        "MASTER_ADDR": "head",
        "MASTER_PORT": "23456",
    }
    w = detect_world(env)
    assert (w.master_addr, w.master_port) == ("head", 23456)


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "rank 2 outside world size 2"),
        ({"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "70000"}, "MASTER_PORT"),
        (
            {
                "SLURM_PROCID": "0",
                "SLURM_NTASKS": "2",
                "SLURM_LOCALID": "3",
                "SLURM_NTASKS_PER_NODE": "2",
            },
            "local rank 3",
        ),
    ],
)
def test_malformed_environments(env: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        detect_world(env)


def test_export_torch_env_sets_env_init_variables() -> None:
    w = World(1, 4, 1, 2, 2, "n1", 15077, "slurm")
    env: dict[str, str] = {"KEEP": "1"}
    export_torch_env(w, env)
    assert env == {
        "KEEP": "1",
        "RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "n1",
        "MASTER_PORT": "15077",
    }
    # Round trip: the exported variables read back as the same placement.
    again = detect_world(env)
    assert (again.rank, again.world_size, again.master_addr, again.master_port) == (
        1,
        4,
        "n1",
        15077,
    )


def test_world_module_imports_only_the_stdlib() -> None:
    # Inside the image only PYTHONPATH is set: importing must not pull in torch/numpy.
    code = (
        "import sys, hpcdl.jobside.world; "
        "bad = [m for m in ('torch', 'numpy', 'click', 'pydantic', 'yaml') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
