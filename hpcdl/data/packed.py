"""A dataset packed into one read-only SquashFS file (``hpcdl data pack``), and the
layout check of such a file without mounting it (``hpcdl data check DATA.sqfs``).

Why one file: an ImageFolder read from a parallel filesystem costs every rank a
metadata operation per directory and an open per image, every epoch, on the
filesystem's metadata servers. A SquashFS file is one open there; Apptainer mounts it
into the container (``-B DATA.sqfs:/data:image-src=/``) and squashfuse mounts it
natively, and the examples see an ordinary directory.

``pack_plan`` decides everything (the mksquashfs argv, the temporary name beside the
output) and is pure apart from the layout check of the source; ``execute`` runs it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from hpcdl.container.hashing import RECORD_VERSION, content_hash, file_sha256, sidecar
from hpcdl.core import proc
from hpcdl.core.atomic import write_json_atomic
from hpcdl.data.mount import SQUASHFS_MAGIC, is_packed_name
from hpcdl.errors import ToolError, UserInputError
from hpcdl.jobside.imagefolder import (
    DirTree,
    ImageFolder,
    Listing,
    dataset_dir,
    image_defect,
    read_ends,
    scan_tree,
    walk_tree,
)

# Compression: real ImageNet JPEGs (~110 KB) are already entropy-coded, so the data
# blocks barely shrink; what compresses is the metadata (inode and directory tables)
# and the small files packed together into fragments (identical JPEG headers).
# gzip is the default because every kernel's squashfs and every squashfuse reads it;
# lz4 decodes faster where both ends have it. Figures: docs/guide/data.md.
COMPRESSIONS = ("gzip", "lz4", "zstd", "none")
DEFAULT_COMPRESSION = "gzip"
# Same tree, same bytes: no owner, no xattrs, every timestamp 0 (the file's own hash
# is then a content name, as an image's is). The root readable by every user: a
# dataset made under a private temporary name (mode 0700) is packed for all ranks.
FIXED_OPTIONS = ("-noappend", "-no-xattrs", "-all-root", "-root-mode", "0755",
                 "-mkfs-time", "0", "-all-time", "0")
MKSQUASHFS = "mksquashfs"
# The block size: files smaller than a block are packed together into fragment blocks
# of that size, and reading one such file decompresses its whole fragment. Images read
# in a shuffled order hit a different fragment each time, so mksquashfs's 128 KiB
# default makes 1 KB images cost ~100x their size in decompression. Measured (a fresh
# loop mount, every file read once shuffled; bench/bench_pack_blocks.py, figures in
# docs/guide/data.md): 20,200 JPEGs of 1 KB, 19.0 s and 12.2 s of CPU with 128K blocks,
# 14.5 s and 7.1 s with 4K or 32K; 4,100 of 19 KB, 3.45 s / 2.14 s CPU with 128K, 3.19 s /
# 1.55 s with 32K (the file 17% larger). So "auto" takes the smallest power of two at
# least the files' median size, between mksquashfs's 4K and its 128K default
# (ImageNet's ~110 KB JPEGs keep 128K).
BLOCK_SIZES = tuple(4096 << i for i in range(9))  # 4K .. 1M, mksquashfs's range
AUTO_BLOCK_MAX = 128 * 1024


def block_size_for(sizes: list[int]) -> int:
    """The "auto" block size for files of ``sizes`` bytes (see BLOCK_SIZES' comment)."""
    if not sizes:
        return AUTO_BLOCK_MAX
    median = sorted(sizes)[len(sizes) // 2]
    return next((b for b in BLOCK_SIZES if b >= median and b <= AUTO_BLOCK_MAX),
                AUTO_BLOCK_MAX)


def parse_block_size(text: str) -> int | None:
    """``--block-size``: "auto" (None) or a power of two from 4K to 1M ("64K", "1M", or
    bytes). Raises UserInputError (one line) for anything else."""
    t = text.strip().upper()
    if t == "AUTO":
        return None
    factor = {"K": 1024, "M": 1024 * 1024}.get(t[-1:], 1)
    digits = t[:-1] if factor != 1 else t
    if digits.isdigit() and int(digits) * factor in BLOCK_SIZES:
        return int(digits) * factor
    raise UserInputError(f"--block-size {text!r}: auto, or a power of two from 4K to 1M "
                         f"(4K, 8K, ... 128K, ... 1M)")
UNSQUASHFS = "unsquashfs"


def compression_args(compression: str) -> list[str]:
    """mksquashfs's options for ``compression`` (one of COMPRESSIONS). Raises
    UserInputError for another."""
    if compression not in COMPRESSIONS:
        raise UserInputError(f"--compression {compression!r} is not one of "
                             f"{', '.join(COMPRESSIONS)}")
    if compression == "none":
        return ["-noI", "-noId", "-noD", "-noF", "-noX"]
    return ["-comp", compression]


@dataclass(frozen=True)
class PackPlan:
    source: Path
    output: Path
    temp: Path  # mksquashfs writes here; renamed to output when complete
    argv: tuple[str, ...]
    compression: str
    block_size: int
    classes: int
    counts: dict[str, int] = field(default_factory=dict)
    files: int = 0  # every file mksquashfs adds (images, and any other)
    # What the tree's symbolic links hold (link_definitions): the links left out of
    # mksquashfs's own walk (-ef, one a line) and added as what they point to (-pf).
    excludes: tuple[str, ...] = ()
    pseudo: tuple[str, ...] = ()

    @property
    def exclude_file(self) -> Path:
        return self.temp.with_name(self.temp.name + ".exclude")

    @property
    def pseudo_file(self) -> Path:
        return self.temp.with_name(self.temp.name + ".pseudo")

    @property
    def record_path(self) -> Path:
        return sidecar(self.output, ".hash")


# Names mksquashfs's pseudo file definitions take as they are; any other character is
# escaped with a backslash (mksquashfs 4.5 reads "a\\ b" as "a b").
_PSEUDO_PLAIN = re.compile(r"[A-Za-z0-9._+,=@%:/-]")


def _pseudo_name(rel: str, what: str) -> str:
    if any(ord(c) < 32 or c == "\x7f" for c in rel):
        raise UserInputError(f"{what}: {rel!r} has a control character (a newline, a tab) "
                             f"in its name; mksquashfs cannot be told such a name")
    return "".join(c if _PSEUDO_PLAIN.fullmatch(c) else "\\" + c for c in rel)


def link_definitions(listing: dict[str, Listing]) -> tuple[list[str], list[str]]:
    """What the symbolic links of a walked tree (walk_tree) hold, for mksquashfs, which
    would store each link as a link (pointing out of the packed file, or nowhere in a
    job): the links to leave out of its walk (-ef) and the pseudo file definitions
    (-pf) that add, at each link's place, the directories it leads to and the files
    in them as regular files: ``d`` a directory (its mode, owner root), ``l`` a file
    read from its real path (mksquashfs 4.5 reads a host file there, no command per
    file). Empty lists for a tree without links: mksquashfs packs it alone."""
    excludes: list[str] = []
    pseudo: list[str] = []
    for rel in sorted(listing):
        here = listing[rel]
        linked = set(here.links)
        for name in here.subdirs + here.files:
            sub = f"{rel}/{name}" if rel else name
            if name in linked and not here.via_link:
                excludes.append(sub)
            if not (here.via_link or name in linked):
                continue
            esc = _pseudo_name(sub, "pack")
            if name in here.subdirs:
                pseudo.append(f"{esc} d {listing[sub].mode:o} 0 0")
            else:
                real = os.path.realpath(os.path.join(here.path, name))
                pseudo.append(f"{esc} l {_pseudo_name(real, 'pack')}")
    return excludes, pseudo


def check_images(folder: ImageFolder, *, decode: bool = False) -> list[int]:
    """Read both ends of every image of ``folder`` (image_defect) and return their sizes;
    ``decode``: also decode each one with PIL (slow: every pixel). Raises
    UserInputError (one line) naming the first file that is empty, truncated or no
    image, so a data-loader worker never finds it mid-epoch."""
    sizes: list[int] = []
    for split in folder.samples:
        for path, _ in folder.samples[split]:
            try:
                head, tail, size = read_ends(path)
            except OSError as exc:
                raise UserInputError(f"dataset {folder.root}: cannot read {path}: "
                                     f"{exc.strerror}") from None
            what = image_defect(head, tail, size)
            if what is None and decode:
                what = _decode_defect(path)
            if what is not None:
                raise UserInputError(f"dataset {folder.root}: {path} {what}",
                                     hint="replace or remove it, then pack again")
            sizes.append(size)
    return sizes


def _decode_defect(path: str) -> str | None:
    from PIL import Image  # lazily: only --decode needs it

    try:
        with Image.open(path) as img:
            img.load()
    except Exception as exc:  # noqa: BLE001 (PIL raises many kinds for a bad file)
        return f"cannot be decoded: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    return None


def pack_plan(source: str | os.PathLike[str], output: str | os.PathLike[str], *,
              compression: str = DEFAULT_COMPRESSION, force: bool = False,
              processors: int | None = None, block_size: int | None = None,
              decode: bool = False) -> PackPlan:
    """Check ``source`` is an ImageFolder dataset whose images are whole (check_images;
    ``decode``: decoded too) and decide how it is packed into ``output``, symbolic
    links followed as the check follows them (walk_tree, link_definitions);
    ``block_size`` None: chosen from the images' sizes (block_size_for). Raises
    UserInputError (one line) for a source that is no ImageFolder, a link loop, a bad
    image, an output that exists (without ``force``), is inside the source or whose
    directory does not exist."""
    src = dataset_dir(source).absolute()
    listing = walk_tree(src)
    folder: ImageFolder = scan_tree(src, DirTree(src, listing))
    out = Path(output).expanduser().absolute()
    if not is_packed_name(out.name):
        raise UserInputError(f"-o {out}: name the packed file *.sqfs (or *.squashfs)")
    if not out.parent.is_dir():
        raise UserInputError(f"-o {out}: no directory {out.parent}")
    if out.exists() and not force:
        raise UserInputError(f"-o {out} exists", hint="pass --force to replace it")
    if src == out or src in out.parents:
        raise UserInputError(f"-o {out} is inside the dataset {src}: it would pack itself")
    sizes = check_images(folder, decode=decode)
    temp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    excludes, pseudo = link_definitions(listing)
    block = block_size if block_size is not None else block_size_for(sizes)
    argv = [MKSQUASHFS, str(src), str(temp), *FIXED_OPTIONS, *compression_args(compression),
            "-b", str(block),
            # -info: one line per file added, counted for the progress line.
            "-info", "-no-progress"]
    if processors:
        argv += ["-processors", str(processors)]
    plan = PackPlan(source=src, output=out, temp=temp, argv=(), compression=compression,
                    block_size=block, classes=len(folder.classes), counts=folder.counts(),
                    files=sum(len(d.files) for d in listing.values()),
                    excludes=tuple(excludes), pseudo=tuple(pseudo))
    if excludes:
        argv += ["-ef", str(plan.exclude_file), "-pf", str(plan.pseudo_file)]
    return dataclasses.replace(plan, argv=tuple(argv))


def execute(plan: PackPlan, *, progress: Callable[[int, int], None] | None = None,
            timeout: float | None = None) -> dict[str, Any]:
    """Run mksquashfs into the temporary file, check it, record its hashes beside it
    (OUTPUT.hash) and rename it into place. ``progress(done, total)`` is called as
    files are added. Returns the summary (also the record). Raises ToolError (mksquashfs
    failed; nothing is left behind)."""
    done = 0

    def on_line(line: str) -> None:
        nonlocal done
        if line.startswith("file "):
            done += 1
            if progress and (done % 1000 == 0 or done == plan.files):
                progress(done, plan.files)

    try:
        if plan.excludes:
            plan.exclude_file.write_text("".join(f"{rel}\n" for rel in plan.excludes))
            plan.pseudo_file.write_text("".join(f"{line}\n" for line in plan.pseudo))
        proc.stream(plan.argv, on_line=on_line, timeout=timeout)
        check_packed(plan.temp)
        tree = content_hash("\0".join(plan.argv[3:]), [(plan.source, "data")])
        record = {
            "version": RECORD_VERSION,
            "hash": file_sha256(plan.temp),  # the packed file's own: its content name
            "tree_hash": tree.digest,  # the files it holds (names, modes, contents)
            "options": list(plan.argv[3:]),
            "source": str(plan.source),
            "classes": plan.classes,
            **plan.counts,
            "files": plan.files,
            "size": plan.temp.stat().st_size,
        }
        write_json_atomic(plan.record_path, record)
        os.replace(plan.temp, plan.output)
    finally:
        for leftover in (plan.temp, plan.exclude_file, plan.pseudo_file):
            leftover.unlink(missing_ok=True)
    return {"path": str(plan.output), **record}


def check_packed(path: str | os.PathLike[str]) -> None:
    """Raise UserInputError (one line) when ``path`` is missing, unreadable or not a
    SquashFS file (its first bytes are not the SquashFS magic)."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            head = fh.read(4)
    except FileNotFoundError:
        raise UserInputError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise UserInputError(f"{p} is a directory, not a packed dataset") from None
    except OSError as exc:
        raise UserInputError(f"{p}: cannot read it: {exc.strerror}") from None
    if head != SQUASHFS_MAGIC:
        raise UserInputError(
            f"{p} is not a SquashFS file (starts with {head.hex() or 'nothing'}, not "
            f"{SQUASHFS_MAGIC.hex()})", hint="make one with `hpcdl data pack DIR -o DATA.sqfs`")


class SquashTree:
    """A packed file's tree, read from one ``unsquashfs -lln`` listing (no mount); the
    headers of the files the check samples come from one ``unsquashfs -extract-file``
    into a temporary directory."""

    def __init__(self, path: Path, listing: str) -> None:
        self.path = path
        self.dirs: dict[str, list[str]] = {}
        self.regular: dict[str, list[str]] = {}
        for line in listing.splitlines():
            # drwxr-xr-x 0/0 32 1970-01-01 00:00 squashfs-root/train/n00000000
            parts = line.split(None, 5)
            if len(parts) < 6 or parts[5] == "squashfs-root":
                continue
            rel = parts[5].split("squashfs-root/", 1)[-1]
            parent, _, name = rel.rpartition("/")
            kind = parts[0][0]
            if kind == "d":
                self.dirs.setdefault(parent, []).append(name)
                self.dirs.setdefault(rel, [])
            elif kind == "-":
                self.regular.setdefault(parent, []).append(name)

    def subdirs(self, rel: str) -> list[str] | None:
        return self.dirs.get(rel)

    def files(self, rel: str) -> list[str]:
        return self.regular.get(rel, [])

    def heads(self, rels: list[str]) -> dict[str, bytes]:
        with tempfile.TemporaryDirectory(prefix="hpcdl-check-") as tmp:
            wanted = Path(tmp) / "files"
            wanted.write_text("".join(f"{r}\n" for r in rels))
            dest = Path(tmp) / "out"
            _unsquashfs(["-no-progress", "-q", "-d", str(dest), "-ef", str(wanted),
                         str(self.path)], self.path)
            out: dict[str, bytes] = {}
            for rel in rels:
                try:
                    with (dest / PurePosixPath(rel)).open("rb") as fh:
                        out[rel] = fh.read(8)
                except OSError:
                    raise UserInputError(f"{self.path}: cannot read {rel} in it") from None
            return out


def _unsquashfs(args: list[str], path: Path) -> str:
    try:
        return proc.run([UNSQUASHFS, *args], timeout=600).stdout
    except ToolError as exc:
        last = (exc.output.strip().splitlines() or [str(exc)])[-1]
        raise UserInputError(f"{path}: unsquashfs cannot read it: {last}",
                             hint="a damaged or truncated file: pack it again") from None


def scan_packed(path: str | os.PathLike[str]) -> ImageFolder:
    """The ImageFolder check of ``hpcdl data check`` on a packed file. Raises
    UserInputError (one line) for a missing, non-SquashFS or damaged file and for
    every layout problem scan_imagefolder reports."""
    p = Path(path)
    check_packed(p)
    listing = _unsquashfs(["-lln", str(p)], p)
    return scan_tree(p, SquashTree(p, listing))
