"""A derived image, as a user makes one: a Dockerfile ``FROM`` the bundled GPU image
(torch + torchvision + Horovod) adding tqdm and tensorboard from the index (neither is in
the GPU image), built by ``hpcdl build`` through this machine's TLS-intercepting proxy,
published where the sandbox's nodes read images; then a training script of the user's
own (byo/tv_train.py: torchvision's resnet50, ImageFolder and transforms, tqdm,
torch.utils.tensorboard) runs unchanged from its own folder on 2 nodes x 2 ranks (of the
sandbox's twin, ``sandbox_twin``: the jobs need only its shape), once
with Horovod and once with torch.distributed (env://), on the tiny dataset, and leaves
its TensorBoard files in its working directory.

The image is built once and then reused by content hash (the Dockerfile and the base
image's content): ``hpcdl build`` is a no-op until either changes. Cost: docs/guide/build.md
("A derived image from the GPU image").
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hpcdl.container.hashing import sidecar
from tests.integration.conftest_apptainer import HOST_BINDS, image_path
from tests.integration.conftest_slurm import NetnsCluster, hpcdl, submit_json, wait_final
from tests.parallel import TWIN_2

BYO = Path(__file__).resolve().parent / "byo"
BUILD_TIMEOUT = 1800  # s: unpack the 3.6 GB base, pip install, import check, mksquashfs
JOB_TIMEOUT = 900  # s: 8 ranks (two jobs) import CUDA torch + torchvision on 2 shared cores
pytestmark = [pytest.mark.slurm, pytest.mark.apptainer, pytest.mark.horovod, pytest.mark.torch,
              # The first test sets up the image: a first build outlasts the 900 s default.
              pytest.mark.timeout(BUILD_TIMEOUT + 300),
              # One worker for the whole module (tests/parallel.py): its derived image is
              # built by a module fixture to one path, and two workers building it at
              # once removed each other's. Its jobs run on the sandbox's twin
              # (sandbox_twin, the second twin's group): they need only its shape.
              pytest.mark.xdist_group(TWIN_2)]
COMMON = ("-p", "sandbox", "-N", "2", "-G", "2", "-c", "1")
DERIVED = "test-gpu-derived.sif"
# What a user writes (docs/guide/build.md): the bundled GPU image as a local FROM.
DOCKERFILE = """\
FROM localimage:{base}
RUN PIP_BREAK_SYSTEM_PACKAGES=1 pip install --no-cache-dir tqdm tensorboard
"""
# The script's own arguments: small images and a few steps, so resnet50 is quick on CPU.
TRAIN_ARGS = ("--epochs", "1", "--batch-size", "2", "--image-size", "32", "--workers", "0",
              "--max-steps", "3", "--lr", "0.001")
_RANK = re.compile(r"TVTRAIN rank=(\d+) size=(\d+) host=(\S+) steps=(\d+) checksum=(\S+)")
_DONE = re.compile(r"TVTRAIN_DONE dist=(\S+) size=(\d+) agree=(\S+) cwd=(\S+) log_dir=(\S+)")


@pytest.fixture(scope="module")
def derived_image(gpu_image: Path, tmp_path_factory: pytest.TempPathFactory
                  ) -> tuple[Path, dict, Path]:
    """The derived image, beside the published GPU image (/scratch/images, which the nodes
    read), ``hpcdl build --json``'s answer (``built`` is False when it was cached) and
    the Dockerfile's folder."""
    context = tmp_path_factory.mktemp("derived") / "gpu-derived"
    context.mkdir()
    # FROM the build cache's copy (the published one is a hard link of it); a FROM path
    # under /scratch makes spython warn that Docker Hub's `scratch` is gone.
    (context / "Dockerfile").write_text(DOCKERFILE.format(base=image_path("pytorch-horovod-gpu-pypi")))
    out = gpu_image.with_name(DERIVED)
    # No --compression: a Dockerfile's SIF is lz4 by default (gzip's mksquashfs of the
    # ~10 GB tree took 18 min here, lz4's under a minute: docs/guide/build.md).
    build = ("build", "Dockerfile", "-o", str(out), "--json")
    # A stale derived image (its base was rebuilt) is only a test's leftover: removed
    # before the build instead of kept beside the new one, ~3.8 GB less at the peak
    # (the unpacked ~10 GB tree and the new SIF are on the same disk).
    plan = hpcdl(*build, "--dry-run", cwd=context)
    assert plan.returncode == 0, plan.stderr
    if not json.loads(plan.stdout)["up_to_date"]:
        for stale in (out, sidecar(out, ".hash")):
            stale.unlink(missing_ok=True)
    res = hpcdl(*build, cwd=context, timeout=BUILD_TIMEOUT)
    log = out.with_name(out.name + ".build.log")
    assert res.returncode == 0, (f"{res.stdout}\n{res.stderr[-3000:]}\n"
                                 f"{log.read_text(errors='replace')[-3000:] if log.exists() else ''}")
    built = json.loads(res.stdout)
    assert out.is_file() and out.stat().st_mode & 0o004, "the nodes must be able to read it"
    return out, built, context


def test_derived_image_built_through_the_proxy_with_the_import_check(
        derived_image: tuple[Path, dict, Path]) -> None:
    image, built, context = derived_image
    assert built["output"] == str(image) and built["seconds"] >= 0
    # The build log of the build that made the image (this one, or the cached one's).
    log = image.with_name(image.name + ".build.log").read_text(errors="replace")
    assert "CERTIFICATE_VERIFY_FAILED" not in log
    assert re.search(r"^Successfully installed .*\btensorboard-\S+ .*\btqdm-", log, re.M), log[-3000:]
    record = json.loads(image.with_name(image.name + ".hash").read_text())
    assert record["hash"] == built["content_hash"]
    assert re.fullmatch(r"torch 2\.14\.1\+cu\d+, torchvision 0\.29\.1 \(nms ran\), horovod \S+, "
                        r"mpi4py .*", record["import_check"]), record["import_check"]
    # Cached from now on: the same Dockerfile and base give the same hash, nothing is built
    # (asking for lz4 by name is the same image as the default).
    assert built["build_options"][-2:] == ["--mksquashfs-args", "-comp lz4"], built
    again = hpcdl("build", "Dockerfile", "-o", str(image), "--compression", "lz4", "--dry-run",
                  "--json", cwd=context)
    assert again.returncode == 0, again.stderr
    plan = json.loads(again.stdout)
    assert plan["up_to_date"] is True and plan["content_hash"] == built["content_hash"], plan


TEARDOWN_ABORT = "terminate called without an active exception"


def _gloo_teardown_abort(dist: str, log: str, err: str) -> bool:
    """Whether a torch.distributed job failed only after its work: every rank printed its
    result, rank 0 that they agree, and then a rank aborted in the script's last lines
    (barrier, destroy_process_group) with torch's gloo teardown abort. A CPU gloo bug of
    torch's own (pytorch/gloo#155: a barrier followed by context destruction fails some
    participants), not of the launch: seen in 2 of 12 whole runs, always after the
    results; the rank lines and the rest are still checked by the test."""
    return (dist == "ddp" and len(_RANK.findall(log)) == 4
            and any(d[2] == "True" for d in _DONE.findall(log))
            and re.search(rf"^\d+: {TEARDOWN_ABORT}$", err, re.M) is not None
            and "Traceback" not in err)


@pytest.fixture(scope="module")
def tv_runs(sandbox_twin: NetnsCluster, derived_image: tuple[Path, dict, Path],
            tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path, str, str]]:
    """The user's script from its own folder (``cd project && hpcdl submit ... -- python3
    train.py``) under Horovod and under torch.distributed, both jobs queued together;
    per launcher: (project folder, run directory, stdout log, stderr log)."""
    image = derived_image[0]
    base = tmp_path_factory.mktemp("tv-runs")  # on /scratch: the nodes read it
    data = base / "tiny"
    made = hpcdl("data", "make-tiny", str(data), "--classes", "4", "--per-class", "8",
                 "--size", "40")
    assert made.returncode == 0, made.stderr
    env = {"HPCDL_RUNS": str(base / "runs")}
    jobs, projects = {}, {}
    for dist in ("horovod", "ddp"):
        project = base / f"project-{dist}"
        project.mkdir()
        projects[dist] = project
        shutil.copyfile(BYO / "tv_train.py", project / "train.py")
        jobs[dist] = submit_json(*COMMON, "--image", str(image), "--job-name", f"tv-{dist}",
                                 "--", "python3", "train.py", "--data", str(data),
                                 "--dist", dist, *TRAIN_ARGS, cwd=project, env=env)
    out = {}
    for dist, job in jobs.items():
        final = wait_final(job["job_id"], timeout=JOB_TIMEOUT)
        run_dir = Path(job["run_dir"])
        log = (run_dir / f"slurm-{job['job_id']}.out").read_text(errors="replace")
        err = (run_dir / f"slurm-{job['job_id']}.err").read_text(errors="replace")
        if final["state"] != "COMPLETED" and _gloo_teardown_abort(dist, log, err):
            print(f"{dist}: every rank finished and agreed, then a rank aborted in gloo's "
                  f"teardown ({TEARDOWN_ABORT}): the job is {final['state']}")
        else:
            assert final["state"] == "COMPLETED", f"{dist}: {final}\n{log[-3000:]}\n{err[-3000:]}"
        out[dist] = (projects[dist], run_dir, log, err)
    return out


@pytest.mark.parametrize("dist", ["horovod", "ddp"])
def test_torchvision_script_runs_unchanged_in_the_derived_image(
        dist: str, tv_runs: dict[str, tuple[Path, Path, str, str]],
        derived_image: tuple[Path, dict, Path], apptainer_bin: str,
        sandbox_twin: NetnsCluster) -> None:
    project, run_dir, log, err = tv_runs[dist]
    ranks = sorted((int(m[0]), m) for m in _RANK.findall(log))
    assert [r for r, _ in ranks] == [0, 1, 2, 3], log[-3000:]
    assert {m[2] for _, m in ranks} == set(sandbox_twin.nodes)
    assert {m[1] for _, m in ranks} == {"4"} and {m[3] for _, m in ranks} == {"3"}
    assert len({m[4] for _, m in ranks}) == 1, ranks  # every rank ends with the same weights
    done = _DONE.findall(log)
    assert len(done) == 1 and done[0][:3] == (dist, "4", "True"), log[-3000:]
    # The ranks start where the user submitted from (the project folder, which the nodes
    # share here), and the script's relative --log-dir ./logs is there.
    cwd, log_dir = Path(done[0][3]), Path(done[0][4])
    assert cwd == project and log_dir == project / "logs", done
    assert (project / "logs").is_dir() and not (run_dir / "logs").exists()
    # tqdm's bar (stderr, rank 0 only) reached the end of its 3 steps.
    bars = re.findall(r"Train Epoch #1: 100%\|[^|]*\| 3/3 ", err)
    assert len(bars) >= 1, err[-3000:]
    events = list(log_dir.glob("events.out.tfevents.*"))
    assert len(events) == 1, list(log_dir.iterdir()) if log_dir.exists() else "no ./logs"
    # Read back with TensorBoard's own reader, in the image (the host need not have it).
    image = derived_image[0]
    reader = ("import sys; from tensorboard.backend.event_processing.event_accumulator "
              "import EventAccumulator as E; a = E(sys.argv[1]); a.Reload(); "
              "print(' '.join(f'{e.step}:{e.value:.6g}' for e in a.Scalars('train/loss')))")
    r = subprocess.run([apptainer_bin, "exec", *HOST_BINDS, str(image), "python3", "-c", reader,
                        str(log_dir)], capture_output=True, text=True, timeout=300,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-3000:]
    points = [p.split(":") for p in r.stdout.split()]
    assert [int(s) for s, _ in points] == [0, 1, 2], r.stdout
    assert all(math.isfinite(float(v)) and float(v) > 0 for _, v in points), r.stdout
