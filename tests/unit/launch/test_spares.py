"""Spare nodes (submit --spares S): what the plan decides and refuses, and the node
guard's record as status reads it. tests/integration/test_spares.py kills real nodes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hpcdl.errors import ValidationError
from hpcdl.jobs import recoveries
from hpcdl.jobside import probe_worker as worker
from hpcdl.launch.nodes import BAD_NODES_NAME, NODES_FILE, RECOVERIES_NAME
from hpcdl.plan import JobPlan, JobRequest, build_plan
from hpcdl.profiles import load_profile
from tests.unit.clirun import hpcdl


def plan_of(profile: str = "neuron", **req: Any) -> JobPlan:
    return build_plan(load_profile(profile), JobRequest.of(**{"nodes": 2, "gpus": 1, **req}))


def test_spares_allocate_n_plus_s_and_the_ranks_run_on_the_guards_nodes() -> None:
    plan = plan_of(spares=1, run_dir="/scratch/r", image="/scratch/i.sif")
    assert (plan.spec.nodes, plan.spec.spares, plan.spec.ntasks) == (2, 1, 2)
    header = [line for line in plan.script.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --nodes=3" in header and "#SBATCH --no-kill" in header
    # World size unchanged: 2 nodes x 1 rank on the nodes the guard names, beside a step
    # a dead node left behind.
    assert plan.launch.launch_line.startswith(
        'srun --label --kill-on-bad-exit=1 --nodes=2 --ntasks=2 '
        '--nodelist="$HPCDL_NODELIST" --overlap ')
    assert "--resume" in plan.launch.command  # a relaunch continues from the checkpoint
    assert dict(plan.files.job_scripts)[NODES_FILE].startswith("#!/bin/bash\n# hpcdl-nodes")
    assert "source /scratch/r/job/bin/hpcdl-nodes\nhpcdl_nodes_init 2\n" in plan.script
    assert "hpcdl_launch() { exec srun " in plan.script
    assert json.loads(json.dumps(plan.to_dict()))["spares"] == 1


def test_no_spares_renders_no_guard() -> None:
    plan = plan_of(run_dir="/scratch/r")
    assert plan.spec.spares == 0 and "--no-kill" not in plan.script
    assert "hpcdl_supervise" not in plan.script and "HPCDL_NODELIST" not in plan.launch.launch_line


def test_the_profile_default_applies_to_training_not_to_the_probe() -> None:
    prof = load_profile("neuron")
    prof = prof.model_copy(update={"scheduler": prof.scheduler.model_copy(update={"spares": 2})})
    assert build_plan(prof, JobRequest.of(nodes=2, gpus=1)).spec.spares == 2
    assert build_plan(prof, JobRequest.of(nodes=2, gpus=1, spares=0)).spec.spares == 0
    probe = build_plan(prof, JobRequest.of(nodes=2, gpus=1, probe=("--sizes", "4K")))
    assert probe.spec.spares == 0 and "--no-kill" not in probe.script


def test_probe_first_with_spares_probes_every_healthy_node_and_feeds_the_guard() -> None:
    plan = plan_of(spares=1, run_dir="/scratch/r", image="/scratch/i.sif", probe_first=True,
                   probe=("--sizes", "4K,64K", "--slow-ratio", "0.25"),
                   command=("python3", "train.py"))
    # Not the plain --probe-first block, which ends the job on any slow verdict ...
    assert "# ---- probe first" not in plan.script
    # ... but a step the guard sizes (all the nodes its gate passed) and whose slow nodes
    # it reads back from the file the worker writes.
    assert plan.probe is not None and plan.probe.line is not None
    probe_line = plan.probe.line
    assert probe_line.startswith(
        'srun --label --kill-on-bad-exit=1 --nodes="$HPCDL_STEP_NODES" '
        '--ntasks="$HPCDL_STEP_TASKS" ')
    assert '--nodelist="$HPCDL_NODELIST" --overlap' in probe_line
    assert probe_line.endswith("--slow-nodes-out /scratch/r/probe-slow-nodes.tsv")
    assert f"hpcdl_probe() {{ {probe_line}; }}" in plan.script
    assert "export HPCDL_PROBE_SLOW=/scratch/r/probe-slow-nodes.tsv" in plan.script
    # Without spares: the plain block, the training's own node count, no file.
    plain = plan_of(run_dir="/scratch/r", image="/scratch/i.sif", probe_first=True,
                    probe=("--sizes", "4K,64K"), command=("python3", "train.py"))
    assert "# ---- probe first" in plain.script and "--slow-nodes-out" not in plain.script
    assert "hpcdl_probe()" not in plain.script


def test_the_workers_slow_node_file_names_each_node_and_why(tmp_path: Path) -> None:
    judged = worker.verdict(["a", "b", "c"], {("a", "b"): 0.8, ("a", "c"): 0.02,
                                              ("b", "c"): 0.021}, slow_ratio=0.25)
    assert judged["slow_nodes"] == ["c"]
    out = tmp_path / "slow.tsv"
    worker.write_slow_nodes(str(out), judged)
    (line,) = out.read_text().splitlines()
    node, why = line.split("\t")
    assert node == "c" and why.startswith("probe: slow: best link 0.021 GB/s, 3% of the median")
    worker.write_slow_nodes(str(out), worker.verdict(
        ["a", "b", "c"], {("a", "b"): 0.8, ("a", "c"): 0.7, ("b", "c"): 0.75}))
    assert out.read_text() == ""  # healthy: an empty list, and no temp file left
    assert [p.name for p in tmp_path.iterdir()] == ["slow.tsv"]


def test_torchrun_gets_the_guards_nodes_too() -> None:
    plan = plan_of(spares=1, launcher="torchrun", backend="ddp")
    assert '--ntasks-per-node=1 --cpus-per-task=' in plan.launch.launch_line
    assert '--nodelist="$HPCDL_NODELIST" --overlap' in plan.launch.launch_line


@pytest.mark.parametrize(("profile", "req", "message"), [
    ("sandbox", {"spares": -1}, "spares: must be 0 or more spare nodes (got -1)"),
    ("sandbox", {"spares": 1}, "nodes: 2 + 1 spares = 3 exceeds partition"),
    ("polaris", {"spares": 1}, "spares: spare nodes are replaced inside a Slurm job"),
    ("sandbox", {"nodes": 1, "spares": 1, "launcher": "mpirun"},
     "spares: launcher mpirun starts ranks on every node of the allocation"),
    ("sandbox", {"nodes": 1, "spares": 1, "chain": 2}, "spares: --chain 2 submits"),
])
def test_refusals_name_the_field_and_the_limit(profile: str, req: dict[str, object],
                                               message: str) -> None:
    with pytest.raises(ValidationError) as err:
        plan_of(profile, **req)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_cli_refusal_is_one_line_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    run = tmp_path / "run"
    res = hpcdl("submit", "-p", "sandbox", "-N", "2", "-G", "1", "--spares", "1", "--run-dir", str(run),
                "--", "true")
    assert res.returncode == 2, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert lines[0].startswith("error: nodes: 2 + 1 spares = 3 exceeds partition debug's limit "
                               "of 2 nodes per job"), res.stderr
    assert not run.exists()


def test_dry_run_says_what_is_allocated(tmp_path: Path) -> None:
    res = hpcdl("submit", "-p", "neuron", "-N", "2", "-G", "1", "--spares", "1", "--dry-run",
                "--run-dir", str(tmp_path / "r"))
    assert res.returncode == 0, res.stderr
    assert ("# nodes: 2 for the training + 1 spare = 3 allocated (--no-kill); a failed node "
            "is replaced inside the job") in res.stderr
    assert "#SBATCH --nodes=3\n" in res.stdout
    assert f"# ==> {tmp_path}/r/job/{NODES_FILE}" in res.stderr


def test_recoveries_join_the_record_with_the_steps(tmp_path: Path) -> None:
    (tmp_path / RECOVERIES_NAME).write_text(
        "7\t0\t1\t1000\tn2\tn2: gate: no answer in 11 s\t1001\tn1,n3\tcheckpoint-00000010.pt\n"
        "7\t0\t2\t2000\tn3\tn3: Slurm: node state down*\t-\t-\tcheckpoint-00000020.pt\n"
        "garbage line\n")
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    steps = [{"step": s, "t": t} for s, t in ((11, 990.0), (12, 995.0), (11, 1008.5),
                                               (12, 1010.0))]
    (metrics / "rank-00000.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    first, second = recoveries.read(tmp_path, "7")
    assert (first.nodes, first.active, first.checkpoint_step) == (("n2",), ("n1", "n3"), 10)
    assert (first.failed_step, first.steps_lost, first.seconds_to_train) == (12, 2, 8.5)
    assert second.relaunched_at is None and second.seconds_to_train is None
    assert recoveries.read(tmp_path, "8") == []
    table = recoveries.lines([first, second])
    assert "n2: gate: no answer in 11 s -> n1,n3 from checkpoint-00000010.pt" in table[1]
    assert table[2].endswith("not relaunched")


def test_excluded_nodes_read_back_in_order_with_their_reason(tmp_path: Path) -> None:
    assert recoveries.excluded(tmp_path) == []  # no guard, no file
    (tmp_path / BAD_NODES_NAME).write_text(
        "n3\tprobe: slow: best link 0.024 GB/s, 3% of the median node's 0.84 GB/s\n"
        "n2\tgate: /scratch is not mounted\n\nhalf")
    found = recoveries.excluded(tmp_path)
    assert found == [
        {"node": "n3", "why": "probe: slow: best link 0.024 GB/s, 3% of the median node's 0.84 GB/s"},
        {"node": "n2", "why": "gate: /scratch is not mounted"}]
    assert recoveries.excluded_line(found) == (
        "nodes excluded: n3 (probe: slow: best link 0.024 GB/s, 3% of the median node's "
        "0.84 GB/s); n2 (gate: /scratch is not mounted)")
