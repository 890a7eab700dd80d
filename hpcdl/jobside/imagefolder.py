"""The ImageFolder (ImageNet) layout: ``ROOT/{train,val}/<class>/<image>``.

``scan_imagefolder`` checks a dataset directory and lists its samples, so a missing
or malformed dataset is reported as one line naming the path and what is wrong,
before any training process starts. Standard library only: it reads file headers,
it does not decode images.
"""

from __future__ import annotations

import os
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


class DirTree:
    """A dataset directory on disk."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def subdirs(self, rel: str) -> list[str] | None:
        base = self.root / rel
        if not base.is_dir():
            return None
        return [e.name for e in os.scandir(base) if e.is_dir()]

    def files(self, rel: str) -> list[str]:
        return [e.name for e in os.scandir(self.root / rel) if e.is_file()]

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
    path = Path(root)
    if not path.exists():
        raise _fail(path, "no such directory", hint="pass --data DIR, or --synthetic")
    if not path.is_dir():
        raise _fail(path, "is not a directory")
    return scan_tree(path, DirTree(path), splits)
