"""`hpcdl probe`'s pure parts: sizes, bandwidth maths, the pair schedule, the slow-node
verdict, the worker's input checks, the report line, the plan/script, the tables and
the CLI's refusals. The measurements themselves run on the sandbox
(tests/integration/test_probe.py)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from hpcdl.cli import cli
from hpcdl.cli.display import probe_view
from hpcdl.errors import ValidationError
from hpcdl.jobs.flow import probe_exit
from hpcdl.jobs.result import JobLogs, result_record
from hpcdl.jobside import probe_worker as worker
from hpcdl.jobside import protocol
from hpcdl.plan import JobPlan, JobRequest, build_plan
from hpcdl.probe.request import ProbeOptions, worker_args
from hpcdl.profiles import load_profile
from hpcdl.profiles.schema import Profile
from hpcdl.schedulers.base import JobState, JobStatus

# ---- sizes ------------------------------------------------------------------------


@pytest.mark.parametrize("text, size", [("4", 4), ("4096", 4096), ("4K", 4096), ("64k", 65536),
                                        ("1M", 1 << 20), ("1MiB", 1 << 20), ("1G", 1 << 30),
                                        (" 16M ", 16 << 20)])
def test_parse_size(text, size):
    assert protocol.parse_size(text) == size
    assert protocol.parse_size(protocol.format_size(size)) == size


@pytest.mark.parametrize("text, why", [("3X", "not a size"), ("", "not a size"), ("1.5M", "not a size"),
                                       ("-4", "not a size"), ("0", "4 bytes to 1G"),
                                       ("2G", "4 bytes to 1G"), ("6", "float32")])
def test_parse_size_refuses(text, why):
    with pytest.raises(protocol.ProbeInputError, match=why):
        protocol.parse_size(text)


def test_parse_sizes_sorts_and_drops_duplicates():
    assert protocol.parse_sizes("1M,4K,1024K") == (4096, 1 << 20)
    for bad in ("", "4K,", ",4K", "4K,,1M"):
        with pytest.raises(protocol.ProbeInputError, match="comma list"):
            protocol.parse_sizes(bad)


def test_format_size_uses_the_largest_exact_unit():
    assert [protocol.format_size(s) for s in (100, 4096, 1536 * 1024, 1 << 30)] == \
        ["100", "4K", "1536K", "1G"]


# ---- bandwidth maths -----------------------------------------------------------------


def test_bus_bandwidth_is_nccl_tests_allreduce_factor():
    # 1 GB in 1 s: algbw 1 GB/s; busbw = algbw * 2(n-1)/n
    assert worker.bandwidths(10**9, 1.0, 2) == (1.0, 1.0)
    algbw, busbw = worker.bandwidths(10**9, 0.5, 8)
    assert algbw == pytest.approx(2.0)
    assert busbw == pytest.approx(2.0 * 14 / 8)
    assert worker.bus_factor(1) == 0
    with pytest.raises(ValueError):
        worker.bandwidths(4096, 0.0, 2)
    with pytest.raises(ValueError):
        worker.bus_factor(0)


# ---- pair schedule ------------------------------------------------------------------


@pytest.mark.parametrize("nodes", [2, 3, 8])
def test_pairs_one_at_a_time_for_few_nodes(nodes):
    rounds = worker.pair_rounds(nodes)
    assert all(len(r) == 1 for r in rounds)
    assert sorted(p for r in rounds for p in r) == list(itertools.combinations(range(nodes), 2))


# Ring (2-3 rounds), then up to 8 suspects one at a time or 1-2 rounds of disjoint pairs.
MAX_ROUNDS = 3 + 8
# Every N from 9 to 64, then sizes up to the probe's limit.
MANY = [*range(9, 65), 100, 127, 128, 255, 511, 512, 1000, 1023, 2048, 4095, 4096]


def _disjoint(rounds):
    for pairs in rounds:
        members = [n for p in pairs for n in p]
        assert len(members) == len(set(members))  # no node twice in a round


@pytest.mark.parametrize("nodes", MANY)
def test_ring_rounds_above_eight_nodes(nodes):
    rounds = worker.pair_rounds(nodes)
    assert len(rounds) == (2 if nodes % 2 == 0 else 3)  # not N-1: constant in N
    _disjoint(rounds)
    every = sorted(p for r in rounds for p in r)
    ring = sorted({(min(i, (i + 1) % nodes), max(i, (i + 1) % nodes)) for i in range(nodes)})
    assert every == ring  # each ring link exactly once: N pairs, 2 per node
    assert all(a < b for a, b in every)


def _probe(nodes, slow, good=1.0, bad=0.05):
    """The worker's schedule on crafted links: a link is slow when either end is."""
    def bw(a, b):
        return bad if a in slow or b in slow else good
    rounds = worker.pair_rounds(nodes)
    measured = {p: bw(*p) for r in rounds for p in r}
    extra = worker.confirm_rounds(nodes, measured)
    measured.update({p: bw(*p) for r in extra for p in r})
    names = [f"n{i}" for i in range(nodes)]
    judged = worker.verdict(names, {(names[a], names[b]): v for (a, b), v in measured.items()})
    return rounds, extra, measured, judged


@pytest.mark.parametrize("nodes", MANY)
def test_one_slow_node_is_named_in_a_constant_number_of_rounds(nodes):
    slow = {nodes * 13 // 16}  # "the 13th of 16"
    rounds, extra, measured, judged = _probe(nodes, slow)
    assert len(rounds) + len(extra) <= MAX_ROUNDS
    _disjoint(extra)
    assert len(extra) == 1 and len(extra[0]) == 1  # the one suspect, against a good node
    (pair,) = extra[0]
    assert set(pair) - slow and not set(pair) - slow <= {(min(slow) + d) % nodes for d in (-1, 1)}
    assert judged["slow_nodes"] == [f"n{n}" for n in sorted(slow)] and judged["bad"]
    assert len(measured) <= nodes + nodes // 2  # about N pairs, never every pair
    covered = {n for p in measured for n in p}
    assert covered == set(range(nodes))  # every node measured


@pytest.mark.parametrize("nodes", [9, 10, 11, 16, 17, 32, 33, 64, 512, 4096])
def test_a_good_node_between_two_slow_ones_is_cleared(nodes):
    # Node 5's both ring links are slow because 4 and 6 are: it is a suspect after the
    # ring, and its link to a good node clears it. Three suspects: one pair a round each.
    slow = {4, 6}
    rounds, extra, measured, judged = _probe(nodes, slow)
    suspects = sorted({n for r in extra for p in r for n in p if n in (4, 5, 6)})
    assert suspects == [4, 5, 6] and [len(r) for r in extra] == [1, 1, 1]
    assert judged["slow_nodes"] == ["n4", "n6"]
    assert len(rounds) + len(extra) <= MAX_ROUNDS


@pytest.mark.parametrize("nodes", [9, 12, 16, 25, 32, 101, 1024])
def test_many_slow_nodes_up_to_just_under_half(nodes):
    slow = set(range(0, nodes, 3))  # every third: a third of the nodes, neighbours of two
    rounds, extra, measured, judged = _probe(nodes, slow)
    assert len(rounds) + len(extra) <= MAX_ROUNDS
    if len(slow) > 8:  # more than 8 suspects: rounds of disjoint pairs, at most 2
        assert len(extra) <= 2
    _disjoint(extra)
    assert judged["slow_nodes"] == [f"n{n}" for n in sorted(slow)]
    adjacent = {4, 5} if nodes > 9 else {4}  # two slow neighbours side by side
    rounds, extra, measured, judged = _probe(nodes, adjacent)
    assert judged["slow_nodes"] == [f"n{n}" for n in sorted(adjacent)]


@pytest.mark.parametrize("nodes", [9, 16, 33, 4096])
def test_healthy_ring_needs_no_second_round(nodes):
    rounds, extra, measured, judged = _probe(nodes, set())
    assert extra == [] and not judged["bad"] and judged["slow_nodes"] == []


def test_a_good_node_slowed_by_load_is_cleared_alone():
    # Noise, not a link: node 7's two ring pairs ran slow, and then it is re-measured in
    # a round of its own against the fastest good node it has not met. (Slowed below the
    # default threshold, as heavy load on a shared machine can.)
    nodes = 20
    ring = {p: 1.0 for r in worker.pair_rounds(nodes) for p in r}
    ring[(6, 7)] = ring[(7, 8)] = protocol.DEFAULT_SLOW_RATIO / 2
    ring[(11, 12)] = 2.0  # the fastest good nodes: 11 and 12
    assert worker.confirm_rounds(nodes, ring) == [[(7, 11)]]
    slow = {0, 5, 10, 15}
    many = {p: (0.1 if set(p) & slow else 1.0) for p in ring}
    shared = worker.confirm_rounds(nodes, many, one_at_a_time_up_to=2)
    assert [len(r) for r in shared] == [4]  # 4 suspects > 2: one round of disjoint pairs
    _disjoint(shared)


def test_confirm_rounds_without_a_reference_adds_nothing():
    nodes = 10
    zero = {p: 0.0 for r in worker.pair_rounds(nodes) for p in r}
    assert worker.confirm_rounds(nodes, zero) == []
    assert worker.best_links(3, {(0, 1): 2.0, (1, 2): 1.0}) == [2.0, 2.0, 1.0]


def test_no_pairs_below_two_nodes():
    assert worker.pair_rounds(1) == [] and worker.pair_rounds(0) == []


# ---- the verdict -----------------------------------------------------------------


def _matrix(nodes, slow=(), good=1.0, bad=0.1):
    return {(a, b): (bad if a in slow or b in slow else good)
            for a, b in itertools.combinations(nodes, 2)}


def test_three_nodes_one_slow_is_named():
    nodes = ["n1", "n2", "n3"]
    judged = worker.verdict(nodes, _matrix(nodes, slow={"n3"}))
    assert judged["bad"] and judged["slow_nodes"] == ["n3"]
    assert judged["slow_links"] == [["n1", "n3"], ["n2", "n3"]]
    assert judged["node_ratio"]["n3"] == pytest.approx(0.1)
    assert "n3" in judged["message"] and "10%" in judged["message"]


def test_healthy_nodes_name_none():
    nodes = ["a", "b", "c", "d"]
    pairs = {p: 1.0 + 0.1 * i for i, p in enumerate(itertools.combinations(nodes, 2))}
    judged = worker.verdict(nodes, pairs)
    assert not judged["bad"] and judged["slow_nodes"] == [] and judged["slow_links"] == []
    assert judged["message"].startswith("no slow node")


def test_one_slow_link_between_good_nodes_names_no_node():
    nodes = ["a", "b", "c", "d"]
    pairs = _matrix(nodes)
    pairs[("a", "b")] = 0.1  # a cable, not a node: a and b have good links elsewhere
    judged = worker.verdict(nodes, pairs)
    assert judged["slow_nodes"] == [] and not judged["bad"]
    assert judged["slow_links"] == [["a", "b"]]


def test_threshold_is_the_slow_ratio():
    nodes = ["a", "b", "c"]
    pairs = _matrix(nodes, slow={"c"}, bad=0.6)
    assert worker.verdict(nodes, pairs)["slow_nodes"] == []  # 60% >= the default
    assert worker.verdict(nodes, pairs, slow_ratio=0.7)["slow_nodes"] == ["c"]


def test_two_nodes_slow_link_against_the_profile_names_no_end():
    judged = worker.verdict(["n1", "n2"], {("n1", "n2"): 1.0}, expected_gbs=10.0)
    assert judged["bad"] and judged["slow_nodes"] == [] and judged["slow_links"] == [["n1", "n2"]]
    assert "third node" in judged["message"] and "10%" in judged["message"]
    fine = worker.verdict(["n1", "n2"], {("n1", "n2"): 9.0}, expected_gbs=10.0)
    assert not fine["bad"] and "no slow link" in fine["message"]


def test_two_nodes_without_expected_bandwidth_cannot_judge():
    judged = worker.verdict(["n1", "n2"], {("n1", "n2"): 0.001})
    assert not judged["bad"] and judged["reference"] == "none"
    assert "expected_busbw_gbs" in judged["message"]


def test_verdict_refuses_bad_input():
    with pytest.raises(ValueError, match="2 or more"):
        worker.verdict(["n1"], {})
    with pytest.raises(ValueError, match="not among"):
        worker.verdict(["n1", "n2"], {("n1", "n9"): 1.0})


# ---- interfaces and NCCL's lines -------------------------------------------------


def test_match_interfaces_follows_nccl_socket_ifname():
    names = ["lo", "eth0", "eth1", "ib0", "docker0"]
    assert worker.match_interfaces("eth", names) == ["eth0", "eth1"]
    assert worker.match_interfaces("=eth", names) == []
    assert worker.match_interfaces("=eth1,ib0", names) == ["eth1", "ib0"]
    assert worker.match_interfaces("^docker,lo", names) == ["eth0", "eth1", "ib0"]
    assert worker.match_interfaces("eth9", names) == []
    assert worker.gloo_interface(worker.match_interfaces("^docker", names)) == "eth0"  # not lo
    assert worker.gloo_interface(["lo"]) == "lo"  # asked for: one node, or the user knows
    with pytest.raises(ValueError):
        worker.gloo_interface([])


def test_parse_nccl_debug():
    text = ("n1:123:456 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>\n"
            "n1:123:456 [0] NCCL INFO Using network Socket\n")
    assert worker.parse_nccl_debug(text) == {"transport": "Socket", "devices": "[0]eth0:10.0.0.1<0>"}
    ib = "NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.1.0.1<0>"
    assert worker.parse_nccl_debug(ib) == {"transport": "IB",
                                           "devices": "[0]mlx5_0:1/IB [1]mlx5_1:1/IB"}
    assert worker.parse_nccl_debug("nothing here") == {}


# ---- the worker's refusals (before torch is imported) ------------------------------


def _run_worker(monkeypatch, capsys, args, world="2"):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", world)
    monkeypatch.setenv("SLURMD_NODENAME", "n7")
    code = worker.main(args)
    out, err = capsys.readouterr()
    return code, protocol.parse_probe(out), err


def test_worker_refuses_one_rank(monkeypatch, capsys):
    code, report, err = _run_worker(monkeypatch, capsys, ["--sizes", "4K"], world="1")
    assert code == protocol.EXIT_BAD_INPUT
    assert report == {"node": "n7", "rank": 0, "error": report["error"], "exit_code": 2}
    assert "world size 1" in report["error"] and err.count("\n") == 1


def test_worker_refuses_an_interface_the_node_lacks(monkeypatch, capsys):
    code, report, err = _run_worker(monkeypatch, capsys, ["--ifname", "eth9"])
    assert code == 2
    assert report["error"].startswith("--ifname eth9: no interface of node n7 matches (it has lo")
    assert err.strip() == f"hpcdl probe: {report['error']}"


def test_a_refusal_reaches_result_json_when_srun_drops_the_ranks_stdout(
        monkeypatch, capsys, tmp_path):
    # srun --kill-on-bad-exit can end the step before a refusing rank's stdout is in the
    # log: the rank also writes its line to the run directory, and the record reads it.
    monkeypatch.setenv("HPCDL_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("SLURMD_NODENAME", "n2")
    assert worker.main(["--ifname", "eth9"]) == 2
    capsys.readouterr()
    assert [p.name for p in tmp_path.iterdir()] == ["probe-error.1"]
    status = JobStatus(job_id="7", name="hpcdl-probe", state=JobState.FAILED, native_state="FAILED",
                       exit_code=143)
    empty = JobLogs(tmp_path / "o", tmp_path / "e", "", "srun: error: n2: task 1: Exited\n")
    record = result_record(status, empty, protocol.read_probe_errors(tmp_path))
    assert record["probe"]["node"] == "n2" and record["probe"]["rank"] == 1
    assert record["probe"]["error"].startswith("--ifname eth9: no interface of node n2")
    assert probe_exit(dict(record), 143) == 2
    assert result_record(status, empty)["probe"] is None  # without the file: nothing


@pytest.mark.parametrize("args, why", [(["--sizes", "3X"], "not a size"),
                                       (["--iters", "0"], "iters 0"),
                                       (["--slow-ratio", "1"], "slow-ratio"),
                                       (["--ifname", "a b"], "not an interface name")])
def test_worker_refuses_bad_values(monkeypatch, capsys, args, why):
    code, report, _ = _run_worker(monkeypatch, capsys, args)
    assert code == 2 and why in report["error"]


# ---- request -> worker arguments -----------------------------------------------------


def _profile(**interconnect) -> Profile:
    data = load_profile("sandbox").model_dump(mode="json")
    data["interconnect"] = interconnect
    return Profile.model_validate(data)


def test_worker_args_carry_the_profile_interconnect():
    args = worker_args(ProbeOptions(sizes="1M,4K"), _profile(expected_busbw_gbs=12.5,
                                                             socket_ifname="eth"))
    assert args == ("--sizes", "4K,1M", "--iters", "5", "--warmup", "2", "--backend", "auto",
                    "--mpi", "auto", "--slow-ratio", f"{protocol.DEFAULT_SLOW_RATIO:g}",
                    "--ifname", "eth",
                    "--expected-gbs", "12.5")
    mine = worker_args(ProbeOptions(ifname="ib0"), _profile(socket_ifname="eth"))
    assert mine[mine.index("--ifname") + 1] == "ib0"


@pytest.mark.parametrize("opts, field", [(ProbeOptions(sizes="4K,x"), "sizes: 'x'"),
                                         (ProbeOptions(sizes="2G"), "sizes: '2G' is 2147483648"),
                                         (ProbeOptions(iters=0), "iters: 0"),
                                         (ProbeOptions(warmup=-1), "warmup: -1"),
                                         (ProbeOptions(slow_ratio=0), "slow-ratio: 0"),
                                         (ProbeOptions(ifname="eth0\nx"), "ifname:"),
                                         (ProbeOptions(ifname="$(reboot)"), "ifname:"),
                                         (ProbeOptions(backend="mpi"), "backend:")])
def test_worker_args_refuse_bad_values(opts, field):
    with pytest.raises(ValidationError, match=field.replace("(", r"\(").replace("$", r"\$")) as exc:
        worker_args(opts, _profile())
    assert "\n" not in exc.value.message


def test_profile_interconnect_is_typed():
    assert _profile(expected_busbw_gbs=25).interconnect.expected_busbw_gbs == 25
    for bad in ({"expected_busbw_gbs": 0}, {"expected_busbw_gbs": -1},
                {"socket_ifname": "eth0;reboot"}, {"speed": 1}):
        with pytest.raises(ValueError):
            _profile(**bad)


# ---- the report line -----------------------------------------------------------------


def test_probe_line_round_trips_through_srun_label_chunks():
    report = {"nodes": ["n1", "n2"], "pad": "x" * 3000}
    line = protocol.probe_line(report)
    chunks = [line[i:i + 1000] for i in range(0, len(line), 1000)]
    log = "hpcdl: job 1\n" + "\n".join(
        f"0: {c}" + ("\n1: a warning from rank 1" if i == 1 else "") for i, c in enumerate(chunks))
    assert protocol.parse_probe(log) == report
    assert protocol.without_probe(log + "\nlast") == "hpcdl: job 1\n1: a warning from rank 1\nlast"
    assert protocol.parse_probe("0: " + line[:100]) is None  # cut short: nothing


def test_parse_probe_prefers_rank_zeros_measurements_to_an_error():
    error = protocol.probe_line({"node": "n2", "error": "boom"})
    measured = protocol.probe_line({"nodes": ["n1", "n2"]})
    assert protocol.parse_probe(f"1: {error}\n0: {measured}\n") == {"nodes": ["n1", "n2"]}
    assert protocol.parse_probe(f"1: {error}\n") == {"node": "n2", "error": "boom"}
    assert protocol.parse_result(f"0: {measured}\n") is None  # not a training result


def test_parse_probe_names_the_lowest_ranks_error_whatever_the_order():
    # Every rank checks its own node; their lines arrive in any order.
    first = protocol.probe_line({"node": "n1", "rank": 0, "error": "no eth9 on n1"})
    second = protocol.probe_line({"node": "n2", "rank": 1, "error": "no eth9 on n2"})
    for log in (f"1: {second}\n0: {first}\n", f"0: {first}\n1: {second}\n"):
        assert protocol.parse_probe(log) == {"node": "n1", "rank": 0, "error": "no eth9 on n1"}


# ---- plan and script -------------------------------------------------------------


def _probe_plan(**kw: Any) -> JobPlan:
    prof = load_profile("sandbox")
    req = JobRequest.of(**{"nodes": 2, "gpus": 0, "launcher": "srun", "job_name": "hpcdl-probe",
                        "image": "/scratch/img/cpu.sif", "probe": worker_args(ProbeOptions(sizes="4K"), prof),
                        **kw})
    return build_plan(prof, req)


def test_probe_job_runs_the_worker_bound_from_the_host():
    plan = _probe_plan()
    assert plan.launch.launch_line.endswith("hpcdl-rank-env python3 /hpcdl/hpcdl/jobside/probe_worker.py "
                                     "--sizes 4K --iters 5 --warmup 2 --backend auto --mpi auto "
                                     f"--slow-ratio {protocol.DEFAULT_SLOW_RATIO:g}")
    assert ":/hpcdl/hpcdl:ro" in plan.launch.launch_line and "PYTHONPATH=/hpcdl" in plan.launch.launch_line
    assert plan.launch.launch_line.startswith("srun --label --kill-on-bad-exit=1 --mpi=pmix ")
    assert plan.launch.example_defaults == () and "probe first" not in plan.script
    assert plan.to_dict()["probe"][:2] == ["--sizes", "4K"]


def test_probe_first_is_a_step_before_the_command():
    plan = _probe_plan(probe_first=True, command=("python3", "train.py"), gpus=2)
    script = plan.script
    probe_line = plan.probe.line if plan.probe else None
    assert probe_line and probe_line in script
    probe_at, train_at = script.index(probe_line), script.index(plan.launch.launch_line)
    assert probe_at < train_at
    between = script[probe_at:train_at]
    assert 'exit "$hpcdl_probe_rc"' in between and "the training command was not started" in between
    assert plan.launch.launch_line.endswith("hpcdl-rank-env python3 train.py")
    assert ":/hpcdl/hpcdl:ro" not in plan.launch.launch_line  # the user's command gets no hpcdl binds


@pytest.mark.parametrize("kw, message", [
    ({"nodes": 1}, "nodes: the probe measures the links between nodes: it needs 2 or more (got 1)"),
    ({"launcher": "mpirun"}, "launcher: the probe starts one rank per task with srun (got mpirun)"),
    ({"example_args": ("--lr=1",)}, "example-arg: applies to the bundled example, not to the probe"),
])
def test_probe_plan_refusals(kw, message):
    with pytest.raises(ValidationError) as exc:
        _probe_plan(**kw)
    assert exc.value.message == message


def test_probe_refused_on_pbs():
    prof = load_profile("polaris")
    req = JobRequest.of(nodes=2, gpus=0, probe=("--sizes", "4K"), launcher="srun")
    with pytest.raises(ValidationError, match="probe: the probe starts its ranks with srun; "
                                              "profile polaris is pbs"):
        build_plan(prof, req)


# ---- tables and exit status ------------------------------------------------------

REPORT = {
    "backend": "gloo", "world_size": 3, "nodes": ["n1", "n2", "n3"], "ranks_per_node": 1,
    "iters": 5, "pair_size": 1 << 20, "pair_mode": "one pair at a time", "expected_gbs": 2.0,
    "allreduce": [{"size": 4096, "algorithm": "torch.distributed gloo all_reduce", "ranks": 3,
                   "time_s": 0.00025, "algbw_gbs": 0.0164, "busbw_gbs": 0.0218},
                  {"size": 1 << 20, "algorithm": "torch.distributed gloo all_reduce", "ranks": 3,
                   "time_s": 0.002, "algbw_gbs": 0.524, "busbw_gbs": 0.699}],
    "mpi": {"skipped": "--mpi off"},
    "pairs": [{"nodes": ["n1", "n2"], "time_s": 0.001, "algbw_gbs": 1.05, "busbw_gbs": 1.05},
              {"nodes": ["n1", "n3"], "time_s": 0.1, "algbw_gbs": 0.0105, "busbw_gbs": 0.0105},
              {"nodes": ["n2", "n3"], "time_s": 0.1, "algbw_gbs": 0.0105, "busbw_gbs": 0.0105}],
    "transport": {"backend": "gloo", "torch": "2.13.0+cpu", "transport": "TCP", "nodes": [
        {"node": "n1", "interface": "eth0", "address": "10.0.0.1", "env": {}},
        {"node": "n2", "interface": "eth0", "address": "10.0.0.2",
         "env": {"GLOO_SOCKET_IFNAME": "eth0"}}]},
}


def test_probe_view_renders_sizes_pairs_transport_and_verdict():
    nodes = REPORT["nodes"]
    report = {**REPORT, "verdict": worker.verdict(
        nodes, {tuple(p["nodes"]): p["busbw_gbs"] for p in REPORT["pairs"]}, expected_gbs=2.0)}
    text = probe_view(report)
    lines = text.splitlines()
    row = next(line for line in lines if line.strip().startswith("1M "))
    assert "2.00 ms" in row and "0.524" in row and "0.699" in row and "35%" in row  # 0.699/2.0
    assert any(line.strip().startswith("4K ") and "250 us" in line for line in lines)
    slow = [line for line in lines if "n3" in line and "yes" in line]
    assert len(slow) == 2 and all("1%" in line for line in slow)  # 0.0105 of the median 1.05
    assert "MPI: not measured (--mpi off)" in lines
    assert "transport: gloo over TCP (torch 2.13.0+cpu)" in lines
    nccl = {**report, "transport": {"backend": "nccl", "torch": "2.14.1", "nccl": "2.30.7",
                                    "transport": "IB", "devices": "[0]mlx5_0:1/IB", "nodes": []}}
    assert "transport: nccl over IB on [0]mlx5_0:1/IB (torch 2.14.1, NCCL 2.30.7)" in \
        probe_view(nccl).splitlines()
    assert "  n1: interface eth0 (10.0.0.1) toward MASTER_ADDR; NCCL_SOCKET_IFNAME and " \
           "GLOO_SOCKET_IFNAME unset" in lines
    assert "  n2: interface eth0 (10.0.0.2) toward MASTER_ADDR; GLOO_SOCKET_IFNAME=eth0" in lines
    assert lines[-1].startswith("verdict: slow node n3 (n3: best link 0.0105 GB/s, 1%")
    assert all(line == line.rstrip() for line in lines)


def test_probe_view_of_an_error_is_one_line():
    assert probe_view({"node": "n2", "error": "--ifname eth9: no interface"}) == \
        "probe error on node n2: --ifname eth9: no interface"


def test_probe_exit():
    assert probe_exit({"probe": {"error": "x"}}, 2) == 2
    assert probe_exit({"probe": {"error": "x"}}, 1) == 2
    assert probe_exit({"probe": {"verdict": {"bad": True}}}, 1) == 1
    assert probe_exit({}, 0) == 0


# ---- CLI -----------------------------------------------------------------------------


@pytest.mark.parametrize("args, line", [
    (["-N", "1"], "error: nodes: the probe measures the links between nodes: it needs 2 or more (got 1)"),
    (["--sizes", "4K,3X"], "error: sizes: '3X' is not a size (bytes, or with K, M, G: 4K,1M,64M)"),
    (["--sizes", "6"], "error: sizes: '6' is 6 bytes, not a whole number of float32 (4 bytes)"),
    (["--ifname", "eth0 eth1"], "error: ifname: 'eth0 eth1' is not an interface name or a "
                                "NCCL_SOCKET_IFNAME list (e.g. ib0, eth, =eth0, ^docker,lo)"),
    (["--slow-ratio", "2"], "error: slow-ratio: 2.0 is not between 0 and 1 (a node below this "
                            "share of the median is slow)"),
    # The bundled example's options are not offered by the probe (issue 45).
    (["-X", "--lr=1"], "error: No such option '-X'."),
    (["--data", "/x"], "error: No such option '--data'. Did you mean '--wait'?"),
])
def test_cli_refusals_are_one_line_exit_2(args, line):
    res = CliRunner().invoke(cli, ["probe", "-p", "sandbox", "--dry-run", *args])
    assert res.exit_code == 2, res.output
    assert res.output.splitlines()[0] == line


def test_cli_dry_run_shows_the_script(tmp_path: Path):
    res = CliRunner().invoke(cli, ["probe", "-p", "sandbox", "-N", "2", "--sizes", "4K,1M",
                                   "--no-image", "--dry-run", "--run-dir", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    assert "jobside/probe_worker.py --sizes 4K,1M --iters 5" in res.output
    assert f"#SBATCH --output={tmp_path}/r/slurm-%j.out" in res.output
    res = CliRunner().invoke(cli, ["probe", "-p", "sandbox", "--no-image", "--dry-run", "--json"])
    assert json.loads(res.output)["job_name"] == "hpcdl-probe"


def test_submit_probe_sizes_needs_probe_first():
    res = CliRunner().invoke(cli, ["submit", "-p", "sandbox", "-N", "2", "-G", "1",
                                   "--probe-sizes", "4K", "--dry-run"])
    assert res.exit_code == 2 and res.output.splitlines()[0] == \
        "error: probe-sizes: only with --probe-first"
    res = CliRunner().invoke(cli, ["submit", "-p", "sandbox", "-N", "2", "-G", "1", "--no-image",
                                   "--probe-first", "--probe-sizes", "4K", "--dry-run"])
    assert res.exit_code == 0 and "jobside/probe_worker.py --sizes 4K" in res.output


def test_profiles_show_lists_the_interconnect(tmp_path: Path):
    import yaml

    data = load_profile("sandbox").model_dump(mode="json", exclude_none=True)
    data["interconnect"] = {"name": "HDR 200", "expected_busbw_gbs": 23.5, "socket_ifname": "ib0"}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    res = CliRunner().invoke(cli, ["profiles", "show", str(path)])
    assert res.exit_code == 0, res.output
    assert ("  interconnect: HDR 200; expected busbw 23.5 GB/s; interface ib0 (hpcdl probe "
            "compares with these)") in res.output.splitlines()
    plain = CliRunner().invoke(cli, ["profiles", "show", "sandbox"])
    assert "interconnect" not in plain.output


def test_node_limit_follows_the_schedule():
    from hpcdl.probe.request import MAX_NODES, check_nodes

    check_nodes(MAX_NODES)  # 4,096: about N process groups, not N(N-1)/2
    with pytest.raises(ValidationError, match="4097 exceeds the probe's 4096 nodes"):
        check_nodes(MAX_NODES + 1)


def test_a_profile_can_default_submit_to_probe_first(tmp_path: Path):
    """scheduler.probe_first: every submit of 2 nodes or more (spares counted) probes
    first, as with --probe-first; --no-probe-first opts out; a 1-node job is not refused
    for the default (the probe needs 2 nodes), as --probe-first itself is."""
    import yaml

    data = load_profile("sandbox").model_dump(mode="json", exclude_none=True)
    data["scheduler"]["probe_first"] = True
    data["partitions"] = [{**p, "max_nodes_per_job": 4, "nodes": 4} for p in data["partitions"]]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    worker = "jobside/probe_worker.py"

    def submit(*args: str) -> Any:
        return CliRunner().invoke(cli, ["submit", "-p", str(path), "-G", "1", "--no-image",
                                        "--dry-run", *args])

    res = submit("-N", "2")
    assert res.exit_code == 0 and worker in res.output, res.output
    assert "hpcdl: the probe found no slow node; starting the training command" in res.output
    res = submit("-N", "2", "--spares", "1", "--probe-sizes", "4K")
    assert res.exit_code == 0 and f"{worker} --sizes 4K" in res.output, res.output
    assert "hpcdl_probe() {" in res.output  # the guard's probe over the N+S nodes
    assert worker not in submit("-N", "2", "--no-probe-first").output
    res = submit("-N", "1")
    assert res.exit_code == 0 and worker not in res.output, res.output
    # The profile's spares count: 1 node and 1 spare are probed, as --probe-first does.
    data["scheduler"]["spares"] = 1
    path.write_text(yaml.safe_dump(data))
    res = submit("-N", "1")
    assert res.exit_code == 0 and "hpcdl_probe() {" in res.output, res.output
    res = submit("-N", "1", "--probe-first")
    assert res.exit_code == 0 and "hpcdl_probe() {" in res.output, res.output
