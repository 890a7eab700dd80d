"""Building images: plan (render, hash, argv) then execute (atomic, logged, streamed).

``plan_build`` is pure apart from reading the spec, the copied files and the hash
record; ``--dry-run`` prints exactly that plan. ``execute`` runs the runtime's
``build`` into a temporary path beside the target and renames it into place only
after the build (and its %test) succeeded, so a failed or interrupted build leaves
the previous image untouched and no partial file. The content hash (rendered
definition + every file copied in) is written beside the image; when it matches,
a rebuild is a no-op.

Why not spython's build: ``Client.build(stream=True)`` streams stdout only and reads
stderr once the process has ended, so Apptainer's own ``FATAL:`` message never
reaches the caller's log and a build that writes more than a pipe buffer (64 KiB) to
stderr blocks forever; it always runs ``singularity`` (never ``apptainer`` or a
profile's binary) and leaves the child running when the caller is interrupted. Its
non-streaming form returns None or an older image on failure. So the build runs
through ``hpcdl.core.proc.stream`` (stdout+stderr merged, exit code checked, child killed
on interrupt), with the same argv spython would compose.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

from hpcdl.container.cache import cache_dirs
from hpcdl.container.definition import (
    WHEELS_DEST,
    RenderContext,
    cache_dir,
    render_definition,
)
from hpcdl.container.hashing import (
    ContentHash,
    content_hash,
    previous_digests,
    read_record,
    sidecar,
)
from hpcdl.container.hosttrust import BAKED_CA, CA_NAME, HostTrust, bake_sections, host_trust
from hpcdl.container.recipes import convert_dockerfile, dockerfile_name, is_dockerfile
from hpcdl.container.runtime import Runtime, find_runtime, runtime_env
from hpcdl.container.spec import ImageSpec, find_spec, load_spec
from hpcdl.container.verify import ImportCheck, check_section, parse_import_check
from hpcdl.container.wheels import (
    Resolution,
    check_root,
    default_root,
    resolution_for,
    resolve,
    target_for,
)
from hpcdl.core import proc
from hpcdl.core.atomic import write_json_atomic
from hpcdl.core.yamlmodel import read_text
from hpcdl.errors import BuildError, ToolError, UserInputError

# Placeholders for machine paths when hashing a rendered spec: a fresh clone in another
# folder, with the same content, hashes the same and reuses the cached image.
HASH_CONTEXT = RenderContext(
    cache_dir="${HPCDL_CACHE}", project_dir="${HPCDL_PROJECT}", spec_dir="${SPEC_DIR}"
)


@dataclass(frozen=True)
class BuildPlan:
    """Everything decided before anything runs; ``--dry-run`` shows this."""

    source: str  # spec or definition file
    name: str
    definition: str
    output: Path
    sandbox: bool
    argv_options: tuple[str, ...]  # build options after `build`
    files: tuple[tuple[str, str], ...]  # (host source, path in image)
    content_hash: str
    record: dict[str, Any] = field(repr=False)
    up_to_date: bool
    force: bool
    workdir: Path  # where relative %files paths resolve (the definition's folder)
    reasons: tuple[str, ...] = ()  # why a build is needed (first few differences)
    # The host's CA bundle and proxies for %post (None: --no-host-trust or --remote).
    trust: HostTrust | None = None
    import_check: bool = True  # the definition ends with the import check's %test
    # pip.packages resolved on the host (--offline, pip.resolve: host); None: none.
    wheels: Resolution | None = None

    # Where the staged CA bundle's folder is shown before the build has its folder.
    STAGED_CA = "<build dir>/host-ca"

    @property
    def log_path(self) -> Path:
        return sidecar(self.output, ".build.log")

    @property
    def hash_path(self) -> Path:
        return sidecar(self.output, ".hash")

    @property
    def def_path(self) -> Path:
        return sidecar(self.output, ".def")

    def argv(self, runtime: str, target: str | Path, definition: str | Path,
             ca_dir: str | Path | None = None) -> list[str]:
        """The build command; with ``ca_dir`` (the folder holding the staged copy of the
        host's CA bundle) it binds that folder for %post (hpcdl.container.hosttrust)."""
        bind = self.trust.bind(ca_dir) if self.trust and ca_dir is not None else []
        return [runtime, "build", *self.argv_options, *bind, str(target), str(definition)]

    def shown_command(self, runtime: str = "apptainer") -> str:
        """The build command as --dry-run shows it: the variables it gets (proxy
        passwords hidden) and the argv."""
        env = self.trust.shown_env() if self.trust else {}
        argv = self.argv(runtime, self.output, "<definition>", self.STAGED_CA)
        return " ".join([*(f"{k}={v}" for k, v in env.items()), *argv])

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "name": self.name,
            "output": str(self.output),
            "sandbox": self.sandbox,
            "build_options": list(self.argv_options),
            "files": [{"source": s, "destination": d} for s, d in self.files],
            "content_hash": self.content_hash,
            "up_to_date": self.up_to_date,
            "will_build": self.force or not self.up_to_date,
            "reasons": list(self.reasons),
            "host_trust": self.trust.to_dict() if self.trust else None,
            "import_check": self.import_check,
            "wheels": self.wheels.to_dict() if self.wheels else None,
            "log": str(self.log_path),
            "hash_record": str(self.hash_path),
        }


@dataclass(frozen=True)
class BuildResult:
    image: Path
    built: bool  # False: up to date, nothing ran
    seconds: float
    content_hash: str
    log: Path | None
    runtime: str | None
    import_check: ImportCheck | None = None


def default_output(name: str, sandbox: bool) -> Path:
    """``<cache>/images/<name>.sif`` (a folder for --sandbox): ${HPCDL_CACHE:-/var/cache/hpcdl}
    where this user may write there, else ~/.cache/hpcdl (hpcdl.container.cache)."""
    return Path(cache_dir()) / "images" / (name if sandbox else f"{name}.sif")


def _is_definition(path: Path) -> bool:
    return path.suffix == ".def" or path.name in ("Singularity", "Apptainer") or (
        path.suffix not in (".yaml", ".yml") and _looks_like_def(path)
    )


def _looks_like_def(path: Path) -> bool:
    # Only the head: the file may be a multi-GB image (a 3.6 GB SIF read whole as text
    # took 23 GB of memory).
    try:
        with path.open("rb") as f:
            head = f.read(4000).decode("utf-8", errors="replace")
    except OSError:
        return False
    return re.search(r"^\s*Bootstrap:", head, re.M | re.I) is not None


def files_of_definition(text: str, workdir: Path) -> list[tuple[str, str]]:
    """(source, destination) pairs of a definition's ``%files`` sections (``%files from
    stage`` copies between stages and is skipped); relative sources resolve in ``workdir``.
    """
    out: list[tuple[str, str]] = []
    section: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("%"):
            section = line
            continue
        if section != "%files" or not line or line.startswith("#"):
            continue
        parts = line.split()
        src = parts[0]
        dst = parts[1] if len(parts) > 1 else src
        path = Path(src)
        out.append((str(path if path.is_absolute() else workdir / path), dst))
    return out


def _localimage_source(text: str, workdir: Path) -> list[tuple[str, str]]:
    """A ``Bootstrap: localimage`` base is an input too: hash it (digests are cached)."""
    boot = re.search(r"^\s*Bootstrap:\s*(\S+)", text, re.M | re.I)
    base = re.search(r"^\s*From:\s*(\S+)", text, re.M | re.I)
    if boot and base and boot.group(1).lower() == "localimage":
        path = Path(base.group(1))
        return [(str(path if path.is_absolute() else workdir / path), "<base image>")]
    return []


def _check_wheelhouse(spec: ImageSpec, files: list[tuple[str, str]], source: str = "spec",
                      searched: tuple[str, ...] = ()) -> None:
    """Each ``pip.local`` requirement must have its wheel in the wheelhouse before a
    20-minute build finds out. Raises UserInputError (exit 2) when the wheelhouse the
    spec names does not exist, BuildError naming a missing wheel and the fix."""
    wheelhouse = next((Path(s) for s, d in files if d == "/opt/wheelhouse"), None)
    if wheelhouse is None:
        return
    hint = ("scripts/build-image.sh --prepare-only fills it (torch CPU wheel + Horovod wheel; "
            "add --gpu for the GPU spec's wheelhouse-gpu)")
    if not wheelhouse.is_dir():
        where = f" (caches searched: {', '.join(searched)})" if len(searched) > 1 else ""
        raise UserInputError(
            f"{source}: pip.wheelhouse {spec.pip.wheelhouse!r} -> {wheelhouse} does not exist"
            f"{where}; pip.local installs only from it", hint=hint)
    wheels = [p.name.lower() for p in wheelhouse.glob("*.whl")]
    for req in spec.pip.local:
        name, _, version = req.partition("==")
        stem = name.lower().replace("-", "_")
        pattern = re.compile(rf"^{re.escape(stem)}-{re.escape(version)}(\+[^-]+)?-")
        if not any(pattern.match(w) for w in wheels):
            raise BuildError(
                f"wheelhouse {wheelhouse} has no wheel for {req}", hint=hint
            )


@dataclass(frozen=True)
class _Recipe:
    """What one kind of build input gives: the definition and what it copies in."""

    text: str  # the definition that is built (and shown by --dry-run)
    hash_text: str  # what is hashed: ``text``, or a spec rendered without machine paths
    files: list[tuple[str, str]]  # (host source, path in image) from %files
    workdir: Path  # where relative %files paths resolve
    name: str
    source: str  # the file the recipe came from
    compression: str | None = None  # a spec's squashfs compression
    wheels: Resolution | None = None  # a spec's pip.packages resolved on the host


# mksquashfs -comp codecs Apptainer's SIF runtime reads (as a spec's ``compression``).
COMPRESSIONS = ("gzip", "lz4", "lzo", "xz", "zstd")

# A Dockerfile's or a .def's SIF, unless --compression says otherwise. Apptainer's own
# default is gzip, whose mksquashfs took 1,098 s for a Dockerfile FROM the 3.8 GB GPU
# image against 52 s with lz4; FROM the CPU image lz4 built in 21-30 s, zstd at level 3
# in 47 s, gzip in 220 s, zstd at mksquashfs's default level 15 in 285 s, and ranks
# started as fast from lz4 as from any (docs/benchmarks.md, "Derived images: the
# compression"). lz4 asks nothing new of a node: the bundled images are lz4 already, so
# a site that runs them reads it (kernel squashfs >= 3.19, or squashfuse with lz4); zstd
# needs kernel >= 4.14. A spec keeps its own `compression` field (absent: gzip).
DERIVED_COMPRESSION = "lz4"


def _recipe_from_dockerfile(path: Path, base_image: str | None) -> _Recipe:
    """A Dockerfile, converted with spython (``base_image`` replaces its FROM)."""
    # The converted definition is the recipe: shown by --dry-run, hashed like any
    # other; COPY sources resolve in the Dockerfile's folder (the build context).
    text = convert_dockerfile(path, base_image=base_image)
    workdir = path.resolve().parent
    return _Recipe(text=text, hash_text=text, files=files_of_definition(text, workdir),
                   workdir=workdir, name=dockerfile_name(path), source=str(path),
                   compression=DERIVED_COMPRESSION)


def _recipe_from_definition(path: Path) -> _Recipe:
    """A definition file, built as it is."""
    text = read_text(path, kind="definition")
    workdir = path.resolve().parent
    return _Recipe(text=text, hash_text=text, files=files_of_definition(text, workdir),
                   workdir=workdir, name=path.stem if path.suffix == ".def" else path.name.lower(),
                   source=str(path), compression=DERIVED_COMPRESSION)


@dataclass(frozen=True)
class WheelOptions:
    """``--offline``/``--wheelhouse``: resolve pip.packages on the host (spec only)."""

    offline: bool = False  # also on when the spec says pip.resolve: host
    root: str | None = None  # where resolved wheelhouses are kept (default <cache>/wheelhouses)
    resolve: bool = True  # False (--dry-run): show the pip download, run nothing
    binary: str | None = None  # the runtime that reads a localimage base's python


def _wheels_for(spec: ImageSpec, spec_dir: Path, opts: WheelOptions) -> Resolution | None:
    """The host resolution of ``spec``'s pip.packages, downloaded unless ``opts.resolve``
    is off or it is already there; None when the spec installs them from the index."""
    if not (opts.offline or spec.pip.resolve == "host") or not spec.pip.packages:
        return None
    base = None
    if spec.base.bootstrap == "localimage":
        path = Path(spec.base.reference).expanduser()
        base = str(path if path.is_absolute() else spec_dir / path)
    target = target_for(spec, base_path=base, binary=opts.binary)
    root = check_root(opts.root) if opts.root else check_root(default_root())
    res = resolution_for(spec, root, target)
    return resolve(res) if opts.resolve else res


def _recipe_from_spec(ref: str, wheel_opts: WheelOptions | None = None) -> _Recipe:
    """An image spec (a YAML file or a bundled spec name), rendered to a definition."""
    spec_path = find_spec(ref)
    spec = load_spec(spec_path)
    wheels = _wheels_for(spec, spec_path.resolve().parent, wheel_opts or WheelOptions())
    # A ${HPCDL_CACHE} path (the wheelhouse) is read from the first cache that has it:
    # the user's own, then a site cache they may read but not write (hpcdl.container.cache).
    dirs = cache_dirs()
    described = wheels.target.describe() if wheels else ""
    ctx = RenderContext(spec_dir=str(spec_path.resolve().parent), cache_dir=dirs.write,
                        cache_read=dirs.read, wheels=str(wheels.path) if wheels else None,
                        wheels_target=described)
    # The resolved folder's place on this host is not content; its wheels are (%files).
    hash_ctx = replace(HASH_CONTEXT, wheels="${HPCDL_WHEELS}" if wheels else None,
                       wheels_target=described)
    rendered = render_definition(spec, ctx)
    files = list(rendered.files)
    _check_wheelhouse(spec, files, str(spec_path), dirs.read)
    return _Recipe(text=rendered.text, hash_text=render_definition(spec, hash_ctx).text,
                   files=files, workdir=spec_path.resolve().parent, name=spec.name,
                   source=str(spec_path), compression=spec.compression, wheels=wheels)


def _recipe(ref: str, base_image: str | None, wheels: WheelOptions | None = None) -> _Recipe:
    """Dispatch on the kind of ``ref``: Dockerfile, definition file, else an image spec."""
    path = Path(ref).expanduser()
    dockerfile = path.is_file() and is_dockerfile(path)
    if base_image and not dockerfile:
        raise UserInputError(f"base-image: only applies to a Dockerfile, not to '{ref}'")
    if wheels and wheels.offline and path.is_file() and (dockerfile or _is_definition(path)):
        raise UserInputError(f"offline: resolves an image spec's pip.packages, not those of "
                             f"'{ref}' (a {'Dockerfile' if dockerfile else 'definition file'})")
    if dockerfile:
        return _recipe_from_dockerfile(path, base_image)
    if path.is_file() and _is_definition(path):
        return _recipe_from_definition(path)
    return _recipe_from_spec(ref, wheels)


def plan_build(
    ref: str,
    *,
    output: str | Path | None = None,
    sandbox: bool = False,
    fakeroot: bool = False,
    remote: bool = False,
    force: bool = False,
    extra_options: tuple[str, ...] = (),
    base_image: str | None = None,
    host: bool = True,
    ca_bundle: str | None = None,
    import_check: bool = True,
    bake_ca: bool = False,
    wheels: WheelOptions | None = None,
    compression: str | None = None,
) -> BuildPlan:
    """Decide what ``hpcdl build REF`` does. ``REF``: a spec file or bundled spec name,
    a definition file, or a Dockerfile (converted with spython; ``base_image`` replaces
    its FROM with a local image, see hpcdl.container.recipes).

    ``host``: pass this host's CA bundle (``ca_bundle`` chooses it) and proxies to the
    build's %post, bound and never kept in the image (hpcdl.container.hosttrust; not
    for ``remote``). ``import_check``: end the definition with the import check's
    %test (hpcdl.container.verify). Neither changes the content hash: an image built
    with or without them is the same software. ``bake_ca``: keep that CA bundle in the
    image as well (/etc/hpcdl/host-ca.crt, with the CA variables in %environment); it is
    then content like any copied file. ``wheels`` (``--offline``, or a spec's
    ``pip.resolve: host``): the spec's pip.packages are resolved on this host for the
    image's Python and platform (hpcdl.container.wheels; this downloads, once per
    content key, unless ``wheels.resolve`` is off) and installed --no-index; the
    resolved wheels are content.
    ``compression``: the SIF's squashfs codec (one of
    COMPRESSIONS), instead of a spec's ``compression`` (absent: the runtime's gzip) or,
    for a Dockerfile or .def, DERIVED_COMPRESSION (lz4); part of the content hash, as
    the spec's is.

    Raises UserInputError (unknown spec/file, bad combination, a proxy variable that is
    not a URL), ConfigError (spec) or BuildError (a copied file or wheel is missing).
    """
    _check_flags(sandbox=sandbox, remote=remote, compression=compression)
    recipe = _recipe(ref, base_image, wheels)
    if compression is not None:
        recipe = replace(recipe, compression=compression)
    trust = host_trust(ca_bundle) if (host or bake_ca) and not remote else None
    if bake_ca:
        recipe = _bake_ca(recipe, trust)
    out = (Path(output).expanduser() if output else default_output(recipe.name, sandbox)).absolute()
    # A directory (--sandbox) image is not compressed at all.
    squash = f"-comp {recipe.compression}" if recipe.compression and not sandbox else None
    # An ordinary user builds in a user namespace: Apptainer >= 1.1 would imply it; saying
    # it keeps --dry-run exact (a remote build runs elsewhere, as root).
    fakeroot = fakeroot or (os.geteuid() != 0 and not remote)
    options = build_options(sandbox=sandbox, fakeroot=fakeroot, remote=remote, squash=squash,
                            extra=extra_options)
    digest, reasons, up_to_date = _freshness(recipe, out, sandbox, squash)
    return BuildPlan(
        reasons=reasons,
        source=recipe.source,
        name=recipe.name,
        definition=recipe.text + (check_section() if import_check else ""),
        output=out,
        sandbox=sandbox,
        argv_options=tuple(options),
        files=tuple(recipe.files),
        content_hash=digest.digest,
        record=digest.record(spec=recipe.name, source=recipe.source),
        up_to_date=up_to_date,
        force=force,
        workdir=recipe.workdir,
        trust=trust,
        import_check=import_check,
        wheels=recipe.wheels,
    )


def _check_flags(*, sandbox: bool, remote: bool, compression: str | None) -> None:
    """The build flags that cannot go together, before anything is read. Pure."""
    if sandbox and remote:
        raise UserInputError("--sandbox and --remote cannot be combined (remote builds give a SIF)")
    if compression is not None and compression not in COMPRESSIONS:
        raise UserInputError(f"--compression {compression!r} is not one of "
                             f"{', '.join(COMPRESSIONS)}")
    if compression is not None and sandbox:
        raise UserInputError(f"--compression {compression}: a --sandbox folder is not "
                             "compressed (drop one of them)")


def _bake_ca(recipe: _Recipe, trust: HostTrust | None) -> _Recipe:
    """``recipe`` with the host's CA bundle copied into the image (--bake-ca): content,
    so it is hashed as well."""
    if trust is None or not trust.ca_bundle:
        raise UserInputError("--bake-ca: no CA bundle found on this host (and --remote "
                             "builds elsewhere)", hint="name one with --ca-bundle PATH")
    baked = bake_sections(trust.ca_bundle)
    return replace(recipe, text=recipe.text + baked, hash_text=recipe.hash_text + baked,
                   files=[*recipe.files, (trust.ca_bundle, BAKED_CA)])


def build_options(*, sandbox: bool, fakeroot: bool, remote: bool, squash: str | None,
                  extra: tuple[str, ...] = ()) -> list[str]:
    """The options after ``apptainer build``, in the order --dry-run shows them. Pure."""
    return (["--sandbox"] if sandbox else []) + (["--fakeroot"] if fakeroot else []) \
        + (["--remote"] if remote else []) + (["--mksquashfs-args", squash] if squash else []) \
        + list(extra)


def _freshness(recipe: _Recipe, out: Path, sandbox: bool, squash: str | None
               ) -> tuple[ContentHash, tuple[str, ...], bool]:
    """(the content hash, why a build is needed, whether ``out`` is up to date): the hash
    of what goes in against the record beside the image."""
    inputs, pending = _hashed_inputs(recipe)
    record = read_record(sidecar(out, ".hash"))
    digest = content_hash(
        recipe.hash_text,
        inputs,
        options=(["sandbox"] if sandbox else []) + ([squash] if squash else []),
        previous=previous_digests(record),
    )
    up_to_date = not pending and bool(
        record and record.get("hash") == digest.digest and (out.is_dir() if sandbox else out.is_file())
    )
    return digest, tuple(pending or rebuild_reasons(record, digest.record(), out, sandbox)), up_to_date


def _hashed_inputs(recipe: _Recipe) -> tuple[list[tuple[str, str]], list[str]]:
    """(the files whose content the hash covers, why the hash is not final yet). Raises
    BuildError for a file to copy in that does not exist."""
    inputs = recipe.files + _localimage_source(recipe.text, recipe.workdir)
    pending: list[str] = []
    if recipe.wheels and not recipe.wheels.resolved:
        # --dry-run before the first resolve: the wheels are not known, nor the hash.
        inputs = [(s, d) for s, d in inputs if d != WHEELS_DEST]
        pending = [f"pip.packages not resolved yet ({recipe.wheels.key}): the content "
                   "hash covers the wheels once they are"]
    for src, _dst in inputs:
        if not Path(src).exists():
            raise BuildError(f"{recipe.source}: file to copy in does not exist: {src}")
    return inputs, pending


def unprivileged_build(binary: str | None = None) -> str:
    """For an ordinary user: one line saying how this host lets them build (see
    hpcdl.container.runtime.build_mode). Raises ToolError naming what is missing when
    nothing works."""
    from hpcdl.container.runtime import build_mode, gather_runtime_facts

    mode, how = build_mode(gather_runtime_facts(binary))
    if mode == "unusable":
        raise ToolError(how, hint="ask the admin to enable unprivileged user namespaces "
                        "(the sysctl named above), or build where you are root and copy the "
                        "image, or use --remote")
    return how


def execute(
    plan: BuildPlan,
    *,
    runtime: Runtime | None = None,
    binary: str | None = None,
    on_line: Callable[[str], None] | None = None,
    timeout: float | None = None,
) -> BuildResult:
    """Build ``plan`` unless it is up to date (and not forced).

    Raises ToolError when no runtime exists, BuildError with the tool's message and exit
    code when the build fails (the previous image and its hash record stay untouched).
    """
    if plan.up_to_date and not plan.force:
        return BuildResult(plan.output, False, 0.0, plan.content_hash, None, None)
    if plan.wheels and not plan.wheels.resolved:
        raise BuildError(f"{plan.source}: pip.packages are not resolved on the host "
                         f"({plan.wheels.path} is missing); plan with wheels resolving")
    runtime = runtime or find_runtime(binary)
    out = plan.output
    out.parent.mkdir(parents=True, exist_ok=True)
    # One build per target at a time (CI, a benchmark and a user may race): the second
    # waits, then finds the image up to date instead of building it again.
    with sidecar(out, ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = read_record(plan.hash_path)
        if not plan.force and record and record.get("hash") == plan.content_hash and (
            out.is_dir() if plan.sandbox else out.is_file()
        ):
            return BuildResult(out, False, 0.0, plan.content_hash, None, None)
        _remove_stale_builds(out)
        return _build(plan, runtime, on_line, timeout)


def _remove_stale_builds(out: Path) -> None:
    """Temporary folders of builds that were SIGKILLed (nothing else could clean up)."""
    for tmp in out.parent.glob(f".{out.name}.building-*"):
        try:
            pid = int((tmp / "pid").read_text())
            os.kill(pid, 0)
            continue  # still running
        except ProcessLookupError:
            pass
        except PermissionError:
            continue  # alive, another user's
        except (OSError, ValueError):
            pass  # no pid file: from before pid files, or unreadable; we hold the lock
        shutil.rmtree(tmp, ignore_errors=True)


class _BuildLog:
    """The build's log file and what its lines tell: every line goes to the log (and to
    ``on_line``); the %test lines about torch and the import check are kept."""

    def __init__(self, log: IO[str], on_line: Callable[[str], None] | None) -> None:
        self.log, self.on_line = log, on_line
        self.checks: list[ImportCheck] = []
        # What the %test capability check printed about torch (see parse_image_facts_line).
        self.image_facts: dict[str, Any] = {}

    def __call__(self, line: str) -> None:
        facts = parse_image_facts_line(line)
        if facts is not None:
            self.image_facts.update(facts)
        result = parse_import_check(line)
        if result is not None:
            self.checks.append(result)
        self.log.write(line)
        self.log.flush()
        if self.on_line:
            self.on_line(line)

    @property
    def last_check(self) -> ImportCheck | None:
        return self.checks[-1] if self.checks else None


def build_failure(checks: list[ImportCheck], runtime: str, name: str, returncode: int | None,
                  output: str) -> str:
    """Why a build failed, in one line. Pure. The import check's own line names the two
    packages that do not match; else the tool's message."""
    failed = next((c for c in reversed(checks) if not c.ok), None)
    if failed:
        return f"import check failed: {failed.message}"
    return f"{runtime} build of {name} failed (exit {returncode}): {_tool_message(output)}"


def build_record(plan: BuildPlan, runtime: Runtime, seconds: float, built_at: datetime,
                 image_facts: dict[str, Any], check: ImportCheck | None) -> dict[str, Any]:
    """The hash record written beside a built image. Pure."""
    return {
        **plan.record,
        "runtime": f"{runtime.name} {runtime.version}",
        "built_at": built_at.isoformat(timespec="seconds"),
        "build_seconds": round(seconds, 1),
        **({"image_facts": image_facts} if image_facts else {}),
        **({"import_check": check.message} if check else {}),
    }


def _stage_build_dir(plan: BuildPlan) -> tuple[Path, Path, Path | None]:
    """(the build's own folder, its definition file, the folder of its CA copy or None).
    The folder lives beside the target (same filesystem: the final rename is atomic) and
    holds this process's pid, so a later build can tell a live one from a killed one."""
    out = plan.output
    tmpdir = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    (tmpdir / "pid").write_text(str(os.getpid()))
    def_file = tmpdir / "image.def"
    def_file.write_text(plan.definition)
    # The host's CA bundle: a copy in the build's own folder (the host file may change,
    # and its folder may hold more than certificates), bound read-only for %post.
    ca_dir = None
    if plan.trust and plan.trust.ca_bundle:
        ca_dir = tmpdir / "host-ca"
        ca_dir.mkdir()
        shutil.copyfile(plan.trust.ca_bundle, ca_dir / CA_NAME)
    return tmpdir, def_file, ca_dir


def _run_build(plan: BuildPlan, runtime: Runtime, argv: list[str], token: str,
               log_tmp: Path, on_line: Callable[[str], None] | None,
               timeout: float | None) -> _BuildLog:
    """Run the build command, its output into ``log_tmp``; on failure or interruption
    the log is published beside the image and the error raised."""
    trust_env = plan.trust.build_env() if plan.trust else {}
    with log_tmp.open("w") as log:
        log.write(f"# hpcdl build {plan.source} -> {plan.output}\n# {' '.join(argv)}\n")
        log.write(f"# runtime: {runtime}\n# content hash: {plan.content_hash}\n")
        if plan.trust:
            log.write(f"# host trust: {plan.trust.summary()}\n")
        lines = _BuildLog(log, on_line)
        try:
            proc.stream(
                argv,
                on_line=lines,
                timeout=timeout,
                env={**runtime_env(), **trust_env, "APPTAINERENV_HPCDL_BUILD": token},
                cwd=plan.workdir,
                error_cls=BuildError,
            )
        except BuildError as err:
            log.write(f"# FAILED: exit {err.returncode}\n")
            log.close()
            _publish_log(log_tmp, plan.log_path)
            raise BuildError(
                build_failure(lines.checks, runtime.name, plan.name, err.returncode, err.output),
                argv=argv,
                returncode=err.returncode,
                output=err.output,
                hint=f"full log: {plan.log_path}; the previous image (if any) is untouched",
            ) from err
        except ToolError as err:  # pragma: no cover - proc raises error_cls
            raise BuildError(err.message, argv=argv, returncode=err.returncode) from err
        except BaseException:
            # Interrupted (Ctrl-C, SIGTERM): proc.stream killed apptainer, but not the
            # %post processes it started (no PID namespace in builds); keep the log.
            killed = kill_build_processes(token)
            log.write(f"# INTERRUPTED (killed {killed} leftover build processes)\n")
            log.close()
            _publish_log(log_tmp, plan.log_path)
            raise
    return lines


def _build(plan: BuildPlan, runtime: Runtime, on_line: Callable[[str], None] | None,
           timeout: float | None) -> BuildResult:
    out = plan.output
    tmpdir, def_file, ca_dir = _stage_build_dir(plan)
    # Tags every process of this build (apptainer passes APPTAINERENV_X into %post as X).
    token = tmpdir.name
    tmp_image = tmpdir / out.name
    argv = plan.argv(runtime.path, tmp_image, def_file, ca_dir)
    log_tmp = tmpdir / "build.log"
    start = time.monotonic()
    try:
        lines = _run_build(plan, runtime, argv, token, log_tmp, on_line, timeout)
        # Never trust the exit code alone: the image must be there.
        if not (tmp_image.is_dir() if plan.sandbox else tmp_image.is_file() and tmp_image.stat().st_size > 0):
            _publish_log(log_tmp, plan.log_path)
            raise BuildError(
                f"{runtime.name} build of {plan.name} exited 0 but wrote no image",
                argv=argv,
                hint=f"full log: {plan.log_path}",
            )
        seconds = time.monotonic() - start
        _replace(tmp_image, out)
        _publish_log(log_tmp, plan.log_path)
        shutil.copyfile(def_file, plan.def_path)
        write_json_atomic(plan.hash_path, build_record(
            plan, runtime, seconds, datetime.now(timezone.utc), lines.image_facts, lines.last_check))
        return BuildResult(out, True, seconds, plan.content_hash, plan.log_path, str(runtime),
                           lines.last_check)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


IMAGE_FACTS_MARK = "HPCDL_IMAGE_FACTS "


def parse_image_facts_line(line: str) -> dict[str, Any] | None:
    """The JSON object of a ``HPCDL_IMAGE_FACTS {...}`` line that the definition's %test
    prints (torch, torch_cuda, cuda_archs, nccl), or None for any other line. Pure.

    The build records it beside the image so that ``hpcdl submit`` can check a
    partition's GPU architecture against the image without starting it.
    """
    at = line.find(IMAGE_FACTS_MARK)
    if at < 0:
        return None
    try:
        data = json.loads(line[at + len(IMAGE_FACTS_MARK):])
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def rebuild_reasons(old: dict[str, Any] | None, new: dict[str, Any], out: Path,
                    sandbox: bool, limit: int = 5) -> list[str]:
    """Why the image must be (re)built, for the user: pure comparison of two records."""
    if not (out.is_dir() if sandbox else out.is_file()):
        return [f"{out} does not exist"]
    if not old:
        return ["no hash record beside the image"]
    if old.get("hash") == new.get("hash"):
        return []
    reasons: list[str] = []
    if old.get("definition_sha256") != new.get("definition_sha256"):
        reasons.append("the rendered definition changed")
    if old.get("options") != new.get("options"):
        reasons.append("build options changed")
    before, after = old.get("files") or {}, new.get("files") or {}
    for path in sorted(set(before) | set(after)):
        if path not in before:
            reasons.append(f"new file {path}")
        elif path not in after:
            reasons.append(f"removed file {path}")
        elif before[path].get("sha256") != after[path].get("sha256"):
            reasons.append(f"changed {path}")
    if len(reasons) > limit:
        reasons = reasons[:limit] + [f"... and {len(reasons) - limit} more"]
    return reasons or ["content hash differs (file modes or copied folders changed)"]


def kill_build_processes(token: str, rounds: int = 3) -> int:
    """SIGKILL every process tagged ``HPCDL_BUILD=<token>`` in its environment (the build's
    apptainer helpers and the %post shell and its children). Returns how many."""
    needle = f"HPCDL_BUILD={token}".encode()
    me = os.getpid()
    killed = 0
    for _ in range(rounds):
        found = 0
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == me:
                continue
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue
            if needle in environ:
                try:
                    os.kill(int(entry), signal.SIGKILL)
                    found += 1
                except OSError:
                    pass
        killed += found
        if not found:
            break
        time.sleep(0.2)
    return killed


def _publish_log(tmp: Path, dest: Path) -> None:
    if tmp.exists():
        os.replace(tmp, dest)


def _replace(new: Path, target: Path) -> None:
    """Move ``new`` to ``target`` atomically (a folder for sandboxes: swap, then delete)."""
    if new.is_dir():
        old = None
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.replace(target, old)
        os.replace(new, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    else:
        if target.is_dir():
            raise BuildError(f"{target} is a folder (a sandbox); choose another -o or remove it")
        os.replace(new, target)


def _tool_message(output: str) -> str:
    """The line that says why: Apptainer's FATAL/ERROR line, else the last line."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith(("FATAL:", "ERROR:")):
            return ln
    return lines[-1] if lines else "no output"
