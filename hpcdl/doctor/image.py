"""Image facts: an image's labels (``inspect``) and what probe.py finds inside it.

``image_facts`` never raises for a broken image: the problem becomes ``error``.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from hpcdl.container.runtime import find_runtime, runtime_env
from hpcdl.container.verify import ImportCheck, find_import_check, import_check_source
from hpcdl.core import proc
from hpcdl.doctor.parse import parse_cuda_archs, parse_horovod_cb, parse_mpi_version
from hpcdl.errors import ToolError, UserInputError


@dataclass
class ImageFacts:
    path: str
    exists: bool = True
    error: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    python: str | None = None
    torch: str | None = None
    torch_cuda: str | None = None  # CUDA the torch build targets (None: CPU build)
    # torch's compiled GPU architectures (sm_XX / compute_XX); [] for a CPU build
    cuda_archs: list[str] = field(default_factory=list)
    nccl: str | None = None
    horovod: str | None = None
    horovod_frameworks: dict[str, bool] = field(default_factory=dict)
    horovod_controllers: dict[str, bool] = field(default_factory=dict)
    horovod_operations: dict[str, bool] = field(default_factory=dict)
    horovod_table: str | None = None  # `horovodrun -cb` verbatim
    mpi_flavour: str | None = None
    mpi_version: str | None = None
    mpi_library: str | None = None
    # Whether this user may read it; where not: its (or a blocking directory's) mode and owner
    readable: bool = True
    user: str | None = None  # who looked
    file_mode: str | None = None  # "0600"
    file_owner: str | None = None  # "root:root"
    blocked_dir: str | None = None  # a directory on the way this user cannot enter
    # hpcdl build's import check run in the image (hpcdl/container/import_check.py)
    import_check: ImportCheck | None = None

    @property
    def gpu_image(self) -> bool:
        return self.labels.get("org.hpcdl.gpu") == "true" or bool(self.torch_cuda)


PROBE_MARK = "HPCDL_PROBE "


def probe_source() -> str:
    """The in-image probe script (probe.py, shipped in the package). Raises OSError
    only for a broken installation."""
    return resources.files("hpcdl.doctor").joinpath("probe.py").read_text(encoding="utf-8")


def apply_probe(facts: ImageFacts, data: dict[str, Any]) -> None:
    """Fill ``facts`` from the probe's JSON object. Pure."""
    facts.python = data.get("python")
    facts.torch = data.get("torch")
    facts.torch_cuda = data.get("torch_cuda")
    facts.cuda_archs = parse_cuda_archs(data.get("cuda_archs"))
    facts.nccl = data.get("nccl")
    facts.horovod = data.get("horovod")
    table = data.get("horovod_table")
    if table:
        facts.horovod_table = table
        parsed = parse_horovod_cb(table)
        facts.horovod_frameworks = parsed["frameworks"]
        facts.horovod_controllers = parsed["controllers"]
        facts.horovod_operations = parsed["operations"]
    lib = data.get("mpi_library")
    if lib:
        facts.mpi_library = lib.splitlines()[0]
        facts.mpi_flavour, facts.mpi_version = parse_mpi_version(lib)


def _name(lookup, ident: int) -> str:  # type: ignore[no-untyped-def]
    try:
        return str(lookup(ident)[0])
    except KeyError:
        return str(ident)


def _mode_owner(path: str) -> tuple[str | None, str | None]:
    import grp
    import pwd

    try:
        st = os.stat(path)
    except OSError:
        return None, None
    return (f"{stat.S_IMODE(st.st_mode):04o}",
            f"{_name(pwd.getpwuid, st.st_uid)}:{_name(grp.getgrgid, st.st_gid)}")


def file_access(path: str) -> ImageFacts:
    """Whether this user can see and read ``path``: exists, readable, mode and owner,
    or the first directory on the way they may not enter. Runs no tool."""
    import pwd

    facts = ImageFacts(path=path, user=_name(pwd.getpwuid, os.geteuid()))
    try:
        os.stat(path)
    except FileNotFoundError:
        facts.exists = False
        return facts
    except PermissionError:
        facts.readable = False
        here = Path(os.path.abspath(path))
        for parent in reversed(here.parents):
            if not os.access(parent, os.X_OK):
                facts.blocked_dir = str(parent)
                facts.file_mode, facts.file_owner = _mode_owner(str(parent))
                break
        return facts
    facts.file_mode, facts.file_owner = _mode_owner(path)
    facts.readable = os.access(path, os.R_OK)
    return facts


def image_facts(image: str, binary: str | None = None, timeout: float = 180) -> ImageFacts:
    """Inspect ``image`` (labels) and probe it (python inside). Never raises for a
    broken image: the problem becomes ``error``. Raises ToolError without a runtime."""
    facts = file_access(image)
    if not facts.exists or not facts.readable:
        return facts
    rt = find_runtime(binary)
    env = runtime_env()
    try:
        r = proc.run([rt.path, "inspect", "--json", "--labels", image], timeout=60, env=env,
                     check=False)
        if r.ok:
            data = json.loads(r.stdout)
            facts.labels = dict(data.get("data", {}).get("attributes", {}).get("labels") or {})
    except (ToolError, ValueError):
        pass
    try:
        r = proc.run([rt.path, "exec", image, "python3", "-c", probe_source()], timeout=timeout,
                     env=env, check=False)
    except ToolError as err:
        facts.error = err.message
        return facts
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith(PROBE_MARK)), None)
    if line is None:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
        facts.error = f"probe failed in the image (exit {r.returncode}): {tail[0]}"
        return facts
    apply_probe(facts, json.loads(line.removeprefix(PROBE_MARK)))
    facts.import_check = run_import_check(rt.path, image, env, timeout)
    return facts


def run_import_check(runtime: str, image: str, env: dict[str, str],
                     timeout: float = 180) -> ImportCheck | None:
    """The same import check as ``hpcdl build``'s %test, run in ``image``; None when it
    printed no result (no python3: the probe already says what is wrong)."""
    try:
        r = proc.run([runtime, "exec", image, "python3", "-c", import_check_source()],
                     timeout=timeout, env=env, check=False)
    except ToolError:
        return None
    return find_import_check(r.stdout)


def require_image(path: str) -> str:
    """``path`` when it exists and this user can read it. Raises UserInputError (naming
    it, and for an unreadable one its mode and owner) otherwise."""
    facts = file_access(path)
    if not facts.exists:
        raise UserInputError(f"image: {path!r} does not exist")
    if not facts.readable:
        raise UserInputError(f"image: {unreadable_reason(facts)}")
    return path


def unreadable_reason(facts: ImageFacts) -> str:
    """One phrase: why ``facts.user`` cannot read the image. Pure."""
    if facts.blocked_dir:
        return (f"{facts.path} cannot be reached by {facts.user}: directory {facts.blocked_dir} "
                f"is {facts.file_mode} {facts.file_owner} (no search permission)")
    return (f"{facts.path} is not readable by {facts.user} "
            f"(mode {facts.file_mode}, owner {facts.file_owner})")
