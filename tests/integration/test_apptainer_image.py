"""The CPU image for real: build (or reuse by content hash), Horovod and MPI inside it,
hybrid MPI from the host, failed and interrupted builds, and the doctor on it.

Every run of more than one process has a hard timeout: a Horovod collective that does
not match across ranks spins forever.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import require
from tests.integration.conftest_apptainer import HOST_BINDS, REPO, image_path

pytestmark = [pytest.mark.apptainer]

# Same parameters on every rank after a few steps, from different initialisations and
# different data per rank: broadcast + allreduce really happened.
HVD_STEP = r'''
import hashlib, json
import torch
import horovod.torch as hvd

hvd.init()
torch.set_num_threads(1)
torch.manual_seed(1234 + hvd.rank())
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
initial = hashlib.sha256(torch.cat([p.detach().flatten() for p in model.parameters()]).numpy().tobytes()).hexdigest()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(opt, root_rank=0)
opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
gen = torch.Generator().manual_seed(99 + hvd.rank())
for _ in range(3):
    x = torch.randn(8, 16, generator=gen)
    y = torch.randint(0, 4, (8,), generator=gen)
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()
print("HVD_RESULT " + json.dumps({"rank": hvd.rank(), "size": hvd.size(), "initial": initial,
      "digest": digest, "all": hvd.allgather_object(digest, name="digests")}), flush=True)
'''

MPI_ALLREDUCE = r'''
import json
from mpi4py import MPI
comm = MPI.COMM_WORLD
total = comm.allreduce(comm.Get_rank() + 1, op=MPI.SUM)
print("MPI_RESULT " + json.dumps({"rank": comm.Get_rank(), "size": comm.Get_size(), "sum": total,
      "library": MPI.Get_library_version().strip("\0 \n").splitlines()[0]}), flush=True)
'''

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def results(output: str, tag: str) -> list[dict]:
    """Every ``TAG {json}`` in the output; mpirun's forwarding may glue two ranks' lines."""
    decoder = json.JSONDecoder()
    found = []
    start = output.find(tag + " ")
    while start != -1:
        obj, end = decoder.raw_decode(output, start + len(tag) + 1)
        found.append(obj)
        start = output.find(tag + " ", end)
    return found


def hpcdl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpcdl", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_same_parameters(res: list[dict]) -> None:
    assert sorted(r["rank"] for r in res) == [0, 1], res
    assert all(r["size"] == 2 for r in res)
    assert res[0]["initial"] != res[1]["initial"], "ranks should start from different weights"
    digests = {r["digest"] for r in res}
    assert len(digests) == 1, f"parameters differ across ranks: {res}"
    assert all(r["all"] == [res[0]["digest"]] * 2 for r in res)


def mpirun_argv(n: int) -> list[str]:
    mpirun = shutil.which("mpirun")
    require(mpirun is not None, "host mpirun (openmpi-bin)")
    assert mpirun is not None
    argv = [mpirun, "-np", str(n)]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    return argv + ["--oversubscribe"]


def test_unchanged_rebuild_is_a_noop(cpu_image: Path) -> None:
    # The first call rebuilds only if the project changed since the fixture ran (a
    # checkout being edited); the second must then be a no-op.
    first = hpcdl("build", "pytorch-horovod-cpu", "--json", timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    r = hpcdl("build", "pytorch-horovod-cpu", "--json", timeout=60)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["built"] is False and data["output"] == str(image_path())
    assert cpu_image.samefile(image_path())  # the nodes read the built image via /scratch
    record = json.loads(Path(data["hash_record"]).read_text())
    assert record["hash"] == data["content_hash"]
    assert any(p.endswith("/wheelhouse/" + Path(p).name) for p in record["files"])


def test_project_is_inside_the_image(cpu_image: Path, apptainer_bin: str) -> None:
    r = subprocess.run([apptainer_bin, "exec", *HOST_BINDS, str(cpu_image), "python3", "-c",
                        "import hpcdl, torch; print(hpcdl.__file__, torch.__version__)"],
                       capture_output=True, text=True, timeout=120, cwd="/")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["/opt/hpcdl/hpcdl/__init__.py", "2.13.0+cpu"]


@pytest.mark.horovod
def test_horovod_gloo_two_ranks_inside_the_image(cpu_image: Path, apptainer_bin: str,
                                                  tmp_path: Path) -> None:
    script = tmp_path / "hvd_step.py"
    script.write_text(HVD_STEP)
    r = subprocess.run([apptainer_bin, "exec", *HOST_BINDS, str(cpu_image), "horovodrun", "--gloo", "-np", "2",
                        "-H", "localhost:2", "python3", str(script)],
                       capture_output=True, text=True, timeout=300, env=ENV)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    check_same_parameters(results(r.stdout, "HVD_RESULT"))


@pytest.mark.mpi
def test_hybrid_host_mpirun_mpi4py_allreduce(cpu_image: Path, apptainer_bin: str,
                                             tmp_path: Path) -> None:
    script = tmp_path / "allreduce.py"
    script.write_text(MPI_ALLREDUCE)
    argv = mpirun_argv(2) + [apptainer_bin, "exec", *HOST_BINDS, str(cpu_image), "python3", str(script)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=180, env=ENV)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = results(r.stdout, "MPI_RESULT")
    assert sorted(x["rank"] for x in res) == [0, 1]
    assert all(x["size"] == 2 and x["sum"] == 3 for x in res), res
    assert all(x["library"].startswith("Open MPI v4.1") for x in res), res


@pytest.mark.mpi
@pytest.mark.horovod
def test_hybrid_host_mpirun_horovod_mpi_controller(cpu_image: Path, apptainer_bin: str,
                                                   tmp_path: Path) -> None:
    script = tmp_path / "hvd_step.py"
    script.write_text(HVD_STEP)
    argv = mpirun_argv(2) + [apptainer_bin, "exec", *HOST_BINDS, str(cpu_image), "python3", str(script)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=ENV)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    check_same_parameters(results(r.stdout, "HVD_RESULT"))


def test_doctor_lists_horovod_support(cpu_image: Path) -> None:
    r = hpcdl("doctor", "--image", str(cpu_image), "--json", timeout=300)
    data = json.loads(r.stdout)
    image = data["image"]
    assert image["horovod"] == "0.28.1"
    assert image["horovod_frameworks"]["PyTorch"] is True
    assert image["horovod_controllers"] == {"MPI": True, "Gloo": True}
    assert image["horovod_operations"]["Gloo"] is True
    assert image["horovod_operations"]["NCCL"] is False
    assert image["mpi_flavour"] == "openmpi" and image["mpi_version"] == "4.1.4"
    assert image["labels"]["org.hpcdl.mpi.version"] == "4.1.4"
    assert image["torch"] == "2.13.0+cpu"
    problems = [v for v in data["verdicts"] if v["level"] == "problem"]
    assert r.returncode == (1 if problems else 0)
    assert not problems, problems  # this machine: same Open MPI on host and in the image
    text = hpcdl("inspect", str(cpu_image), timeout=300)
    assert text.returncode == 0, text.stderr
    assert "[X] PyTorch" in text.stdout and "[X] Gloo" in text.stdout


# --- failed and interrupted builds: small images on a tiny base --------------------------

BASE_DEF = """Bootstrap: debootstrap
OSVersion: bookworm
MirrorURL: http://deb.debian.org/debian

%post
    echo hpcdl-test-base > /etc/hpcdl-test-base
"""


@pytest.fixture(scope="module")
def tiny_base(apptainer_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A minimal Debian image (~90 MB), built once and then reused by content hash."""
    cache = Path(os.environ.get("HPCDL_CACHE") or "/var/cache/hpcdl")
    out = cache / "images" / "hpcdl-test-base.sif"
    d = tmp_path_factory.mktemp("base") / "hpcdl-test-base.def"
    d.write_text(BASE_DEF)
    r = hpcdl("build", str(d), "-o", str(out), timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def tiny_def(base: Path, post: str) -> str:
    return f"Bootstrap: localimage\nFrom: {base}\n\n%post\n{post}\n"


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".building-" in p.name or p.name.endswith(".tmp"))


def test_failed_post_leaves_previous_image_and_no_partial_file(tiny_base: Path, tmp_path: Path,
                                                               apptainer_bin: str) -> None:
    out = tmp_path / "tiny.sif"
    good = tmp_path / "good.def"
    good.write_text(tiny_def(tiny_base, "    echo good > /marker"))
    r = hpcdl("build", str(good), "-o", str(out), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    before = (sha256(out), out.stat().st_mtime_ns, (tmp_path / "tiny.sif.hash").read_text())

    bad = tmp_path / "bad.def"
    bad.write_text(tiny_def(tiny_base, "    echo about-to-fail-on-purpose\n    exit 3"))
    r = hpcdl("build", str(bad), "-o", str(out), timeout=600)
    assert r.returncode == 1
    assert "error: apptainer build of bad failed (exit 255)" in r.stderr or \
        "error: singularity build of bad failed" in r.stderr, r.stderr
    assert "post" in r.stderr.lower()  # the tool's own reason: the %post section failed
    assert f"hint: full log: {out}.build.log" in r.stderr
    assert "Traceback" not in r.stderr
    log = (tmp_path / "tiny.sif.build.log").read_text(errors="replace")
    assert "about-to-fail-on-purpose" in log and "# FAILED: exit 255" in log
    # The previous image and its hash record are untouched; no partial file anywhere.
    after = (sha256(out), out.stat().st_mtime_ns, (tmp_path / "tiny.sif.hash").read_text())
    assert after == before
    assert leftovers(tmp_path) == []
    r = subprocess.run([apptainer_bin, "exec", *HOST_BINDS, str(out), "cat", "/marker"], capture_output=True,
                       text=True, timeout=60)
    assert r.stdout.strip() == "good"


def test_interrupted_build_leaves_previous_image(tiny_base: Path, tmp_path: Path) -> None:
    out = tmp_path / "prev.sif"
    shutil.copyfile(tiny_base, out)  # the "previous image" at the target path
    before = sha256(out)
    slow = tmp_path / "slow.def"
    token = "hpcdl-interrupt-test"
    naptime = str(random.randint(100_000, 999_999))  # unique: identifies this run's sleep
    # The sleep runs before the marker is printed: the interrupt always finds it.
    slow.write_text(tiny_def(tiny_base, f"    sleep {naptime} &\n    echo {token}-running\n    wait"))
    proc = subprocess.Popen([sys.executable, "-m", "hpcdl", "build", str(slow), "-o", str(out),
                             "--force", "-v"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    seen = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 300
        for line in proc.stdout:
            seen.append(line)
            if line.rstrip().endswith(f"] {token}-running"):
                break
            assert time.monotonic() < deadline, "".join(seen)
        else:
            pytest.fail("build ended before %post started:\n" + "".join(seen))
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode != 0
    assert sha256(out) == before
    assert leftovers(tmp_path) == []
    assert "# INTERRUPTED" in (tmp_path / "prev.sif.build.log").read_text(errors="replace")
    # The build's own processes are gone too (the %post sleep would otherwise linger).
    time.sleep(1)
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, timeout=30)
    assert f"sleep {naptime}" not in ps.stdout
