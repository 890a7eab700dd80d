"""Where a job sees a packed dataset (``hpcdl data pack``): pure names and paths, shared
by the plan (which binds or mounts it) and the packer.

In an image the file is bound with Apptainer's image mount (``-B
DATA.sqfs:/data:image-src=/,ro``: Apptainer mounts the SquashFS itself, setuid or
unprivileged); natively the job script mounts it on every node with squashfuse_ll
(squashfuse where a node has no squashfuse_ll), below the node-local scratch, and the ranks get that directory as ``--data`` ($HPCDL_DATA).
"""

from __future__ import annotations

from pathlib import PurePosixPath

# The superblock's first four bytes (little-endian 0x73717368).
SQUASHFS_MAGIC = b"hsqs"
PACKED_SUFFIXES = (".sqfs", ".squashfs")
# The packed dataset's root inside a container.
CONTAINER_MOUNT = "/data"
# The variable that holds the dataset's directory in the job (both ways).
DATA_VARIABLE = "HPCDL_DATA"
# The node's copy of a staged packed file (submit --stage-data): what the bind or the
# mount reads instead of the shared file.
STAGED_DATA_VARIABLE = "HPCDL_DATA_FILE"


def is_packed_name(path: str) -> bool:
    """``path`` names a packed dataset (by its suffix; the file's content is checked
    before submission: hpcdl.data.packed.check_packed)."""
    return path.lower().endswith(PACKED_SUFFIXES)


def image_bind(source: str) -> str:
    """The -B of an image run: the file's root at CONTAINER_MOUNT, read-only."""
    return f"{source}:{CONTAINER_MOUNT}:image-src=/,ro"


def native_mount_dir(local_scratch: str | None) -> str:
    """The directory (before the job id, which the script appends) each node mounts the
    file on: node-local scratch, else /tmp."""
    return str(PurePosixPath(local_scratch or "/tmp") / "hpcdl-data-")
