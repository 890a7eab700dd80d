"""The job's dataset: the request's data part (--data, --synthetic, --stage-data and who
reads the data), decided once into the plan's DataPart (plan.json's ``data``), and the
two template blocks made from it: the copy to every node (--stage-data) and the native
mount of a packed file. Every reader of "which dataset does the job read" (the bundled
example's --data, the container's bind, the shared-path check, the many-files warning)
reads the DataPart instead of deriving it again. Pure.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Literal

from hpcdl.core.templating import Raw, shell_join
from hpcdl.data.mount import (
    CONTAINER_MOUNT,
    DATA_VARIABLE,
    STAGED_DATA_VARIABLE,
    image_bind,
    is_packed_name,
    native_mount_dir,
)
from hpcdl.errors import ValidationError
from hpcdl.profiles.schema import Profile
from hpcdl.schedulers.base import JobSpec, ScriptDialect

# Who reads the dataset: the bundled example (as its --data), a user's COMMAND (only a
# packed file reaches it, mounted at $HPCDL_DATA) or the probe (no dataset).
Reader = Literal["example", "command", "probe"]


@dataclass(frozen=True)
class DataRequest:
    """The request's data part, as given: --data, --synthetic, --stage-data, and who
    reads the data (JobRequest sets it from the launch and probe parts)."""

    path: str | None = None
    synthetic: bool = False
    stage: bool = False
    reader: Reader = "example"


@dataclass(frozen=True)
class DataPart:
    """The dataset the job reads, decided once (decide_data)."""

    reader: Reader
    given: str | None  # --data as typed
    synthetic: bool  # --synthetic
    # The path the job reads: --data, else for the bundled example the profile's
    # paths.imagenet; None: no dataset (--synthetic, the probe, a COMMAND without --data).
    source: str | None
    origin: Literal["--data", "profile paths.imagenet"] | None
    packed: str | None  # the packed file (hpcdl data pack) the job mounts, absolute
    stage: bool  # --stage-data: each node gets a copy of the packed file

    @property
    def generated(self) -> bool:
        """The bundled example runs on generated data (its --synthetic)."""
        return self.reader == "example" and self.source is None

    def host_path(self, image: str | None) -> str | None:
        """The path the compute nodes must see on the host (check_shared_paths): a
        packed file always (the job mounts it), the example's dataset natively; in an
        image --data is the container's path (a --bind makes it)."""
        return (self.source if self.reader == "example" and not image else None) or self.packed

    def example_args(self, image: str | None) -> list[str]:
        """What the bundled example is told: ``--data`` and the path it reads (a packed
        file's mount: fixed in an image, the node's mount point $HPCDL_DATA natively),
        or ``--synthetic``."""
        if self.packed:
            return ["--data", CONTAINER_MOUNT if image else Raw(f'"${DATA_VARIABLE}"')]
        return ["--data", self.source] if self.source else ["--synthetic"]

    def image_binds(self, *, staged: bool) -> list[str]:
        """The container's bind of a packed file: the shared file, or with ``staged``
        each node's copy ($HPCDL_DATA_FILE, whose path holds the job id and is only
        known to the script); none otherwise (a tree is the user's --bind)."""
        if not self.packed:
            return []
        return [Raw(image_bind(f'"${STAGED_DATA_VARIABLE}"')) if staged
                else image_bind(self.packed)]

    def to_dict(self) -> dict[str, Any]:
        """plan.json's ``data``."""
        return {"reader": self.reader, "given": self.given, "synthetic": self.synthetic,
                "source": self.source, "origin": self.origin, "packed": self.packed,
                "stage": self.stage}


def decide_data(imagenet: str | None, data: DataRequest) -> DataPart:
    """Which dataset the job reads (``imagenet``: the profile's paths.imagenet, the
    bundled example's default). The one place this is decided."""
    source: str | None = None
    origin: Literal["--data", "profile paths.imagenet"] | None = None
    if not data.synthetic and data.reader != "probe":
        if data.path:
            source, origin = data.path, "--data"
        elif data.reader == "example" and imagenet:
            source, origin = imagenet, "profile paths.imagenet"
    packed = (os.path.normpath(os.path.abspath(source))
              if source and is_packed_name(source) else None)
    return DataPart(reader=data.reader, given=data.path, synthetic=data.synthetic,
                    source=source, origin=origin, packed=packed, stage=data.stage)


def data_stage(profile: Profile, data: DataPart, spec: JobSpec,
               dialect: ScriptDialect) -> dict[str, Any] | None:
    """How the script copies the packed dataset to every node before the ranks start
    (--stage-data: the same sbcast step as the image's, a template ``stage`` item), or
    None. Only a packed file is staged: a tree would be one sbcast per file, which is
    what packing avoids (--stage-to copies a tree). Raises ValidationError."""
    if not data.stage:
        return None
    source = data.packed
    if not source:
        if data.given and not data.synthetic:
            tree = data.given.rstrip("/") or "/"
            raise ValidationError(
                f"stage-data: --data {data.given} is not a packed file; --stage-data "
                f"copies one DATA.sqfs to every node (pack the tree once: hpcdl data "
                f"pack {tree} -o {tree}.sqfs)")
        raise ValidationError(f"stage-data: needs a packed --data DATA.sqfs (this job has "
                              f"{'--synthetic' if data.synthetic else 'no --data'})")
    if refused := dialect.unsupported(profile, "stage-data"):
        raise ValidationError(refused)
    local = profile.paths.local_scratch
    if not local:
        raise ValidationError(f"stage-data: profile {profile.name} has no paths.local_scratch "
                              f"(the node-local directory --stage-data copies the dataset to)")
    name = f"data-{PurePosixPath(source).name}"
    return {**dialect.stage_file(spec, local, name, "dataset"), "what": "dataset",
            "shown_what": "the packed dataset", "source": shell_join([source]),
            "var": STAGED_DATA_VARIABLE}


def data_mount(profile: Profile, data: DataPart, image: str | None,
               dialect: ScriptDialect, *, staged: bool = False) -> dict[str, str] | None:
    """How the ranks see a packed dataset (hpcdl.data.mount), or None: in an image a bind
    (container_binds adds it), natively a squashfuse_ll (else squashfuse) mount on every
    node that the script makes before the first rank and removes when it ends (the
    template's ``packed``). ``staged``: from each node's copy ($HPCDL_DATA_FILE,
    data_stage), not the shared file. Raises ValidationError where the scheduler's
    script has no such block."""
    source = data.packed
    if not source:
        return None
    where = f"each node's copy of {source}" if staged else f"the packed file {source}"
    if image:
        return {"source": source, "note": f"dataset: {where}, mounted by "
                f"the container runtime read-only at {CONTAINER_MOUNT} ($HPCDL_DATA)."}
    if dialect.unsupported(profile, "stage"):
        raise ValidationError(
            f"data: natively a packed dataset is mounted by the job script on every node "
            f"with srun; profile {profile.name} is {profile.scheduler.type}: give --image "
            f"(the container runtime mounts it)")
    head = native_mount_dir(profile.paths.local_scratch)
    # The note shows the directory as the script names it: the job-id expression bare.
    shown = f"{head}{dialect.job_id_word.strip(chr(34))}"
    return {"source": source,
            "source_q": f'"${STAGED_DATA_VARIABLE}"' if staged else shell_join([source]),
            "mount": shell_join([head]) + dialect.job_id_word,
            "note": f"dataset: {where}, mounted read-only with squashfuse_ll (else "
                    f"squashfuse) on every node at {shown} ($HPCDL_DATA, below), "
                    f"unmounted at the end."}
