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

from hpcdl.errors import ConfigError, UserInputError
from hpcdl.resources import containers_dir
from hpcdl.yamlmodel import load_yaml_model, parse_yaml_model

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL = re.compile(r"^[A-Za-z0-9_.\-]+$")
_DEB = re.compile(r"^[a-z0-9][a-z0-9+.\-]*(=[A-Za-z0-9.+~:\-]+)?$")
# A pip requirement as hpcdl accepts it: name, optional extras, optional version spec.
_REQ = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._\-]*)(\[[A-Za-z0-9_,\-]+\])?((==|>=|<=|~=|!=|<|>)[A-Za-z0-9.*+!\-]+(,(==|>=|<=|~=|!=|<|>)[A-Za-z0-9.*+!\-]+)*)?$")
_URL = re.compile(r"^(https?|file)://\S+$")
# ${HPCDL_CACHE} and ${HPCDL_PROJECT} are the only variables a path may use, so a
# spec never hard-codes a path of one machine and renders the same everywhere.
PATH_VARIABLES = ("HPCDL_CACHE", "HPCDL_PROJECT")
_FRAMEWORKS: tuple[Literal["pytorch"], ...] = ("pytorch",)
_CONTROLLERS: tuple[Literal["mpi", "gloo"], ...] = ("mpi", "gloo")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Base(_Strict):
    """Where the root filesystem comes from."""

    bootstrap: Literal["debootstrap", "docker", "localimage"]
    os_version: str | None = Field(default=None, description="debootstrap suite, e.g. bookworm")
    mirror: str = Field(
        default="http://deb.debian.org/debian",
        description="debootstrap MirrorURL (the Debian mirror the host's apt uses)",
    )
    include: list[str] = Field(default_factory=list, description="debootstrap Include packages")
    image: str | None = Field(default=None, description="docker: image name; localimage: path")
    tag: str | None = Field(default=None, description="docker: tag, e.g. 24.10-py3")

    @model_validator(mode="after")
    def _complete(self) -> Base:
        if self.bootstrap == "debootstrap":
            if not self.os_version:
                raise ValueError("bootstrap 'debootstrap' needs os_version (e.g. bookworm)")
            if not _URL.match(self.mirror):
                raise ValueError(f"mirror must be an http(s) URL, got {self.mirror!r}")
        elif not self.image:
            raise ValueError(f"bootstrap '{self.bootstrap}' needs image")
        if self.bootstrap == "docker" and not self.tag:
            raise ValueError("bootstrap 'docker' needs tag (the base image is pinned)")
        for pkg in self.include:
            if not _DEB.match(pkg):
                raise ValueError(f"include: {pkg!r} is not a Debian package name")
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

    flavour: Literal["openmpi", "mpich", "intelmpi", "mvapich2"]
    version: str = Field(pattern=r"^[0-9][0-9A-Za-z.\-]*$")
    pmix: str | None = Field(default=None, pattern=r"^[0-9][0-9A-Za-z.\-]*$")
    source: Literal["apt", "base"] = Field(
        description="apt: Debian packages installed by the spec; base: shipped by the base image"
    )
    model: Literal["hybrid", "bind"] = "hybrid"


class Horovod(_Strict):
    version: str = Field(default="0.28.1", pattern=r"^[0-9][0-9A-Za-z.\-]*$")
    install: Literal["wheel", "source"] = Field(
        description="wheel: a prebuilt wheel from pip.wheelhouse; source: build in %post"
    )
    frameworks: list[Literal["pytorch"]] = Field(default_factory=lambda: list(_FRAMEWORKS))
    controllers: list[Literal["mpi", "gloo"]] = Field(default_factory=lambda: list(_CONTROLLERS))
    cpu_operations: Literal["GLOO", "MPI"] | None = None
    gpu_operations: Literal["NCCL", "MPI"] | None = None
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


class Pip(_Strict):
    index_url: str | None = Field(default=None, description="pip --index-url inside the build")
    extra_index_urls: list[str] = Field(default_factory=list)
    wheelhouse: str | None = Field(
        default=None,
        description="host folder of local wheels copied to /opt/wheelhouse "
        "(may use ${HPCDL_CACHE}); packages in 'local' install from it only",
    )
    local: list[str] = Field(
        default_factory=list, description="requirements installed --no-index from the wheelhouse"
    )
    packages: list[str] = Field(default_factory=list, description="requirements from the index")

    @field_validator("index_url")
    @classmethod
    def _index(cls, v: str | None) -> str | None:
        if v is not None and not _URL.match(v):
            raise ValueError(f"must be a URL, got {v!r}")
        return v

    @field_validator("extra_index_urls")
    @classmethod
    def _extra(cls, v: list[str]) -> list[str]:
        for url in v:
            if not _URL.match(url):
                raise ValueError(f"must be a URL, got {url!r}")
        return v

    @field_validator("local", "packages")
    @classmethod
    def _requirements(cls, v: list[str]) -> list[str]:
        for req in v:
            m = _REQ.match(req)
            if not m:
                raise ValueError(f"{req!r} is not a requirement hpcdl accepts (name[==version])")
            # An unpinned torch pulls the multi-GB CUDA build (or replaces a base image's).
            if m.group(1).lower() == "torch" and not (m.group(3) or "").startswith("=="):
                raise ValueError(f"{req!r}: torch must be pinned exactly (torch==X.Y.Z)")
        return v

    @model_validator(mode="after")
    def _wheelhouse(self) -> Pip:
        if self.local and not self.wheelhouse:
            raise ValueError("'local' requirements need a wheelhouse")
        return self


class ImageSpec(_Strict):
    """One image: everything the definition file is rendered from."""

    name: str = Field(description="image name; default output <cache>/images/<name>.sif")
    description: str = ""
    gpu: bool = Field(description="built for NVIDIA GPUs (run with --nv)")
    base: Base
    apt_packages: list[str] = Field(default_factory=list)
    python: str = Field(default="python3", pattern=r"^[A-Za-z0-9_./\-]+$")
    pip: Pip = Field(default_factory=Pip)
    horovod: Horovod | None = None
    mpi: Mpi
    project: bool = Field(
        default=True, description="copy hpcdl/ and examples/ to /opt/hpcdl (PYTHONPATH)"
    )
    env: dict[str, str] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    compression: Literal["gzip", "lz4", "lzo", "xz", "zstd"] | None = Field(
        default=None,
        description="squashfs compression of the SIF (mksquashfs -comp); default: the "
        "runtime's (gzip). Every process that starts from a SIF decompresses what it "
        "reads, so a faster codec shortens each rank's start-up.",
    )
    test: list[str] = Field(
        default_factory=list, description="extra %test commands (after the capability check)"
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"{v!r} is not a valid image name (letters, digits, . _ -)")
        return v

    @field_validator("apt_packages")
    @classmethod
    def _apt(cls, v: list[str]) -> list[str]:
        for pkg in v:
            if not _DEB.match(pkg):
                raise ValueError(f"{pkg!r} is not a Debian package name")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not _ENV_NAME.match(key):
                raise ValueError(f"{key!r} is not a valid environment variable name")
            if "\n" in str(value):
                raise ValueError(f"{key}: value must be one line")
        return v

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not _LABEL.match(key):
                raise ValueError(f"label {key!r}: letters, digits, . _ - only")
            if "\n" in str(value):
                raise ValueError(f"label {key}: value must be one line")
        return v

    @field_validator("test")
    @classmethod
    def _test(cls, v: list[str]) -> list[str]:
        for line in v:
            if "\n" in line:
                raise ValueError("each test command must be one line")
        return v

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
    m = _REQ.match(req)
    return m.group(1).lower() if m else req.lower()


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
    raise UserInputError(f"spec: '{ref}' is neither a file nor a bundled spec (bundled: {names})")


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
