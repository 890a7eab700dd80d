"""The ImageFolder (ImageNet) layout: ``ROOT/{train,val}/<class>/<image>``.

``scan_imagefolder`` checks a dataset directory and lists its samples, so a missing
or malformed dataset is reported as one line naming the path and what is wrong,
before any training process starts. Standard library only: it reads file headers,
it does not decode images.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from hpcdl.jobside.errors import UserInputError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".webp")
LAYOUT = "expected ImageFolder layout DIR/train/<class>/<image> and DIR/val/<class>/<image>"

# Leading bytes of the formats above; a file with an image name but none of these
# (an HTML error page saved as .JPEG, a truncated download) is malformed.
_MAGIC = (
    b"\xff\xd8\xff",  # JPEG
    b"\x89PNG\r\n\x1a\n",  # PNG
    b"P3",
    b"P6",  # PPM
    b"BM",  # BMP
    b"RIFF",  # WEBP container
)


# How much of a file's end ``image_defect`` reads: a JPEG's end-of-image marker (FFD9)
# must lie in it. Entropy-coded JPEG data never holds FF D9 (an FF there is followed by
# 00 or a restart marker), so a file cut short has none in its last bytes; a kilobyte
# leaves room for the padding some cameras and editors write after the marker.
TAIL = 1024
_PNG = b"\x89PNG\r\n\x1a\n"


def image_defect(head: bytes, tail: bytes, size: int) -> str | None:
    """What is wrong with an image file, from its first bytes ``head`` (8 at least), its
    last bytes ``tail`` (TAIL at most) and its ``size``; None when nothing is. Cheap
    checks, no decode: empty; not one of the formats (by its first bytes, whatever its
    name); a JPEG without its end marker FFD9 near the end, a PNG without its IEND
    chunk; a BMP or WEBP shorter than its header says."""
    if size == 0:
        return "is empty (0 bytes)"
    if head.startswith(b"\xff\xd8\xff"):
        if b"\xff\xd9" not in tail:
            return (f"is a truncated JPEG: no end-of-image marker FFD9 in its last "
                    f"{min(size, TAIL)} bytes")
    elif head.startswith(_PNG):
        if b"IEND" not in tail[-16:]:
            return "is a truncated PNG: it does not end with the IEND chunk"
    elif head.startswith(b"BM") and len(head) >= 6:
        declared = int.from_bytes(head[2:6], "little")
        if declared > size:
            return f"is a truncated BMP: {size} bytes, its header says {declared}"
    elif head.startswith(b"RIFF") and len(head) >= 8:
        declared = int.from_bytes(head[4:8], "little") + 8
        if declared > size:
            return f"is a truncated WEBP: {size} bytes, its header says {declared}"
    elif not any(head.startswith(m) for m in _MAGIC):
        return f"is not an image (unrecognised header {head[:4].hex()})"
    return None


def read_ends(path: str) -> tuple[bytes, bytes, int]:
    """The first 8 bytes, the last TAIL bytes and the size of the file ``path`` (two
    reads; raises OSError)."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        head = fh.read(8)
        tail = head if size <= 8 else os.pread(fh.fileno(), min(size, TAIL), max(0, size - TAIL))
    return head, tail, size


@dataclass(frozen=True)
class ImageFolder:
    """A checked dataset: class names (sorted, index = label) and samples per split."""

    root: Path
    classes: tuple[str, ...]
    samples: dict[str, list[tuple[str, int]]] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        return {split: len(items) for split, items in self.samples.items()}


def _fail(root: Path, what: str, hint: str | None = LAYOUT) -> UserInputError:
    return UserInputError(f"dataset {root}: {what}", hint=hint)


def _is_image_name(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS) and not name.startswith(".")


def _check_head(head: bytes, path: str, root: Path) -> None:
    if not head:
        raise _fail(root, f"{path} is empty (0 bytes)", hint=None)
    if not any(head.startswith(m) for m in _MAGIC):
        raise _fail(
            root, f"{path} is not an image (unrecognised header {head[:4].hex()})", hint=None
        )


class Tree(Protocol):
    """What the layout check reads: a directory on disk, or a packed file's listing."""

    def subdirs(self, rel: str) -> list[str] | None:
        """Names of the visible directories in ``rel`` (None: ``rel`` is no directory)."""

    def files(self, rel: str) -> list[str]:
        """Names of the regular files in the directory ``rel``."""

    def heads(self, rels: list[str]) -> dict[str, bytes]:
        """The first 8 bytes of each file (raises UserInputError when one is unreadable)."""


@dataclass
class Listing:
    """One directory of a walked tree (walk_tree): what ``hpcdl data check`` reads and
    what ``hpcdl data pack`` packs, links followed."""

    path: str  # where it is read: the real path when it was reached through a link
    mode: int  # its permission bits
    via_link: bool  # reached through a symbolic link (it, or a directory above it)
    subdirs: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)  # regular files, links to them too
    links: list[str] = field(default_factory=list)  # the names here that are links


def _rel(parent: str, name: str) -> str:
    return f"{parent}/{name}" if parent else name


def walk_tree(root: Path, only: tuple[str, ...] | None = None) -> dict[str, Listing]:
    """Every directory below ``root`` by its path relative to it ("" for ``root``), with
    symbolic links to directories and files followed wherever they point (datasets are
    often assembled from pieces on other disks): the one reading of a tree that both
    ``hpcdl data check`` and ``hpcdl data pack`` use, so a file packs what the check
    counted. ``only``: the top-level names to descend into (the splits; None: all).

    Raises UserInputError (one line) for a link that loops back to a directory above
    it, a link that cannot be followed, a link to something neither file nor
    directory, and an unreadable directory."""
    top = os.stat(root)
    out: dict[str, Listing] = {}
    # (rel, path, via_link, the (device, inode) and rel of every directory above it)
    todo: list[tuple[str, str, bool, tuple[tuple[tuple[int, int], str], ...]]] = [
        ("", str(root), False, (((top.st_dev, top.st_ino), ""),))]
    out[""] = Listing(str(root), stat.S_IMODE(top.st_mode), False)
    while todo:
        rel, path, via_link, above = todo.pop()
        here = out[rel]
        try:
            with os.scandir(path) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            raise _fail(root, f"cannot read {path}: {exc.strerror}", hint=None) from None
        for entry in entries:
            sub = _rel(rel, entry.name)
            if not rel and only is not None and entry.name not in only:
                continue
            if entry.is_symlink():
                here.links.append(entry.name)
                target = os.readlink(entry.path)
                try:
                    st = os.stat(entry.path)
                except OSError as exc:
                    raise _fail(root, f"{sub} is a link to {target} that cannot be followed: "
                                      f"{exc.strerror}", hint=None) from None
                if stat.S_ISDIR(st.st_mode):
                    key = (st.st_dev, st.st_ino)
                    loop = next((r for k, r in above if k == key), None)
                    if loop is not None:
                        raise _fail(root, f"{sub} is a link to {target} that loops back to "
                                          f"{loop or '.'} (a directory above it)", hint=None)
                    real = os.path.realpath(entry.path)
                    here.subdirs.append(entry.name)
                    out[sub] = Listing(real, stat.S_IMODE(st.st_mode), True)
                    todo.append((sub, real, True, (*above, (key, sub))))
                elif stat.S_ISREG(st.st_mode):
                    here.files.append(entry.name)
                else:
                    raise _fail(root, f"{sub} is a link to {target}, neither a file nor a "
                                      f"directory", hint=None)
            elif entry.is_dir(follow_symlinks=False):
                st = entry.stat(follow_symlinks=False)
                here.subdirs.append(entry.name)
                out[sub] = Listing(entry.path, stat.S_IMODE(st.st_mode), via_link)
                todo.append((sub, entry.path, via_link,
                             (*above, ((st.st_dev, st.st_ino), sub))))
            elif entry.is_file(follow_symlinks=False):
                here.files.append(entry.name)
    return out


class DirTree:
    """A dataset directory on disk, as walk_tree reads it."""

    def __init__(self, root: Path, listing: dict[str, Listing] | None = None,
                 splits: tuple[str, ...] = ("train", "val")) -> None:
        self.root = root
        self.listing = listing if listing is not None else walk_tree(root, only=splits)

    def subdirs(self, rel: str) -> list[str] | None:
        here = self.listing.get(rel)
        return None if here is None else list(here.subdirs)

    def files(self, rel: str) -> list[str]:
        here = self.listing.get(rel)
        return [] if here is None else list(here.files)

    def heads(self, rels: list[str]) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        for rel in rels:
            try:
                with open(self.root / rel, "rb") as fh:
                    out[rel] = fh.read(8)
            except OSError as exc:
                raise _fail(self.root, f"cannot read {self.root / rel}: {exc.strerror}",
                            hint=None) from None
        return out


def _list_split(
    root: Path, tree: Tree, split: str, classes: tuple[str, ...] | None, firsts: list[str]
) -> tuple[tuple[str, ...], list[tuple[str, int]]]:
    dirs = tree.subdirs(split)
    if dirs is None:
        raise _fail(root, f"no {split}/ directory")
    found = sorted(d for d in dirs if not d.startswith("."))
    if not found:
        raise _fail(root, f"{split}/ holds no class directories")
    if classes is None:
        classes = tuple(found)
    else:
        unknown = sorted(set(found) - set(classes))
        if unknown:
            raise _fail(
                root,
                f"{split}/ has {len(unknown)} class(es) that train/ lacks, e.g. {unknown[0]!r}",
                hint="val/ must use the same class directory names as train/",
            )
    index = {name: i for i, name in enumerate(classes)}
    samples: list[tuple[str, int]] = []
    for name in found:
        files = sorted(f for f in tree.files(f"{split}/{name}") if _is_image_name(f))
        if not files:
            raise _fail(
                root,
                f"{split}/{name}/ holds no images ({', '.join(IMAGE_EXTENSIONS)})",
                hint=None,
            )
        # Headers of the first file per class: catches a wrong directory quickly
        # without reading a million files.
        firsts.append(f"{split}/{name}/{files[0]}")
        samples.extend((str(root / split / name / f), index[name]) for f in files)
    return classes, samples


def scan_tree(
    root: Path, tree: Tree, splits: tuple[str, ...] = ("train", "val")
) -> ImageFolder:
    """The layout check of ``scan_imagefolder`` on any ``tree`` (a directory, a packed
    file's listing); sample paths are ``root``/split/class/file. Raises UserInputError."""
    classes: tuple[str, ...] | None = None
    samples: dict[str, list[tuple[str, int]]] = {}
    firsts: list[str] = []
    for split in splits:
        classes, samples[split] = _list_split(root, tree, split, classes, firsts)
    assert classes is not None
    for rel, head in tree.heads(firsts).items():
        _check_head(head, str(root / rel), root)
    return ImageFolder(root=root, classes=classes, samples=samples)


def scan_imagefolder(
    root: str | os.PathLike[str], splits: tuple[str, ...] = ("train", "val")
) -> ImageFolder:
    """Check ``root`` and list its samples. The first split defines the classes.

    Raises UserInputError (one line, naming the path and the problem) when the
    directory is missing, a split or class directory is missing or empty, a split
    has classes the first one lacks, or a sampled file is not an image.
    """
    path = dataset_dir(root)
    return scan_tree(path, DirTree(path, splits=splits), splits)


def dataset_dir(root: str | os.PathLike[str]) -> Path:
    """``root`` as a Path, or UserInputError (one line) when it is missing or no
    directory."""
    path = Path(root)
    if not path.exists():
        raise _fail(path, "no such directory", hint="pass --data DIR, or --synthetic")
    if not path.is_dir():
        raise _fail(path, "is not a directory")
    return path
