"""The product's main job, made small: `hpcdl submit --profile sandbox --nodes 2 --gpus 2
--image CPU.sif --wait` runs the bundled ResNet example in the real image on the real
two-node sandbox Slurm (4 ranks, srun --mpi=pmix apptainer exec --nv), for each backend;
a crashing rank is reported by rank; an unreachable controller is one line with the fix.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest_slurm import hpcdl

pytestmark = [pytest.mark.slurm, pytest.mark.apptainer, pytest.mark.horovod]

JOB_TIMEOUT = 420  # s: 4 ranks start torch + Horovod in the image on 2 cores
EXAMPLE_ARGS = ("-X", "--arch=resnet18", "-X", "--image-size=32", "-X", "--batch-size=4",
                "-X", "--max-steps=2", "-X", "--epochs=1")


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("e2e") / "tiny-imagenet"
    res = hpcdl("data", "make-tiny", str(root), "--classes", "4", "--per-class", "8",
                "--size", "40")
    assert res.returncode == 0, res.stderr
    return root


def _submit(image: Path, *args: str, timeout: float = JOB_TIMEOUT) -> subprocess.CompletedProcess[str]:
    return hpcdl("submit", "--profile", "sandbox", "--nodes", "2", "--gpus", "2",
                 "--cpus-per-task", "1", "--image", str(image), "--wait", *args, timeout=timeout)


def _run_dir(stdout: str) -> Path:
    m = re.search(r"^run directory: (.+)$", stdout, re.M)
    assert m, stdout
    return Path(m.group(1))


@pytest.mark.parametrize("backend", ["horovod", "ddp"])
def test_two_nodes_train_in_the_image(backend: str, slurm_cluster: Path, cpu_image: Path,
                                      tiny_data: Path, runs_dir: Path) -> None:
    res = _submit(cpu_image, "--backend", backend, "--data", str(tiny_data),
                  "--bind", str(tiny_data), "--job-name", f"e2e-{backend}", *EXAMPLE_ARGS)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    out = res.stdout

    # The table printed at the end.
    assert re.search(r"^world size\s+4$", out, re.M), out
    assert re.search(r"^nodes\s+2$", out, re.M), out
    assert re.search(rf"^backend\s+{backend}$", out, re.M), out
    assert re.search(r"^images/sec\s+\d", out, re.M), out
    assert re.search(r"^top-1 \(val\)\s+\d+\.\d%$", out, re.M), out
    assert "parameters identical on every rank" in out

    run_dir = _run_dir(out)
    assert run_dir.parent == runs_dir.resolve()
    record = json.loads((run_dir / "result.json").read_text())
    assert record["state"] == "COMPLETED" and record["exit_code"] == 0
    result = record["hpcdl_result"]
    assert (result["world_size"], result["nodes"], result["backend"]) == (4, 2, backend)
    assert result["launcher"] == "slurm" and result["ranks_agree"] is True
    ranks = record["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert {r["host"] for r in ranks} == {"n1", "n2"}
    assert len({r["checksum"] for r in ranks}) == 1
    assert ranks[0]["checksum"] == result["param_checksum"]
    assert record["failed_ranks"] == []

    # The run directory is enough to reproduce the run.
    script = (run_dir / "job.sbatch").read_text()
    assert "srun --label --kill-on-bad-exit=1 --mpi=pmix apptainer exec --nv" in script
    assert str(cpu_image) in script
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["ntasks"] == 4 and plan["backend"] == backend
    image = json.loads((run_dir / "image.json").read_text())
    build_record = json.loads(cpu_image.with_name(cpu_image.name + ".hash").read_text())
    assert image["content_hash"] == build_record["hash"]
    assert "\nBootstrap: debootstrap\n" in (run_dir / "image.def").read_text()
    profile = hpcdl("profiles", "validate", str(run_dir / "profile.yaml"))
    assert profile.returncode == 0, profile.stderr
    assert (run_dir / f"slurm-{record['job_id']}.out").read_text().count("hpcdl_rank_checksum") == 4
    assert Path(result["checkpoint"]).is_file()
    assert Path(result["checkpoint"]).parent == run_dir / "checkpoints"


CRASH = """
import os, sys, time
rank = int(os.environ["SLURM_PROCID"])
print(f"rank {rank} working", flush=True)
if rank == 3:
    print("about to fail", file=sys.stderr, flush=True)
    raise RuntimeError("rank 3 crashed on purpose")
time.sleep(600)
"""


def test_a_crashing_rank_is_named_with_its_last_lines(slurm_cluster: Path, cpu_image: Path,
                                                      runs_dir: Path) -> None:
    # The other ranks sleep 600 s: only srun --kill-on-bad-exit ends the job within the
    # timeout (the hang users know from a rank that died before a collective).
    res = _submit(cpu_image, "--job-name", "e2e-crash", "--", "python3", "-c", CRASH,
                  timeout=240)
    assert res.returncode != 0, res.stdout
    out = res.stdout
    assert "--- the job failed: rank 3 on n2: Exited with exit code 1 ---" in out, out
    assert "  about to fail" in out
    assert "  RuntimeError: rank 3 crashed on purpose" in out
    assert "ranks 0,1,2 stopped after that" in out
    record = json.loads((_run_dir(out) / "result.json").read_text())
    assert record["state"] == "FAILED" and record["failed_ranks"] == [3]
    assert record["hpcdl_result"] is None


def test_unreachable_controller_names_the_fix(slurm_cluster: Path, tmp_path: Path,
                                              runs_dir: Path, cpu_image: Path) -> None:
    # The sandbox's own slurm.conf with the controller moved to a port nobody listens on:
    # Slurm's tools fail exactly as they do when the sandbox is down.
    conf = tmp_path / "slurm.conf"
    text = slurm_cluster.read_text()
    assert "SlurmctldPort=" in text
    conf.write_text(re.sub(r"^SlurmctldPort=.*$", "SlurmctldPort=1", text, flags=re.M))
    res = hpcdl("submit", "--profile", "sandbox", "--nodes", "2", "--gpus", "2",
                "--image", str(cpu_image), "--synthetic",
                env={"SLURM_CONF": str(conf)}, timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert lines[0].startswith("error: Slurm's controller is not reachable (profile sandbox)")
    assert lines[-1] == "hint: start the local sandbox cluster: hpcdl sandbox up"
    assert "Traceback" not in res.stderr
