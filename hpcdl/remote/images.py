"""Images on a cluster reached over SSH: ``hpcdl push`` copies a local SIF into the
profile's images directory (``login.images``, default ``hpcdl-images`` in the remote
home), named by its content, and submit maps a local ``--image`` to that copy.

The remote name is ``<stem>-<first 16 hex of sha256>.sif``: a rebuilt image is a new
file (a job still running on the old one keeps it), and an image already there moves
nothing (one ``stat`` over the master connection). A copy lands under a temporary name
in the same directory and is renamed into place, so the content-keyed name never holds
half a file. The sha256 of a multi-GB image takes seconds to compute, so it is
remembered in the user's cache (``image-sha256.json``, this module's file) by path,
size and mtime, as hpcdl build remembers its inputs' digests.

Never prints: what the user should hear while it works goes to a ``note`` callback.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcdl.container.hashing import FileDigest, file_sha256
from hpcdl.core.atomic import write_json_atomic
from hpcdl.core.resources import user_cache
from hpcdl.data.mount import is_packed_name
from hpcdl.errors import HpcdlError, UserInputError
from hpcdl.remote.dirs import DEFAULT_IMAGES, ensure_writable, remote_dir
from hpcdl.remote.ssh import Shell, SshExecutor, rsync_progress

if TYPE_CHECKING:
    from hpcdl.profiles.schema import Login

HASH_CACHE = "image-sha256.json"
CACHE_VERSION = 1
# Entries kept in the hash cache (the most recently hashed): enough for every image a
# user keeps, small enough to rewrite on each push.
CACHE_ENTRIES = 200
# A file modified this recently may still be being written within the same mtime tick:
# its digest is used but not remembered (the "racy" case of git's index).
RACY_S = 2.0
HASH_HEX = 16
# How often a long copy says how far it got.
PROGRESS_EVERY_S = 10.0
# What a remote name keeps of the local one: the remote shell sees it only quoted, but
# a plain name is one a user can type, and a leading '-' or '.' is neither an option
# nor hidden.
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]+")
STEM_MAX = 100

Note = Callable[[str], None]


@dataclass(frozen=True)
class Pushed:
    """What ``hpcdl push`` did (its ``--json``)."""

    image: str  # the local file
    host: str  # the login node ([user@]host)
    remote_path: str
    sha256: str
    size: int  # bytes of the image
    bytes_moved: int  # what crossed the wire (rsync's figure; 0 when already there)
    already_there: bool
    seconds: float
    # Another name of the same content there (the image pushed under another file
    # name), hard-linked instead of sent.
    linked_from: str | None = None

    def record(self) -> dict[str, Any]:
        return asdict(self)


def remote_name(local: Path, sha256: str) -> str:
    """``<stem>-<first 16 hex of sha256>.sif``: the stem made of letters, digits and
    ``_.-`` (anything else becomes ``_``; never starting with ``.`` or ``-``); ``.sqfs``
    instead for a packed dataset (``*.sqfs``, ``*.squashfs``: submit --data knows it by
    that suffix). Pure."""
    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise ValueError(f"sha256 {sha256!r}: not 64 lowercase hex digits")
    stem = _UNSAFE.sub("_", local.stem).lstrip("._-")[:STEM_MAX] or "image"
    suffix = ".sqfs" if is_packed_name(local.name) else ".sif"
    return f"{stem}-{sha256[:HASH_HEX]}{suffix}"


def human_mb(size: int) -> str:
    """``size`` bytes as MB for a message (one decimal below 10 MB). Pure."""
    mb = size / 1e6
    return f"{mb:.1f} MB" if mb < 10 else f"{mb:,.0f} MB"


# --- the local image ----------------------------------------------------------------

def check_image(local: Path) -> os.stat_result:
    """The stat of ``local`` when it is a readable image file (SIF, squashfs or ext3,
    what Apptainer runs). Raises UserInputError (exit 2) naming the path otherwise."""
    try:
        st = local.stat()
    except FileNotFoundError:
        raise UserInputError(f"image: {local} does not exist") from None
    except OSError as err:
        raise UserInputError(f"image: {local} cannot be read ({err.strerror})") from None
    if local.is_dir():
        raise UserInputError(f"image: {local} is a directory; push copies one image file",
                             hint=f"make a SIF of it first: apptainer build IMAGE.sif {local}")
    if not local.is_file():
        raise UserInputError(f"image: {local} is not a regular file")
    try:
        with local.open("rb") as fh:
            head = fh.read(0x440)
    except OSError as err:
        raise UserInputError(f"image: {local} cannot be read ({err.strerror})") from None
    if not image_kind(head):
        raise UserInputError(f"image: {local} is not a SIF, squashfs or ext3 image "
                             f"({st.st_size} bytes, no SIF_MAGIC at byte 32)",
                             hint="build one with: hpcdl build SPEC -o IMAGE.sif")
    return st


def image_kind(head: bytes) -> str | None:
    """Which image format the first 0x440 bytes of a file start: "sif", "squashfs",
    "ext3", or None. Pure."""
    if head[32:41] == b"SIF_MAGIC":
        return "sif"
    if head[:4] == b"hsqs":
        return "squashfs"
    if head[0x438:0x43A] == b"\x53\xef":
        return "ext3"
    return None


# --- the sha256, remembered ------------------------------------------------------------

def hash_cache_path(env: dict[str, str] | None = None) -> Path:
    """The user's hash cache: ``$XDG_CACHE_HOME/hpcdl`` or ``~/.cache/hpcdl`` (never the
    system cache: what this user pushed is theirs)."""
    return Path(user_cache(env)) / HASH_CACHE


def read_hash_cache(path: Path) -> dict[str, FileDigest]:
    """The remembered digests (absolute path -> size, mtime, sha256); a missing,
    unreadable or foreign file is an empty cache, never an error."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION:
        return {}
    out: dict[str, FileDigest] = {}
    for name, d in (data.get("files") or {}).items():
        try:
            digest = FileDigest(int(d["size"]), int(d["mtime_ns"]), str(d["sha256"]))
        except (KeyError, TypeError, ValueError):
            continue
        if re.fullmatch(r"[0-9a-f]{64}", digest.sha256):
            out[name] = digest
    return out


def remember(known: dict[str, FileDigest], key: str, digest: FileDigest) -> dict[str, Any]:
    """The cache file's content with ``key`` set to ``digest`` (moved to the newest end),
    keeping the ``CACHE_ENTRIES`` newest. Pure."""
    files = {k: v for k, v in known.items() if k != key}
    files[key] = digest
    kept = list(files.items())[-CACHE_ENTRIES:]
    return {"version": CACHE_VERSION,
            "files": {k: {"size": d.size, "mtime_ns": d.mtime_ns, "sha256": d.sha256}
                      for k, d in kept}}


def image_sha256(local: Path, *, cache: Path | None = None, note: Note | None = None,
                 now: float | None = None, store: bool = True) -> FileDigest:
    """The sha256 of ``local``, from the cache while its size and mtime are the ones
    hashed; else computed (``note`` says so first: seconds per GB) and remembered
    (unless ``store`` is False: a dry run writes nothing). A cache that cannot be
    written only costs the next push a rehash."""
    cache = cache or hash_cache_path()
    key = str(local.resolve())
    st = local.stat()
    known = read_hash_cache(cache)
    hit = known.get(key)
    if hit and (hit.size, hit.mtime_ns) == (st.st_size, st.st_mtime_ns):
        return hit
    if note:
        note(f"hashing {local} ({human_mb(st.st_size)})")
    digest = FileDigest(st.st_size, st.st_mtime_ns, file_sha256(local))
    after = local.stat()
    if (after.st_size, after.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
        raise HpcdlError(f"image: {local} changed while it was hashed (is it still being "
                         f"written?)", hint="push it again once it is complete")
    if store and (now if now is not None else time.time()) - st.st_mtime_ns / 1e9 >= RACY_S:
        with contextlib.suppress(OSError):
            cache.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(cache, remember(known, key, digest))
    return digest


# --- the cluster's side ----------------------------------------------------------------

def images_dir(ex: Shell, login: Login, *, remembered: bool = False) -> str:
    """The profile's images directory on the cluster: ``login.images``, else
    ``hpcdl-images`` in the remote home (``remembered``: as hpcdl.remote.dirs.remote_dir)."""
    return remote_dir(ex, login.images, DEFAULT_IMAGES, remembered=remembered)


def remote_size(ex: Shell, path: str) -> int | None:
    """The size of the regular file ``path`` on the login node, or None when there is
    none (or it cannot be read)."""
    res = ex.run(["stat", "-L", "-c", "%F %s", "--", path], timeout=60, check=False)
    kind, _, size = res.stdout.strip().rpartition(" ")
    if not res.ok or kind != "regular file" or not size.isdigit():
        return None
    return int(size)


# Copies of one content under other names: every STEM-HASH.sif of the directory (the
# glob, not find: POSIX sh alone), with its size. Paths reach the script as "$1", "$2".
_TWINS = ["sh", "-c", 'for f in "$1"/*-"$2".sif "$1"/*-"$2".sqfs; do if [ -f "$f" ] && [ ! -L "$f" ]; then '
                      'stat -c "%s %n" -- "$f"; fi; done', "sh"]


def remote_twin(ex: Shell, folder: str, sha256: str, size: int) -> str | None:
    """A file of ``folder`` on the login node named for the same content (another stem,
    the same hash and size), or None."""
    res = ex.run([*_TWINS, folder, sha256[:HASH_HEX]], timeout=60, check=False)
    for line in res.stdout.splitlines() if res.ok else ():
        found, _, path = line.partition(" ")
        if found == str(size) and posixpath.dirname(path) == folder:
            return path
    return None


def remote_image(ex: Shell, login: Login, local: Path) -> str | None:
    """Where ``hpcdl push`` put ``local`` on the cluster, when it is there (same content
    name, same size), else None. Hashes ``local`` unless the cache knows it."""
    digest = image_sha256(local)
    path = posixpath.join(images_dir(ex, login), remote_name(local, digest.sha256))
    return path if remote_size(ex, path) == digest.size else None


def pushed_path(ex: Shell, login: Login, local: Path) -> str:
    """Where ``hpcdl push`` puts ``local`` on the cluster, decided here without asking
    whether it is there (a dry run): the hash is computed (or recalled) locally and not
    remembered, the images directory is ``login.images`` or the remembered remote home's
    (the login node is asked for its home only when neither is known)."""
    digest = image_sha256(local, store=False)
    return posixpath.join(images_dir(ex, login, remembered=True),
                          remote_name(local, digest.sha256))


@dataclass(frozen=True)
class PushPlan:
    """What a push will do (``hpcdl push --dry-run`` shows it): where the image goes and
    whether it is there already."""

    local: Path
    host: str
    folder: str  # the images directory
    remote_path: str
    sha256: str
    size: int
    mtime_ns: int
    already_there: bool
    twin: str | None = None  # the same content under another name there, when not itself

    def temp_path(self, token: str) -> str:
        """The name the copy is written under before ``mv -f``: hidden, in the same
        directory (so the rename is atomic), this push's alone."""
        return posixpath.join(self.folder, f".{posixpath.basename(self.remote_path)}"
                                           f".tmp-{token}")


def plan_push(ex: SshExecutor, login: Login, local: Path, *,
              note: Note | None = None) -> PushPlan:
    """Check ``local``, hash it (or recall its hash) and ask the login node whether its
    copy is there. Writes nothing on the cluster. Raises UserInputError (exit 2) for a
    file that is not an image."""
    local = local.absolute()  # rsync reads a relative "-x.sif" or "a:b.sif" otherwise
    check_image(local)
    digest = image_sha256(local, note=note)  # its size and mtime: those it hashed
    folder = images_dir(ex, login)
    path = posixpath.join(folder, remote_name(local, digest.sha256))
    there = remote_size(ex, path) == digest.size
    twin = None if there else remote_twin(ex, folder, digest.sha256, digest.size)
    return PushPlan(local, ex.login.target, folder, path, digest.sha256, digest.size,
                    digest.mtime_ns, there, twin)


class Progress:
    """rsync's ``--progress`` lines turned into at most one line for the user every
    ``every`` seconds: ``sent 229 MB of 565 MB (40%, 45.2MB/s, 0:00:07 left)``."""

    def __init__(self, size: int, note: Note, *, every: float = PROGRESS_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.size, self.note, self.every, self.clock = size, note, every, clock
        self.last = clock()

    def __call__(self, line: str) -> None:
        got = rsync_progress(line)
        now = self.clock()
        if got is None or got[1] >= 100 or now - self.last < self.every:
            return
        self.last = now
        sent, percent, rate, left = got
        self.note(f"sent {human_mb(sent)} of {human_mb(self.size)} ({percent}%, {rate}, "
                  f"{left} left)")


def copy_argv(ex: SshExecutor, local: Path, tmp: str) -> list[str]:
    """The local rsync that push_image runs to copy ``local`` to ``tmp`` on the login
    node (what `hpcdl push --dry-run` shows). Pure."""
    return ex.rsync_argv(str(local), ":" + tmp)


def rename_argv(tmp: str, path: str) -> list[str]:
    """The remote command that puts the copy in place: ``mv -f`` (a rename within one
    directory, atomic), with ``-T`` so that a directory of that name is an error
    rather than a place to move the copy into. Pure."""
    return ["mv", "-f", "-T", "--", tmp, path]


def transfer_timeout(size: int) -> float:
    """How long a copy of ``size`` bytes may take: at least 1 MB/s, so a slow link gets
    time and a stalled one (ssh's keepalives end a dead connection) does not hang for
    ever. Pure."""
    return 600 + size / 1e6


def push_image(ex: SshExecutor, login: Login, local: Path, *, note: Note | None = None,
               timeout: float | None = None) -> Pushed:
    """Copy ``local`` into the profile's images directory under its content name, unless
    it is there already. Raises UserInputError (exit 2) for an image that cannot be
    pushed or an images directory this user cannot write, RemoteError (exit 1) for a
    failed transfer; a failed copy leaves no file behind on the cluster."""
    start = time.monotonic()
    plan = plan_push(ex, login, local, note=note)
    local = plan.local

    def done(moved: int, there: bool, twin: str | None = None) -> Pushed:
        return Pushed(str(local), plan.host, plan.remote_path, plan.sha256, plan.size, moved,
                      there, round(time.monotonic() - start, 2), twin)

    if plan.already_there:
        return done(0, True)
    ensure_writable(ex, plan.folder, "login.images")
    tmp = plan.temp_path(secrets.token_hex(6))
    if plan.twin and _link(ex, plan.twin, tmp, plan.remote_path):
        return done(0, False, plan.twin)
    if note:
        note(f"sending {local} ({human_mb(plan.size)}) to {plan.host}:{plan.remote_path}")
    try:
        moved = ex.send_file(local, tmp, timeout=timeout or transfer_timeout(plan.size),
                             progress=Progress(plan.size, note) if note else None)
        now = local.stat()
        if (now.st_size, now.st_mtime_ns) != (plan.size, plan.mtime_ns):
            raise HpcdlError(f"image: {local} changed while it was sent (is it still being "
                             f"written?)", hint="push it again once it is complete")
        ex.run(rename_argv(tmp, plan.remote_path), timeout=60)
    except BaseException:
        # The temp name is this push's alone; a dropped connection may leave it (the
        # next push of the image writes its own).
        with contextlib.suppress(HpcdlError):
            ex.run(["rm", "-f", "--", tmp], timeout=60, check=False)
        raise
    return done(moved, False)


def _link(ex: SshExecutor, twin: str, tmp: str, path: str) -> bool:
    """Give ``twin``'s content the name ``path`` too: a hard link under the temporary
    name, then the rename. False when the filesystem refuses the link (the image is
    then sent)."""
    if not ex.run(["ln", "--", twin, tmp], timeout=60, check=False).ok:
        return False
    try:
        ex.run(rename_argv(tmp, path), timeout=60)
    except BaseException:
        with contextlib.suppress(HpcdlError):
            ex.run(["rm", "-f", "--", tmp], timeout=60, check=False)
        raise
    return True
