"""`hpcdl sandbox up --nodes N`'s pure parts (hpcdl/sandbox/): the shape that
scripts/sandbox.sh reads (checked by sandbox.sh's own `config`, which writes nothing),
the environment file, the matching profile, and the CLI's refusals. Starting such a
cluster is bench/ work (bench/bench_scale_nodes.py), not a test's."""

from __future__ import annotations

import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from hpcdl import sandbox as shape
from hpcdl.cli import cli
from hpcdl.errors import ValidationError
from hpcdl.profiles.schema import Profile

REPO = Path(__file__).resolve().parents[3]
BUNDLED = yaml.safe_load((REPO / "hpcdl" / "profiles" / "bundled" / "sandbox.yaml").read_text())


@pytest.mark.parametrize("nodes", [1, 2, 32, 200])
def test_shape_lines(nodes):
    lines = shape.shape_text(nodes, "10.91.7").splitlines()
    node_lines = [line.split() for line in lines if line.startswith("node ")]
    assert [n[1] for n in node_lines] == shape.node_names(nodes)
    assert len({n[2] for n in node_lines}) == nodes and len({n[3] for n in node_lines}) == nodes
    assert all(re.fullmatch(r"10\.91\.7\.(\d+)", n[2]) for n in node_lines)
    assert all(2 <= int(n[2].rsplit(".", 1)[1]) <= 254 for n in node_lines)
    (partition,) = [line for line in lines if line.startswith("partition ")]
    assert f"MaxNodes={nodes} " in partition and "Default=YES" in partition


def test_sandbox_sh_reads_the_shape(tmp_path):
    (tmp_path / "shape.txt").write_text(shape.shape_text(32, "10.91.8"))
    env = shape.environment(tmp_path / "c", 32, 17999)
    res = subprocess.run(["bash", str(REPO / "scripts" / "sandbox.sh"), "config"],
                         env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                              "HPCDL_SANDBOX_PYTHON": sys.executable,
                              **env, "HPCDL_SANDBOX_SHAPE": str(tmp_path / "shape.txt")},
                         capture_output=True, text=True, timeout=60, check=True)
    conf = res.stdout
    assert len(re.findall(r"^NodeName=s32n\d+ NodeHostname", conf, re.M)) == 32
    assert "NodeAddr=10.91.8.42 Port=17032" in conf  # the 32nd node
    assert re.search(r"^PartitionName=debug Nodes=s32n1,.*,s32n32 Default=YES MaxNodes=32 ", conf,
                     re.M)
    assert "ClusterName=hpcdl-sandbox-32n" in conf and "SlurmctldPort=17999" in conf
    assert "AccountingStorageType=accounting_storage/none" in conf
    assert not (tmp_path / "c").exists()  # config writes nothing


@pytest.mark.parametrize("nodes, subnet, why", [(0, "10.1.2", "is not 1 to 200"),
                                                (201, "10.1.2", "is not 1 to 200"),
                                                (2, "10.1.256", "is not 10.A.B"),
                                                (2, "10.1.2.0", "is not 10.A.B"),
                                                (2, "192.168.1", "is not 10.A.B")])
def test_shape_refuses(nodes, subnet, why):
    with pytest.raises(ValidationError, match=why):
        shape.shape_text(nodes, subnet)


def test_environment_file_round_trip(tmp_path):
    env = shape.environment(tmp_path / "x", 16, 40001)
    assert env["HPCDL_SANDBOX_DIR"] == str(tmp_path / "x")
    assert env["SLURM_CONF"] == str(tmp_path / "x" / "etc" / "slurm.conf")
    assert env["HPCDL_SANDBOX_CLUSTER"] == "hpcdl-sandbox-16n"
    assert shape.parse_env_file(shape.env_file_text(env)) == env
    with pytest.raises(ValidationError, match="line 2"):
        shape.parse_env_file("A=1\nrm -rf /\n")


def test_pick_subnet_avoids_used_ones():
    used = "\n".join(f"3: hsb{i} inet 10.{a}.{b}.1/24 scope global" for i, (a, b) in
                     enumerate((a, b) for a in range(80, 128) for b in range(256) if b != 5))
    assert shape.pick_subnet(used, random.Random(1)).endswith(".5")
    with pytest.raises(ValidationError, match="no free"):
        shape.pick_subnet(used + "\n9: x inet 10.80.5.1/24\n" + "\n".join(
            f"9: y inet 10.{a}.5.1/24" for a in range(80, 128)), random.Random(1))


@pytest.mark.parametrize("nodes", [1, 32])
def test_profile_matches_the_shape(tmp_path, nodes):
    data = shape.profile_data(BUNDLED, nodes, tmp_path)
    profile = Profile.model_validate(data)
    assert profile.name == f"sandbox-{nodes}n"
    (part,) = profile.partitions
    assert (part.name, part.nodes, part.gpus_per_node, part.cpus_per_node) == ("debug", nodes, 4, 8)
    assert [str(b) for b in profile.container.binds] == [str(tmp_path / "tmp"), "/scratch"]
    assert BUNDLED["name"] == "sandbox"  # the bundled data is not changed in place


def test_cli_refuses_a_node_count(monkeypatch):
    monkeypatch.setattr("hpcdl.cli.sandbox._run", lambda *a, **k: pytest.fail("ran sandbox.sh"))
    res = CliRunner().invoke(cli, ["sandbox", "up", "--nodes", "0"])
    assert res.exit_code == 2 and "nodes: 0 is not 1 to 200" in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_cli_down_without_such_a_cluster(monkeypatch, tmp_path):
    monkeypatch.setattr(shape, "DEFAULT_DIR", tmp_path / "sb")
    monkeypatch.setattr("hpcdl.cli.sandbox._run", lambda *a, **k: pytest.fail("ran sandbox.sh"))
    res = CliRunner().invoke(cli, ["sandbox", "down", "--nodes", "7"])
    assert res.exit_code == 2
    assert f"no sandbox of 7 nodes in {tmp_path}/sb-7n" in res.output


def test_cli_default_sandbox_is_unchanged(monkeypatch):
    calls = []
    monkeypatch.setattr("hpcdl.cli.sandbox._run", lambda action, env=None: calls.append((action, env)))
    assert CliRunner().invoke(cli, ["sandbox", "up"]).exit_code == 0
    assert CliRunner().invoke(cli, ["sandbox", "down"]).exit_code == 0
    assert calls == [("up", None), ("down", None)]  # no shape, no environment: sandbox.sh's own


def test_cli_up_writes_shape_env_and_profile(monkeypatch, tmp_path):
    monkeypatch.setattr(shape, "DEFAULT_DIR", tmp_path / "sb")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    calls = []
    monkeypatch.setattr("hpcdl.cli.sandbox._run", lambda action, env=None: calls.append((action, env)))
    res = CliRunner().invoke(cli, ["sandbox", "up", "--nodes", "4"])
    assert res.exit_code == 0, res.output
    folder = tmp_path / "sb-4n"
    env = shape.parse_env_file((folder / "sandbox.env").read_text())
    assert calls == [("up", env)] and env["HPCDL_SANDBOX_DIR"] == str(folder)
    assert (folder / "shape.txt").read_text().count("\nnode ") == 3  # 4 lines, first without \n
    profile = tmp_path / "cfg" / "hpcdl" / "profiles" / "sandbox-4n.yaml"
    assert Profile.model_validate(yaml.safe_load(profile.read_text())).partitions[0].nodes == 4
    assert f"export SLURM_CONF={folder}/etc/slurm.conf" in res.output
    # A second up reuses the cluster's subnet and port (the running cluster has them).
    before = (folder / "shape.txt").read_text(), (folder / "sandbox.env").read_text()
    assert CliRunner().invoke(cli, ["sandbox", "up", "--nodes", "4"]).exit_code == 0
    assert ((folder / "shape.txt").read_text(), (folder / "sandbox.env").read_text()) == before


def test_cli_dir_goes_with_nodes_and_one_size(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    calls = []
    monkeypatch.setattr("hpcdl.cli.sandbox._run", lambda action, env=None: calls.append(env))
    res = CliRunner().invoke(cli, ["sandbox", "up", "--dir", str(tmp_path / "c")])
    assert res.exit_code == 2 and "--dir goes with --nodes" in res.output and calls == []
    assert CliRunner().invoke(cli, ["sandbox", "up", "-N", "3", "--dir", str(tmp_path / "c")]
                              ).exit_code == 0
    assert calls[0]["HPCDL_SANDBOX_DIR"] == str(tmp_path / "c")
    res = CliRunner().invoke(cli, ["sandbox", "up", "-N", "5", "--dir", str(tmp_path / "c")])
    assert res.exit_code == 2 and "another size than 5 nodes" in res.output and len(calls) == 1
