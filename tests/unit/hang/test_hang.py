"""The hang watchdog without a cluster: py-spy's dumps parsed, fake stacks in and a
diagnosis out, silence, the node-side collection script run for real with a stand-in
py-spy, the watchdog's files and actions, the rank wrapper's pid files, and the bad
inputs of submit --hang-timeout. The real thing runs in
tests/integration/test_hang_watchdog.py."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from hpcdl.errors import ToolError
from hpcdl.hang import diagnosis as hang
from hpcdl.hang.actions import parse_seconds
from hpcdl.hang.diagnosis import (
    CONTAINER_PY_SPY,
    Frame,
    NodeDump,
    RankPid,
    RankStack,
    Silence,
    diagnose,
    node_command,
    parse_dump,
    parse_pid_file,
    rank_stacks,
    split_node_output,
)
from hpcdl.jobside.hangwatch import overlap_argv
from hpcdl.launch.rankenv import WRAPPER_NAME, rank_env_script
from hpcdl.plan import JobRequest, build_plan
from hpcdl.profiles import load_profile

TORCH = "/usr/local/lib/python3.11/dist-packages/torch/distributed"
# Real py-spy 0.4.3 output (a 2-node gloo job, rank 1 asleep before its all_reduce).
WAITING = f"""\
Process 21367: python3 /tmp/job/hang_ddp.py 1 3
Python v3.11.2 (/usr/bin/python3.11)

Thread 21367 (idle): "MainThread"
    all_reduce ({TORCH}/distributed_c10d.py:3252)
    _exception_logger.<locals>.wrapper ({TORCH}/c10d_logger.py:83)
    <module> (/tmp/job/hang_ddp.py:17)
"""
SLEEPING = """\
Process 21416: python3 /tmp/job/hang_ddp.py 1 3
Python v3.11.2 (/usr/bin/python3.11)

Thread 21416 (idle): "MainThread"
    <module> (/tmp/job/hang_ddp.py:16)
"""
# --subprocesses: a parent with a helper thread and one child (as torchrun's agent).
TREE = """\
Process 29192: /usr/bin/python3 -m torch.distributed.run --nproc-per-node=2 train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 29192 (idle): "MainThread"
    Popen._try_wait (/usr/lib/python3.11/subprocess.py:2004)
    <module> (/usr/lib/python3.11/runpy.py:5)
Thread 0x7F3A12 (active): "helper"
    <lambda> (/tmp/parent.py:2)

--------------------------------------------------------------------------------
Process 29235: /usr/bin/python3 -u train.py
Python v3.11.7 (/usr/bin/python3.11)
Parent Process 29192: /usr/bin/python3 -m torch.distributed.run

Thread 29235 (idle)
    step (/work/train.py:40)
    <module> (/work/train.py:55)
"""


def stack(rank: int, *frames: tuple[str, str, int], node: str = "n1") -> RankStack:
    return RankStack(f"rank {rank}", node, 1000 + rank,
                     tuple(Frame(f, file, line) for f, file, line in frames), rank=rank)


IN_ALLREDUCE = ((("all_reduce", f"{TORCH}/distributed_c10d.py", 3252)),
                ("wrapper", f"{TORCH}/c10d_logger.py", 83), ("main", "/job/train.py", 30))
IN_SLEEP = (("main", "/job/train.py", 21), ("<module>", "/job/train.py", 40))


# ---- inputs --------------------------------------------------------------------------


@pytest.mark.parametrize("text,seconds", [("90", 90.0), ("1.5", 1.5), (" 600 ", 600.0),
                                          (".5", 0.5)])
def test_parse_seconds(text: str, seconds: float) -> None:
    assert parse_seconds("hang-timeout", text) == seconds


@pytest.mark.parametrize("text,message", [
    ("abc", "hang-timeout: 'abc' is not a number of seconds (e.g. 600)"),
    ("10m", "hang-timeout: '10m' is not a number of seconds (e.g. 600)"),
    ("0", "hang-timeout: must be more than 0 seconds (got 0)"),
    ("-5", "hang-timeout: must be more than 0 seconds (got -5)"),
    ("inf", "hang-timeout: 'inf' is not a number of seconds (e.g. 600)"),
    ("", "hang-timeout: '' is not a number of seconds (e.g. 600)"),
])
def test_parse_seconds_refuses_in_one_line(text: str, message: str) -> None:
    with pytest.raises(ValueError) as exc:
        parse_seconds("hang-timeout", text)
    assert str(exc.value) == message


def test_pid_files() -> None:
    assert parse_pid_file("rank-3", "n2 4242\n") == RankPid(3, "n2", 4242)
    assert parse_pid_file("node-1", "n2 77") == RankPid(1, "n2", 77, agent=True)
    for name, text in (("rank-3", ""), ("rank-3", "n2"), ("rank-x", "n2 1"),
                       ("rank-3.tmp", "n2 1"), ("rank-3", "-rf 12"), ("rank-3", "n2 12 x")):
        assert parse_pid_file(name, text) is None, (name, text)


# ---- py-spy's output -------------------------------------------------------------------


def test_parse_dump_reads_frames_innermost_first() -> None:
    (proc,) = parse_dump(WAITING)
    assert proc.pid == 21367 and proc.command == "python3 /tmp/job/hang_ddp.py 1 3"
    assert proc.main is not None and proc.main.idle
    assert [f.where for f in proc.main.frames] == [
        "all_reduce (torch/distributed/distributed_c10d.py:3252)",
        "_exception_logger.<locals>.wrapper (torch/distributed/c10d_logger.py:83)",
        "<module> (hang_ddp.py:17)"]


def test_parse_dump_with_subprocesses_and_named_threads() -> None:
    parent, child = parse_dump(TREE)
    assert parent.is_torchrun_agent and parent.parent is None
    assert [t.name for t in parent.threads] == ["MainThread", "helper"]
    assert parent.threads[1].tid == 0x7F3A12 and not parent.threads[1].idle
    assert child.parent == 29192 and child.main is not None
    assert child.main.frames[0] == Frame("step", "/work/train.py", 40)


def test_split_node_output() -> None:
    out = (f"@@hpcdl-stack 0 21367\n{WAITING}@@hpcdl-end 0\n"
           "@@hpcdl-stack 2 99\nError: Failed to find python version from target process\n"
           "@@hpcdl-end 1\n@@hpcdl-stack 4 5\npartial")
    dumps = split_node_output(out)
    assert [(d.spec, d.pid, d.returncode) for d in dumps] == [("0", 21367, 0), ("2", 99, 1),
                                                              ("4", 5, None)]
    assert parse_dump(dumps[0].text)[0].pid == 21367


def test_node_command_in_the_image_and_natively() -> None:
    pids = [RankPid(0, "n1", 11), RankPid(1, "n1", 12)]
    argv = node_command(pids, "/venv/bin/py-spy", runtime="apptainer", image="/scratch/img/x.sif")
    assert argv[:5] == ["apptainer", "exec", "-B", f"/venv/bin/py-spy:{CONTAINER_PY_SPY}:ro",
                        "/scratch/img/x.sif"]
    assert argv[5:7] == ["/bin/sh", "-c"] and argv[8:] == [hang.COLLECTOR_NAME,
                                                           CONTAINER_PY_SPY, "0:11", "1:12"]
    native = node_command([RankPid(0, "n2", 7, agent=True)], "/venv/bin/py-spy")
    assert native[0] == "/bin/sh" and native[-2:] == ["/venv/bin/py-spy", "n0:7"]


def test_the_node_script_runs_py_spy_per_rank_and_delimits(tmp_path: Path) -> None:
    """NODE_SCRIPT for real, with a stand-in py-spy that echoes its arguments."""
    fake = tmp_path / "py-spy"
    fake.write_text('#!/bin/sh\necho "args: $*"\n[ "$3" = 13 ] && exit 3\nexit 0\n')
    fake.chmod(0o755)
    argv = node_command([RankPid(0, "n1", 11), RankPid(1, "n1", 13)], str(fake))
    res = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True)
    dumps = split_node_output(res.stdout)
    assert [(d.spec, d.pid, d.returncode) for d in dumps] == [("0", 11, 0), ("1", 13, 3)]
    assert dumps[0].text == "args: dump --pid 11 --subprocesses --full-filenames"


def test_overlap_argv() -> None:
    argv = overlap_argv("42", "n2", ["/bin/sh", "-c", "x"])
    assert argv[:4] == ["srun", "--overlap", "--jobid=42", "--nodelist=n2"]
    assert argv[-3:] == ["/bin/sh", "-c", "x"] and "--quiet" in argv
    for job, node in (("42;rm", "n1"), ("42", "-n1"), ("42", "n1 n2"), ("", "n1")):
        with pytest.raises(ToolError):
            overlap_argv(job, node, ["true"])


# ---- the diagnosis ------------------------------------------------------------------------


def test_the_rank_outside_the_collective_is_named_with_its_frame() -> None:
    stacks = [stack(3, *IN_ALLREDUCE, node="n2"), stack(0, *IN_ALLREDUCE), stack(1, *IN_SLEEP),
              stack(2, *IN_ALLREDUCE, node="n2")]  # in any order: named in rank order
    diag = diagnose(stacks, job_id="7", silent_s=61.2, timeout_s=60)
    (s,) = diag.stragglers
    assert (s.label, s.node, s.pid, s.function, s.line) == ("rank 1", "n1", 1001, "main", 21)
    assert s.frame == "main (train.py:21)" and not s.in_collective
    assert diag.summary == (
        "rank 1 (n1, pid 1001) is in main (train.py:21) outside any collective, while rank 0, "
        "rank 2, rank 3 wait in all_reduce (torch/distributed/distributed_c10d.py:3252) "
        "(called from main (train.py:30))")
    assert diag.places[0].ranks == ("rank 0", "rank 2", "rank 3")
    assert diag.places[0].in_collective and diag.places[0].called_from == "main (train.py:30)"
    lines = diag.lines()
    assert lines[0].startswith("job 7: no progress for 61 s (--hang-timeout 60): rank 1 ")
    assert lines[1:] == [
        "  rank 0, rank 2, rank 3: all_reduce (torch/distributed/distributed_c10d.py:3252), "
        "called from main (train.py:30) [in a collective]",
        "  rank 1: main (train.py:21)"]
    json.dumps(diag.to_dict())  # diagnosis.json is plain JSON


def test_two_ranks_a_tie_goes_to_the_collective() -> None:
    for order in ((0, 1), (1, 0)):
        stacks = [stack(order[0], *IN_SLEEP), stack(order[1], *IN_ALLREDUCE)]
        diag = diagnose(stacks, job_id="7", silent_s=20, timeout_s=15)
        assert [s.label for s in diag.stragglers] == [f"rank {order[0]}"]


def test_a_rank_in_another_collective_is_named_too() -> None:
    barrier = (("barrier", f"{TORCH}/distributed_c10d.py", 4100), ("main", "/job/train.py", 50))
    stacks = [stack(0, *IN_ALLREDUCE), stack(1, *IN_ALLREDUCE), stack(2, *barrier)]
    diag = diagnose(stacks, job_id="7", silent_s=20, timeout_s=15)
    (s,) = diag.stragglers
    assert s.label == "rank 2" and s.in_collective and s.user_frame == "main (train.py:50)"
    assert "rank 2 (n1, pid 1002) is in barrier" in diag.summary
    assert "outside any collective" not in diag.summary


def test_all_ranks_in_the_same_place() -> None:
    diag = diagnose([stack(r, *IN_ALLREDUCE) for r in range(4)], job_id="7", silent_s=20,
                    timeout_s=15)
    assert diag.stragglers == ()
    assert diag.summary.startswith("all 4 ranks are at all_reduce (torch/distributed/"
                                   "distributed_c10d.py:3252) in a collective: none of them")


def test_ranks_without_a_stack_are_listed() -> None:
    stacks = [stack(0, *IN_ALLREDUCE), stack(1, *IN_ALLREDUCE),
              RankStack("rank 2", "n2", 5, error="srun: error: n2: Unable to create step", rank=2)]
    diag = diagnose(stacks, job_id="7", silent_s=20, timeout_s=15)
    assert diag.missing == (("rank 2", "srun: error: n2: Unable to create step"),)
    assert diag.summary.endswith("; no stack from rank 2")
    assert "  rank 2: no stack (srun: error: n2: Unable to create step)" in diag.lines()
    assert diagnose(stacks[2:], job_id="7", silent_s=1, timeout_s=1).summary == \
        "no rank's stack could be read"


def test_rank_stacks_from_the_nodes_dumps() -> None:
    pids = [RankPid(0, "n1", 21367), RankPid(1, "n2", 21416), RankPid(2, "n2", 9),
            RankPid(3, "n3", 10)]
    dumps = {"n1": [NodeDump("0", 21367, WAITING, 0)],
             "n2": [NodeDump("1", 21416, SLEEPING, 0),
                    NodeDump("2", 9, "Error: Permission denied (os error 13)", 1)]}
    got = rank_stacks(pids, dumps, {"n3": "srun: error: Unable to create step"})
    assert [s.label for s in got] == ["rank 0", "rank 1", "rank 2", "rank 3"]
    assert got[0].frames[0].function == "all_reduce" and got[1].frames[0].line == 16
    assert got[2].error == "Error: Permission denied (os error 13)" and not got[2].frames
    assert got[3].error == "srun: error: Unable to create step"
    diag = diagnose(got, job_id="7", silent_s=20, timeout_s=15)
    assert diag.stragglers[0].label == "rank 1"


def test_a_torchrun_agent_stands_for_its_workers() -> None:
    got = rank_stacks([RankPid(0, "n1", 29192, agent=True)],
                      {"n1": [NodeDump("n0", 29192, TREE, 0)]})
    assert [(s.label, s.pid, s.frames[0].function) for s in got] == [
        ("node 0 pid 29235", 29235, "step")]
    # With the RANK the node script read from the worker's environment:
    ranked = rank_stacks([RankPid(0, "n1", 29192, agent=True)],
                         {"n1": [NodeDump("n0", 29192, TREE + "@@hpcdl-rank 29235 3\n", 0)]})
    assert [(s.label, s.rank) for s in ranked] == [("rank 3", 3)]


def test_the_node_script_reads_a_torchrun_workers_rank(tmp_path: Path) -> None:
    """NODE_SCRIPT with a stand-in agent (a process with two children whose RANK is set)
    and a stand-in py-spy: the children's ranks come back as rank lines."""
    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    agent = subprocess.Popen(["/bin/sh", "-c", "RANK=6 sleep 60 & RANK=7 sleep 60 & wait"])
    try:
        deadline = time.monotonic() + 10
        children: list[str] = []
        while len(children) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
            children = Path(f"/proc/{agent.pid}/task/{agent.pid}/children").read_text().split()
        argv = node_command([RankPid(0, "n1", agent.pid, agent=True)], str(fake))
        res = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True)
    finally:
        subprocess.run(["pkill", "-P", str(agent.pid)], check=False)
        agent.kill()
        agent.wait()
    (dump,) = split_node_output(res.stdout)
    assert sorted(hang.worker_ranks(dump.text).values()) == [6, 7]


# ---- silence ------------------------------------------------------------------------------------


def test_silence_starts_when_running_and_restarts_on_progress() -> None:
    s = Silence()
    a, b = frozenset({("x", 1, 1)}), frozenset({("x", 2, 2)})
    assert s.observe(0, False, a) == 0  # queued: never silence
    assert s.observe(10, True, a) == 0
    assert s.observe(25, True, a) == 15
    assert s.observe(30, True, b) == 0  # the log grew
    assert s.observe(31, False, b) == 0  # requeued: starts again when it runs
    assert s.observe(40, True, b) == 0 and s.observe(45, True, b) == 5


# ---- the rank wrapper and the plan ------------------------------------------------------------


def test_the_wrapper_records_the_pid_the_command_keeps(tmp_path: Path) -> None:
    script = rank_env_script(record_pid=True)
    env = {"PATH": "/usr/bin:/bin", "HPCDL_PID_DIR": str(tmp_path), "SLURM_PROCID": "3",
           "SLURM_NTASKS": "4", "SLURMD_NODENAME": "n7"}
    res = subprocess.run(["/bin/sh", "-c", script, WRAPPER_NAME, "/bin/sh", "-c", "echo $$"],
                         capture_output=True, text=True, timeout=30, env=env, check=True)
    assert (tmp_path / "rank-3").read_text() == f"n7 {res.stdout.strip()}\n"
    torchrun = rank_env_script("torchrun", record_pid=True)
    env["SLURM_NODEID"] = "1"
    subprocess.run(["/bin/sh", "-c", torchrun, WRAPPER_NAME, "true"], env=env, timeout=30,
                   check=True)
    assert (tmp_path / "node-1").read_text().startswith("n7 ")
    assert "HPCDL_PID_DIR" not in rank_env_script()


def test_the_plan_records_pids_only_with_the_watchdog() -> None:
    prof = load_profile("sandbox")
    req = JobRequest.of(nodes=2, command=("python3", "t.py"), run_dir="/scratch/runs/r1")
    plain = build_plan(prof, req)
    assert "HPCDL_PID_DIR" not in plain.script and plain.hang is None
    dog = build_plan(prof, JobRequest.of(nodes=2, command=("python3", "t.py"), run_dir="/scratch/runs/r1",
                                      hang_timeout=60))
    assert "export HPCDL_PID_DIR=/scratch/runs/r1/pids\n" in dog.script
    assert "export PYTHONUNBUFFERED=1\n" in dog.script
    assert dog.hang is not None and (dog.hang.timeout, dog.hang.action) == (60, "cancel")
    assert dog.to_dict()["hang_timeout"] == 60


def test_submit_refuses_bad_watchdog_input_in_one_line() -> None:
    # In process (click's runner): the CLI's own error handling, without a Python start
    # per case.
    from click.testing import CliRunner

    from hpcdl.cli import cli

    base = ["submit", "-p", "sandbox", "-N", "2", "-G", "0"]
    cases = {
        ("--hang-timeout", "soon", "--wait"): "error: hang-timeout: 'soon' is not a number of "
                                               "seconds (e.g. 600)",
        ("--hang-timeout", "0", "--wait"): "error: hang-timeout: must be more than 0 seconds "
                                            "(got 0)",
        ("--hang-action", "leave", "--wait"): "error: hang-action: 'leave' needs --hang-timeout "
                                              "SECONDS",
        ("--hang-timeout", "30", "--chain", "2", "--wait"):
            "error: hang-timeout: the watchdog follows one job; --chain 2 submits 2",
    }
    for args, message in cases.items():
        res = CliRunner().invoke(cli, [*base, *args, "--", "python3", "t.py"],
                                 catch_exceptions=False)
        assert res.exit_code == 2, (args, res.stderr)
        assert res.stderr.splitlines()[0] == message, args
        assert len(res.stderr.splitlines()) <= 2 and not res.stdout
    res = CliRunner().invoke(cli, [*base, "--hang-timeout", "900", "-t", "10", "--dry-run", "--",
                                   "python3", "t.py"], catch_exceptions=False)
    assert res.exit_code == 0
    assert ("warning: hang-timeout: 900 s is not shorter than the job's time limit 00:10:00: "
            "the watchdog cannot fire before it") in res.stderr
