"""hpcdl.jobside.hangdiag's small pure parts: frames (library or the user's, short
names), grouping the recorded processes by node, the torchrun workers' ranks and the
suspect node (the diagnosis itself, on real py-spy dumps, is tests/unit/hang/test_hang.py)."""

from __future__ import annotations

from hpcdl.jobside.hangdiag import (
    Diagnosis,
    Frame,
    RankPid,
    Straggler,
    by_node,
    in_collective,
    suspect_node,
    user_frame,
    worker_ranks,
)

SITE = "/usr/local/lib/python3.11/site-packages"
ALLREDUCE = Frame("all_reduce", f"{SITE}/torch/distributed/distributed_c10d.py", 2501)
TRAIN = Frame("train_step", "/work/job/train.py", 42)
MAIN = Frame("<module>", "/work/job/train.py", 80)
STDLIB = Frame("wait", "/usr/lib/python3.11/threading.py", 320)


def test_frames_know_library_from_the_users_code_and_name_themselves_short():
    assert ALLREDUCE.is_library and STDLIB.is_library and not TRAIN.is_library
    assert Frame("f", "<frozen runpy>", 1).is_library
    assert ALLREDUCE.where == "all_reduce (torch/distributed/distributed_c10d.py:2501)"
    assert TRAIN.where == "train_step (train.py:42)"


def test_a_collective_on_the_stack_and_the_users_innermost_frame():
    assert in_collective((ALLREDUCE, TRAIN, MAIN))
    assert not in_collective((STDLIB, TRAIN, MAIN))
    assert user_frame((ALLREDUCE, TRAIN, MAIN)) == TRAIN
    assert user_frame((ALLREDUCE, STDLIB)) is None


def test_by_node_groups_in_rank_order_agents_last():
    pids = [RankPid(3, "n2", 30), RankPid(0, "n1", 10), RankPid(1, "n1", 11),
            RankPid(2, "n2", 20), RankPid(0, "n1", 5, agent=True)]
    grouped = by_node(pids)
    assert list(grouped) == ["n1", "n2"]
    assert [p.label for p in grouped["n1"]] == ["rank 0", "rank 1", "node 0 agent"]
    assert [p.spec for p in grouped["n2"]] == ["2", "3"]


def test_worker_ranks_reads_only_well_formed_rank_lines():
    text = "@@hpcdl-rank 4242 5\n@@hpcdl-rank 4243 x\nnoise\n@@hpcdl-rank 77 0 extra\n"
    assert worker_ranks(text) == {4242: 5}


def _straggler(node: str) -> Straggler:
    return Straggler("rank 1", node, 1, "f (x.py:1)", "f", "x.py", 1, False, None)


def test_suspect_node_only_when_every_straggler_is_on_one_node():
    def diag(*nodes: str) -> Diagnosis:
        return Diagnosis("42", 60.0, 30.0, "", tuple(_straggler(n) for n in nodes), ())

    assert suspect_node(diag("n2", "n2")) == "n2"
    assert suspect_node(diag("n1", "n2")) == ""
    assert suspect_node(diag()) == ""
