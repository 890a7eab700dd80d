"""The training examples as real multi-process runs on CPU: torchrun (DDP/gloo),
horovodrun --gloo and mpirun (Horovod and DDP), resume, dataset staging and errors.

Every launch has a hard timeout and kills its whole process group when it expires
(a collective that does not match across ranks would otherwise spin forever).
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hpcdl.jobside import protocol
from hpcdl.launch.staging import JOB_DIR_NAME, job_side_files, stage
from tests.conftest import require

ROOT = Path(__file__).resolve().parents[2]
RESNET = ROOT / "examples" / "resnet50_imagenet.py"
BENCH = ROOT / "examples" / "synthetic_benchmark.py"
MNIST = ROOT / "examples" / "mnist_small.py"
TIMEOUT = 240  # seconds per launch; a healthy one takes 5-15 s here

pytestmark = pytest.mark.torch

# Small enough for 2 ranks x 1 thread on 2 cores: ResNet-18, 32 px, 3 steps.
SMALL = [
    "--arch", "resnet18", "--synthetic", "--synthetic-size", "64", "--synthetic-val-size", "16",
    "--num-classes", "10", "--image-size", "32", "--batch-size", "8", "--threads", "1",
]  # fmt: skip



@dataclass
class Launch:
    argv: list[str]
    returncode: int
    output: str

    def result(self) -> dict[str, Any]:
        # The parser hpcdl uses on job logs (horovodrun's "[0]<stdout>:" prefix included).
        result = protocol.parse_result(self.output)
        assert result, f"no hpcdl_result line from {self.argv}:\n{self.output[-4000:]}"
        return result

    def checksums(self) -> dict[int, str]:
        rows = protocol.parse_rank_table(self.output)
        assert all(row["host"] for row in rows), f"a rank line without host=: {rows}"
        return {row["rank"]: row["checksum"] for row in rows}


def _env() -> dict[str, str]:
    # A MASTER_ADDR/PORT left in the caller's environment would override the launchers'.
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    env.update(
        OMP_NUM_THREADS="1",
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        # Open MPI would otherwise refuse 2 ranks if it counted fewer slots.
        OMPI_MCA_rmaps_base_oversubscribe="1",
        PYTHONWARNINGS="ignore",
    )
    return env


def launch(
    argv: list[str], cwd: Path, timeout: float = TIMEOUT, extra_env: dict[str, str] | None = None
) -> Launch:
    """Run a launcher in its own session; on timeout kill the whole group and fail."""
    proc = subprocess.Popen(
        argv, cwd=cwd, env={**_env(), **(extra_env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=30)
        pytest.fail(f"timed out after {timeout} s: {' '.join(argv)}\n{out[-4000:]}")
    return Launch(argv, proc.returncode, out)


def ok(run: Launch) -> Launch:
    assert run.returncode == 0, (
        f"{' '.join(run.argv)} exited {run.returncode}:\n{run.output[-4000:]}"
    )
    return run


def torchrun(script: Path, *args: str) -> list[str]:
    require(
        shutil.which("torchrun") is not None, "torchrun is not on PATH (pip install torch==2.13.0)"
    )
    return ["torchrun", "--standalone", "--nproc-per-node", "2", str(script), *args]


def horovodrun(script: Path, *args: str) -> list[str]:
    require_horovod()
    # --start-timeout: horovodrun's 30 s default covers both ranks' start (torch's import
    # included); `make test` runs these beside other workers' jobs on 2 cores.
    return ["horovodrun", "--gloo", "--start-timeout", "180", "-np", "2", sys.executable,
            str(script), *args]


def mpirun(script: Path, *args: str) -> list[str]:
    require(
        shutil.which("mpirun") is not None, "mpirun is not on PATH (apt-get install openmpi-bin)"
    )
    return ["mpirun", "-np", "2", "--allow-run-as-root", sys.executable, str(script), *args]


def require_horovod() -> None:
    require(
        importlib.util.find_spec("horovod") is not None and shutil.which("horovodrun") is not None,
        "Horovod is not installed: run scripts/build-horovod.sh",
    )


def assert_two_rank_run(run: Launch, backend: str) -> dict[str, Any]:
    ok(run)
    res = run.result()
    sums = run.checksums()
    assert sorted(sums) == [0, 1], run.output[-3000:]
    assert sums[0] == sums[1] == res["param_checksum"]
    assert res["ranks_agree"] is True
    assert res["world_size"] == 2 and res["backend"] == backend
    assert math.isfinite(res["final_loss"]) and res["final_loss"] > 0
    assert res["steps"] == 3
    assert res["global_batch"] == 16
    assert res["images_per_sec"] and res["images_per_sec"] > 0
    # Two ranks synchronise every step: some wait is measured, never more than the step.
    assert 0 < res["sync_seconds"] < res["step_seconds"], res
    assert res["sync_share"] == pytest.approx(res["sync_seconds"] / res["step_seconds"], abs=1e-3)
    return res


# The same configuration under each launcher: the launcher tests check each run, and the
# cross-launcher test compares their weights.
SAME_CONFIG = {
    "torchrun-ddp": lambda ck: torchrun(RESNET, "--backend", "ddp", *SMALL, "--max-steps", "3",
                                        "--checkpoint-dir", str(ck)),
    "horovodrun-horovod": lambda ck: horovodrun(RESNET, "--backend", "horovod", *SMALL,
                                                "--max-steps", "3", "--checkpoint-dir", str(ck)),
    "mpirun-horovod": lambda ck: mpirun(RESNET, "--backend", "horovod", *SMALL, "--max-steps", "3",
                                        "--checkpoint-dir", str(ck)),
}  # fmt: skip


class SameConfigRuns:
    """Each launcher's run, made once by whichever test asks first: the cross-launcher
    test launches what it lacks itself, so it passes or fails the same whatever order,
    or subset (-k, a rerun of one failure), the tests are run in."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self.factory = factory
        self.runs: dict[str, Launch] = {}

    def get(self, name: str) -> Launch:
        if name not in self.runs:
            where = self.factory.mktemp(name)
            self.runs[name] = launch(SAME_CONFIG[name](where / "ck"), where)
        return self.runs[name]


@pytest.fixture(scope="module")
def same_config_runs(tmp_path_factory: pytest.TempPathFactory) -> SameConfigRuns:
    return SameConfigRuns(tmp_path_factory)


def test_ddp_under_torchrun(same_config_runs: SameConfigRuns) -> None:
    res = assert_two_rank_run(same_config_runs.get("torchrun-ddp"), "ddp")
    assert res["launcher"] == "torchrun"
    assert Path(res["checkpoint"]).name == "checkpoint-00000003.pt"


@pytest.mark.horovod
def test_horovod_under_horovodrun_gloo(same_config_runs: SameConfigRuns) -> None:
    assert_two_rank_run(same_config_runs.get("horovodrun-horovod"), "horovod")


@pytest.mark.horovod
@pytest.mark.mpi
def test_horovod_under_mpirun(same_config_runs: SameConfigRuns) -> None:
    require_horovod()
    res = assert_two_rank_run(same_config_runs.get("mpirun-horovod"), "horovod")
    assert res["launcher"] == "openmpi"


@pytest.mark.horovod
@pytest.mark.mpi
def test_all_launchers_and_backends_reach_the_same_weights(
    same_config_runs: SameConfigRuns,
) -> None:
    # Same seed, data, batch and schedule: DDP and Horovod average the same gradients,
    # and with 2 ranks a+b == b+a exactly, so the weights agree bit for bit.
    sums = {name: ok(same_config_runs.get(name)).result()["param_checksum"]
            for name in SAME_CONFIG}
    assert len(set(sums.values())) == 1, sums


@pytest.mark.mpi
def test_ddp_under_mpirun_with_fp16_and_accumulation(tmp_path: Path) -> None:
    # DDP started by mpirun: rank/world/master come from OMPI_COMM_WORLD_* via hpcdl.launch.
    run = launch(mpirun(RESNET, "--backend", "ddp", *SMALL, "--max-steps", "3", "--fp16-allreduce",
                        "--batches-per-allreduce", "2", "--batch-size", "4",
                        "--checkpoint-dir", ""), tmp_path)  # fmt: skip
    res = assert_two_rank_run(run, "ddp")
    assert res["launcher"] == "openmpi" and res["checkpoint"] is None
    assert res["lr"] == pytest.approx(
        0.0125 * 2 * 2
    )  # linear in world size x batches per allreduce


def _resume_case(tmp_path: Path, make_argv: Any, backend: str) -> None:
    # 64 images / global batch 16 = 4 steps per epoch: stopping at step 3 is mid-epoch,
    # so the resume must skip the samples already seen in that epoch.
    base = ["--backend", backend, *SMALL, "--epochs", "3", "--warmup-epochs", "1"]
    straight = ok(
        launch(
            make_argv(*base, "--max-steps", "6", "--checkpoint-dir", str(tmp_path / "a")), tmp_path
        )
    )
    first = ok(
        launch(
            make_argv(*base, "--max-steps", "3", "--checkpoint-dir", str(tmp_path / "b")), tmp_path
        )
    )
    resumed = ok(launch(make_argv(*base, "--max-steps", "6", "--checkpoint-dir", str(tmp_path / "b"),
                                  "--resume"), tmp_path))  # fmt: skip
    r_straight, r_first, r_resumed = straight.result(), first.result(), resumed.result()
    assert r_first["steps"] == 3 and r_resumed["steps"] == 6 and r_resumed["steps_this_run"] == 3
    assert r_resumed["resumed_from"].endswith("checkpoint-00000003.pt")
    assert r_first["param_checksum"] != r_straight["param_checksum"]
    assert r_resumed["param_checksum"] == r_straight["param_checksum"]
    assert resumed.checksums()[0] == resumed.checksums()[1]
    # Both runs' last epoch covers steps 5-6 with the same weights and data: same loss.
    assert r_resumed["final_loss"] == pytest.approx(r_straight["final_loss"], rel=1e-9)


def test_resume_ddp_matches_uninterrupted_run(tmp_path: Path) -> None:
    _resume_case(tmp_path, lambda *a: torchrun(RESNET, *a), "ddp")


@pytest.mark.horovod
def test_resume_horovod_matches_uninterrupted_run(tmp_path: Path) -> None:
    _resume_case(tmp_path, lambda *a: horovodrun(RESNET, *a), "horovod")


def test_tiny_imagenet_with_staging_workers_and_keep_n(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    from hpcdl.data.tiny import TinySpec, make_tiny

    data = tmp_path / "tiny"
    make_tiny(data, TinySpec(classes=4, per_class=8, val_per_class=2, size=40))
    stage, ck = tmp_path / "local", tmp_path / "ck"
    run = ok(launch(torchrun(RESNET, "--backend", "ddp", "--arch", "resnet18", "--data", str(data),
                             "--image-size", "32", "--batch-size", "4", "--epochs", "3",
                             "--threads", "1", "--workers", "1", "--stage-to", str(stage),
                             "--checkpoint-dir", str(ck), "--keep-checkpoints", "2"), tmp_path))  # fmt: skip
    res = run.result()
    assert res["data"] == str(stage / "tiny")
    assert res["stage_seconds"] is not None and res["stage_seconds"] >= 0
    assert (stage / "tiny" / ".hpcdl-staged").read_text().strip() == str(data.resolve())
    assert sorted(p.name for p in (stage / "tiny" / "train").iterdir()) == sorted(
        p.name for p in (data / "train").iterdir()
    )
    # One copy per node: exactly one "staged" line (local rank 0), none from rank 1.
    assert run.output.count("staged ") == 1
    assert res["steps"] == 12 and len(res["epoch_times"]) == 3
    assert 0 <= res["top1"] <= res["top5"] <= 1
    assert sorted(p.name for p in ck.iterdir()) == [
        "checkpoint-00000008.pt",
        "checkpoint-00000012.pt",
    ]
    assert run.checksums()[0] == run.checksums()[1]


def _no_val(d: Path) -> Path:
    pytest.importorskip("PIL")
    from hpcdl.data.tiny import TinySpec, make_tiny

    make_tiny(d / "ds", TinySpec(classes=2, per_class=2, size=16))
    shutil.rmtree(d / "ds" / "val")
    return d / "ds"


@pytest.mark.parametrize(
    ("make", "expect"),
    [(lambda d: d / "missing", "no such directory"), (_no_val, "no val/ directory")],
)
def test_bad_dataset_is_one_line_error(tmp_path: Path, make: Any, expect: str) -> None:
    path = make(tmp_path)
    run = launch(
        [sys.executable, str(RESNET), "--backend", "ddp", "--data", str(path)],
        tmp_path,
        timeout=120,
    )
    assert run.returncode == 2, run.output
    assert "Traceback" not in run.output
    errors = [ln for ln in run.output.splitlines() if ln.startswith("error:")]
    assert errors == [f"error: dataset {path}: {expect}"], run.output


def test_mnist_small_two_ranks_learns(tmp_path: Path) -> None:
    run = ok(
        launch(torchrun(MNIST, "--backend", "ddp", "--epochs", "3", "--threads", "1"), tmp_path)
    )
    res = run.result()
    assert res["world_size"] == 2
    sums = run.checksums()
    assert sums[0] == sums[1] == res["param_checksum"]
    assert res["top1"] > 0.5  # 10 classes: chance is 0.1


@pytest.mark.horovod
def test_synthetic_benchmark_horovod(tmp_path: Path) -> None:
    run = ok(launch(horovodrun(BENCH, "--backend", "horovod", "--model", "resnet18", "--image-size", "32",
                               "--batch-size", "8", "--threads", "1", "--num-warmup-batches", "1",
                               "--num-batches-per-iter", "2", "--num-iters", "2"), tmp_path))  # fmt: skip
    res = run.result()
    assert res["world_size"] == 2 and res["images_per_sec"] > 0
    assert len(res["iterations"]) == 2


def srun(staged: Path, *args: str) -> list[str]:
    """The bundled example on two sandbox nodes, from ``staged`` (staged_job's copy: the
    nodes see the shared filesystem, not this checkout)."""
    return ["srun", "-N2", "-n2", "--mpi=pmix", "-t", "5", sys.executable,
            str(staged / "examples" / RESNET.name), *args]


def staged_job(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The job-side files copied as `hpcdl submit` stages them (into tmp_path/job, on the
    shared /scratch), and the PYTHONPATH that makes the copy's hpcdl the one imported."""
    stage(tmp_path, job_side_files())
    return tmp_path / JOB_DIR_NAME, {"PYTHONPATH": str(tmp_path / JOB_DIR_NAME)}


@pytest.mark.slurm
@pytest.mark.horovod
def test_horovod_and_ddp_under_srun_on_two_nodes(slurm_cluster: Path, tmp_path: Path) -> None:
    require_horovod()
    args = [*SMALL, "--max-steps", "3", "--checkpoint-dir", ""]
    staged, env = staged_job(tmp_path)
    hvd = launch(srun(staged, "--backend", "horovod", *args), tmp_path, extra_env=env)
    res = assert_two_rank_run(hvd, "horovod")
    assert res["launcher"] == "slurm" and res["nodes"] == 2
    # No MASTER_ADDR: the rendezvous host is the first node, n1, whose name resolves and
    # whose address is its own (a network namespace per sandbox node).
    ddp = launch(srun(staged, "--backend", "ddp", *args), tmp_path, extra_env=env)
    res_ddp = assert_two_rank_run(ddp, "ddp")
    assert res_ddp["nodes"] == 2
    assert res_ddp["param_checksum"] == res["param_checksum"]
    hosts = set(re.findall(r"hpcdl_rank_checksum rank=\d+ host=(\S+)", ddp.output))
    assert hosts == {"n1", "n2"}


@pytest.mark.slurm
def test_ddp_under_srun_with_unresolvable_master_is_one_line(
    slurm_cluster: Path, tmp_path: Path
) -> None:
    # The sandbox's own node names resolve: a name that cannot (RFC 6761 .invalid).
    staged, env = staged_job(tmp_path)
    run = launch(
        srun(staged, "--backend", "ddp", *SMALL, "--max-steps", "1", "--checkpoint-dir", ""),
        tmp_path, extra_env={**env, "MASTER_ADDR": "rank0.invalid"},
    )
    assert run.returncode != 0
    assert "Traceback" not in run.output
    assert "error: MASTER_ADDR 'rank0.invalid' (from slurm) does not resolve" in run.output
