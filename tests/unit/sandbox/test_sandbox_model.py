"""The sandbox cluster as data (hpcdl/sandbox/cluster.py, render.py, templates/sandbox/):
the shape file parsed into the model and back, every value checked as a token, the
files rendered from it (slurm.conf and gres.conf byte for byte what scripts/sandbox.sh
rendered in bash before: tests/golden/sandbox/default.conf was captured from it), the
bundled profile generated from it, and sandbox.sh reading what it renders.

    HPCDL_REGEN_GOLDEN=1 pytest tests/unit/sandbox/test_sandbox_model.py   (regenerates the golden)

A changed slurm.conf restarts a running sandbox on its next `up` (cancelling its jobs):
regenerate the golden only for a change that is meant."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from hpcdl.cli import cli
from hpcdl.errors import ValidationError
from hpcdl.profiles.loader import load_profile_file
from hpcdl.sandbox import cluster_profile, profile_data
from hpcdl.sandbox.cluster import DEFAULT_SHAPE, Cluster, Partition, parse_shape
from hpcdl.sandbox.render import bundled_profile, render_files

REPO = Path(__file__).resolve().parents[3]
GOLDEN = REPO / "tests" / "golden" / "sandbox" / "default.conf"
BUNDLED = REPO / "hpcdl" / "profiles" / "bundled" / "sandbox.yaml"
SANDBOX_SH = REPO / "scripts" / "sandbox.sh"
HOST = socket.gethostname().split(".")[0]
# The golden was taken on a machine named vm: SlurmctldHost is this machine's name.
GOLDEN_HOST = "vm"


def golden_here() -> str:
    return GOLDEN.read_text().replace(f"SlurmctldHost={GOLDEN_HOST}(", f"SlurmctldHost={HOST}(")


def sandbox_sh(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """scripts/sandbox.sh ARGS (config only: it writes nothing) with this Python."""
    return subprocess.run(["bash", str(SANDBOX_SH), *args], capture_output=True, text=True,
                          timeout=60, check=False,
                          env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                               "HPCDL_SANDBOX_PYTHON": sys.executable, **(env or {})})


def test_default_cluster_renders_what_bash_rendered() -> None:
    files = render_files(Cluster(shape=DEFAULT_SHAPE), GOLDEN_HOST)
    text = files["slurm.conf"] + files["gres.conf"]
    if os.environ.get("HPCDL_REGEN_GOLDEN") == "1":
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_sandbox_sh_config_prints_the_golden() -> None:
    res = sandbox_sh("config")
    assert (res.returncode, res.stderr) == (0, "")
    assert res.stdout == golden_here()


def test_bundled_profile_is_generated_from_the_model(tmp_path: Path) -> None:
    text = bundled_profile()
    assert BUNDLED.read_text() == text, ("hpcdl/profiles/bundled/sandbox.yaml drifted from the "
                                         "model: hpcdl sandbox render --bundled-profile > it")
    (tmp_path / "sandbox.yaml").write_text(text)
    profile = load_profile_file(tmp_path / "sandbox.yaml")
    assert [p.name for p in profile.partitions] == [p.name for p in DEFAULT_SHAPE.partitions]
    short = next(p for p in profile.partitions if p.name == "short")
    assert (short.nodes, short.node_limit, short.gpus_per_node, short.max_time) == \
        (2, 1, 4, "00:05:00")
    assert profile.default_partition is not None and profile.default_partition.name == "debug"
    res = CliRunner().invoke(cli, ["sandbox", "render", "--bundled-profile"])
    assert (res.exit_code, res.output) == (0, text)


def test_shape_file_round_trip() -> None:
    assert parse_shape(DEFAULT_SHAPE.shape_text()) == DEFAULT_SHAPE
    text = ("# a comment\n\nnode g1 127.0.16.1 7001 8 4096 gpu:a100:4 up\n"
            "node b1 127.0.16.5 7005 4 2048 gpu:a100:2 nogres\n"
            "node c1 127.0.16.6 7006 16 8192 - down\n"
            "partition big g[1-3] MaxTime=1-00:00:00\n"
            "partition hid c1 Hidden=YES MaxTime=UNLIMITED\n"
            "partition empty - MaxTime=00:10:00\n"
            "partition maint g1 MaxTime=00:30:00 State=DOWN\n")
    shape = parse_shape(text)
    assert parse_shape(shape.shape_text()) == shape
    assert not shape.netns and shape.ctld_address == "127.0.0.1"
    assert [p.slurm_line() for p in shape.partitions] == [
        "PartitionName=big Nodes=g[1-3] MaxTime=1-00:00:00 State=UP",
        "PartitionName=hid Nodes=c1 MaxTime=UNLIMITED Hidden=YES State=UP",
        "PartitionName=empty MaxTime=00:10:00 State=UP",
        "PartitionName=maint Nodes=g1 MaxTime=00:30:00 State=DOWN"]
    assert shape.partitions[0].node_names() == ["g1", "g2", "g3"]
    files = render_files(Cluster(shape=shape, accounting="none"), "host1")
    # A down node has no slurmd (State=DOWN); a nogres node gets no gres.conf line.
    assert "NodeName=c1 NodeHostname=c1 NodeAddr=127.0.16.6 Port=7006 CPUs=16 Sockets=1 " \
           "CoresPerSocket=16 ThreadsPerCore=1 RealMemory=8192 State=DOWN\n" in files["slurm.conf"]
    assert "# Advertise each node's CPUs whatever the host has." in files["slurm.conf"]
    assert files["gres.conf"] == (
        "# Written by scripts/sandbox.sh: fake GPUs (character devices, see write_config).\n"
        "AutoDetect=off\nNodeName=g1 Name=gpu Type=a100 File=/var/lib/hpcdl-sandbox/dev/g1/gpu[0-3]\n")


def test_a_cluster_without_gpus_has_an_empty_gres_conf() -> None:
    shape = parse_shape("node a1 10.9.1.11 7001 8 4096 - up\n")
    assert render_files(Cluster(shape=shape), "h")["gres.conf"] == "AutoDetect=off\n"


@pytest.mark.parametrize("text, message", [
    ("node n1 10.1.1.5 7001 8 4096 - up extra\n", "bad shape line: node n1 10.1.1.5 7001 8 4096 - up extra"),
    ("node N1 10.1.1.5 7001 8 4096 - up\n", "bad shape line: node N1 10.1.1.5 7001 8 4096 - up"),
    ("node n1 10.1.1.5 7001 8 4096 gpu:fake up\n", "bad shape line: node n1"),
    ("node n1 10.1.1.5 0 8 4096 - up\n", "port: Input should be greater than or equal to 1"),
    ("node n1 10.1.1.5 7001 8 4096 - sleeping\n", "state: Input should be 'up', 'down' or 'nogres'"),
    ("node n1 10.1.1.5 7001 8 4096 - up\nnode n1 10.1.1.6 7002 8 4096 - up\n",
     "bad shape: node n1 is listed twice"),
    ("node n1 10.1.1.5 7001 8 4096 - up\npartition p n1\npartition p -\n",
     "bad shape: partition p is listed twice"),
    ("node n1 10.1.1.5 7001 8 4096 - up\npartition p n1 Foo=1\n", "'Foo=1' is not one of Default="),
    ("node n1 10.1.1.5 7001 8 4096 - up\npartition p n1 MaxTime=$(reboot)\n",
     "max_time: '$(reboot)' is not a Slurm time"),
    ("node n1 10.1.1.5 7001 8 4096 - up\npartition p n1;id\n", "nodes: 'n1;id' is not a node list"),
    ("node n1 10.1.1.5 7001 8 4096 - up\npartition p n1 Default=maybe\n", "Default 'maybe' is not YES"),
    ("node n1 10.1.1.5 7001 8 4096 - up\npartition p\n", "bad shape line: partition p"),
    ("cluster x y\n", "bad shape line: cluster x y"),
    ("node n1 10.1.1.5 7001 8 4096 - up\nnode n2 10.1.1.6 7002 8 4096 - up\x1b[2J\n",
     "not printable ASCII"),
    ("# nothing\n", "bad shape: no node lines"),
])
def test_bad_shapes_are_one_line(text: str, message: str) -> None:
    with pytest.raises(ValidationError) as err:
        parse_shape(text)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("env, message", [
    ({"HPCDL_SANDBOX_DIR": "/tmp/a b"}, "HPCDL_SANDBOX_DIR: '/tmp/a b': '/tmp/a b' is not an "
                                        "absolute directory"),
    ({"HPCDL_SANDBOX_DIR": "relative/dir"}, "is not an absolute directory"),
    ({"HPCDL_SANDBOX_CLUSTER": "x;reboot"}, "HPCDL_SANDBOX_CLUSTER: 'x;reboot': 'x;reboot' is not "
                                            "a cluster name"),
    ({"HPCDL_SANDBOX_CTLD_PORT": "17x"}, "HPCDL_SANDBOX_CTLD_PORT: '17x' is not a port (1-65535)"),
    ({"HPCDL_SANDBOX_DB_PORT": "70000"}, "HPCDL_SANDBOX_DB_PORT: 70000: Input should be less than"),
    ({"HPCDL_SANDBOX_ACCOUNTING": "yes"}, "HPCDL_SANDBOX_ACCOUNTING: 'yes': Input should be "
                                          "'slurmdbd' or 'none'"),
])
def test_environment_values_are_tokens(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        Cluster.from_env(env)


def test_a_model_value_is_checked_where_it_is_made() -> None:
    with pytest.raises(ValueError, match="is not a partition name"):
        Partition(name="p x", nodes=None)


def test_sandbox_sh_refuses_a_bad_value_before_anything(tmp_path: Path) -> None:
    res = sandbox_sh("config", env={"HPCDL_SANDBOX_DIR": str(tmp_path / "c"),
                                    "HPCDL_SANDBOX_CLUSTER": "a$(id)"})
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr == ("sandbox: HPCDL_SANDBOX_CLUSTER: 'a$(id)': 'a$(id)' is not a cluster "
                          "name, e.g. 'hpcdl-sandbox'\n")
    res = sandbox_sh("status", env={"HPCDL_SANDBOX_SHAPE": str(tmp_path / "missing.txt")})
    assert res.returncode == 2
    assert res.stderr == f"sandbox: cannot read {tmp_path}/missing.txt: No such file or directory\n"
    assert not (tmp_path / "c").exists()


def test_the_variables_sandbox_sh_sources(tmp_path: Path) -> None:
    """cluster.sh is sourced by bash: the arrays, the names derived from the directory
    (TAG: the first 6 hex digits of its SHA-1), loopback mode."""
    folder = "/tmp/hpcdl-nx-abc"
    shape = parse_shape("node xa1 10.91.3.11 7001 8 4096 gpu:fake:4 up\n"
                        "node xa2 10.91.3.12 7002 8 4096 gpu:fake:2 nogres\n"
                        "node xa3 10.91.3.13 7003 8 4096 - down\n")
    files = render_files(Cluster(shape=shape, dir=folder), "h")
    (tmp_path / "cluster.sh").write_text(files["cluster.sh"])
    out = subprocess.run(
        ["bash", "-c", 'set -eu; . "$1"; echo "$D|$TAG|$BRIDGE|$NETNS|$CTLD_ADDR|${NODES[*]}|'
         '${UP_NODES[*]}|${READY_NODES[*]}|${NODE_VETH[xa3]}|${NODE_NETNS[xa1]}|'
         '${NODE_GPUS[xa2]}|$HOSTS_END"', "_", str(tmp_path / "cluster.sh")],
        capture_output=True, text=True, timeout=30, check=True).stdout
    tag = "7d5229"  # sha1("/tmp/hpcdl-nx-abc")[:6]
    assert out == (f"{folder}|{tag}|hsb-{tag}|1|10.91.3.1|xa1 xa2 xa3|xa1 xa2|xa1|hsv-{tag}-3|"
                   f"hpcdl-{tag}-xa1|2|# <<< hpcdl-sandbox {tag}\n")
    assert files["hosts"] == (f"# >>> hpcdl-sandbox {tag} ({folder}): written by scripts/sandbox.sh "
                              f"up, removed by down\n10.91.3.11 xa1\n10.91.3.12 xa2\n10.91.3.13 xa3\n"
                              f"# <<< hpcdl-sandbox {tag}\n")


def test_render_writes_every_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "shape.txt").write_text("node q1 127.0.9.1 7001 4 2048 - up\n")
    monkeypatch.setenv("HPCDL_SANDBOX_SHAPE", str(tmp_path / "shape.txt"))
    monkeypatch.setenv("HPCDL_SANDBOX_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("HPCDL_SANDBOX_ACCOUNTING", "none")
    res = CliRunner().invoke(cli, ["sandbox", "render", "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == sorted(["slurm.conf", "gres.conf", "slurmdbd.conf", "hosts", "cluster.sh"])
    conf = (tmp_path / "out" / "slurm.conf").read_text()
    assert f"SlurmctldHost={HOST}(127.0.0.1)" in conf
    assert "AccountingStorageType=accounting_storage/none" in conf
    assert "NETNS=0" in (tmp_path / "out" / "cluster.sh").read_text()


def test_profile_of_a_shape_follows_its_partitions() -> None:
    shape = parse_shape("node g1 10.5.5.11 7001 8 4096 gpu:a100:4 up\n"
                        "node g2 10.5.5.12 7002 4 2048 gpu:a100:2 up\n"
                        "partition all g1,g2 Default=YES MaxNodes=1 MaxTime=UNLIMITED\n"
                        "partition down g1 MaxTime=00:10:00 State=DOWN\n"
                        "partition none - MaxTime=00:10:00\n")
    base = yaml.safe_load(BUNDLED.read_text())
    data = cluster_profile(base, shape, Path("/tmp/c1"), "p1", "test")
    # The smallest node decides what a job may ask for in a partition.
    assert data["partitions"] == [{"name": "all", "nodes": 2, "gpus_per_node": 2,
                                   "gpu_type": "a100", "cpus_per_node": 4, "mem_per_node_gb": 2,
                                   "max_nodes_per_job": 1, "max_time": "infinite",
                                   "default": True}]
    assert data["container"]["binds"] == ["/tmp/c1/tmp", "/scratch"]


def test_profile_of_n_nodes_needs_no_addresses(tmp_path: Path) -> None:
    # bench/bench_scale.py --planning plans on a 4,096-node partition (more than a /24).
    data = profile_data(yaml.safe_load(BUNDLED.read_text()), 4096, tmp_path)
    assert data["partitions"] == [{"name": "debug", "nodes": 4096, "gpus_per_node": 4,
                                   "gpu_type": "fake", "cpus_per_node": 8, "mem_per_node_gb": 4,
                                   "max_time": "00:30:00", "default": True}]
