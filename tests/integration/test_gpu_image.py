"""The GPU image built here from Debian + PyPI wheels (containers/pytorch-horovod-gpu-pypi.yaml):
built (cached by content), inspected, checked against profiles' GPU types, and run on the
two-node sandbox. A CUDA build of torch runs on the CPU where there is no GPU, so all of it
runs here except the GPU paths themselves (NCCL allreduce, AMP, channels_last, pinning):
the ``gpu``-marked test at the end runs those and is skipped without an NVIDIA GPU (in CI
too: CI has none).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest_apptainer import HOST_BINDS
from tests.integration.conftest_slurm import hpcdl

pytestmark = [pytest.mark.apptainer, pytest.mark.horovod, pytest.mark.torch]

JOB_TIMEOUT = 900  # s: 4 ranks import the CUDA torch + Horovod from a multi-GB image, 2 cores

TORCH = "2.14.1"
TORCHVISION = "0.29.1"

# A user script of the kind Horovod's own examples are (pytorch_synthetic_benchmark.py):
# torchvision's model, Horovod's DistributedOptimizer, synthetic data. Run unchanged.
USER_SCRIPT = '''
import torch
import torch.nn.functional as F
import horovod.torch as hvd
from torchvision import models

hvd.init()
cuda = torch.cuda.is_available()
if cuda:
    torch.cuda.set_device(hvd.local_rank())
device = torch.device("cuda" if cuda else "cpu")
torch.manual_seed(0)
model = models.resnet18(num_classes=10).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(opt, root_rank=0)
data = torch.randn(2, 3, 32, 32, device=device)
target = torch.randint(0, 10, (2,), device=device)
for _ in range(2):
    opt.zero_grad()
    F.cross_entropy(model(data), target).backward()
    opt.step()
checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
sums = hvd.allgather_object(round(checksum, 6))
if hvd.rank() == 0:
    print(f"USER_SCRIPT size={hvd.size()} nccl_built={int(bool(hvd.nccl_built()))} agree={len(set(sums)) == 1}")
'''


def _exec(apptainer: str, image: Path, *argv: str, timeout: float = 300) -> str:
    r = subprocess.run([apptainer, "exec", *HOST_BINDS, str(image), *argv], capture_output=True, text=True,
                       timeout=timeout, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, f"{argv}: exit {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"
    return r.stdout


def test_torchvision_imports_and_horovod_has_nccl(apptainer_bin: str, gpu_image: Path) -> None:
    out = _exec(apptainer_bin, gpu_image, "python3", "-c",
                "import torch, torchvision, horovod.torch as hvd; "
                "print(torch.__version__, torch.version.cuda, torchvision.__version__, "
                "int(bool(hvd.nccl_built())), int(hvd.mpi_built()), int(hvd.gloo_built()), "
                "hvd.nccl_built())")
    torch_v, cuda, tv, nccl, mpi, gloo, nccl_code = out.split()
    assert torch_v.startswith(TORCH + "+cu") and cuda.startswith("13.")
    assert tv.startswith(TORCHVISION)
    assert (nccl, mpi, gloo) == ("1", "1", "1")
    # nccl_built() is the NCCL version code Horovod was compiled against (2.30.7 -> 23007)
    assert int(nccl_code) >= 2_00_00, nccl_code
    table = _exec(apptainer_bin, gpu_image, "horovodrun", "-cb")
    assert re.search(r"\[X\] NCCL", table), table
    assert re.search(r"\[X\] PyTorch", table), table


def test_inspect_shows_cuda_archs_nccl_and_horovod(gpu_image: Path) -> None:
    res = hpcdl("inspect", "--json", str(gpu_image), timeout=600)
    assert res.returncode == 0, res.stderr
    facts = json.loads(res.stdout)
    assert facts["torch"].startswith(TORCH) and facts["torch_cuda"].startswith("13.")
    assert "sm_90" in facts["cuda_archs"] and "sm_70" not in facts["cuda_archs"]
    assert re.fullmatch(r"2\.\d+\.\d+", facts["nccl"] or ""), facts["nccl"]
    assert facts["horovod_operations"].get("NCCL") is True
    assert facts["mpi_flavour"] == "openmpi" and facts["mpi_version"] == "4.1.4"
    text = hpcdl("inspect", str(gpu_image), timeout=600)
    assert text.returncode == 0, text.stderr
    assert re.search(r"^  GPU architectures : .*sm_80", text.stdout, re.M), text.stdout
    assert re.search(r"\[X\] NCCL", text.stdout), text.stdout


def test_build_record_drives_the_plan_time_arch_check(gpu_image: Path) -> None:
    record = json.loads(gpu_image.with_name(gpu_image.name + ".hash").read_text())
    facts = record["image_facts"]
    assert facts["torch_cuda"].startswith("13.") and "sm_80" in facts["cuda_archs"]
    # Neuron's smallest fitting partition is a V100 one (sm_70): refused, one line.
    res = hpcdl("submit", "-p", "neuron", "-N", "1", "-G", "2", "--image", str(gpu_image),
                "--dry-run")
    assert res.returncode == 2, res.stdout + res.stderr
    first = res.stderr.strip().splitlines()[0]
    assert "GPU type V100" in first and "sm_70" in first and "sm_80" in first, res.stderr
    assert "cas_v100" in first and res.stdout == ""
    # An A100 partition (sm_80) is fine.
    res = hpcdl("submit", "-p", "neuron", "-N", "1", "-G", "2", "--partition", "amd_a100_2",
                "--image", str(gpu_image), "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "GPU architecture" not in res.stderr


def _run_dir(stdout: str) -> Path:
    m = re.search(r"^run directory: (.+)$", stdout, re.M)
    assert m, stdout
    return Path(m.group(1))


@pytest.mark.slurm
def test_bundled_example_two_nodes_two_ranks(slurm_cluster: Path, gpu_image: Path,
                                             runs_dir: Path) -> None:
    # The sandbox profile's example defaults keep the bundled example small.
    res = hpcdl("submit", "-p", "sandbox", "-N", "2", "-G", "2", "--cpus-per-task", "1",
                "--image", str(gpu_image), "--job-name", "gpu-image-e2e", "--wait",
                timeout=JOB_TIMEOUT)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    assert re.search(r"^world size\s+4$", res.stdout, re.M), res.stdout
    assert re.search(r"^nodes\s+2$", res.stdout, re.M), res.stdout
    assert "parameters identical on every rank" in res.stdout
    record = json.loads((_run_dir(res.stdout) / "result.json").read_text())
    assert record["state"] == "COMPLETED" and record["failed_ranks"] == []
    assert {r["host"] for r in record["ranks"]} == {"n1", "n2"}
    assert len({r["checksum"] for r in record["ranks"]}) == 1


@pytest.mark.slurm
def test_user_script_with_torchvision_runs_unchanged(slurm_cluster: Path, gpu_image: Path,
                                                     runs_dir: Path, tmp_path: Path) -> None:
    script = tmp_path / "hvd_resnet18.py"
    script.write_text(USER_SCRIPT)
    res = hpcdl("submit", "-p", "sandbox", "-N", "2", "-G", "2", "--cpus-per-task", "1",
                "--image", str(gpu_image), "--job-name", "gpu-image-user", "--wait",
                "--", "python3", str(script), cwd=tmp_path, timeout=JOB_TIMEOUT)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    out = (_run_dir(res.stdout)).glob("slurm-*.out")
    text = "".join(p.read_text() for p in out)
    assert re.search(r"USER_SCRIPT size=4 nccl_built=1 agree=True", text), text[-3000:]


def _gpu_count() -> int:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    r = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
    return sum(line.startswith("GPU ") for line in r.stdout.splitlines()) if r.returncode == 0 else 0


@pytest.mark.gpu
def test_gpu_paths_on_a_real_gpu(apptainer_bin: str, gpu_image: Path, tmp_path: Path) -> None:
    """NCCL allreduce, AMP, channels_last and pinned memory: the example's GPU paths, run
    with --nv on this host's GPUs. Skipped without an NVIDIA GPU (CI and the dev machine
    have none), never turned into a pass."""
    gpus = _gpu_count()
    if gpus == 0:
        pytest.skip("no NVIDIA GPU on this host (nvidia-smi -L lists none)")
    horovodrun = shutil.which("horovodrun")
    assert horovodrun, "horovodrun is needed on the host (scripts/build-horovod.sh)"
    probe = subprocess.run(
        [apptainer_bin, "exec", *HOST_BINDS, "--nv", str(gpu_image), "python3", "-c",
         "import torch; print(torch.cuda.is_available(), torch.cuda.nccl.version())"],
        capture_output=True, text=True, timeout=300)
    assert probe.stdout.startswith("True"), probe.stdout + probe.stderr[-2000:]
    ranks = min(gpus, 2)
    data = tmp_path / "tiny"
    made = hpcdl("data", "make-tiny", str(data), "--classes", "4", "--per-class", "8",
                 "--size", "40")
    assert made.returncode == 0, made.stderr
    r = subprocess.run(
        [horovodrun, "-np", str(ranks), "-H", f"localhost:{ranks}", apptainer_bin, "exec",
         "--nv", "-B", str(data), str(gpu_image), "python3",
         "/opt/hpcdl/examples/resnet50_imagenet.py", "--backend", "horovod", "--data",
         str(data), "--arch", "resnet18", "--image-size", "32", "--batch-size", "4",
         "--max-steps", "2", "--epochs", "1", "--amp", "on"],
        capture_output=True, text=True, timeout=JOB_TIMEOUT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    sums = set(re.findall(r"hpcdl_rank_checksum rank=\d+ host=\S+ checksum=(\S+)", r.stdout))
    assert len(sums) == 1, r.stdout[-3000:]
