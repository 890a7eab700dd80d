"""Host facts: container runtime (and how this user may run it), Slurm tools, GPUs and
driver, host MPI.

Every tool runs through hpcdl.core.proc; a missing or failing tool is itself a fact (the
field stays empty), so ``host_facts`` never raises.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from hpcdl.container.runtime import RuntimeFacts, find_runtime, gather_runtime_facts
from hpcdl.core import proc
from hpcdl.doctor.parse import parse_mpi_version, parse_shared_loop_devices
from hpcdl.errors import ToolError, ValidationError
from hpcdl.schedulers.slurm import releases
from hpcdl.schedulers.slurm.detect import parse_mpi_list


@dataclass
class HostFacts:
    runtime: str | None = None  # "apptainer"
    runtime_version: str | None = None
    runtime_path: str | None = None
    runtime_error: str | None = None
    slurm_version: str | None = None  # from `srun --version`
    # Its release (YY.MM) and what hpcdl does differently there (releases.differences),
    # with the note for a release hpcdl does not know.
    slurm_release: str | None = None
    release_notes: list[str] = field(default_factory=list)
    # The profile's scheduler.commands the Slurm tools were looked for in (None: PATH).
    slurm_commands: str | None = None
    slurm_tools: dict[str, bool] = field(default_factory=dict)
    srun_mpi: list[str] = field(default_factory=list)  # `srun --mpi=list` plugin types
    pmix_plugins: list[str] = field(default_factory=list)  # e.g. ["pmix_v4"]
    gpus: list[str] = field(default_factory=list)
    driver_version: str | None = None
    driver_cuda: str | None = None  # the CUDA version the driver supports (nvidia-smi)
    gpu_compute_cap: str | None = None  # first GPU's compute capability, e.g. "9.0"
    mpi_flavour: str | None = None
    mpi_version: str | None = None
    # apptainer.conf's "shared loop devices" (None: config not readable)
    shared_loop_devices: bool | None = None
    # setuid starter, user namespaces, FUSE: how this user can run images (None: not gathered)
    access: RuntimeFacts | None = None


def _release(f: HostFacts, version: str) -> None:
    """The release ``srun --version``'s text names, into ``f``: unparsable text leaves
    it unknown (the version line shows what srun said)."""
    try:
        found = releases.release_of(version, tried="srun --version")
    except ValidationError:
        return
    f.slurm_release = found.behaviour.release
    f.release_notes = [*([found.note] if found.note else []),
                       *releases.differences(found.behaviour)]


def _try(argv: list[str], timeout: float = 30) -> str | None:
    """stdout + stderr of ``argv`` when it runs and succeeds; None otherwise."""
    if not (argv[0].startswith("/") or proc.which(argv[0])):
        return None
    try:
        r = proc.run(argv, timeout=timeout, check=False)
    except ToolError:
        return None
    return (r.stdout + r.stderr) if r.ok else None


def host_facts(binary: str | None = None, commands: str | None = None) -> HostFacts:
    """What this host offers. ``binary``: the runtime to look for (a profile's
    container.binary), else apptainer/singularity on PATH. ``commands``: the directory
    of Slurm's commands (a profile's scheduler.commands), else PATH. Never raises."""
    f = HostFacts(slurm_commands=commands)

    def slurm(tool: str) -> str:
        return f"{commands.rstrip('/')}/{tool}" if commands else tool
    try:
        rt = find_runtime(binary)
        f.runtime, f.runtime_version, f.runtime_path = rt.name, rt.version, rt.path
    except ToolError as err:
        f.runtime_error = err.message
    f.access = gather_runtime_facts(binary)
    if f.runtime and f.access.conf_path:
        with contextlib.suppress(OSError):  # unreadable config: the fact stays unknown
            conf = Path(f.access.conf_path).read_text(encoding="utf-8")
            f.shared_loop_devices = parse_shared_loop_devices(conf)
    for tool in ("sbatch", "srun", "squeue", "sinfo", "sacct", "scontrol"):
        f.slurm_tools[tool] = proc.which(slurm(tool)) is not None
    if f.slurm_tools["srun"]:
        version = _try([slurm("srun"), "--version"])
        if version:
            f.slurm_version = version.split()[-1]
            _release(f, version)
        listing = _try([slurm("srun"), "--mpi=list"])
        if listing:
            offered = parse_mpi_list(listing)
            f.srun_mpi, f.pmix_plugins = list(offered.types), sorted(offered.pmix_versions)
    smi = _try(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    if smi:
        rows = [r.split(",") for r in smi.strip().splitlines() if r.strip()]
        f.gpus = [r[0].strip() for r in rows]
        f.driver_version = rows[0][1].strip() if rows and len(rows[0]) > 1 else None
        banner = _try(["nvidia-smi"]) or ""
        m = re.search(r"CUDA Version:\s*([\d.]+)", banner)
        f.driver_cuda = m.group(1) if m else None
        # A query of its own: drivers before 510 do not know compute_cap.
        cap = _try(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"]) or ""
        m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*(?:\n.*)?", cap, re.S)
        f.gpu_compute_cap = f"{m.group(1)}.{m.group(2)}" if m else None
    mpi = _try(["mpirun", "--version"])
    if mpi:
        f.mpi_flavour, f.mpi_version = parse_mpi_version(mpi)
    return f
