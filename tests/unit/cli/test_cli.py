"""CLI behaviour through click's runner: exit codes, one-line messages, no tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from hpcdl.cli import cli


def invoke(*args: str, cwd=None):
    runner = CliRunner()
    result = runner.invoke(cli, list(args), catch_exceptions=False)
    assert "Traceback" not in result.output
    return result


def test_dry_run_prints_script_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("submit", "--profile", "neuron", "--nodes", "2", "--gpus", "4", "--dry-run")
    assert result.exit_code == 0
    assert "#SBATCH --partition=cas_v100nv_4" in result.stdout
    assert "smallest partition that fits" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_gpus_over_limit_exit_2_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("submit", "-p", "neuron", "-N", "2", "-G", "9", "--partition", "amd_a100nv_8",
                    "--dry-run")
    assert result.exit_code == 2
    assert result.stderr == ("error: gpus: 9 GPUs per node exceeds partition amd_a100nv_8's 8 GPUs "
                             "per node (partitions that fit: none)\n")
    assert list(tmp_path.iterdir()) == []


def test_nodes_over_limit(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("submit", "-p", "neuron", "--nodes", "99", "--gpus", "4")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: nodes: 99 exceeds partition cas_v100_4's limit of 15")
    assert list(tmp_path.iterdir()) == []  # refused before a run directory exists


def test_json_plan(tmp_path):
    result = invoke("submit", "-p", "sandbox", "-N", "2", "-G", "4", "--dry-run", "--json",
                    "-e", "A=b c", "--", "hostname")
    assert result.exit_code == 0
    plan = json.loads(result.stdout)
    assert plan["ntasks"] == 8 and plan["partition"] == "debug"
    assert plan["env"]["A"] == "b c" and plan["command"] == ["hostname"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["-p", "nope", "-G", "1"], "error: profile: unknown profile 'nope'"),
        (["-p", "sandbox", "-G", "1", "--partition", "huge"], "error: partition: 'huge'"),
        (["-p", "sandbox", "-G", "1", "-e", "NOEQUALS"], "error: env: 'NOEQUALS' is not KEY=VALUE"),
        (["-p", "sandbox", "-G", "1", "-t", "later"], "error: time: 'later' is not a Slurm time"),
        (["-p", "sandbox", "-G", "2", "-c", "5"], "error: cpus-per-task: 5 x 2 tasks per node"),
        (["-p", "sandbox", "-G", "x"], "'x' is not a valid integer"),
        (["-p", "sandbox"], "Missing option '--gpus'"),
    ],
)
def test_bad_input_exit_2(args, needle):
    result = invoke("submit", *args, "--dry-run")
    assert result.exit_code == 2, result.output
    assert needle in result.stderr


def test_malformed_profile_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\npartitions:\n  - {name: p, nodes: 1, gpus_per_node: 1, cpus: 4}\n")
    result = invoke("profiles", "validate", str(bad))
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {bad}: unknown key 'partitions[0].cpus'")
    result = invoke("submit", "--profile", str(bad), "-G", "1", "--dry-run")
    assert result.exit_code == 2 and str(bad) in result.stderr


def test_profiles_list_show_validate(tmp_path):
    result = invoke("profiles", "list", "--json")
    names = [row["name"] for row in json.loads(result.stdout)]
    assert names == ["generic", "karolina", "neuron", "polaris", "sandbox", "sandbox-remote", "taurus"]
    shown = invoke("profiles", "show", "neuron").stdout
    assert "amd_a100nv_8" in shown and "14" in shown
    good = invoke("profiles", "validate", "hpcdl/profiles/bundled/sandbox.yaml")
    assert good.exit_code == 0 and "ok (profile sandbox, 5 partitions)" in good.stdout


def test_alloc_dry_run_matches_seed_form():
    result = invoke("alloc", "-p", "neuron", "--partition", "amd_a100nv_8", "-J", "debug",
                    "-N", "2", "-t", "2:00:00", "-G", "4", "--dry-run")
    assert result.exit_code == 0
    assert ("salloc --job-name=debug --partition=amd_a100nv_8 --nodes=2 --ntasks-per-node=4 "
            "--gres=gpu:4 --cpus-per-task=7 --time=02:00:00 --comment=pytorch") in result.stdout


def test_help_is_fast_and_never_imports_torch():
    code = ("import sys; from hpcdl.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "try:\n    main(['submit', '--help'])\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules, 'torch imported on the CLI path'\n"
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.returncode == 0, out.stderr
    assert "Commands:" in out.stdout and out.stdout.rstrip().endswith("ok")


# What `hpcdl submit` must not load on its way to sbatch (issue 31: hpcdl's own time
# before sbatch is mostly start-up): ML and plotting libraries, and hpcdl's own follow
# side (the status display, the follow loop, the hang watchdog, the report, salloc's
# path), which only --wait and alloc use.
# Issue 43 took more off the way: the hang diagnosis (its actions and the timeout's
# parser are hpcdl.hang.actions), `profiles detect`'s Slurm reader (the live check's
# config parser is in hpcdl.schedulers.slurm.parse), and the container runtime's and a
# packed dataset's checks (imported by preflight where an image or a *.sqfs is met).
HEAVY = ("torch", "numpy", "matplotlib", "rich", "pandas", "mlflow", "tensorboard",
         "hpcdl.cli.display", "hpcdl.jobs.follow", "hpcdl.jobs.watchdog", "hpcdl.report",
         "hpcdl.jobs.alloc", "hpcdl.hang.diagnosis", "hpcdl.schedulers.slurm.detect",
         "hpcdl.sweep", "hpcdl.results")
# ... and, for a job without an image or a packed dataset (the sandbox's default; the
# neuron profile's bundled example has an image), their checks.
HEAVY_NO_IMAGE = (*HEAVY, "hpcdl.container.runtime", "hpcdl.data.packed")


def test_submit_dry_run_loads_nothing_heavy():
    code = ("import sys; from hpcdl.cli import main\n"
            "try:\n    main(['submit', '-p', 'neuron', '-N', '2', '-G', '4', '--dry-run', "
            "'--', 'true'])\n"
            "except SystemExit as exc:\n    assert not exc.code, exc.code\n"
            f"print('loaded:', *[m for m in {HEAVY!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("#!/bin/bash") and "srun" in out.stdout  # the script, planned
    assert out.stdout.rstrip().splitlines()[-1] == "loaded:"


def test_a_submission_loads_nothing_heavy_and_runs_three_programs(fake_slurm):
    """A real submission (live check and sbatch, against tests/fakeslurm's programs on
    PATH, in a process of its own as a user's): issue 43's "hpcdl submit in a blink"
    without timing it. What it imports is what costs (start-up is most of hpcdl's own
    time), and the programs it runs are the live check's two and sbatch, once each."""
    code = ("import sys; from hpcdl.cli import main\n"
            "try:\n    main(['submit', '-p', 'sandbox', '-N', '2', '-G', '4', '--', 'true'])\n"
            "except SystemExit as exc:\n    assert not exc.code, exc.code\n"
            f"print('loaded:', *[m for m in {HEAVY_NO_IMAGE!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Submitted job ")  # the job went to (fake) Slurm
    assert out.stdout.rstrip().splitlines()[-1] == "loaded:"
    assert fake_slurm.counts() == {"scontrol": 1, "sinfo": 1, "sbatch": 1}


def test_missing_image_and_dataset_are_refused_before_submission(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("submit", "-p", "sandbox", "-N", "2", "-G", "2",
                    "--image", str(tmp_path / "none.sif"))
    assert result.exit_code == 2
    assert f"error: image: '{tmp_path / 'none.sif'}' does not exist" in result.stderr
    assert "hint: build it first: hpcdl build" in result.stderr
    result = invoke("submit", "-p", "sandbox", "-N", "2", "-G", "2", "--data", "nodata")
    assert result.exit_code == 2
    assert "error: data: dataset folder 'nodata' does not exist" in result.stderr
    assert "hpcdl data make-tiny nodata" in result.stderr
    (tmp_path / "flat").mkdir()
    result = invoke("submit", "-p", "sandbox", "-N", "2", "-G", "2", "--data", "flat")
    assert result.exit_code == 2 and "has no train/ folder" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["flat"]  # nothing written


@pytest.mark.parametrize(("command", "script"), [
    (("python3", "train.py", "--lr", "1"), "train.py"),
    (("/usr/bin/python3.11", "-u", "-X", "dev", "a/b.py"), None),  # -X takes a value: unsure
    (("python", "-u", "a/b.py"), "a/b.py"),
    (("python3", "-c", "print(1)"), None),
    (("python3", "-m", "pkg.mod"), None),
    (("torchrun", "train.py"), None),
    ((), None),
])
def test_command_script(command, script):
    from hpcdl.jobs.preflight import command_script

    assert command_script(command) == script


def test_scale_takes_the_launch_options():
    res = CliRunner().invoke(cli, ["scale", "-p", "sandbox", "-N", "1,2", "-G", "2", "--backend",
                                    "ddp", "--synthetic", "--launcher", "torchrun", "--dry-run",
                                    "--json"])
    assert res.exit_code == 0, res.output
    assert "torch.distributed.run --nnodes=2 --nproc-per-node=2" in res.output
    refused = CliRunner().invoke(cli, ["scale", "-p", "sandbox", "-N", "1", "-G", "2",
                                        "--launcher", "torchrun", "--dry-run"])
    assert refused.exit_code == 2 and "launcher: torchrun starts ranks without MPI" in refused.output


def test_a_pbs_profiles_dry_run_prints_its_script_and_connects_nowhere() -> None:
    # hpcdl renders PBS for reading and submits nothing there: the dry run needs no
    # connection (the scheduler registry refuses PBS for anything that talks to it).
    res = CliRunner().invoke(cli, ["submit", "-p", "polaris", "-N", "2", "-G", "4", "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "#PBS -l select=2:ncpus=32:ngpus=4" in res.output
