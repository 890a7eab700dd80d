"""Offline builds: a spec's ``pip.packages`` resolved on the host into a wheelhouse for
the image's own Python and platform, then installed in the build with ``--no-index``.

A build node without network (or behind a proxy its build cannot pass) still builds:
``hpcdl build SPEC --offline`` (or ``pip.resolve: host`` in the spec) runs

    python -m pip download --only-binary=:all: --implementation cp --python-version 3.11
        --abi cp311 --platform manylinux_2_36_x86_64 --platform manylinux_2_35_x86_64 ...
        -d <wheelhouse> REQUIREMENTS

with the host's pip (its configuration, index, certificates and proxies), into
``<root>/<key>``, where the key is a hash of the requirements, the indexes and the
target. A resolved folder is complete (it appears by an atomic rename) and is reused,
also by a build node without network that shares the folder (``--resolve-only`` on a
connected host, then ``--offline --wheelhouse DIR`` on the build node). The folder is
copied in with ``%files`` (so the image's content hash covers every wheel's bytes),
installed with ``pip install --no-index --find-links``, and removed in ``%post``.

Why every manylinux platform is listed: pip expands a ``--platform`` of the legacy
``manylinux2014``/``manylinux2010`` forms to the older ones, but not a PEP 600
``manylinux_2_36_x86_64`` (pip 23.2: only that exact tag), so most manylinux2014
wheels would be missed. The list is what the image's own pip accepts
(packaging.tags: ``manylinux_2_X`` down to 2.5, the legacy aliases, ``linux_ARCH``).

Where the target comes from (``target_for``): the spec's ``pip.target``; else the base
image itself for a ``localimage`` base (its python, glibc and machine, read with
``apptainer exec``); else the Debian/Ubuntu release of a ``debootstrap`` base (the
table below, for the system ``python3``); a ``docker`` base needs ``pip.target``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcdl.container.definition import WHEELS_DEST as DEST
from hpcdl.container.hashing import file_sha256
from hpcdl.container.spec import ImageSpec
from hpcdl.core import proc
from hpcdl.core.tokens import GLIBC_VERSION, MACHINE, PY_VERSION, check_token
from hpcdl.errors import ToolError, UserInputError

KEY_VERSION = 1
# A wheelhouse root lands unquoted in %files (Apptainer cannot quote there).
ROOT = re.compile(r"/[A-Za-z0-9._+\-/]*")
# Python and glibc of each Debian/Ubuntu release's system python3 (debootstrap bases).
RELEASES: dict[str, tuple[str, str]] = {
    "bullseye": ("3.9", "2.31"),
    "bookworm": ("3.11", "2.36"),
    "trixie": ("3.13", "2.41"),
    "focal": ("3.8", "2.31"),
    "jammy": ("3.10", "2.35"),
    "noble": ("3.12", "2.39"),
}
# Printed by the base image's python: what pip download must aim at.
PROBE = (
    "import json, platform, sys\n"
    "libc, version = platform.libc_ver()\n"
    "print(json.dumps({'python': '%d.%d' % sys.version_info[:2],"
    " 'implementation': sys.implementation.name, 'libc': libc, 'glibc': version,"
    " 'machine': platform.machine()}))\n"
)


@dataclass(frozen=True)
class Target:
    """The interpreter and platform wheels are chosen for (CPython on glibc Linux)."""

    python: str  # "3.11"
    glibc: str  # "2.36"
    machine: str  # "x86_64"
    # Where it was read ("pip.target", "base image ...", "debootstrap bookworm"): not
    # part of what it is.
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        # What pip download is told (and a base image may print anything): checked with
        # re.fullmatch, as the spec's pip.target is.
        for value, kind in ((self.python, PY_VERSION), (self.glibc, GLIBC_VERSION),
                            (self.machine, MACHINE)):
            try:
                check_token(value, kind)
            except ValueError as exc:
                raise UserInputError(f"wheel target ({self.source or 'spec'}): {exc}") from None

    @property
    def abi(self) -> str:
        return "cp" + self.python.replace(".", "")

    @property
    def platform(self) -> str:
        """The newest platform tag, for messages."""
        return f"manylinux_2_{self.glibc.split('.')[1]}_{self.machine}"

    def platforms(self) -> list[str]:
        """Every platform tag this interpreter's pip accepts, newest first (as
        packaging.tags orders them): manylinux_2_X down to 2.5, with the legacy
        manylinux2014/2010/1 names at 2.17/2.12/2.5, then linux_ARCH."""
        minor = int(self.glibc.split(".")[1])
        legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
        out: list[str] = []
        # manylinux2010 and manylinux1 exist for x86 only.
        low = 5 if self.machine == "x86_64" else 17
        for m in range(minor, low - 1, -1):
            out.append(f"manylinux_2_{m}_{self.machine}")
            if m in legacy and (m == 17 or self.machine == "x86_64"):
                out.append(f"{legacy[m]}_{self.machine}")
        out.append(f"linux_{self.machine}")
        return out

    def describe(self) -> str:
        return f"CPython {self.python} on {self.platform}"

    def to_dict(self) -> dict[str, str]:
        return {"python": self.python, "glibc": self.glibc, "machine": self.machine,
                "abi": self.abi, "source": self.source}


@dataclass(frozen=True)
class Resolution:
    """One spec's pip.packages for one target: where they are (or will be) resolved."""

    requirements: tuple[str, ...]
    target: Target
    index_url: str | None
    extra_index_urls: tuple[str, ...]
    root: Path

    @property
    def key(self) -> str:
        """Content key: the requirements, the indexes and the target (not where from)."""
        data = {"version": KEY_VERSION, "requirements": list(self.requirements),
                "index_url": self.index_url, "extra_index_urls": list(self.extra_index_urls),
                "python": self.target.python, "glibc": self.target.glibc,
                "machine": self.target.machine}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:20]

    @property
    def path(self) -> Path:
        return self.root / self.key

    @property
    def record_path(self) -> Path:
        return self.root / f"{self.key}.json"

    @property
    def resolved(self) -> bool:
        # The folder appears by a rename once pip download succeeded: present is complete.
        return self.path.is_dir()

    def argv(self, dest: str | Path | None = None, python: str = sys.executable) -> list[str]:
        """The host's ``pip download`` (``dest``: where to; default the keyed folder)."""
        t = self.target
        argv = [python, "-m", "pip", "download", "--only-binary=:all:",
                "--implementation", "cp", "--python-version", t.python, "--abi", t.abi]
        for plat in t.platforms():
            argv += ["--platform", plat]
        if self.index_url:
            argv += ["--index-url", self.index_url]
        for url in self.extra_index_urls:
            argv += ["--extra-index-url", url]
        return [*argv, "-d", str(dest if dest is not None else self.path), *self.requirements]

    def shown(self) -> str:
        """``argv`` for --dry-run, shell-quoted, the platform list shortened to its ends."""
        plats = self.target.platforms()
        argv = self.argv()
        first = argv.index("--platform")
        after = first + 2 * len(plats)
        middle = [f"[{len(plats) - 2} more --platform down to manylinux1]"] if len(plats) > 2 else []
        return " ".join([shlex.join(argv[:first + 2]), *middle,
                         shlex.join(["--platform", plats[-1], *argv[after:]])])

    def to_dict(self) -> dict[str, Any]:
        return {"requirements": list(self.requirements), "target": self.target.to_dict(),
                "wheelhouse": str(self.path), "destination": DEST, "resolved": self.resolved,
                "key": self.key, "pip_download": self.argv()}


def check_root(root: str | Path) -> Path:
    """The folder resolved wheelhouses are kept in: absolute, of characters %files can
    carry unquoted. Raises UserInputError (exit 2) naming the value."""
    path = Path(root).expanduser().absolute()
    if not ROOT.fullmatch(str(path)):
        raise UserInputError(f"--wheelhouse: {str(path)!r} may hold only letters, digits and "
                             "._+-/ (it is copied in by the definition's %files, unquoted)")
    return path


def debian_target(spec: ImageSpec, machine: str) -> Target | None:
    """The target of a debootstrap base's system python3 (None: not a known release)."""
    release = RELEASES.get(spec.base.os_version or "")
    if spec.base.bootstrap != "debootstrap" or release is None or spec.python != "python3":
        return None
    return Target(release[0], release[1], machine, f"debootstrap {spec.base.os_version}")


def parse_probe(text: str, image: str) -> Target:
    """The target from PROBE's output (the image may print anything: it is checked)."""
    line = next((ln for ln in reversed(text.splitlines()) if ln.startswith("{")), "")
    try:
        data = json.loads(line)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise UserInputError(f"base image {image}: its python printed no target "
                             f"({text.strip()[-200:]!r})", hint="give pip.target in the spec")
    if data.get("implementation") != "cpython" or data.get("libc") != "glibc":
        raise UserInputError(
            f"base image {image}: python is {data.get('implementation')!r} on "
            f"{data.get('libc') or 'no glibc'!r}; resolving on the host needs CPython on glibc")
    return Target(str(data.get("python")), str(data.get("glibc")), str(data.get("machine")),
                  f"base image {image}")


def probe_image(image: str, python: str, binary: str | None = None) -> Target:
    """Read the target from a local base image: its python's version, glibc, machine."""
    from hpcdl.container.runtime import find_runtime, runtime_env

    runtime = find_runtime(binary)
    try:
        r = proc.run([runtime.path, "exec", "--cleanenv", image, python, "-c", PROBE],
                     timeout=300, env=runtime_env())
    except ToolError as err:
        raise ToolError(f"base image {image}: cannot read its python's version and platform: "
                        f"{err.message}", hint="give pip.target in the spec") from err
    return parse_probe(r.stdout, image)


def target_for(spec: ImageSpec, *, base_path: str | None = None,
               machine: str | None = None, binary: str | None = None) -> Target:
    """The target of ``spec``'s image (the module docstring says in which order).
    ``base_path``: a localimage base resolved to a host path. Raises UserInputError
    (exit 2) when there is no way to know it."""
    import platform as _platform

    t = spec.pip.target
    if t is not None:
        return Target(t.python, t.glibc, t.machine, "pip.target")
    host_machine = machine or _platform.machine()
    deb = debian_target(spec, host_machine)
    if deb is not None:
        return deb
    if spec.base.bootstrap == "localimage":
        return probe_image(base_path or spec.base.reference, spec.python, binary)
    raise UserInputError(
        f"spec {spec.name}: pip.target is needed to resolve pip.packages on the host "
        f"(base {spec.base.bootstrap} {spec.base.reference or spec.base.os_version}: its "
        "python cannot be read without building)",
        hint="e.g. pip: {target: {python: '3.11', glibc: '2.36', machine: x86_64}}")


def no_wheel_message(output: str, target: Target) -> str | None:
    """One line naming the package pip found no wheel of, or None for another failure."""
    found = re.findall(r"No matching distribution found for (\S+)", output)
    if not found:
        return None
    return (f"pip.packages: no wheel of {found[-1]!r} for {target.describe()} "
            f"(glibc {target.glibc}; resolving on the host takes binary wheels only)")


def resolve(res: Resolution, *, timeout: float = 3600,
            python: str = sys.executable) -> Resolution:
    """Run the host's pip download into a temporary folder beside the keyed one and
    rename it into place; a failure leaves nothing. A resolved key is not downloaded
    again. Raises UserInputError (exit 2) when a package has no wheel for the target,
    ToolError for any other pip failure (network, index)."""
    if res.resolved:
        return res
    created = not res.root.exists()
    res.root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{res.key}.resolving-", dir=res.root))
    done = False
    try:
        r = proc.run(res.argv(tmp, python), timeout=timeout, check=False)
        if not r.ok:
            output = r.stdout + r.stderr
            message = no_wheel_message(output, res.target)
            if message:
                raise UserInputError(message, hint="build it into a wheel (pip wheel) and "
                                     "install it from pip.wheelhouse/pip.local, or build "
                                     "without --offline")
            last = [ln for ln in output.splitlines() if ln.startswith("ERROR:")]
            raise ToolError(f"pip download for {res.target.describe()} failed (exit "
                            f"{r.returncode}): {(last or [output.strip()[-300:]])[-1]}",
                            argv=list(r.argv), returncode=r.returncode, output=output)
        wheels = {p.name: file_sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        # mkdtemp made it 0700: a wheelhouse shared with a build node (or other users)
        # must be readable there.
        tmp.chmod(0o755)
        try:
            os.replace(tmp, res.path)
        except OSError:
            if not res.resolved:  # not a concurrent resolve of the same key
                raise
        record = {"requirements": list(res.requirements), "target": res.target.to_dict(),
                  "index_url": res.index_url, "extra_index_urls": list(res.extra_index_urls),
                  "wheels": wheels}
        res.record_path.write_text(json.dumps(record, indent=2) + "\n")
        done = True
        return res
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if created and not done:
            # A refused resolve leaves nothing behind, not even the folder it made.
            with contextlib.suppress(OSError):
                res.root.rmdir()


def wheel_names(res: Resolution) -> list[str]:
    return sorted(p.name for p in res.path.iterdir()) if res.resolved else []


def default_root() -> Path:
    """``<cache>/wheelhouses`` (the cache this user writes, hpcdl.container.cache)."""
    from hpcdl.container.cache import cache_dirs

    return Path(cache_dirs().write) / "wheelhouses"


def resolution_for(spec: ImageSpec, root: Path, target: Target,
                   requirements: Sequence[str] | None = None) -> Resolution:
    return Resolution(tuple(requirements if requirements is not None else spec.pip.packages),
                      target, spec.pip.index_url, tuple(spec.pip.extra_index_urls), root)
