"""Content hash of an image build: the definition text plus every file copied in.

An unchanged rebuild must be a no-op in well under a second even when a 200 MB
wheelhouse is part of the input, so each file's digest is remembered in the record
beside the image and reused while the file's size and mtime are unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Byte-code caches change whenever Python runs; they do not change what the image does.
IGNORED_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".git"}
IGNORED_SUFFIXES = (".pyc", ".pyo")
RECORD_VERSION = 1


@dataclass(frozen=True)
class FileDigest:
    size: int
    mtime_ns: int
    sha256: str


@dataclass(frozen=True)
class ContentHash:
    digest: str  # hex sha256 over everything below
    definition_sha256: str
    files: dict[str, FileDigest]  # absolute host path -> digest
    options: tuple[str, ...]

    def record(self, **extra: Any) -> dict[str, Any]:
        """The JSON object written beside the image."""
        return {
            "version": RECORD_VERSION,
            "hash": self.digest,
            "definition_sha256": self.definition_sha256,
            "options": list(self.options),
            "files": {
                p: {"size": d.size, "mtime_ns": d.mtime_ns, "sha256": d.sha256}
                for p, d in sorted(self.files.items())
            },
            **extra,
        }


def _walk(root: Path) -> Iterator[Path]:
    if root.is_file():
        yield root
        return
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if d not in IGNORED_DIRS)
        for name in sorted(filenames):
            if not name.endswith(IGNORED_SUFFIXES):
                yield Path(dirpath) / name


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def digest_file(path: Path, previous: Mapping[str, FileDigest]) -> FileDigest:
    """sha256 of ``path``, reusing ``previous`` when size and mtime match."""
    st = path.stat()
    known = previous.get(str(path))
    if known and known.size == st.st_size and known.mtime_ns == st.st_mtime_ns:
        return known
    return FileDigest(st.st_size, st.st_mtime_ns, file_sha256(path))


def content_hash(
    definition: str,
    sources: Iterable[tuple[str | Path, str]],
    *,
    options: Iterable[str] = (),
    previous: Mapping[str, FileDigest] | None = None,
) -> ContentHash:
    """Hash ``definition`` + every file under each ``(source, label)`` in ``sources``.

    Files count by ``label`` (their place in the image) + relative name + mode +
    contents, never by host path, so a fresh clone elsewhere with the same content
    hashes the same (``definition`` should be rendered with placeholder paths too).
    Raises FileNotFoundError for a source that does not exist (the caller reports it).
    """
    previous = previous or {}
    h = hashlib.sha256()
    def_sha = hashlib.sha256(definition.encode()).hexdigest()
    h.update(b"definition\0" + def_sha.encode() + b"\0")
    opts = tuple(options)
    h.update(b"options\0" + "\0".join(opts).encode() + b"\0")
    files: dict[str, FileDigest] = {}
    for source, label in sources:
        root = Path(source)
        if not root.exists():
            raise FileNotFoundError(str(root))
        h.update(b"source\0" + label.encode() + b"\0")
        for path in _walk(root):
            d = digest_file(path, previous)
            files[str(path)] = d
            rel = path.name if root.is_file() else str(path.relative_to(root))
            # Mode matters too (an executable script copied in).
            mode = oct(path.stat().st_mode & 0o777)
            h.update(f"{rel}\0{mode}\0{d.sha256}\0".encode())
    return ContentHash(h.hexdigest(), def_sha, files, opts)


def sidecar(image: Path, suffix: str) -> Path:
    """A file ``hpcdl build`` keeps beside an image: .hash (record), .def, .build.log."""
    return image.with_name(image.name + suffix)


def read_record(path: Path) -> dict[str, Any] | None:
    """The hash record beside an image, or None when absent or unreadable."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("version") == RECORD_VERSION else None


def previous_digests(record: Mapping[str, Any] | None) -> dict[str, FileDigest]:
    out: dict[str, FileDigest] = {}
    for p, d in ((record or {}).get("files") or {}).items():
        try:
            out[p] = FileDigest(int(d["size"]), int(d["mtime_ns"]), str(d["sha256"]))
        except (KeyError, TypeError, ValueError):
            continue
    return out


def image_record(image: str) -> tuple[dict[str, Any], Path | None]:
    """What a run records of the image it ran (its image.json: the image's path, size and
    time, and the build record's hash, spec, build time, runtime and definition hash),
    and the definition file the image was built from (None when there is no build record
    or no definition beside the image)."""
    path = Path(image).expanduser().resolve()
    info: dict[str, Any] = {"path": str(path)}
    try:
        st = path.stat()
        info.update(size=st.st_size, mtime=time.strftime("%Y-%m-%dT%H:%M:%S%z",
                                                         time.localtime(st.st_mtime)))
    except OSError as exc:
        info["error"] = f"cannot stat the image: {exc.strerror}"
    record = read_record(sidecar(path, ".hash"))
    if record:
        info.update({k: record.get(k) for k in (
            "spec", "built_at", "runtime", "definition_sha256")},
            content_hash=record.get("hash"))
    else:
        info["content_hash"] = None
        info["note"] = ("no `hpcdl build` record beside the image; "
                        "`apptainer inspect --deffile IMAGE` shows its definition")
    definition = sidecar(path, ".def")
    if record and definition.is_file():
        return info, definition
    return info, None
