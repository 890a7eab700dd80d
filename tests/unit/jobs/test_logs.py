"""Parsing job logs: result line, rank table, failed ranks."""

from hpcdl.jobs.logs import (
    describe_failures,
    failed_ranks,
    format_result_table,
    parse_failures,
    rank_lines,
)
from hpcdl.jobside.protocol import parse_rank_table, parse_result

LOG = """\
hpcdl: job 12 on n[1-2]: 4 ranks (2 nodes x 2)
0: epoch 1/1 loss 6.91 top1 0.0
1: hpcdl_rank_checksum rank=1 host=n1 checksum=abc123
0: hpcdl_rank_checksum rank=0 host=n1 checksum=abc123
3: hpcdl_rank_checksum rank=3 host=n2 checksum=abc123
2: hpcdl_rank_checksum rank=2 host=n2 checksum=abc123
0: {"hpcdl_result": {"world_size": 4, "nodes": 2, "backend": "horovod", "images_per_sec": 123.456, "sync_share": 0.1234, "final_loss": 6.9, "top1": 0.0, "wall_time": 12.5}}
"""


def test_result_and_rank_table():
    result = parse_result(LOG)
    assert result["world_size"] == 4 and result["backend"] == "horovod"
    ranks = parse_rank_table(LOG)
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert {r["host"] for r in ranks} == {"n1", "n2"}
    table = format_result_table(result, ranks)
    assert "world size           4" in table
    assert "images/sec           123.5" in table
    assert "gradient sync share  12.3%" in table
    assert "top-1 (val)          0.0%" in table and "top-5 (val)          -" in table
    assert table.endswith("parameters identical on every rank")


def test_differing_checksums_are_called_out():
    log = LOG.replace("rank=3 host=n2 checksum=abc123", "rank=3 host=n2 checksum=zzz")
    assert "WARNING: 2 different parameter checksums" in format_result_table(
        parse_result(log), parse_rank_table(log))


def test_no_result_line():
    assert parse_result("0: Traceback\n0: {not json\n") is None


def test_failures_and_rank_lines():
    err = (
        "3: Traceback (most recent call last):\n"
        "3:   File \"x.py\", line 1\n"
        "3: RuntimeError: rank 3 crashed on purpose\n"
        "srun: error: n2: task 3: Exited with exit code 1\n"
        "srun: error: n1: tasks 0-1: Killed\n"
    )
    failures = parse_failures(err)
    assert [(f.host, f.ranks, f.reason) for f in failures] == [
        ("n2", (3,), "Exited with exit code 1"), ("n1", (0, 1), "Killed")]
    assert rank_lines(err, 3, last=2) == ['  File "x.py", line 1',
                                          "RuntimeError: rank 3 crashed on purpose"]


CRASH_ERR = (
    "0: hpcdl: rank 0 up\n"
    "3: Traceback (most recent call last):\n"
    "3:   File \"x.py\", line 1\n"
    "3: RuntimeError: rank 3 crashed on purpose\n"
    "srun: error: n2: task 3: Exited with exit code 1\n"
    "srun: error: n1: tasks 0-1: Killed\n"
    "srun: error: n2: task 2: Killed\n"
)


def test_describe_failures_names_the_cause_and_its_last_lines():
    lines = describe_failures("3: step 1 loss 6.9\n", CRASH_ERR, last=2)
    assert lines == [
        "rank 3 on n2: Exited with exit code 1",
        "--- last 2 lines of rank 3 ---",
        '    File "x.py", line 1',
        "  RuntimeError: rank 3 crashed on purpose",
        "ranks 0,1,2 stopped after that (srun --kill-on-bad-exit)",
    ]
    assert failed_ranks(CRASH_ERR) == [3]


def test_describe_failures_falls_back_to_stdout_and_to_killed_tasks():
    err = "srun: error: n1: tasks 0-1: Killed\n"
    lines = describe_failures("1: out of memory\n", err)
    assert lines[0] == "ranks 0,1 on n1: Killed"
    assert "  out of memory" in lines
    assert failed_ranks(err) == [0, 1]
    assert describe_failures("all good", "") == []
