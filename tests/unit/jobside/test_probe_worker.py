"""hpcdl.jobside.probe_worker's pure stages of the measurement: the report rows, the
node layout, the pair mode text and the NCCL log reading (the probe's policy — pairs,
rounds, verdict — is tested in tests/unit/probe/test_probe.py; the torch parts run in
tests/integration/test_probe.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdl.jobside import probe_worker as worker


def test_result_row_rounds_to_four_digits_and_computes_bus_bandwidth():
    row = worker.result_row(1_000_000, 0.0003, 4, "torch.distributed gloo all_reduce")
    assert row == {"size": 1_000_000, "algorithm": "torch.distributed gloo all_reduce",
                   "ranks": 4, "time_s": 0.0003, "algbw_gbs": 3.333, "busbw_gbs": 5.0}
    # The keys' order is the report line's.
    assert list(row) == ["size", "algorithm", "ranks", "time_s", "algbw_gbs", "busbw_gbs"]


def test_result_row_refuses_a_zero_time():
    with pytest.raises(ValueError, match="seconds: 0"):
        worker.result_row(4096, 0.0, 2, "x")


def _info(rank: int, node: str, node_rank: int) -> dict[str, object]:
    return {"rank": rank, "node": node, "node_rank": node_rank}


def test_node_layout_orders_nodes_by_node_rank_and_picks_each_first_rank():
    # Gathered in rank order, but rank 0 sits on the second node of the layout.
    everyone = [_info(0, "b", 1), _info(1, "b", 1), _info(2, "a", 0), _info(3, "a", 0),
                _info(4, "c", 2)]
    nodes, leaders = worker.node_layout(everyone)
    assert nodes == ["a", "b", "c"]
    assert leaders == {"a": 2, "b": 0, "c": 4}


def test_node_layout_of_one_node():
    assert worker.node_layout([_info(1, "n1", 0), _info(0, "n1", 0)]) == (["n1"], {"n1": 0})


def test_ring_pair_mode_without_suspects():
    assert (worker.ring_pair_mode(2, [], 10, 10)
            == "ring neighbours in 2 rounds of disjoint pairs: 10 of 45 pairs")


def test_ring_pair_mode_with_one_and_with_several_suspects():
    assert (worker.ring_pair_mode(3, [[(0, 4)]], 10, 9)
            == "ring neighbours in 3 rounds of disjoint pairs, then 1 suspect node against "
               "good nodes in 1 round: 10 of 36 pairs")
    assert (worker.ring_pair_mode(2, [[(0, 4), (1, 6)], [(2, 7)]], 13, 10)
            == "ring neighbours in 2 rounds of disjoint pairs, then 3 suspect nodes against "
               "good nodes in 2 rounds: 13 of 45 pairs")


def test_read_nccl_log_parses_and_removes_the_file(tmp_path: Path):
    log = tmp_path / "nccl.log"
    log.write_text("n1:1:1 [0] NCCL INFO Using network Socket\n", encoding="utf-8")
    assert worker._read_nccl_log(str(log)) == {"transport": "Socket"}
    assert not log.exists()


def test_read_nccl_log_without_a_file_is_empty(tmp_path: Path):
    assert worker._read_nccl_log(None) == {}
    assert worker._read_nccl_log(str(tmp_path / "absent.log")) == {}


def test_worker_imports_only_the_stdlib_and_protocol_at_module_level():
    # It runs in images without hpcdl's dependencies: torch and mpi4py load inside main.
    source = Path(worker.__file__).read_text(encoding="utf-8")
    imports = {line.split()[1].split(".")[0] for line in source.splitlines()
               if line.startswith(("import ", "from "))}
    assert imports <= {"__future__", "argparse", "os", "re", "socket", "statistics", "sys",
                       "time", "collections", "typing", "hpcdl"}, imports
