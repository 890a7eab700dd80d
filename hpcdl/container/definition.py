"""Image spec -> Apptainer definition text: a pure function (templates read, nothing written).

The result also lists every host path the definition copies in (``%files``), so the
builder can hash exactly what goes into the image.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from hpcdl.container.cache import SYSTEM_CACHE, cache_dirs
from hpcdl.container.spec import ImageSpec, _req_name, expand_path
from hpcdl.core.resources import PACKAGE_DIR, REPO_ROOT, containers_dir, examples_dir
from hpcdl.core.templating import render_template
from hpcdl.errors import ConfigError

TEMPLATE = "singularity.def.j2"
DEFAULT_CACHE = SYSTEM_CACHE
# Folders of the project copied into /opt/hpcdl (PYTHONPATH) when spec.project is set.
PROJECT_DIRS = ("hpcdl", "examples")
# Where a wheelhouse resolved on the host is copied for %post (hpcdl.container.wheels.DEST).
WHEELS_DEST = "/opt/hpcdl-wheels"


def cache_dir() -> str:
    """Where this user's builds write: ``$HPCDL_CACHE`` or /var/cache/hpcdl when
    writable, else ~/.cache/hpcdl (hpcdl.container.cache has the rules)."""
    return cache_dirs().write


@dataclass(frozen=True)
class RenderContext:
    """The machine-dependent inputs of a render; fixed values give reproducible goldens."""

    cache_dir: str = field(default_factory=cache_dir)
    # Further caches to read a ${HPCDL_CACHE} path from when it is missing under
    # cache_dir (a site cache this user may read but not write); () keeps a render pure.
    cache_read: tuple[str, ...] = ()
    # None: the project files of this installation, wherever they are (a checkout keeps
    # examples/ beside the package, an installed wheel under hpcdl/_data); a string (a
    # placeholder or ".") puts them at <project_dir>/hpcdl and <project_dir>/examples.
    project_dir: str | None = None
    spec_dir: str = field(default_factory=lambda: str(containers_dir()))
    # The host folder pip.packages were resolved into (hpcdl.container.wheels), copied
    # to WHEELS_DEST and installed from it with --no-index; None: from the index in %post.
    wheels: str | None = None
    wheels_target: str = ""  # what they were resolved for ("CPython 3.11 on manylinux_2_36_x86_64")


def project_sources(ctx: RenderContext) -> list[tuple[str, str]]:
    """(name, host folder) of each project folder copied into /opt/hpcdl."""
    if ctx.project_dir is None:
        found = {"hpcdl": str(PACKAGE_DIR), "examples": str(examples_dir())}
        return [(name, found[name]) for name in PROJECT_DIRS]
    root = ctx.project_dir.rstrip("/") or "/"
    return [(name, f"{root}/{name}") for name in PROJECT_DIRS]


@dataclass(frozen=True)
class Definition:
    text: str
    files: tuple[tuple[str, str], ...]  # (host source, path in the image)


def copied_files(spec: ImageSpec, ctx: RenderContext) -> list[tuple[str, str]]:
    """The ``%files`` entries: the wheelhouse, then the project folders. A
    ${HPCDL_CACHE} wheelhouse missing under ``ctx.cache_dir`` is taken from the first of
    ``ctx.cache_read`` that has it.

    Raises ConfigError for a path Apptainer's %files cannot carry (whitespace).
    """
    files: list[tuple[str, str]] = []
    if spec.pip.wheelhouse:
        candidates = [expand_path(
            spec.pip.wheelhouse,
            cache_dir=root,
            project_dir=ctx.project_dir or str(REPO_ROOT),
            spec_dir=ctx.spec_dir,
        ) for root in dict.fromkeys((ctx.cache_dir, *ctx.cache_read))]
        src = candidates[0]
        if len(candidates) > 1 and not Path(src).exists():
            src = next((c for c in candidates[1:] if Path(c).exists()), src)
        files.append((src, "/opt/wheelhouse"))
    if ctx.wheels and spec.pip.packages:
        files.append((ctx.wheels, WHEELS_DEST))
    if spec.project:
        for name, src in project_sources(ctx):
            files.append((src, f"/opt/hpcdl/{name}"))
    for src, _ in files:
        if re.search(r"\s", src):
            raise ConfigError(f"spec {spec.name}: path {src!r} contains whitespace (%files cannot copy it)")
    return files


def horovod_build_env(spec: ImageSpec) -> list[tuple[str, str]]:
    """HOROVOD_* variables for a source build, from the spec's Horovod section."""
    hvd = spec.horovod
    if hvd is None:
        return []
    # Values are fixed words (1, GLOO, NCCL, MPI), safe to render unquoted.
    env = [("HOROVOD_WITH_PYTORCH", "1"), ("HOROVOD_WITHOUT_TENSORFLOW", "1"),
           ("HOROVOD_WITHOUT_MXNET", "1")]
    env.append(("HOROVOD_WITH_GLOO", "1") if "gloo" in hvd.controllers else ("HOROVOD_WITHOUT_GLOO", "1"))
    env.append(("HOROVOD_WITH_MPI", "1") if "mpi" in hvd.controllers else ("HOROVOD_WITHOUT_MPI", "1"))
    if hvd.cpu_operations:
        env.append(("HOROVOD_CPU_OPERATIONS", hvd.cpu_operations))
    if hvd.gpu_operations:
        env.append(("HOROVOD_GPU_OPERATIONS", hvd.gpu_operations))
    return env


def capability_checks(spec: ImageSpec) -> dict[str, object]:
    """What the %test capability check asserts inside the built image."""
    reqs = spec.pip.local + spec.pip.packages
    torch = next((r.split("==", 1)[1] for r in reqs if _req_name(r) == "torch"), None)
    horovod: list[str] = []
    if spec.horovod:
        horovod = sorted(spec.horovod.controllers)
        if spec.horovod.gpu_operations == "NCCL":
            horovod.append("nccl")
    has_mpi4py = any(_req_name(r) == "mpi4py" for r in reqs)
    return {
        "torch": torch,
        "horovod": horovod,
        "mpi_flavour": spec.mpi.flavour,
        "mpi_version": spec.mpi.version if has_mpi4py else None,
    }


def render_definition(spec: ImageSpec, ctx: RenderContext | None = None) -> Definition:
    """Render ``spec`` through templates/singularity.def.j2.

    Raises RenderError (template problem) or ConfigError (a path the spec cannot use).
    """
    ctx = ctx or RenderContext()
    files = copied_files(spec, ctx)
    text = render_template(
        TEMPLATE,
        {
            "spec": spec,
            "files": files,
            "horovod_env": horovod_build_env(spec),
            "checks": capability_checks(spec),
            "wheels": WHEELS_DEST if ctx.wheels and spec.pip.packages else None,
            "wheels_target": ctx.wheels_target,
        },
    )
    return Definition(text=text, files=tuple(files))


# The committed root Singularity.def: the default (GPU) image, rendered with paths that
# work from the repo root and the default cache, so it is the same on every machine.
DEFAULT_SPEC = "pytorch-horovod-gpu"
ROOT_CONTEXT = RenderContext(cache_dir=DEFAULT_CACHE, project_dir=".", spec_dir="containers")


def render_root_definition() -> str:
    """The text the repo's ``Singularity.def`` must hold (a test fails on drift)."""
    from hpcdl.container.spec import find_spec, load_spec

    return render_definition(load_spec(find_spec(DEFAULT_SPEC)), ROOT_CONTEXT).text


def root_definition_path() -> Path:
    return REPO_ROOT / "Singularity.def"
