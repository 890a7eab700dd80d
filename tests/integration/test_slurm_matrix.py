"""The first tests of the Slurm release matrix (issue 41): each runs once per release
(``slurm_release``: the host's 22.05 sandbox, the 24.11 and 26.05 release sandboxes;
tests/integration/conftest_releases.py), through hpcdl's own commands and the
release's own Slurm. What they cover: a native 2-node run with status and logs read
back, the job's accounting (sacct) read through `hpcdl status`, a job's cancel, a sweep array task's status, `hpcdl alloc`, `profiles detect`, the
bundled example in the CPU image on 2 nodes, and natively (the nodes' Python, torch and
py-spy) a sweep's failed point retried alone (--retry-failed), `hpcdl probe` on 2 nodes
and the hang dump. Requeue on each release: test_slurm_matrix_requeue.py."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import yaml

from tests.integration.conftest_releases import SlurmRelease, release_command
from tests.integration.conftest_slurm import hpcdl, shared_copy

pytestmark = [pytest.mark.slurm, pytest.mark.slurm_matrix]


def _last_json(text: str) -> dict:
    return dict(json.loads(text.strip().splitlines()[-1]))


def _labelled(text: str) -> list[str]:
    """The text after srun's --label prefix, of each labelled line."""
    return sorted(line.split(":", 1)[1].strip() for line in text.splitlines()
                  if line[:1].isdigit() and ":" in line)


def _state(rel: SlurmRelease, job: str) -> dict:
    res = rel.hpcdl("status", job, "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    return dict(json.loads(res.stdout))


def _until(rel: SlurmRelease, job: str, states: tuple[str, ...], timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        row = _state(rel, job)
        if row["state"] in states or time.monotonic() > deadline:
            return row
        time.sleep(1)


def test_a_native_two_node_run_its_status_and_logs(slurm_release: SlurmRelease) -> None:
    rel = slurm_release
    res = rel.hpcdl("submit", "-p", rel.profile, "-N", "2", "-G", "1", "--no-image", "--wait",
                    "--json", "--", "hostname", timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    record = _last_json(res.stdout)
    job = str(record["job_id"])
    names = _labelled(Path(record["stdout"]).read_text())
    assert names == sorted(rel.nodes)  # a rank on each node, each its own host
    row = _state(rel, job)
    assert row["state"] == "COMPLETED"
    logs = rel.hpcdl("logs", job)
    assert logs.returncode == 0 and _labelled(logs.stdout) == names, logs.stdout + logs.stderr


def test_the_jobs_accounting_read_through_hpcdl(slurm_release: SlurmRelease) -> None:
    """sacct of the release (every release sandbox runs its own slurmdbd, as 22.05's
    does): a 2-node job that exits 3 is listed by `hpcdl status -p PROFILE --json` from
    the accounting database (source ``sacct``: once slurmdbd has its record, sacct's row
    wins over squeue's) with its state, exit code, partition and both nodes; and the
    job's attempts (`sacct -D`, what `hpcdl status JOB` reads for a requeued job) are
    there too."""
    rel = slurm_release
    # Rank 1 ends first (0), rank 0 a moment later with 3: if both ended 3, srun's
    # --kill-on-bad-exit could TERM the slower one first, and the job's code be 143 (seen
    # under load on 22.05 and 24.11).
    res = rel.hpcdl("submit", "-p", rel.profile, "-N", "2", "-G", "0", "--no-image", "--wait",
                    "--json", "--", "bash", "-c",
                    'if [ "$SLURM_PROCID" = 0 ]; then sleep 2; exit 3; fi', timeout=300)
    assert res.returncode == 3, res.stdout + res.stderr
    job = str(_last_json(res.stdout)["job_id"])
    deadline = time.monotonic() + 60
    while True:
        listed = rel.hpcdl("status", "-p", rel.profile, "--json")
        assert listed.returncode == 0, listed.stdout + listed.stderr
        row = next((r for r in json.loads(listed.stdout) if r["job_id"] == job), None)
        if (row and row["source"] == "sacct") or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert row is not None and row["source"] == "sacct", row
    assert (row["state"], row["exit_code"], row["partition"]) == ("FAILED", 3, "debug"), row
    nodes = release_command(rel.command("scontrol"), "show", "hostnames", row["nodes"],
                            env=rel.env).split()
    assert sorted(nodes) == sorted(rel.nodes), row
    sacct = release_command(rel.command("sacct"), "-n", "-P", "-X", "-D", "-j", job, "-o",
                            "JobID,State,ExitCode", env=rel.env)
    assert sacct.split() == [f"{job}|FAILED|3:0"], sacct


def test_cancel_of_a_running_job(slurm_release: SlurmRelease) -> None:
    rel = slurm_release
    res = rel.hpcdl("submit", "-p", rel.profile, "-N", "1", "-G", "0", "--no-image", "--json",
                    "--time", "00:05:00", "--", "sleep", "300")
    assert res.returncode == 0, res.stdout + res.stderr
    job = str(_last_json(res.stdout)["job_id"])
    assert _until(rel, job, ("RUNNING",))["state"] == "RUNNING"
    cancel = rel.hpcdl("cancel", job, timeout=90)
    assert cancel.returncode == 0 and "CANCELLED" in cancel.stdout, cancel.stdout + cancel.stderr
    assert _until(rel, job, ("CANCELLED",))["state"] == "CANCELLED"


def test_a_sweep_array_tasks_status(slurm_release: SlurmRelease) -> None:
    rel = slurm_release
    res = rel.hpcdl("sweep", "-p", rel.profile, "-N", "1", "-G", "0", "-c", "1", "--param",
                    "n=1,2", "--no-image", "--wait", "--json", "--", "bash", "-c",
                    "echo n={n}; exit $(( {n} - 1 ))", timeout=240)
    assert res.returncode == 1, res.stdout + res.stderr  # n=2 exits 1
    data = json.loads(res.stdout)
    assert [r["state"] for r in data["rows"]] == ["COMPLETED", "FAILED"]
    (sweep_dir,) = Path(rel.env["HPCDL_RUNS"]).glob("sweep-*")  # this session's only one
    record = json.loads((sweep_dir / "sweep.json").read_text())
    task = record["points"][1]["job_id"]
    assert task.endswith("_1")
    row = _state(rel, task)
    assert row["state"] == "FAILED" and row["job_id"] == task


def test_alloc_runs_the_releases_salloc_and_srun(slurm_release: SlurmRelease) -> None:
    """`hpcdl alloc` (salloc, from the profile's command directory) with a command: srun
    inside the allocation is the release's and gives each task the CPUs asked for (22.05
    through SRUN_CPUS_PER_TASK, later releases by inheriting the allocation's)."""
    rel = slurm_release
    res = rel.hpcdl("alloc", "-p", rel.profile, "-N", "2", "-G", "1", "-c", "2", "-t",
                    "00:02:00", "--", "srun", "bash", "-c",
                    'echo "hpcdl-alloc $(hostname) cpt=$SLURM_CPUS_PER_TASK srun=$(command -v srun)"',
                    timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = sorted(line.split()[1:] for line in res.stdout.splitlines()
                  if line.startswith("hpcdl-alloc "))
    assert [r[0] for r in rows] == sorted(rel.nodes), res.stdout
    assert {r[1] for r in rows} == {"cpt=2"}
    assert {r[2] for r in rows} == {f"srun={rel.command('srun')}" if rel.commands else
                                    rows[0][2]}


def test_profiles_detect_records_the_release(slurm_release: SlurmRelease,
                                             tmp_path: Path) -> None:
    rel = slurm_release
    out = tmp_path / "detected.yaml"
    args = ["profiles", "detect", "--name", "detected", "-o", str(out)]
    if rel.commands:
        args += ["--commands", str(rel.commands)]
    res = rel.hpcdl(*args)
    assert res.returncode == 0, res.stdout + res.stderr
    data = yaml.safe_load(out.read_text())
    assert data["scheduler"]["release"] == rel.release
    assert data["scheduler"].get("commands") == (str(rel.commands) if rel.commands else None)
    nodes = sum(p["nodes"] for p in data["partitions"] if p.get("default"))
    assert nodes >= 2
    if rel.release != "22.05":  # what hpcdl does differently there, in a note
        assert f"note: Slurm {rel.release}: " in res.stderr


@pytest.mark.apptainer
def test_the_bundled_example_in_the_image_on_two_nodes(slurm_release: SlurmRelease,
                                                      cpu_image: Path) -> None:
    """The headline path on each release: the bundled example in the CPU image, one
    rank per node on 2 nodes, under the release's srun (Apptainer on the release's nodes
    is the host's /usr/bin/apptainer). DDP: 26.05's sandbox has no PMIx for Horovod's
    MPI (docs/guide/slurm-releases.md); the sizes are the profile's example defaults."""
    rel = slurm_release
    res = rel.hpcdl("submit", "-p", rel.profile, "-N", "2", "-G", "1", "--image",
                    str(cpu_image), "--backend", "ddp", "--wait", timeout=600)
    assert res.returncode == 0, f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    out = res.stdout
    assert re.search(r"^job \d+: COMPLETED", out, re.M), out
    assert re.search(r"^world size\s+2$", out, re.M), out
    assert re.search(r"^nodes\s+2$", out, re.M), out
    assert re.search(r"^backend\s+ddp$", out, re.M), out
    assert "parameters identical on every rank" in out


def test_a_sweep_arrays_failed_point_retried_alone(slurm_release: SlurmRelease,
                                                    tmp_path: Path) -> None:
    """A sweep of 3 points as one job array whose n=2 fails the first time only (a node
    hiccup); `--retry-failed` resubmits that point alone as a new array, and every point
    is then COMPLETED. Its own runs directory: the session's holds one sweep already.
    (22.05 with the host-like twin: test_sweep_array.py.)"""
    rel = slurm_release
    env = {**rel.env, "HPCDL_RUNS": str(tmp_path / "runs")}
    flag = tmp_path / "failed-once"
    script = f"echo n={{n}}; [ {{n}} != 2 ] || [ -e {flag} ] || {{ touch {flag}; exit 3; }}"
    res = hpcdl("sweep", "-p", rel.profile, "-N", "1", "-G", "0", "-c", "1", "--param",
                "n=1,2,3", "--no-image", "--wait", "--json", "--", "bash", "-c", script,
                env=env, timeout=240)
    assert res.returncode == 1, res.stdout + res.stderr
    assert [r["state"] for r in json.loads(res.stdout)["rows"]] == ["COMPLETED", "FAILED",
                                                                    "COMPLETED"]
    (sweep_dir,) = (tmp_path / "runs").glob("sweep-*")
    again = hpcdl("sweep", "--retry-failed", str(sweep_dir), "--wait", "--json", env=env,
                  timeout=240)
    assert again.returncode == 0, again.stdout + again.stderr
    assert [r["state"] for r in json.loads(again.stdout)["rows"]] == ["COMPLETED"] * 3
    record = json.loads((sweep_dir / "sweep.json").read_text())
    first, retry = record["arrays"]
    assert retry["indices"] == [1] and "--array=1" in retry["argv"], retry
    task = record["points"][1]["job_id"]
    assert task == f"{retry['job_id']}_1"
    logs = hpcdl("logs", task, env=env)
    assert logs.returncode == 0 and "n=2" in logs.stdout, logs.stdout + logs.stderr


def test_the_probe_on_two_nodes(slurm_release: SlurmRelease) -> None:
    """`hpcdl probe` natively (the nodes' Python and torch, Gloo) on 2 nodes under the
    release's srun: a sweep of allreduce sizes over both ranks, one pair, no slow node.
    (22.05 in the image, with MPI and slowed links: test_probe.py.)"""
    rel = slurm_release
    res = rel.hpcdl("probe", "-p", rel.profile, "-N", "2", "--sizes", "4K,64K", "--iters",
                    "3", "--warmup", "1", "--wait", "--json", timeout=300)
    assert "Traceback" not in res.stderr, res.stderr
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = _last_json(res.stdout)
    assert out["state"] == "COMPLETED" and out["exit_status"] == 0, out
    probe = out["probe"]
    assert probe["nodes"] == sorted(rel.nodes) and probe["world_size"] == 2, probe
    assert [r["size"] for r in probe["allreduce"]] == [4096, 65536]
    assert all(r["time_s"] > 0 and r["algorithm"] == "torch.distributed gloo all_reduce"
               for r in probe["allreduce"]), probe["allreduce"]
    assert [p["nodes"] for p in probe["pairs"]] == [sorted(rel.nodes)]
    assert probe["verdict"]["slow_nodes"] == [] and not probe["verdict"]["bad"], probe["verdict"]


def test_the_hang_dump_names_the_hung_rank(slurm_release: SlurmRelease) -> None:
    """`submit --wait --hang-timeout 30` natively (the nodes' Python and py-spy, dumped
    through the release's `srun --overlap`): 2 ranks of a gloo script, rank 1 asleep in
    slow_step while rank 0 waits in all_reduce; the watchdog names rank 1 and its frame
    and cancels the job. (22.05 in the image, 4 ranks: test_hang_watchdog.py.)"""
    rel = slurm_release
    script = shared_copy(Path(__file__).resolve().parent / "hang") / "gloo_hang.py"
    res = rel.hpcdl("submit", "-p", rel.profile, "-N", "2", "-G", "0", "-c", "1",
                    "--no-image", "--hang-timeout", "30", "--wait", "--json", "--",
                    "python3", str(script), "--steps", "3", "--slow-rank", "1", timeout=400)
    assert "Traceback" not in res.stderr, res.stderr
    out = _last_json(res.stdout)
    assert out["state"] == "CANCELLED" and res.returncode != 0, f"{out}\n{res.stderr[-3000:]}"
    hang = out["hang"]
    assert hang["cancelled"] is True, hang
    (slow,) = hang["stragglers"]
    assert (slow["label"], slow["function"]) == ("rank 1", "slow_step"), hang
    assert slow["node"] in rel.nodes and not slow["in_collective"], hang
    (waiting,) = [p for p in hang["places"] if p["ranks"] != ["rank 1"]]
    assert waiting["ranks"] == ["rank 0"] and waiting["in_collective"], hang
    assert hang["silent_s"] >= 30
