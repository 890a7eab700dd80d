"""The job's dataset: the request's data part (--data, --synthetic, --stage-data and who
reads the data), decided once into the plan's DataPart (plan.json's ``data``), and the
two template blocks made from it: the copy to every node (--stage-data) and the native
mount of a packed file. Every reader of "which dataset does the job read" (the bundled
example's --data, the container's bind, the shared-path check, the many-files warning)
reads the DataPart instead of deriving it again. The request's own checks are here too
(DataRequest.check_path, check_alone), and what --data names on this host
(check_data_kind, the one function here that looks at files). Pure otherwise.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from hpcdl.core.templating import Raw, shell_join
from hpcdl.core.tokens import PATH, check_field
from hpcdl.data.mount import (
    CONTAINER_MOUNT,
    DATA_VARIABLE,
    SQUASHFS_MAGIC,
    STAGED_DATA_VARIABLE,
    image_bind,
    is_packed_name,
    native_mount_dir,
)
from hpcdl.errors import UserInputError, ValidationError
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

    def check_path(self) -> None:
        """--data can be written into the script (check_request calls it where the
        other paths are checked). Raises ValidationError."""
        if self.path is not None:
            check_field("data", self.path, PATH)

    def check_alone(self) -> None:
        """--synthetic and --data exclude each other. Raises ValidationError."""
        if self.synthetic and self.path:
            raise ValidationError(f"synthetic: --synthetic and --data {self.path!r} "
                                  f"exclude each other")


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


def _kind(st: os.stat_result) -> str:
    """What a path that is no directory is, in words."""
    for test, words in ((stat.S_ISREG, f"a regular file ({st.st_size:,} bytes)"),
                        (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                        (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket")):
        if test(st.st_mode):
            return words
    return "no directory"


DATA_TAKES = ("--data takes a dataset folder (DIR/train/<class>/, DIR/val/<class>/) or a "
              "packed dataset DATA.sqfs (hpcdl data pack)")


def check_data_kind(data: DataRequest) -> None:
    """Raise ValidationError (one line: what the path is, what --data takes) when
    ``--data`` names a path on this host that is neither a directory nor a SquashFS
    file named *.sqfs (a text file, a device, a SquashFS file under another name, a
    *.sqfs that is no SquashFS); nothing for a path this host lacks (the bundled
    example's check_inputs says that; a COMMAND's data may live only on the nodes).
    For every command that takes --data, dry run or not (hpcdl.jobs.prepare calls it
    first, through Cluster.check_data: over a transport --data is a path on the
    cluster), so a user's COMMAND is not submitted without the data it was given."""
    if not data.path or data.synthetic:
        return
    path = Path(data.path).expanduser()
    try:
        st = path.stat()
    except OSError:
        return
    if is_packed_name(data.path):
        from hpcdl.data.packed import check_packed

        try:
            check_packed(path)
        except UserInputError as exc:
            raise ValidationError(f"data: {exc.message}", hint=DATA_TAKES) from None
        return
    if stat.S_ISDIR(st.st_mode):
        return
    what = _kind(st)
    if stat.S_ISREG(st.st_mode):
        try:
            with path.open("rb") as fh:
                if fh.read(len(SQUASHFS_MAGIC)) == SQUASHFS_MAGIC:
                    raise ValidationError(
                        f"data: --data {data.path} is a SquashFS file without the .sqfs "
                        f"name a packed dataset is known by",
                        hint=f"rename it (or link it) as {path.name}.sqfs")
        except OSError:
            pass
    raise ValidationError(f"data: --data {data.path} is {what}, neither a dataset folder nor "
                          f"a packed SquashFS file", hint=DATA_TAKES)
