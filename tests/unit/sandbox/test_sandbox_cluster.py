"""hpcdl/sandbox/cluster.py: the shape file parses back to the shape that wrote it, the
addresses make one cluster or say why not, hostlists expand, a partition's profile entry
is its smallest node's, and the environment's values are checked, one line per error."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcdl.errors import ValidationError
from hpcdl.sandbox.cluster import (
    DEFAULT_SHAPE,
    Cluster,
    Node,
    Partition,
    Shape,
    network_problem,
    parse_shape,
    profile_partition,
    profile_partitions,
)

NAMES = st.from_regex(r"[a-z][a-z0-9]{0,5}", fullmatch=True)
TIMES = st.sampled_from([None, "00:05:00", "1-00:00:00", "UNLIMITED", "30"])


@st.composite
def shapes(draw) -> Shape:
    names = draw(st.lists(NAMES, min_size=1, max_size=4, unique=True))
    netns = draw(st.booleans())
    nodes = []
    for i, name in enumerate(names):
        gpus = draw(st.integers(0, 8))
        nodes.append(Node(name=name, address=f"10.9.0.{i + 2}" if netns else f"127.0.0.{i + 2}",
                          port=draw(st.integers(1, 65535)), cpus=draw(st.integers(1, 256)),
                          memory_mb=draw(st.integers(1, 10**6)), gpus=gpus,
                          gpu_type=draw(st.sampled_from(["a100", "fake"])) if gpus else None,
                          state=draw(st.sampled_from(["up", "down", "nogres"]))))
    parts = []
    for pname in draw(st.lists(NAMES, max_size=3, unique=True)):
        members = draw(st.lists(st.sampled_from(names), max_size=3, unique=True))
        parts.append(Partition(
            name=pname, nodes=",".join(members) or None, default=draw(st.booleans()),
            max_nodes=draw(st.none() | st.integers(1, 99)), max_time=draw(TIMES),
            default_time=draw(TIMES), priority_tier=draw(st.none() | st.integers(0, 65533)),
            preempt_mode=draw(st.sampled_from([None, "OFF", "REQUEUE", "CANCEL"])),
            grace_time=draw(st.none() | st.integers(0, 999)), hidden=draw(st.booleans()),
            state=draw(st.sampled_from(["UP", "DOWN", "DRAIN", "INACTIVE"]))))
    return Shape(nodes=tuple(nodes), partitions=tuple(parts))


@given(shapes())
def test_the_shape_file_parses_back_to_its_shape(shape):
    assert parse_shape(shape.shape_text()) == shape


def test_the_default_shape_round_trips_and_sits_on_its_bridge():
    assert parse_shape(DEFAULT_SHAPE.shape_text()) == DEFAULT_SHAPE
    assert (DEFAULT_SHAPE.netns, DEFAULT_SHAPE.subnet, DEFAULT_SHAPE.ctld_address) == \
        (True, "10.77.0", "10.77.0.1")


def test_comments_and_blank_lines_are_skipped_and_loopback_means_no_namespaces():
    shape = parse_shape("# two nodes\n\nnode a 127.0.0.2 7001 4 2048 gpu:x:2 up\n"
                        "   node b 127.0.0.3 7002 2 512 - down\npartition p a,b MaxNodes=1\n")
    assert (shape.netns, shape.subnet, shape.ctld_address) == (False, "", "127.0.0.1")
    assert shape.nodes[0].gres == "gpu:x:2" and shape.nodes[1].gres is None
    assert not shape.nodes[1].has_slurmd and shape.nodes[0].has_slurmd


@pytest.mark.parametrize(("text", "message"), [
    ("", "no node lines"),
    ("node a 10.0.0.2 1 1 1 - up\nnode a 10.0.0.3 1 1 1 - up\n", "node a is listed twice"),
    ("node a 10.0.0.2 1 1 1\n", "bad shape line: node a 10.0.0.2 1 1 1"),
    ("node a 10.0.0.2 1 1 1 gpu:x up\n", "bad shape line"),
    ("node a 10.0.0.2 1 0 1 - up\n", "cpus"),
    ("node a 10.0.0.2 1 1 1 - sleepy\n", "state"),
    ("node A 10.0.0.2 1 1 1 - up\n", "bad shape line: node A"),
    ("node a 10.0.0.2 1 1 1 - up\npartition p a Colour=red\n", "'Colour=red' is not one of"),
    ("node a 10.0.0.2 1 1 1 - up\npartition p a MaxNodes=many\n", "MaxNodes 'many' is not a number"),
    ("node a 10.0.0.2 1 1 1 - up\npartition p a Hidden=yes\n", "Hidden 'yes' is not YES or NO"),
    ("node a 10.0.0.2 1 1 1 - up\npartition p a MaxTime=soon\n", "max_time"),
    ("node a 10.0.0.2 1 1 1 - up\npartition p\n", "bad shape line: partition p"),
    ("node a 10.0.0.2 1 1 1 - up\npartition q a\npartition q a\n", "partition q is listed twice"),
    ("node a 10.0.0.2 1 1 1 - up \u00e9\n", "not printable ASCII"),
    ("cluster a\n", "bad shape line: cluster a"),
    ("node a 10.0.0.1 1 1 1 - up\n", "must end in 2-254"),
    ("node a 10.0.0.300 1 1 1 - up\n", "is not an IPv4 address"),
    ("node a 10.0.0.2 1 1 1 - up\nnode b 10.0.1.2 1 1 1 - up\n", "outside the cluster's subnet 10.0.0.0/24"),
    ("node a 10.0.0.2 1 1 1 - up\nnode b 127.0.0.2 1 1 1 - up\n", "mix 127.0.0.0/8"),
])
def test_a_bad_shape_is_refused_in_one_line(text, message):
    with pytest.raises(ValidationError) as err:
        parse_shape(text)
    assert message in err.value.message and "\n" not in err.value.message


def test_network_problem_accepts_one_slash_24_or_all_loopback():
    def node(name, address):
        return Node(name=name, address=address, port=1, cpus=1, memory_mb=1)
    assert network_problem((node("a", "10.1.2.2"), node("b", "10.1.2.254"))) is None
    assert network_problem((node("a", "127.0.0.2"), node("b", "127.9.9.9"))) is None
    assert "must end in 2-254" in network_problem((node("a", "10.1.2.255"),))


def test_hostlists_expand_and_the_slurm_line_keeps_its_order():
    p = Partition(name="p", nodes="f[1-3],g,h[9-10]", default=True, max_time="00:05:00",
                  hidden=True, state="DOWN")
    assert p.node_names() == ["f1", "f2", "f3", "g", "h9", "h10"]
    assert p.slurm_line() == ("PartitionName=p Nodes=f[1-3],g,h[9-10] Default=YES "
                              "MaxTime=00:05:00 Hidden=YES State=DOWN")
    assert Partition(name="e", nodes=None).node_names() == []


def test_gpus_and_gpu_type_go_together():
    with pytest.raises(ValueError, match="gpus and gpu_type go together"):
        Node(name="a", address="10.0.0.2", port=1, cpus=1, memory_mb=1, gpus=2)


def test_a_profile_partition_is_what_its_smallest_node_can_run():
    big = Node(name="a", address="10.0.0.2", port=1, cpus=16, memory_mb=8192, gpus=4,
               gpu_type="x")
    small = Node(name="b", address="10.0.0.3", port=1, cpus=4, memory_mb=2048, gpus=2,
                 gpu_type="y")
    tiny = Node(name="c", address="10.0.0.4", port=1, cpus=4, memory_mb=1000)
    p = Partition(name="p", nodes="a,b", max_nodes=1, max_time="UNLIMITED", default=True)
    assert profile_partition(p, [big, small]) == {
        "name": "p", "nodes": 2, "gpus_per_node": 2, "cpus_per_node": 4, "mem_per_node_gb": 2,
        "max_nodes_per_job": 1, "max_time": "infinite", "default": True}
    one = profile_partition(Partition(name="q", nodes="a", max_nodes=5), [big])
    assert one == {"name": "q", "nodes": 1, "gpus_per_node": 4, "gpu_type": "x",
                   "cpus_per_node": 16, "mem_per_node_gb": 8, "max_time": "infinite"}
    assert "mem_per_node_gb" not in profile_partition(p, [tiny])
    shape = Shape(nodes=(big, small, tiny), partitions=(
        p, Partition(name="down", nodes="a", state="DOWN"), Partition(name="none", nodes=None),
        Partition(name="ghost", nodes="z")))
    assert [e["name"] for e in profile_partitions(shape)] == ["p"]


def test_the_cluster_from_its_environment():
    assert Cluster.from_env({}) == Cluster(shape=DEFAULT_SHAPE)
    c = Cluster.from_env({"HPCDL_SANDBOX_DIR": "/tmp/c-1", "HPCDL_SANDBOX_CTLD_PORT": "7000",
                          "HPCDL_SANDBOX_EXPEDITE": "yes", "HPCDL_SANDBOX_ACCOUNTING": "",
                          "HPCDL_SANDBOX_SLURM_ROOT": "/opt/r"},
                         "node a 127.0.0.2 7001 1 1 - up\n")
    assert (c.dir, c.ctld_port, c.expedited_requeue, c.accounting) == \
        ("/tmp/c-1", 7000, True, "slurmdbd")
    assert c.plugin_dir == "/opt/r/usr/lib/x86_64-linux-gnu/slurm-wlm"
    assert len(c.tag) == 6 and c.bridge == f"hsb-{c.tag}" and len(c.bridge) <= 15
    assert c.veth_of("a") == f"hsv-{c.tag}-1" and c.netns_of("a") == f"hpcdl-{c.tag}-a"
    # Another directory, another tag: two clusters' interfaces never meet.
    assert Cluster.from_env({"HPCDL_SANDBOX_DIR": "/tmp/c-2"}).tag != c.tag


@pytest.mark.parametrize(("env", "message"), [
    ({"HPCDL_SANDBOX_EXPEDITE": "true"}, "HPCDL_SANDBOX_EXPEDITE: 'true' is not yes or no"),
    ({"HPCDL_SANDBOX_DB_PORT": "80a"}, "HPCDL_SANDBOX_DB_PORT: '80a' is not a port"),
    ({"HPCDL_SANDBOX_DBD_PORT": "70000"}, "HPCDL_SANDBOX_DBD_PORT: 70000"),
    ({"HPCDL_SANDBOX_DIR": "/tmp/a b"}, "HPCDL_SANDBOX_DIR: '/tmp/a b'"),
    ({"HPCDL_SANDBOX_CLUSTER": "$(id)"}, "HPCDL_SANDBOX_CLUSTER: '$(id)'"),
])
def test_a_bad_environment_value_is_named(env, message):
    with pytest.raises(ValidationError) as err:
        Cluster.from_env(env)
    assert err.value.message.startswith(message)
