"""Where a run directory lives for the cluster, and how it gets there and back.

hpcdl on a login node writes the run directory where the nodes read it (``Here``:
nothing moves). hpcdl on a laptop writes it locally and copies it to the profile's
``login.runs`` on the cluster with the transport's push (``Shipped``): the plan's paths
are the cluster's, the local copy is the record, and what the job writes (logs, result
files) is pulled back into it with the transport's pull. Which of the two a profile gets
is the Cluster handle's decision (hpcdl.jobs.cluster.connect). The mapping is by
path below a root on each side: a sweep's points stay inside its sweep directory.
No terminal output: figures come back to the caller.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from hpcdl.jobs.rundir import JOB_DIR_NAME, RunDir
from hpcdl.remote.dirs import DEFAULT_RUNS, ensure_writable, remote_dir
from hpcdl.schedulers.executor import Executor, RemoteError

# What a pull leaves on the cluster: checkpoints (large; the job resumes from them
# there) and what submit copied there (the local copy is the original).
PULL_EXCLUDES = ("/checkpoints/", f"/{JOB_DIR_NAME}/", "/code/")


class RunPlace(Protocol):
    """Where run directories live for the cluster."""

    remote: bool

    def describe(self) -> str:
        """Where, in words (for messages)."""
        ...

    def cluster_path(self, local: Path) -> str:
        """The cluster's path of the local run directory ``local``."""
        ...

    def local_path(self, cluster: str) -> Path:
        """The local run directory whose cluster path is ``cluster``."""
        ...

    def prepare(self) -> None:
        """Check the cluster's runs directory can be written (made if missing)."""
        ...

    def ship(self, run: RunDir) -> int:
        """Copy the run directory to the cluster; returns the bytes moved."""
        ...

    def fetch(self, run: RunDir) -> int:
        """Bring what the job wrote back into the local run directory; returns bytes."""
        ...

    def discard(self, run: RunDir) -> None:
        """Remove the cluster's copy of a run that was never submitted."""
        ...


class Here:
    """The cluster sees this machine's files (hpcdl runs on a login node)."""

    remote = False

    def describe(self) -> str:
        return "this machine"

    def cluster_path(self, local: Path) -> str:
        return str(local)

    def local_path(self, cluster: str) -> Path:
        return Path(cluster)

    def prepare(self) -> None:
        return None

    def ship(self, run: RunDir) -> int:
        return 0

    def fetch(self, run: RunDir) -> int:
        return 0

    def discard(self, run: RunDir) -> None:
        return None


HERE = Here()


@dataclass
class Shipped:
    """Run directories under ``local_root`` here and under the profile's ``login.runs``
    (default: DEFAULT_RUNS in the remote home) on the cluster, moved with the transport
    ``ex``'s push and pull (rsync over a login node's connection). The remote root is asked for once, when first needed.
    ``planning``: a dry run's place: paths only (the remote home as remembered from an
    earlier connection when login.runs does not name the root); moving anything is a
    programming error."""

    ex: Executor
    configured_root: str | None
    local_root: Path
    planning: bool = False
    _root: str | None = field(default=None, init=False)

    remote = True

    @property
    def root(self) -> str:
        if self._root is None:
            self._root = remote_dir(self.ex, self.configured_root, DEFAULT_RUNS,
                                    remembered=self.planning)
        return self._root

    def _moving(self) -> None:
        # A dry run plans with this place and must never write on either side.
        if self.planning:
            raise RuntimeError("a dry run's place moves nothing")

    def describe(self) -> str:
        return f"{self.ex.target}:{self.root}"

    def cluster_path(self, local: Path) -> str:
        try:
            rel = local.resolve().relative_to(self.local_root.resolve())
        except ValueError:
            rel = Path(local.name)
        return posixpath.join(self.root, rel.as_posix())

    def local_path(self, cluster: str) -> Path:
        rel = posixpath.relpath(cluster, self.root)
        if rel.startswith(".."):
            return self.local_root / posixpath.basename(cluster)
        return self.local_root / rel

    def prepare(self) -> None:
        self._moving()
        ensure_writable(self.ex, self.root, "login.runs")

    def ship(self, run: RunDir) -> int:
        self._moving()
        target = self.cluster_path(run.path)
        # Unchanged files (the job-side files, the code) are hard-linked on the cluster
        # from the newest sibling run shipped before, so only what is new crosses.
        return self.ex.push(run.path, target, link_dest=_siblings(run.path),
                            parents=posixpath.dirname(target) != self.root)  # prepare made it

    def fetch(self, run: RunDir) -> int:
        self._moving()
        return self.ex.pull(self.cluster_path(run.path), run.path, exclude=PULL_EXCLUDES)

    def discard(self, run: RunDir) -> None:
        self._moving()
        target = self.cluster_path(run.path)
        if posixpath.dirname(target).startswith(self.root):
            try:
                self.ex.run(["rm", "-rf", "--", target], timeout=120, check=False)
            except RemoteError:
                pass  # unreachable now: the copy is an unsubmitted directory, harmless


def _siblings(path: Path, keep: int = 3) -> list[str]:
    """The newest run directories beside ``path`` that were submitted (job.json), as
    rsync --link-dest takes them: relative to the destination."""
    try:
        found = [p for p in path.parent.iterdir()
                 if p != path and (p / "job.json").is_file()]
    except OSError:
        return []
    found.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    return [f"../{p.name}" for p in found[:keep]]
