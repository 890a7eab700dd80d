"""hpcdl/probe/request.py: `hpcdl probe`'s options become the worker's command line, which
the worker's own parser reads back as the same options (property); each bad option is a
one-line refusal naming it and its limit; the node count and the worker's path."""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcdl.errors import ValidationError
from hpcdl.jobside import probe_worker, protocol
from hpcdl.probe.request import (
    DIST_BACKENDS,
    MAX_NODES,
    MPI_MODES,
    ProbeOptions,
    check_nodes,
    worker_args,
    worker_path,
)
from hpcdl.profiles.schema import Profile


def profile(**interconnect: object) -> Profile:
    return Profile.model_validate({"name": "site", "interconnect": interconnect, "partitions": [
        {"name": "p", "nodes": 2, "gpus_per_node": 0, "cpus_per_node": 4, "max_time": "01:00:00"}]})


SIZES = st.lists(st.integers(1, 1 << 28).map(lambda n: 4 * n), min_size=1, max_size=4)


@given(sizes=SIZES, iters=st.integers(1, protocol.MAX_ITERS),
       warmup=st.integers(0, protocol.MAX_ITERS), backend=st.sampled_from(DIST_BACKENDS),
       mpi=st.sampled_from(MPI_MODES), ratio=st.floats(0.01, 0.99),
       ifname=st.sampled_from([None, "ib0", "^docker,lo", "=eth0"]),
       expected=st.none() | st.floats(0.5, 400))
def test_the_worker_reads_back_what_was_asked(sizes, iters, warmup, backend, mpi, ratio,
                                               ifname, expected):
    opts = ProbeOptions(sizes=",".join(map(str, sizes)), iters=iters, warmup=warmup,
                        backend=backend, mpi=mpi, ifname=ifname, slow_ratio=ratio)
    args = worker_args(opts, profile(expected_busbw_gbs=expected))
    got = probe_worker._arguments(list(args))
    assert protocol.parse_sizes(got.sizes) == tuple(sorted(set(sizes)))
    assert (got.iters, got.warmup, got.backend, got.mpi, got.ifname) == \
        (iters, warmup, backend, mpi, ifname)
    assert got.slow_ratio == pytest.approx(ratio, rel=1e-5)
    assert (got.expected_gbs is None) == (expected is None)
    if expected is not None:
        assert got.expected_gbs == pytest.approx(expected, rel=1e-5)


def test_the_profiles_interface_is_the_default_and_ifname_overrides_it():
    args = worker_args(ProbeOptions(), profile(socket_ifname="ib0"))
    assert args[args.index("--ifname") + 1] == "ib0"
    args = worker_args(ProbeOptions(ifname="eth1"), profile(socket_ifname="ib0"))
    assert args[args.index("--ifname") + 1] == "eth1"
    assert "--ifname" not in worker_args(ProbeOptions(), profile())
    assert worker_args(ProbeOptions(), profile())[:2] == ("--sizes", "64K,1M,16M,128M")


@pytest.mark.parametrize(("opts", "message"), [
    (ProbeOptions(sizes="6"), "sizes: '6' is 6 bytes, not a whole number of float32"),
    (ProbeOptions(sizes="1K,,2K"), "sizes: '1K,,2K' is not a comma list of sizes"),
    (ProbeOptions(sizes="2G"), "sizes: '2G' is 2147483648 bytes: a probe message is 4 bytes to 1G"),
    (ProbeOptions(iters=0), "iters: 0 is not 1 to 1000"),
    (ProbeOptions(warmup=1001), "warmup: 1001 is not 0 to 1000"),
    (ProbeOptions(backend="mpi"), "backend: 'mpi' is not one of auto, gloo, nccl"),
    (ProbeOptions(mpi="yes"), "mpi: 'yes' is not one of auto, on, off"),
    (ProbeOptions(slow_ratio=1.0), "slow-ratio: 1.0 is not between 0 and 1"),
    (ProbeOptions(ifname="eth0; reboot"), "ifname: 'eth0; reboot' is not an interface name"),
    (ProbeOptions(ifname="a" * 16), "ifname: "),
])
def test_a_bad_option_is_one_line_naming_it(opts, message):
    with pytest.raises(ValidationError) as err:
        worker_args(opts, profile())
    assert err.value.message.startswith(message) and "\n" not in err.value.message


def test_the_probe_needs_two_nodes_and_at_most_its_limit():
    with pytest.raises(ValidationError, match=r"needs 2 or more \(got 1\)") as err:
        check_nodes(1)
    assert "-N 2" in (err.value.hint or "")
    check_nodes(2)
    check_nodes(MAX_NODES)
    with pytest.raises(ValidationError, match=f"{MAX_NODES + 1} exceeds the probe's {MAX_NODES} nodes"):
        check_nodes(MAX_NODES + 1)


def test_where_the_job_finds_the_worker():
    assert worker_path(True, "/ignored", PurePosixPath("/opt/hpcdl")) == \
        "/opt/hpcdl/hpcdl/jobside/probe_worker.py"
    assert worker_path(False, "/home/u/src/hpcdl", PurePosixPath("/opt/hpcdl")) == \
        "/home/u/src/hpcdl/jobside/probe_worker.py"
