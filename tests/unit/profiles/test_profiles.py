"""Profile schema and lookup: every bundled profile loads, every malformed one is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdl.errors import ConfigError, UserInputError
from hpcdl.profiles import list_profiles, load_profile, load_profile_file
from hpcdl.profiles.loader import resolve_profile

BUNDLED = ["generic", "karolina", "neuron", "polaris", "sandbox", "sandbox-remote", "taurus"]

MINIMAL = """\
name: mini
partitions:
  - {name: p1, nodes: 2, gpus_per_node: 4, cpus_per_node: 8, max_time: "01:00:00"}
"""


def write(tmp_path: Path, text: str, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_bundled_profiles_all_load():
    names = [s.name for s in list_profiles()]
    assert names == BUNDLED
    for name in BUNDLED:
        assert load_profile(name).name == name


def test_neuron_matches_the_seed_table():
    prof = load_profile("neuron")
    a100nv = prof.partition("amd_a100nv_8")
    assert (a100nv.nodes, a100nv.gpus_per_node, a100nv.max_gpus_per_user) == (14, 8, 64)
    v100 = prof.partition("cas_v100_4")
    assert (v100.nodes, v100.gpus_per_node, v100.cpus_per_node) == (15, 4, 40)
    assert prof.scheduler.extra_options == {"comment": "pytorch"}


def test_sandbox_profile_shape():
    prof = load_profile("sandbox")
    assert [p.name for p in prof.partitions] == ["debug", "gpu", "short", "lowprio", "urgent"]
    assert prof.default_partition.name == "debug"
    assert all(p.gpus_per_node == 4 and p.nodes == 2 for p in prof.partitions)
    assert prof.mpi.launcher == "srun" and prof.mpi.srun_mpi == "pmix"


def test_unknown_key_names_file_field_and_valid_keys(tmp_path):
    path = write(tmp_path, MINIMAL.replace("max_time", "gpus: 1, max_time"))
    with pytest.raises(ConfigError) as err:
        load_profile_file(path)
    msg = err.value.message
    assert str(path) in msg
    assert "unknown key 'partitions[0].gpus'" in msg
    assert "gpus_per_node" in msg  # the valid keys are listed


def test_top_level_unknown_key(tmp_path):
    path = write(tmp_path, MINIMAL + "modulez: [a]\n")
    with pytest.raises(ConfigError, match=r"unknown key 'modulez' \(valid keys here: .*modules"):
        load_profile_file(path)


def test_wrong_type_names_field_and_value(tmp_path):
    path = write(tmp_path, MINIMAL.replace("nodes: 2", "nodes: many"))
    with pytest.raises(ConfigError, match=r"field 'partitions\[0\]\.nodes'.*'many'"):
        load_profile_file(path)


def test_yaml_syntax_error_has_line(tmp_path):
    path = write(tmp_path, "name: x\npartitions: [\n  {name: p\n")
    with pytest.raises(ConfigError, match=rf"{path}:\d+:\d+: YAML syntax error"):
        load_profile_file(path)


def test_bad_time_and_duplicate_partitions(tmp_path):
    path = write(tmp_path, MINIMAL.replace('"01:00:00"', '"soon"'))
    with pytest.raises(ConfigError, match="not a Slurm time"):
        load_profile_file(path)
    dup = MINIMAL + '  - {name: p1, nodes: 1, gpus_per_node: 0, cpus_per_node: 8, max_time: "1:00:00"}\n'
    with pytest.raises(ConfigError, match="duplicate partition names: p1"):
        load_profile_file(write(tmp_path, dup, "d.yaml"))


def test_max_nodes_above_partition_size(tmp_path):
    text = MINIMAL.replace("max_time", "max_nodes_per_job: 3, max_time")
    with pytest.raises(ConfigError, match=r"max_nodes_per_job \(3\) exceeds the partition's 2 nodes"):
        load_profile_file(write(tmp_path, text))


def test_not_a_mapping(tmp_path):
    with pytest.raises(ConfigError, match="must be a YAML mapping"):
        load_profile_file(write(tmp_path, "- a\n- b\n"))


def test_lookup_order(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    user_dir = tmp_path / "cfg" / "hpcdl" / "profiles"
    user_dir.mkdir(parents=True)
    # A user profile named like a bundled one hides it.
    (user_dir / "neuron.yaml").write_text(MINIMAL.replace("mini", "neuron"))
    assert [p.name for p in load_profile("neuron").partitions] == ["p1"]
    # $HPCDL_PROFILE is used when no --profile is given; a path works too.
    monkeypatch.setenv("HPCDL_PROFILE", "sandbox")
    assert load_profile(None).name == "sandbox"
    path = write(tmp_path, MINIMAL)
    assert load_profile(str(path)).name == "mini"
    assert resolve_profile("karolina").name == "karolina.yaml"


def test_no_profile_and_unknown_profile(monkeypatch):
    monkeypatch.delenv("HPCDL_PROFILE", raising=False)
    with pytest.raises(UserInputError, match="none given.*available: generic"):
        load_profile(None)
    with pytest.raises(UserInputError, match="unknown profile 'nope'"):
        load_profile("nope")
    with pytest.raises(UserInputError, match="does not exist"):
        load_profile("/no/such/profile.yaml")


def test_the_gate_timeout_reaches_the_guard_and_is_bounded(tmp_path):
    from hpcdl.launch.nodes import guard_exports

    def gate(profile):
        exports = dict(guard_exports(profile, tasks_per_node=1, gpus=0, max_relaunches=1,
                                     nodes_file="n", image=False, master_addr=False))
        return exports["HPCDL_GATE_TIMEOUT"]

    assert gate(load_profile_file(write(tmp_path, MINIMAL))) == "90"
    path = write(tmp_path, MINIMAL + "scheduler: {gate_timeout: 30}\n", "g.yaml")
    assert gate(load_profile_file(path)) == "30"
    for bad in ("5", "7200", "soon"):
        path = write(tmp_path, MINIMAL + f"scheduler: {{gate_timeout: {bad}}}\n", f"b{bad}.yaml")
        with pytest.raises(ConfigError, match=rf"'scheduler\.gate_timeout'.*{bad}") as err:
            load_profile_file(path)
        assert "\n" not in err.value.message
