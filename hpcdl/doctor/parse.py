"""Pure parsers of the tool output the doctor gathers (no tool is run here)."""

from __future__ import annotations

import re


def parse_mpi_version(text: str) -> tuple[str | None, str | None]:
    """(flavour, version) from `mpirun --version` / MPI_Get_library_version text."""
    patterns = [
        (r"Open MPI\)?\s*v?(\d+\.\d+(?:\.\d+)?)", "openmpi"),
        (r"Intel\(R\) MPI Library\s+(?:for Linux\* OS,\s*Version\s*)?(\d+(?:\.\d+)*)", "intelmpi"),
        (r"MVAPICH2?\s*(?:Version\s*:?\s*)?(\d+\.\d+(?:\.\d+)?\w*)", "mvapich2"),
        (r"MPICH\s*(?:Version\s*:?\s*)?(\d+\.\d+(?:\.\d+)?)", "mpich"),
        (r"HYDRA build details:\s*Version:\s*(\d+\.\d+(?:\.\d+)?)", "mpich"),
    ]
    for pattern, flavour in patterns:
        m = re.search(pattern, text, re.I)
        if m:
            return flavour, m.group(1)
    return None, None


def parse_horovod_cb(text: str) -> dict[str, dict[str, bool]]:
    """`horovodrun -cb` -> {"frameworks": {...}, "controllers": {...}, "operations": {...}}."""
    sections = {"available frameworks": "frameworks", "available controllers": "controllers",
                "available tensor operations": "operations"}
    out: dict[str, dict[str, bool]] = {v: {} for v in sections.values()}
    current: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        key = line.rstrip(":").lower()
        if key in sections:
            current = sections[key]
            continue
        m = re.fullmatch(r"\[([ X])\]\s+(.+)", line)
        if m and current:
            out[current][m.group(2).strip()] = m.group(1) == "X"
    return out


def parse_cuda_archs(value: object) -> list[str]:
    """The probe's ``cuda_archs`` (a list, or torch's space-separated flag string) as a
    list of well-formed sm_XX / compute_XX names; anything else is dropped. Pure."""
    items = value.split() if isinstance(value, str) else value if isinstance(value, list) else []
    return [a for a in items if isinstance(a, str) and re.fullmatch(r"(sm|compute)_\d+[af]?", a)]


def parse_shared_loop_devices(conf: str) -> bool:
    """apptainer.conf / singularity.conf's ``shared loop devices`` (default: no)."""
    value = False
    for line in conf.splitlines():
        key, sep, rest = line.partition("=")
        if sep and key.strip().lower() == "shared loop devices":
            value = rest.strip().lower() == "yes"
    return value
