"""GPU architectures: which compute capability a profile's GPU type has, and whether
an image's torch was compiled for it. Pure functions; the facts about an image are
read by hpcdl.jobs.preflight (from the record ``hpcdl build`` writes beside the image).

Why at plan time: PyPI's CUDA 13 build of torch carries kernels for sm_75 and newer
only, so on a V100 (sm_70) it starts, finds no kernel image for the device and dies
on the first CUDA operation, after the job waited in the queue. Neuron's partitions
are V100s.

Compatibility rule (NVIDIA's CUDA compatibility guide): a cubin for sm_XY runs on a
GPU of the same major version and minor >= Y; PTX for compute_XY is JIT-compiled on
any GPU with capability >= XY. Arch-specific targets (sm_90a, sm_100a...) run only
on exactly that capability.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Compute capability of the data-centre and common workstation GPUs that Slurm sites
# name in their GRES types. Longer names first where one contains another (GH200/H200,
# L40S/L40, A100/A10 is kept apart by the digit look-ahead in ``compute_capability``).
COMPUTE_CAPABILITY: tuple[tuple[str, tuple[int, int]], ...] = (
    ("GB300", (10, 3)), ("B300", (10, 3)),
    ("GB200", (10, 0)), ("B200", (10, 0)), ("B100", (10, 0)),
    ("GH200", (9, 0)), ("H200", (9, 0)), ("H100", (9, 0)), ("H800", (9, 0)),
    ("L40S", (8, 9)), ("L40", (8, 9)), ("L4", (8, 9)), ("RTX 4090", (8, 9)),
    ("RTX 6000 ADA", (8, 9)),
    ("A100", (8, 0)), ("A800", (8, 0)), ("A30", (8, 0)),
    ("A40", (8, 6)), ("A10", (8, 6)), ("A16", (8, 6)), ("A2", (8, 6)),
    ("RTX A6000", (8, 6)), ("RTX 3090", (8, 6)), ("RTX 3080", (8, 6)),
    ("T4", (7, 5)), ("RTX 2080", (7, 5)), ("QUADRO RTX", (7, 5)), ("TITAN RTX", (7, 5)),
    ("V100", (7, 0)), ("TITAN V", (7, 0)),
    ("P100", (6, 0)), ("P40", (6, 1)), ("P4", (6, 1)), ("GTX 1080", (6, 1)),
    ("K80", (3, 7)), ("K40", (3, 5)),
    ("RTX 5090", (12, 0)), ("RTX PRO 6000", (12, 0)),
)

# GRES types that stand for no real device (the sandbox's GPUs are character devices):
# there is no architecture to check.
FAKE_GPU_TYPES = frozenset({"fake"})


def compute_capability(gpu_type: str) -> tuple[int, int] | None:
    """(major, minor) for a profile's GPU type, e.g. "V100 (NVLink)" -> (7, 0),
    "A100-SXM4-40GB" -> (8, 0), "RTX 2080 Ti" -> (7, 5); None when not in the table."""
    name = re.sub(r"[_\-/]+", " ", gpu_type.upper())
    name = re.sub(r"\b(NVIDIA|TESLA|GEFORCE)\b", " ", name)
    name = " ".join(name.split())
    for key, cc in COMPUTE_CAPABILITY:
        # A100 must not match A10, nor L40 match L4: no digit may follow the key.
        if re.search(rf"(?<![A-Z0-9]){re.escape(key)}(?![0-9])", name):
            return cc
    return None


def sm_name(cc: tuple[int, int]) -> str:
    """(7, 0) -> "sm_70"."""
    return f"sm_{cc[0]}{cc[1]}"


def _parse_arch(arch: str) -> tuple[str, tuple[int, int], bool] | None:
    """"sm_86" -> ("sm", (8, 6), False); "compute_90" -> ("compute", (9, 0), False);
    "sm_90a" -> ("sm", (9, 0), True); anything else -> None."""
    m = re.fullmatch(r"(sm|compute)_(\d+)(\d)([af]?)", arch.strip())
    if not m:
        return None
    return m.group(1), (int(m.group(2)), int(m.group(3))), bool(m.group(4))


def runs_on(cc: tuple[int, int], archs: list[str] | tuple[str, ...]) -> bool:
    """Whether code compiled for ``archs`` (torch's arch flags: sm_XY / compute_XY) has
    a kernel image for a GPU of capability ``cc``."""
    for arch in archs:
        parsed = _parse_arch(arch)
        if parsed is None:
            continue
        kind, target, specific = parsed
        if specific:
            if target == cc:
                return True
        elif kind == "sm" and target[0] == cc[0] and target[1] <= cc[1]:
            return True
        elif kind == "compute" and target <= cc:
            return True
    return False


@dataclass(frozen=True)
class ImageArchFacts:
    """What hpcdl knows about an image's GPU code, gathered by hpcdl.jobs.preflight.

    ``archs`` is None when it could not be read (``unknown`` says why); () with
    ``torch_cuda`` None is a CPU build of torch.
    """

    image: str
    archs: tuple[str, ...] | None = None
    torch: str | None = None
    torch_cuda: str | None = None
    unknown: str | None = None


@dataclass(frozen=True)
class ArchVerdict:
    """``error``: the job cannot run (exit 2); ``warning``: said, the job goes on."""

    error: str | None = None
    warning: str | None = None


def check_partition(partition: str, gpu_type: str | None, gpus: int,
                    facts: ImageArchFacts | None) -> ArchVerdict:
    """Whether the image's torch has kernels for the partition's GPUs. Pure.

    Nothing to say without GPUs requested, without an image, for a CPU build of torch
    (doctor's concern), or for fake GPU types. Unknown GPU types and unreadable images
    give a warning saying the check was not done; a GPU the image cannot run on gives
    the one-line error.
    """
    if gpus <= 0 or facts is None or (gpu_type or "").lower() in FAKE_GPU_TYPES:
        return ArchVerdict()
    if facts.archs is None:
        return ArchVerdict(warning=(
            f"GPU architecture not checked: {facts.unknown or 'unknown'} for image "
            f"{facts.image} (partition {partition}, GPU type {gpu_type or 'unnamed'})"))
    if not facts.torch_cuda:
        return ArchVerdict()
    if not gpu_type:
        return ArchVerdict(warning=(
            f"GPU architecture not checked: partition {partition} names no gpu_type in the "
            "profile"))
    cc = compute_capability(gpu_type)
    if cc is None:
        return ArchVerdict(warning=(
            f"GPU architecture not checked: GPU type {gpu_type!r} of partition {partition} is "
            "not in hpcdl's table (hpcdl/core/gpuarch.py)"))
    if runs_on(cc, facts.archs):
        return ArchVerdict()
    return ArchVerdict(error=(
        f"partition {partition}: GPU type {gpu_type} is {sm_name(cc)}, but the image's torch "
        f"{facts.torch or '?'} (CUDA {facts.torch_cuda}) was built for "
        f"{' '.join(facts.archs) or 'no GPU architecture'}: {facts.image} cannot run there"))


def facts_from_record(image: str, record: dict[str, object] | None) -> ImageArchFacts:
    """ImageArchFacts from the build record beside an image (``image_facts``, written by
    ``hpcdl build`` from the %test line). Pure."""
    if record is None:
        return ImageArchFacts(image=image, unknown="no hpcdl build record beside the image")
    raw = record.get("image_facts")
    if not isinstance(raw, dict):
        return ImageArchFacts(
            image=image, unknown="its build record has no torch facts (built by an older hpcdl)")
    archs = raw.get("cuda_archs")
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        return ImageArchFacts(image=image, unknown="its build record's cuda_archs is malformed")
    torch = raw.get("torch")
    cuda = raw.get("torch_cuda")
    return ImageArchFacts(
        image=image,
        archs=tuple(archs),
        torch=torch if isinstance(torch, str) else None,
        torch_cuda=cuda if isinstance(cuda, str) else None,
    )
