"""The doctor's rules: a pure function of host, image and profile facts.

No tool runs here, so every rule is unit-tested on crafted facts. Each problem comes
with its fix.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

from hpcdl.container.runtime import (
    FUSE_DEVICE,
    INSTALL_HINT,
    RuntimeFacts,
    can_unsquash,
    runtime_mode,
    runtime_mode_reason,
    setuid_problem,
    unprivileged_missing,
)
from hpcdl.core.gpuarch import runs_on
from hpcdl.doctor.host import HostFacts
from hpcdl.doctor.image import ImageFacts, unreadable_reason
from hpcdl.doctor.profile import ProfileFacts
from hpcdl.schedulers.launchers import launcher_for

Level = Literal["ok", "warning", "problem"]


@dataclass(frozen=True)
class Verdict:
    level: Level
    topic: str
    message: str
    fix: str | None = None

    def line(self) -> str:
        text = f"{self.level:<8} {self.topic}: {self.message}"
        return text + (f"\n         fix: {self.fix}" if self.fix else "")


def _cc(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    return int(major), int(minor or 0)


def _major(version: str | None) -> str | None:
    return version.split(".")[0] if version else None


def _minor(version: str | None) -> str | None:
    return ".".join(version.split(".")[:2]) if version else None


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version)[:3])


# --- verdicts (pure) ---------------------------------------------------------------------

def verdicts(host: HostFacts, image: ImageFacts | None = None,
             profile: ProfileFacts | None = None) -> list[Verdict]:
    """Judge the facts. Ordered: host, then image, then host x image x profile."""
    out = _host_verdicts(host)
    if profile is not None:
        out += _profile_verdicts(host, profile)
    if image is None:
        return out
    unusable = _unusable_image(host, image)
    if unusable is not None:
        # Nothing inside an image that cannot be read or started can be judged.
        return [*out, unusable]
    for check in IMAGE_CHECKS:
        out += check(host, image, profile)
    return out


def _host_verdicts(host: HostFacts) -> list[Verdict]:
    """The host alone: runtime, container access, Slurm, MPI, image mounts, GPUs."""
    out: list[Verdict] = []
    if host.runtime:
        out.append(Verdict("ok", "runtime",
                           f"{host.runtime} {host.runtime_version} ({host.runtime_path})"))
    else:
        out.append(Verdict("problem", "runtime",
                           host.runtime_error or "no apptainer or singularity", INSTALL_HINT))
    if host.runtime and host.access is not None:
        out += _access_verdicts(host.access)
    out.append(_slurm_verdict(host))
    if host.mpi_flavour:
        out.append(Verdict("ok", "host MPI", f"{host.mpi_flavour} {host.mpi_version}"))
    mounts = _mounts_verdict(host)
    if mounts is not None:
        out.append(mounts)
    if host.gpus:
        out.append(Verdict("ok", "GPUs",
                           f"{len(host.gpus)} x {host.gpus[0]}, driver {host.driver_version}"
                           + (f" (CUDA {host.driver_cuda})" if host.driver_cuda else "")))
    return out


def _slurm_verdict(host: HostFacts) -> Verdict:
    if all(host.slurm_tools.get(t) for t in ("sbatch", "srun", "squeue")):
        return Verdict("ok", "slurm", f"Slurm {host.slurm_version or '?'} tools found")
    missing = [t for t in ("sbatch", "srun", "squeue") if not host.slurm_tools.get(t)]
    return Verdict("warning", "slurm", f"not on PATH: {', '.join(missing)}",
                   "run on a login node (or `module load slurm`); `hpcdl submit --dry-run` "
                   "works anywhere")


def _mounts_verdict(host: HostFacts) -> Verdict | None:
    """How the ranks on a node mount the image; None when apptainer.conf was not read."""
    unprivileged = host.access is not None and runtime_mode(host.access) in (
        "unprivileged", "unusable")
    if host.shared_loop_devices is not None and unprivileged:
        # Loop devices are mounted by root or the setuid starter; an ordinary user's
        # ranks each mount the image with their own squashfuse.
        return Verdict("ok", "image mounts", "as this user every rank mounts the image with "
                       "its own squashfuse (shared loop devices applies to root and setuid only)")
    if host.shared_loop_devices is True:
        return Verdict("ok", "image mounts", "shared loop devices = yes: the ranks on a node "
                       "share one mount (and one page cache) of the image")
    if host.shared_loop_devices is False:
        return Verdict("warning", "image mounts",
                       "shared loop devices = no: every rank mounts and decompresses its own "
                       "copy of the image (measured on the sandbox with 4 ranks: 0.83-0.92x "
                       "native throughput, first step 1.7-2.2 s later)",
                       "set `shared loop devices = yes` in apptainer.conf (an admin setting; "
                       "scripts/install-apptainer.sh sets it)")
    return None


def _unusable_image(host: HostFacts, image: ImageFacts) -> Verdict | None:
    """The one problem when the image is missing, unreadable or does not start; None
    when its facts were read."""
    if not image.exists:
        return Verdict("problem", "image", f"{image.path} does not exist",
                       "build it: hpcdl build SPEC -o " + image.path)
    if not image.readable:
        return Verdict("problem", "image", unreadable_reason(image), _unreadable_fix(image))
    if not image.error:
        return None
    # The image exists: its fix is never a rebuild. Most often this user cannot
    # start containers at all, and the access verdict above says why.
    access = host.access
    if not host.runtime:
        return Verdict("problem", "image", image.error, INSTALL_HINT)
    if access is not None and runtime_mode(access) == "unusable":
        fix = "the container access problem above"
        if can_unsquash(access):
            fix += (f"; until then `{access.runtime or 'apptainer'} exec --unsquash "
                    f"{image.path} ...` starts it ({UNSQUASH_COST})")
        return Verdict("problem", "image",
                       f"cannot start it as {image.user or 'this user'}: {image.error}", fix)
    runtime = host.runtime or "apptainer"
    return Verdict("problem", "image", image.error,
                   f"`{runtime} exec {image.path} python3 -V` shows the runtime's whole "
                   f"message; `{runtime} sif list {image.path}` checks the file")


# What an ordinary user pays for --unsquash: bench/bench_unsquash.py on the 2-core
# sandbox machine (busy), CPU image (539 MiB SIF), `python3 -c pass`, two runs of 3:
# medians 49.5 s and 35.7 s (range 20.5-60.6 s), a 1.8 GiB temporary sandbox; mounted
# 0.16-0.20 s.
UNSQUASH_COST = ("measured with the 539 MiB CPU image: 20-60 s and 1.8 GiB of "
                 "$APPTAINER_TMPDIR per start, vs 0.2 s mounted")


def access_fix(f: RuntimeFacts, image: str = "IMAGE") -> str:
    """What makes SIF images start for this user: the admin's fix for each missing
    piece, or the setuid starter, and the user's own way out where there is one. Pure."""
    admin: list[str] = []
    if not f.userns:
        if f.unprivileged_userns_clone == 0:
            admin.append("`sysctl -w kernel.unprivileged_userns_clone=1`")
        elif not f.max_user_namespaces:
            admin.append("`sysctl -w user.max_user_namespaces=15000`")
        else:  # the sysctls allow it; a security module refuses it
            admin.append("allow unprivileged user namespaces (Ubuntu >= 23.10: "
                         "`sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` or "
                         "Apptainer's AppArmor profile)")
    if not f.squashfuse:
        admin.append("install squashfuse (Debian/Ubuntu: apt install squashfuse)")
    if f.fuse_mode is None:
        admin.append("`modprobe fuse`")
    elif f.fuse_error:
        admin.append(f"`chmod 0666 {FUSE_DEVICE}` (the mode distributions ship; a udev rule "
                     'KERNEL=="fuse", MODE="0666" keeps it)')
    text = "ask the admin for " + " and ".join(admin) if admin else "ask the admin"
    text += (" (persist sysctls in /etc/sysctl.d/)" if not f.userns else "")
    text += ", or to install Apptainer's setuid starter (starter-suid, allow setuid = yes)"
    if can_unsquash(f):
        text += (f"; meanwhile yourself: `{f.runtime or 'apptainer'} exec --unsquash {image} ...` "
                 f"extracts the image to a temporary sandbox at every start ({UNSQUASH_COST})")
    return text


def _access_verdicts(f: RuntimeFacts) -> list[Verdict]:
    mode = runtime_mode(f)
    if mode != "unusable":
        out = [Verdict("ok", "container access", f"{mode}: {runtime_mode_reason(f)}")]
        if mode == "unprivileged" and not f.fuse2fs:
            out.append(Verdict("warning", "container access",
                               "fuse2fs is not installed: writable overlay images (--overlay "
                               "FILE.img) will not mount",
                               "ask the admin to install fuse2fs (Debian/Ubuntu: apt install "
                               "fuse2fs)"))
        return out
    causes = [setuid_problem(f), *unprivileged_missing(f)]
    return [Verdict("problem", "container access",
                    "this user cannot start SIF images: " + "; ".join(causes), access_fix(f))]


def _unreadable_fix(image: ImageFacts) -> str:
    owner = (image.file_owner or "root:root").partition(":")
    if image.blocked_dir:
        return (f"ask {owner[0]} (its owner) to run `chmod o+x {image.blocked_dir}`, or "
                "use an image in a directory you can enter")
    return (f"ask {owner[0]} (its owner) to run `chmod o+r {image.path}` (or g+r, with "
            f"{image.user or 'you'} in group {owner[2] or owner[0]}), or use a copy you can read")


def _profile_verdicts(host: HostFacts, profile: ProfileFacts) -> list[Verdict]:
    out: list[Verdict] = []
    add = out.append
    if launcher_for(profile.launcher).passes_srun_mpi and profile.srun_mpi and host.srun_mpi:
        if profile.srun_mpi not in host.srun_mpi:
            add(Verdict("problem", "srun --mpi",
                        f"profile {profile.name} uses --mpi={profile.srun_mpi} but this Slurm "
                        f"offers {', '.join(host.srun_mpi)}",
                        "set mpi.srun_mpi in the profile to one of those (pmix for Open MPI), "
                        "or mpi.launcher: mpirun"))
        else:
            add(Verdict("ok", "srun --mpi", f"{profile.srun_mpi} is offered by this Slurm"))
    if profile.nv and profile.gpus_per_node > 0 and not host.gpus:
        add(Verdict("warning", "--nv",
                    f"profile {profile.name} runs with --nv but this host shows no NVIDIA GPU "
                    "(nvidia-smi absent or empty): --nv is a silent no-op here",
                    "check on a GPU node (srun -p <gpu partition> hpcdl doctor ...)"))
    return out


# --- what is inside the image: one check per topic, in the order doctor prints them ---
# Each is (host, image, profile) -> verdicts, so the table below is the whole list.

def _torch_verdicts(host: HostFacts, image: ImageFacts,
                    profile: ProfileFacts | None) -> list[Verdict]:
    out = [Verdict("ok", "image", f"{image.path}: python {image.python}, torch {image.torch}"
                   + (f", CUDA {image.torch_cuda}" if image.torch_cuda else " (CPU build)")
                   + (f", NCCL {image.nccl}" if image.nccl else "")
                   + (f", GPU architectures {' '.join(image.cuda_archs)}"
                      if image.cuda_archs else ""))]
    if image.torch_cuda and not image.cuda_archs:
        out.append(Verdict("warning", "torch", "a CUDA build of torch that reports no GPU "
                           "architecture (torch._C._cuda_getArchFlags)",
                           "check `python3 -c 'import torch; print(torch.cuda.get_arch_list())'` "
                           "on a GPU node"))
    if image.torch is None:
        out.append(Verdict("problem", "torch", "torch does not import in the image",
                           "add torch (pinned, torch==X.Y.Z) to the spec or use a PyTorch base "
                           "image"))
    check = image.import_check
    if check is not None and check.ok:
        out.append(Verdict("ok", "imports", f"load together: {check.message}"))
    elif check is not None and image.torch is not None:
        # "torchvision 0.28.0 does not match torch 2.13.0+cpu: operator ... does not exist"
        out.append(Verdict("problem", "imports", check.message,
                           "install the build made for this torch (the same index or wheelhouse "
                           "as torch), or derive from an image that has both (for torchvision: "
                           "pytorch-horovod-gpu-pypi, which runs on CPUs too)"))
    return out


def _horovod_verdicts(host: HostFacts, image: ImageFacts,
                      profile: ProfileFacts | None) -> list[Verdict]:
    """What `horovodrun -cb` says."""
    if not image.horovod:
        return [Verdict("warning", "horovod", "Horovod is not installed in the image",
                        "use --backend ddp, or add Horovod to the spec")]
    fw, ctl, ops = image.horovod_frameworks, image.horovod_controllers, image.horovod_operations

    def have(flags: dict[str, bool]) -> str:
        return ", ".join(k for k, v in flags.items() if v) or "none"

    out = [Verdict("ok", "horovod", f"{image.horovod}: frameworks {have(fw)}; controllers "
                   f"{have(ctl)}; tensor operations {have(ops)}")]
    if not fw.get("PyTorch"):
        out.append(Verdict("problem", "horovod", "built without PyTorch support",
                           "rebuild with HOROVOD_WITH_PYTORCH=1 against the image's torch"))
    if not (ctl.get("MPI") or ctl.get("Gloo")):
        out.append(Verdict("problem", "horovod", "built with neither MPI nor Gloo controller",
                           "rebuild with HOROVOD_WITH_MPI=1 and/or HOROVOD_WITH_GLOO=1"))
    if image.gpu_image and not ops.get("NCCL"):
        out.append(Verdict("problem", "horovod",
                           "GPU image but Horovod was built without NCCL: allreduce goes "
                           "through host memory (MPI/Gloo), many times slower",
                           "rebuild with HOROVOD_GPU_OPERATIONS=NCCL "
                           "(spec: horovod.gpu_operations: NCCL)"))
    return out


def _mpi_verdicts(host: HostFacts, image: ImageFacts,
                  profile: ProfileFacts | None) -> list[Verdict]:
    """The hybrid model: a host launcher starts ranks that use the image's MPI."""
    if not (image.mpi_flavour and host.mpi_flavour):
        # Without MPI on the host there is nothing to match; an image without it only
        # loses the MPI launchers.
        return [Verdict("warning", "MPI", "no MPI library found in the image (mpi4py/mpirun)",
                        "Gloo-only Horovod or DDP still work; add MPI for mpirun/srun "
                        "--mpi=pmix")] if image.mpi_flavour is None else []
    if image.mpi_flavour != host.mpi_flavour:
        return [Verdict("problem", "MPI",
                        f"host {host.mpi_flavour} {host.mpi_version} vs image "
                        f"{image.mpi_flavour} {image.mpi_version}: `mpirun ... apptainer exec` "
                        "(hybrid model) needs the same MPI on both sides",
                        "build the image with the host's MPI (spec mpi: flavour/version), or "
                        "launch with srun --mpi=pmix and no host mpirun")]
    if _major(image.mpi_version) != _major(host.mpi_version):
        return [Verdict("problem", "MPI",
                        f"host {host.mpi_flavour} {host.mpi_version} vs image {image.mpi_version}: "
                        "different major versions do not interoperate",
                        f"build the image with {host.mpi_flavour} {_minor(host.mpi_version)}.x")]
    if _minor(image.mpi_version) != _minor(host.mpi_version):
        return [Verdict("warning", "MPI",
                        f"host {host.mpi_flavour} {host.mpi_version} vs image {image.mpi_version}: "
                        "same major, different minor (usually works; hangs at start-up if not)",
                        f"match {_minor(host.mpi_version)}.x in the spec for the hybrid model")]
    return [Verdict("ok", "MPI", f"{image.mpi_flavour} {image.mpi_version} in the image matches "
                    f"the host's {host.mpi_version} (hybrid model)")]


def _pmix_verdicts(host: HostFacts, image: ImageFacts,
                   profile: ProfileFacts | None) -> list[Verdict]:
    """Slurm's pmix plugin vs the PMIx the image's MPI was built with, and PMI-2."""
    out: list[Verdict] = []
    image_pmix = image.labels.get("org.hpcdl.pmix.version")
    if image_pmix and host.pmix_plugins:
        majors = {p.removeprefix("pmix_v") for p in host.pmix_plugins}
        if _major(image_pmix) not in majors:
            out.append(Verdict("warning", "PMIx",
                               f"Slurm offers {', '.join(host.pmix_plugins)} but the image's MPI "
                               f"uses PMIx {image_pmix}: cross-version PMIx can fail at MPI_Init",
                               f"build the image against PMIx {', '.join(sorted(majors))}.x, or "
                               "launch with mpirun inside the allocation"))
        else:
            out.append(Verdict("ok", "PMIx", f"image PMIx {image_pmix} matches Slurm's "
                               f"{', '.join(host.pmix_plugins)}"))
    if profile and profile.srun_mpi == "pmi2" and image.mpi_flavour == "openmpi":
        out.append(Verdict("warning", "srun --mpi",
                           "profile uses --mpi=pmi2 with an Open MPI image: Open MPI only speaks "
                           "PMI-2 when built --with-pmi (Debian's is not)",
                           "use mpi.srun_mpi: pmix"))
    return out


def _gpu_verdicts(host: HostFacts, image: ImageFacts,
                  profile: ProfileFacts | None) -> list[Verdict]:
    """GPUs and --nv: the image's torch against this host's GPUs and driver."""
    if not image.gpu_image:
        return [Verdict("warning", "GPUs",
                        "this host has GPUs but the image is a CPU build of torch",
                        "build the GPU spec (pytorch-horovod-gpu) for GPU training")
                ] if host.gpus else []
    if not host.gpus:
        return [Verdict("warning", "--nv",
                        "GPU image but no NVIDIA GPU/driver on this host: --nv passes nothing "
                        "and torch.cuda.is_available() will be False",
                        "run it on a GPU node; `hpcdl doctor --image` there checks the driver")]
    if host.gpu_compute_cap and image.cuda_archs and not runs_on(
            _cc(host.gpu_compute_cap), image.cuda_archs):
        return [Verdict("problem", "GPU architecture",
                        f"this host's {host.gpus[0]} is sm_{host.gpu_compute_cap.replace('.', '')} "
                        f"but the image's torch was built for {' '.join(image.cuda_archs)}",
                        "use an image whose torch supports this GPU (older GPUs: a CUDA 12 "
                        "build), or run on newer GPUs")]
    if image.torch_cuda and host.driver_cuda and \
            _version_tuple(image.torch_cuda)[:2] > _version_tuple(host.driver_cuda)[:2]:
        return [Verdict("problem", "CUDA",
                        f"image torch needs CUDA {image.torch_cuda} but the driver "
                        f"{host.driver_version} supports up to {host.driver_cuda}",
                        "use an older base image tag (spec base.tag) or a newer driver")]
    return []


ImageCheck = Callable[[HostFacts, ImageFacts, ProfileFacts | None], list[Verdict]]
IMAGE_CHECKS: tuple[ImageCheck, ...] = (
    _torch_verdicts, _horovod_verdicts, _mpi_verdicts, _pmix_verdicts, _gpu_verdicts)


def report(host: HostFacts, image: ImageFacts | None, checks: list[Verdict]) -> dict[str, Any]:
    """Facts and verdicts as the JSON object `hpcdl doctor --json` prints. Pure."""
    return {
        "host": asdict(host),
        "image": asdict(image) if image else None,
        "verdicts": [asdict(v) for v in checks],
        "problems": sum(v.level == "problem" for v in checks),
        "warnings": sum(v.level == "warning" for v in checks),
    }

