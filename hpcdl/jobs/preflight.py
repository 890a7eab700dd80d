"""Checks on the submitting host before a job is queued: things a user will hit
(an image that was never built, a dataset path with a typo) are cheaper to report
now than after the job waited in the queue and died.

Cluster filesystems are shared between login and compute nodes, so a path that is
missing here is missing in the job too.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from hpcdl.core.gpuarch import ImageArchFacts, facts_from_record
from hpcdl.data.mount import is_packed_name
from hpcdl.errors import UserInputError, ValidationError
from hpcdl.plan import DataPart, JobRequest, RuntimeMode
from hpcdl.plan.rules import on_shared_path
from hpcdl.profiles.schema import Profile

if TYPE_CHECKING:
    from hpcdl.container.runtime import RuntimeFacts

# The image's build record and runtime (hpcdl.container) and a packed dataset's reader
# (hpcdl.data.packed) are imported by the checks that meet an image or a *.sqfs: a
# submission without them does not load them on its way to sbatch (issue 43).

# A dataset tree on a shared path with more files than this is worth packing: each rank
# opens every file every epoch through the parallel filesystem's metadata servers (a
# small ImageNet subset already has tens of thousands). Counting stops one past it, so
# the check costs at most this many directory entries whatever the tree's size.
MANY_FILES = 10_000


def count_files(root: str | os.PathLike[str], stop: int) -> int:
    """Files (anything not a directory) below ``root``, counted until ``stop``: the
    result is min(files, stop). Unreadable directories are skipped."""
    found, todo = 0, [os.fspath(root)]
    while todo:
        try:
            with os.scandir(todo.pop()) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        todo.append(entry.path)
                    else:
                        found += 1
                        if found >= stop:
                            return found
        except OSError:
            continue
    return found


def many_files_warning(profile: Profile, dataset: DataPart, *,
                       limit: int = MANY_FILES) -> str | None:
    """One line when the job's dataset (the plan's decided part) is a directory tree on
    a shared path (the profile's paths.shared; with none listed, anywhere but its local
    scratch) holding more than ``limit`` files, with the ``hpcdl data pack`` command
    that turns it into one file; None otherwise (a packed file, --synthetic, a path this
    host does not have, a small tree)."""
    data = dataset.source
    if not data or dataset.packed or not Path(data).expanduser().is_dir():
        return None
    path = os.path.normpath(os.path.abspath(Path(data).expanduser()))
    shared, local = profile.paths.shared, profile.paths.local_scratch
    if shared and not on_shared_path(path, shared):
        return None
    if not shared and local and on_shared_path(path, [local]):
        return None
    count = count_files(path, limit + 1)
    if count <= limit:
        return None
    return (f"data: {path} is a directory tree of more than {limit:,} files on a shared "
            f"path: every rank opens each of them every epoch through the filesystem's "
            f"metadata servers; pack it once and pass the file: hpcdl data pack {path} -o "
            f"{path}.sqfs")


# Images that live elsewhere: nothing on this host to read (nor to push).
REMOTE_IMAGE = re.compile(r"[a-z][a-z0-9+.-]*://.*")


def image_arch_facts(image: str | None) -> ImageArchFacts | None:
    """What the image's torch was compiled for, read from the record ``hpcdl build``
    keeps beside it (no container is started). None without an image; an
    ImageArchFacts with ``unknown`` set when it cannot be read. Never raises.
    """
    if not image:
        return None
    if REMOTE_IMAGE.fullmatch(image):
        return ImageArchFacts(image=image, unknown="a remote image is not read before submission")
    path = Path(image).expanduser()
    if not path.is_file():
        return ImageArchFacts(image=image, unknown="the image is not a file on this host")
    from hpcdl.container.hashing import read_record, sidecar

    record = read_record(sidecar(path, ".hash"))
    # A record older than the image belongs to an image that was since replaced.
    try:
        stale = record is not None and \
            sidecar(path, ".hash").stat().st_mtime_ns < path.stat().st_mtime_ns
    except OSError:
        stale = True
    if stale:
        return ImageArchFacts(image=image, unknown="its build record is older than the image")
    return facts_from_record(image, record)


def check_inputs(req: JobRequest, image: str | None = None) -> None:
    """Raise ValidationError (exit 2) with the fix when the image, the dataset or the
    command's script is missing. ``image``: the plan's (default: ``req.container.image``)."""
    image = image or req.container.image
    if image:
        if not Path(image).expanduser().exists():
            raise ValidationError(
                f"image: {image!r} does not exist",
                hint=f"build it first: hpcdl build pytorch-horovod-cpu -o {image} "
                f"(in a checkout, scripts/build-image.sh -o {image} also fills the "
                "wheelhouse the CPU spec installs from)",
            )
    script = command_script(req.launch.command)
    # The job starts in this directory (sbatch's default), and Apptainer binds it, so a
    # relative script path must exist here. An absolute one may live only in the image.
    if script and (not Path(script).is_absolute() or not image) and not Path(script).exists():
        raise ValidationError(
            f"command: script {script!r} does not exist (in {Path.cwd()})",
            hint="give the script's path relative to where you submit, or an absolute one",
        )
    # --data's kind (check_data_kind) was checked first by every prepare, dry run or not.
    if req.data.path and is_packed_name(req.data.path):
        from hpcdl.data.packed import check_packed

        try:
            check_packed(Path(req.data.path).expanduser())
        except UserInputError as exc:
            raise ValidationError(f"data: {exc.message}", hint=exc.hint) from None
    elif req.data.path and not req.launch.command:
        data = Path(req.data.path).expanduser()
        if not data.is_dir():
            raise ValidationError(
                f"data: dataset folder {req.data.path!r} does not exist",
                hint=f"make a tiny one for a test run: hpcdl data make-tiny {req.data.path}",
            )
        if not (data / "train").is_dir():
            raise ValidationError(
                f"data: {req.data.path!r} has no train/ folder (ImageNet layout: train/ and val/, "
                f"one folder per class)",
                hint=f"make a tiny one for a test run: hpcdl data make-tiny {req.data.path}",
            )


_PYTHON = re.compile(r"python[0-9.]*")


def command_script(command: tuple[str, ...]) -> str | None:
    """The script of ``python[3] [options] SCRIPT.py ...``, or None (not a python script
    command, ``-c``/``-m``, or no .py argument)."""
    if not command or not _PYTHON.fullmatch(PurePosixPath(command[0]).name):
        return None
    for arg in command[1:]:
        if arg in ("-c", "-m") or arg.startswith(("-c", "-m")) and not arg.startswith("--"):
            return None
        if arg.startswith("-"):
            continue
        return arg if arg.endswith(".py") else None
    return None


def runtime_mode(image: str | None, binary: str | None = None,
                 facts: RuntimeFacts | None = None) -> tuple[RuntimeMode | None, str | None]:
    """How the container runtime will run this user's ranks, judged on this host (a
    login node has its compute nodes' Apptainer installation), and a warning when this
    host cannot run images as this user at all. (None, None) without an image or without
    a runtime here (then the profile's container.mode decides). An unusable runtime
    plans as unprivileged, the nodes' likely way, and says what is missing here."""
    if image is None:
        return None, None
    from hpcdl.container.runtime import gather_runtime_facts, runtime_mode_reason
    from hpcdl.container.runtime import runtime_mode as container_runtime_mode

    facts = facts or gather_runtime_facts(binary)
    if facts.runtime is None:
        return None, None
    mode = container_runtime_mode(facts)
    if mode == "unusable":
        return "unprivileged", (f"this host cannot run container images as this user "
                                f"({runtime_mode_reason(facts)}); if the compute nodes are "
                                f"set up the same way the ranks will fail to start: see "
                                f"hpcdl doctor")
    return mode, None
