"""The typed schema of an image spec (``containers/*.yaml``) and its loader.

A spec says what goes into an Apptainer/Singularity image: the base (debootstrap,
docker or a local image), Debian packages, Python packages (torch always pinned),
how Horovod gets in (a prebuilt wheel from a wheelhouse, or built from source with
the C++17 fix), which MPI the image carries (recorded in the labels: hybrid model),
environment, labels and the capability test. Every model forbids unknown keys, so a
typo is an error naming the file and the field.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hpcdl.core.resources import containers_dir
from hpcdl.core.tokens import (
    REQUIREMENT,
    DebPackage,
    DefText,
    EnvName,
    Executable,
    GlibcVersion,
    HostPath,
    ImageName,
    ImageRef,
    ImageTag,
    LabelKey,
    Machine,
    OsVersion,
    PyVersion,
    Requirement,
    Text,
    Url,
    Version,
)
from hpcdl.core.yamlmodel import load_yaml_model, parse_yaml_model
from hpcdl.errors import ConfigError, UserInputError

_FRAMEWORKS: tuple[Literal["pytorch"], ...] = ("pytorch",)
_CONTROLLERS: tuple[Literal["mpi", "gloo"], ...] = ("mpi", "gloo")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Base(_Strict):
    """Where the root filesystem comes from."""

    bootstrap: Literal["debootstrap", "docker", "localimage"] = Field(
        description="the definition's Bootstrap: a Debian debootstrap, a registry image or "
                    "a local image")
    os_version: OsVersion | None = Field(default=None, description="debootstrap suite, e.g. bookworm")
    mirror: Url = Field(
        default="http://deb.debian.org/debian",
        description="debootstrap MirrorURL (the Debian mirror the host's apt uses)",
    )
    include: list[DebPackage] = Field(default_factory=list, description="debootstrap Include packages")
    image: ImageRef | None = Field(default=None, description="docker: image name; localimage: path")
    tag: ImageTag | None = Field(default=None, description="docker: tag, e.g. 24.10-py3")

    @model_validator(mode="after")
    def _complete(self) -> Base:
        if self.bootstrap == "debootstrap":
            if not self.os_version:
                raise ValueError("bootstrap 'debootstrap' needs os_version (e.g. bookworm)")
        elif not self.image:
            raise ValueError(f"bootstrap '{self.bootstrap}' needs image")
        if self.bootstrap == "docker" and not self.tag:
            raise ValueError("bootstrap 'docker' needs tag (the base image is pinned)")
        return self

    @property
    def reference(self) -> str:
        """The ``From:`` value."""
        if self.bootstrap == "docker":
            return f"{self.image}:{self.tag}"
        return self.image or ""


class Mpi(_Strict):
    """The MPI the image carries. Hybrid model: the host's mpirun/srun starts ranks that
    use this MPI, so flavour and version (and PMIx) must match what the host speaks."""

    flavour: Literal["openmpi", "mpich", "intelmpi", "mvapich2"] = Field(
        description="the MPI implementation (recorded in the image's labels)")
    version: Version = Field(description="its version (labels; the host's launcher must speak it)")
    pmix: Version | None = Field(default=None, description="the PMIx version, when it has one")
    source: Literal["apt", "base"] = Field(
        description="apt: Debian packages installed by the spec; base: shipped by the base image"
    )
    model: Literal["hybrid", "bind"] = Field(
        default="hybrid",
        description="recorded in the labels: hybrid (the image's own MPI, started by the "
                    "host's launcher) or bind (the host's MPI bound in)")


class Horovod(_Strict):
    """How Horovod gets into the image and what it is built with."""

    version: Version = Field(default="0.28.1", description="the Horovod version")
    install: Literal["wheel", "source"] = Field(
        description="wheel: a prebuilt wheel from pip.wheelhouse; source: build in %post"
    )
    frameworks: list[Literal["pytorch"]] = Field(
        default_factory=lambda: list(_FRAMEWORKS), description="frameworks Horovod is built for (a source build: HOROVOD_WITH_PYTORCH)")
    controllers: list[Literal["mpi", "gloo"]] = Field(
        default_factory=lambda: list(_CONTROLLERS),
        description="a source build: HOROVOD_WITH_MPI / HOROVOD_WITH_GLOO; at least one")
    cpu_operations: Literal["GLOO", "MPI"] | None = Field(
        default=None, description="a source build's HOROVOD_CPU_OPERATIONS; null: Horovod's default")
    gpu_operations: Literal["NCCL", "MPI"] | None = Field(
        default=None, description="a source build's HOROVOD_GPU_OPERATIONS; needs gpu: true")
    cxx17_fix: bool = Field(
        default=True,
        description="set CMAKE_CXX_STANDARD 17 in both CMakeLists (needed for torch >= 2.1)",
    )

    @field_validator("controllers")
    @classmethod
    def _controllers(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("at least one controller (mpi, gloo) is needed")
        return v


class WheelTarget(_Strict):
    """The image's Python and platform, for resolving pip.packages on the host when
    hpcdl cannot read them (a docker base; or to pin them)."""

    python: PyVersion = Field(description="the image python's version, e.g. '3.11'")
    glibc: GlibcVersion = Field(description="the image's glibc version, e.g. '2.36' (bookworm)")
    machine: Machine = Field(default="x86_64", description="the image's machine")


class Pip(_Strict):
    """Python packages: from an index, or offline from a wheelhouse."""

    index_url: Url | None = Field(default=None, description="pip --index-url inside the build")
    extra_index_urls: list[Url] = Field(
        default_factory=list, description="pip --extra-index-url inside the build")
    wheelhouse: HostPath | None = Field(
        default=None,
        description="host folder of local wheels copied to /opt/wheelhouse "
        "(may use ${HPCDL_CACHE}); packages in 'local' install from it only",
    )
    local: list[Requirement] = Field(
        default_factory=list, description="requirements installed --no-index from the wheelhouse"
    )
    packages: list[Requirement] = Field(default_factory=list, description="requirements from the index")
    resolve: Literal["build", "host"] = Field(
        default="build",
        description="where pip.packages are resolved: build (pip in %post, from the index) "
        "or host (pip download on the host for the image's Python and platform, installed "
        "--no-index: the build needs no network; as `hpcdl build --offline`)")
    target: WheelTarget | None = Field(
        default=None,
        description="the image's Python and platform for resolve: host (default: read from "
        "a localimage base, or the debootstrap release's python3; needed for a docker base)")

    @field_validator("local", "packages")
    @classmethod
    def _requirements(cls, v: list[str]) -> list[str]:
        for req in v:
            m = REQUIREMENT.pattern.fullmatch(req) if REQUIREMENT.pattern else None
            # An unpinned torch pulls the multi-GB CUDA build (or replaces a base image's).
            if m and m["name"].lower() == "torch" and not (m["spec"] or "").startswith("=="):
                raise ValueError(f"{req!r}: torch must be pinned exactly (torch==X.Y.Z)")
        return v

    @model_validator(mode="after")
    def _wheelhouse(self) -> Pip:
        if self.local and not self.wheelhouse:
            raise ValueError("'local' requirements need a wheelhouse")
        return self


class ImageSpec(_Strict):
    """One image: everything the definition file is rendered from."""

    name: ImageName = Field(description="image name; default output <cache>/images/<name>.sif")
    description: DefText = Field(default="", description="the image's %help text")
    gpu: bool = Field(description="built for NVIDIA GPUs (run with --nv)")
    base: Base = Field(description="where the root filesystem comes from")
    apt_packages: list[DebPackage] = Field(
        default_factory=list, description="Debian packages installed in %post")
    python: Executable = Field(default="python3", description="the python pip installs into")
    pip: Pip = Field(default_factory=Pip, description="Python packages")
    horovod: Horovod | None = Field(default=None, description="null: no Horovod")
    mpi: Mpi = Field(description="the MPI the image carries")
    project: bool = Field(
        default=True, description="copy hpcdl/ and examples/ to /opt/hpcdl (PYTHONPATH)"
    )
    env: dict[EnvName, Text] = Field(default_factory=dict, description="the image's %environment")
    labels: dict[LabelKey, Text] = Field(
        default_factory=dict, description="%labels, after hpcdl's own (org.hpcdl.*)")
    compression: Literal["gzip", "lz4", "lzo", "xz", "zstd"] | None = Field(
        default=None,
        description="squashfs compression of the SIF (mksquashfs -comp); default: the "
        "runtime's (gzip). Every process that starts from a SIF decompresses what it "
        "reads, so a faster codec shortens each rank's start-up.",
    )
    test: list[DefText] = Field(
        default_factory=list, description="extra %test commands (after the capability check)"
    )

    @model_validator(mode="after")
    def _consistent(self) -> ImageSpec:
        hvd = self.horovod
        if hvd is not None:
            if hvd.gpu_operations and not self.gpu:
                raise ValueError(
                    f"horovod.gpu_operations={hvd.gpu_operations} needs gpu: true"
                )
            if hvd.install == "wheel" and not any(
                _req_name(r) == "horovod" for r in self.pip.local
            ):
                raise ValueError(
                    "horovod.install 'wheel' needs a horovod==VERSION entry in pip.local"
                )
            for req in self.pip.local + self.pip.packages:
                if _req_name(req) == "horovod" and req != f"horovod=={hvd.version}":
                    raise ValueError(f"pip requirement {req!r} disagrees with horovod.version")
        if self.base.bootstrap == "debootstrap" and self.pip.packages + self.pip.local:
            if "python3-pip" not in self.apt_packages:
                raise ValueError("pip packages on a debootstrap base need python3-pip in apt_packages")
        return self

    def label_items(self) -> list[tuple[str, str]]:
        """Labels recorded in the image: hpcdl's own (spec, MPI model) then the spec's."""
        own: dict[str, str] = {
            "org.hpcdl.spec": self.name,
            "org.hpcdl.gpu": str(self.gpu).lower(),
            "org.hpcdl.mpi.model": self.mpi.model,
            "org.hpcdl.mpi.flavour": self.mpi.flavour,
            "org.hpcdl.mpi.version": self.mpi.version,
        }
        if self.mpi.pmix:
            own["org.hpcdl.pmix.version"] = self.mpi.pmix
        if self.horovod:
            own["org.hpcdl.horovod.version"] = self.horovod.version
            own["org.hpcdl.horovod.controllers"] = ",".join(self.horovod.controllers)
            ops = [o for o in (self.horovod.cpu_operations, self.horovod.gpu_operations) if o]
            own["org.hpcdl.horovod.operations"] = ",".join(ops) or "default"
        torch = next((r for r in self.pip.local + self.pip.packages if _req_name(r) == "torch"), None)
        if torch:
            own["org.hpcdl.torch"] = torch.split("==", 1)[1]
        own.update(self.labels)
        return sorted(own.items())


def _req_name(req: str) -> str:
    m = REQUIREMENT.pattern.fullmatch(req) if REQUIREMENT.pattern else None
    return m["name"].lower() if m else req.lower()


def find_spec(ref: str) -> Path:
    """A spec file from a path or a bundled name (``pytorch-horovod-cpu``).

    Raises UserInputError naming the bundled specs when nothing matches.
    """
    path = Path(ref).expanduser()
    if path.is_file():
        return path
    for candidate in (containers_dir() / f"{ref}.yaml", containers_dir() / f"{ref}.yml"):
        if candidate.is_file():
            return candidate
    names = ", ".join(bundled_spec_names()) or "none"
    raise UserInputError(f"spec: {ref!r} is neither a file nor a bundled spec (bundled: {names})")


def bundled_spec_names() -> list[str]:
    folder = containers_dir()
    return sorted(p.stem for p in folder.glob("*.y*ml")) if folder.is_dir() else []


def load_spec(path: str | Path) -> ImageSpec:
    """Parse and validate one spec file. Raises ConfigError naming the file and field."""
    return load_yaml_model(Path(path), ImageSpec, kind="spec")


def parse_spec(text: str, *, source: str = "<spec>") -> ImageSpec:
    """Validate spec YAML text. Raises ConfigError with ``source`` and the field."""
    return parse_yaml_model(text, ImageSpec, source=source, kind="spec")


def expand_path(value: str, *, cache_dir: str, project_dir: str, spec_dir: str) -> str:
    """Resolve ``${HPCDL_CACHE}`` / ``${HPCDL_PROJECT}`` and a path relative to the spec.

    Raises ConfigError for any other ``$`` variable (a spec must render the same on
    every machine; only hpcdl's own locations vary).
    """
    if "$" in re.sub(r"\$\{(HPCDL_CACHE|HPCDL_PROJECT)\}", "", value):
        raise ConfigError(
            f"path {value!r}: only ${{HPCDL_CACHE}} and ${{HPCDL_PROJECT}} may be used"
        )
    out = value.replace("${HPCDL_CACHE}", cache_dir).replace("${HPCDL_PROJECT}", project_dir)
    path = Path(out).expanduser()
    if not path.is_absolute():
        path = Path(spec_dir) / path
    return str(path)
