"""hpcdl/schedulers/slurm/describe.py on facts built here (test_slurm_detect.py runs it on
captured outputs of real clusters): the YAML writer reads back as what it wrote whatever
text a value or a comment holds, and the rules that pick each profile value."""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from hpcdl.errors import ConfigError
from hpcdl.schedulers.slurm import detect as sd
from hpcdl.schedulers.slurm.describe import Leaf, Map, Seq, describe, profile_name, to_yaml

RUNTIME = sd.Runtime("apptainer", "/usr/bin/apptainer", "1.3.4")
TEXT = st.text(max_size=30)  # any code point: what a Reason= or an error may hold


@given(value=TEXT, comment=TEXT, header=TEXT, items=st.lists(TEXT, max_size=3))
def test_the_writer_reads_back_as_its_values_whatever_the_text(value, comment, header, items):
    doc = Map((("a", Leaf(value, comment)),
               ("b", Map((("c", Leaf(3, comment)), ("d", Leaf(None, comment))), comment)),
               ("e", Seq(tuple(Leaf(x, comment) for x in items), comment)),
               ("f", Seq((Map((("g", Leaf(True, comment)),)),), comment))))
    text = to_yaml(doc, [header, "", header])
    assert yaml.safe_load(text) == {"a": value, "b": {"c": 3, "d": None}, "e": items,
                                    "f": [{"g": True}]}


@pytest.mark.parametrize("comment", ["down\u2028evil: 1", "x\x85evil: 1", "bad \x80 byte",
                                     "a\u2029b: 2", "line\nbreak: 3"])
def test_a_comment_cannot_add_a_key_or_break_the_yaml(comment):
    text = to_yaml(Map((("k", Leaf("v", comment)),)), [comment])
    assert yaml.safe_load(text) == {"k": "v"}


def test_a_value_that_is_no_scalar_is_refused():
    with pytest.raises(TypeError, match="cannot write float"):
        to_yaml(Map((("k", Leaf(1.5)),)), [])


def _node(name, cpus=8, mem=16384, gres=(), state="IDLE", parts=("p",), reason=""):
    return sd.Node(name, cpus, mem, tuple(sd.Gres("gpu", t, n) for t, n in gres), state,
                   parts, reason)


def _part(name="p", **kw):
    base = dict(name=name, default=True, hidden=False, state="UP", max_time="01:00:00",
                default_time=None, max_nodes=None, total_nodes=2, nodes="n[1-2]", qos=None,
                total_cpus=16, tres="cpu=16,gres/gpu=0")
    return sd.PartitionInfo(**{**base, **kw})


def _facts(partitions=None, nodes=None, config=None, mpi=None, qos=None, gaps=None,
           runtime=None):
    return sd.ClusterFacts(
        partitions=partitions if partitions is not None else [_part()],
        nodes=nodes if nodes is not None else [_node("n1"), _node("n2")],
        config=config if config is not None else {"ClusterName": "c1"},
        mpi=mpi, qos=qos, runtime=runtime or RUNTIME, gaps=gaps or {})


def test_hostile_text_from_the_cluster_still_gives_a_profile():
    # A node's Reason is whatever the admin typed; a gap is a command's error text.
    nodes = [_node("n1", state="DOWN", reason="fan\u2028name: evil\x85x\x80"), _node("n2")]
    found = describe(_facts(nodes=nodes, gaps={"mpi": "srun: \u2029mpi: evil"},
                           config={"ClusterName": "lab-\U0001f680"}))
    assert found.profile.name == "lab"
    assert found.profile.description == "Slurm cluster lab-\U0001f680 (detected from Slurm unknown version)"
    assert "1 not usable now: n1 DOWN" in found.text


def test_a_partition_is_described_by_its_smallest_node():
    nodes = [_node("g1", cpus=32, mem=65536, gres=(("a100", 4),)),
             _node("g2", cpus=16, mem=32768, gres=(("a100", 2),))]
    part = describe(_facts(nodes=nodes)).profile.partitions[0]
    assert (part.gpus_per_node, part.cpus_per_node, part.mem_per_node_gb) == (2, 16, 32)
    assert part.gpu_type == "a100"
    assert "heterogeneous nodes" in (part.description or "")


def test_mixed_gpu_types_leave_the_type_open():
    nodes = [_node("g1", gres=(("a100", 2),)), _node("g2", gres=(("v100", 2),))]
    found = describe(_facts(nodes=nodes))
    assert found.profile.partitions[0].gpu_type is None
    assert "GPU types differ (a100: g1; v100: g2)" in found.text


def test_without_node_records_the_partition_totals_are_averaged():
    part = _part(total_cpus=24, tres="cpu=24,gres/gpu=6", total_nodes=3)
    found = describe(_facts(partitions=[part], nodes=[], gaps={"nodes": "scontrol failed"}))
    got = found.profile.partitions[0]
    assert (got.gpus_per_node, got.cpus_per_node, got.mem_per_node_gb) == (2, 8, None)
    assert "GAP: nodes: scontrol failed" in found.notes


def test_partitions_slurm_takes_no_jobs_in_are_left_out_and_none_left_is_an_error():
    parts = [_part("off", state="INACTIVE"), _part("dr", state="DRAIN"),
             _part("empty", total_nodes=0), _part("p", default=False)]
    parts = [dataclasses.replace(p, default=False) for p in parts]
    nodes = [_node("n1", parts=("off", "dr", "p"))]
    found = describe(_facts(partitions=parts, nodes=nodes))
    assert [p.name for p in found.profile.partitions] == ["p"]
    assert any("partition off: State=INACTIVE" in n for n in found.notes)
    assert any("partition empty: no nodes" in n for n in found.notes)
    assert any("no default partition" in n for n in found.notes)
    with pytest.raises(ConfigError, match=r"no partition can be described \(Slurm lists: off, dr"):
        describe(_facts(partitions=parts[:3], nodes=nodes))


@pytest.mark.parametrize(("max_nodes", "want"), [(None, None), (2, None), (5, None), (1, 1)])
def test_max_nodes_is_kept_only_below_the_node_count(max_nodes, want):
    part = _part(max_nodes=max_nodes)
    assert describe(_facts(partitions=[part])).profile.partitions[0].max_nodes_per_job == want


def test_max_time_unlimited_is_infinite_and_the_default_time_comes_from_the_default():
    parts = [_part("a", max_time="UNLIMITED", default_time="00:30:00"),
             _part("b", default=False, max_time="1-00:00:00", default_time="00:10:00")]
    nodes = [_node("n1", parts=("a", "b"))]
    found = describe(_facts(partitions=parts, nodes=nodes)).profile
    assert [p.max_time for p in found.partitions] == ["infinite", "1-00:00:00"]
    assert found.scheduler.default_time == "00:30:00"
    # No default partition: the shortest DefaultTime any partition sets.
    parts = [dataclasses.replace(p, default=False) for p in parts]
    assert describe(_facts(partitions=parts, nodes=nodes)).profile.scheduler.default_time \
        == "00:10:00"
    parts = [dataclasses.replace(p, default_time=None) for p in parts]
    assert describe(_facts(partitions=parts, nodes=nodes)).profile.scheduler.default_time \
        == "01:00:00"


def test_per_user_limits_come_from_the_partitions_qos_else_normal():
    qos = {"normal": sd.Qos("normal", 10, None, None), "gpu": sd.Qos("gpu", 2, 8, None)}
    parts = [_part("a"), _part("b", default=False, qos="gpu"), _part("c", default=False,
                                                                        qos="gone")]
    nodes = [_node("n1", parts=("a", "b", "c"))]
    got = describe(_facts(partitions=parts, nodes=nodes, qos=qos)).profile.partitions
    assert [(p.max_jobs_per_user, p.max_gpus_per_user) for p in got] == \
        [(10, None), (2, 8), (None, None)]
    text = describe(_facts(partitions=parts, nodes=nodes, qos=qos)).text
    assert "partition QoS=gone (sacctmgr show qos): no such QOS" in text


@pytest.mark.parametrize(("types", "want"), [(("pmi2", "pmix", "none"), "pmix"),
                                             (("pmi2", "none"), "pmi2"), (("none",), None)])
def test_srun_mpi_prefers_pmix_then_pmi2(types, want):
    found = describe(_facts(mpi=sd.MpiPlugins(types, ()))).profile
    assert found.mpi.srun_mpi == want


def test_no_runtime_found_falls_back_to_the_schema_default_and_says_so():
    found = describe(_facts(runtime=sd.Runtime(None, None, None),
                            gaps={"runtime": "neither apptainer nor singularity"}))
    assert found.profile.container.runtime == "apptainer"
    assert "GAP: neither apptainer nor singularity on this node" in found.text


@pytest.mark.parametrize(("cluster", "name", "want"), [
    ("c1", None, "c1"), ("my cluster/1", None, "my-cluster-1"), ("..", None, "detected"),
    (None, None, "detected"), ("c1", "mine", "mine")])
def test_profile_name(cluster, name, want):
    config = {"ClusterName": cluster} if cluster else {}
    assert profile_name(_facts(config=config), name) == want
