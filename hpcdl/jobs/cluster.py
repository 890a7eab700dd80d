"""One handle on the cluster a profile names: ``connect(profile)``.

The handle owns every decision that turns on where the cluster is, that is on the
profile's ``login:`` block: the transport its commands and files go through
(hpcdl.schedulers.executor picks it), where run directories live (``Here``, or
``Shipped`` to the cluster's ``login.runs``), how a request's paths are seen there
(a pushed image's or dataset's copy, a COMMAND's code), which checks read this host's
files (the image's build record, the container runtime, the inputs, the dataset's
size) and what a transport does not allow (``--code`` without it). The commands above ask the handle; none of them asks the profile whether
the cluster is remote. Never prints: notes and warnings come back as text.
"""

from __future__ import annotations

import dataclasses
import posixpath
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from hpcdl.core.gpuarch import ImageArchFacts
from hpcdl.data.mount import is_packed_name
from hpcdl.errors import ValidationError
from hpcdl.jobs import preflight
from hpcdl.jobs.place import HERE, RunPlace, Shipped
from hpcdl.jobs.rundir import RunDir, runs_root
from hpcdl.plan import DataPart, JobRequest, RuntimeMode, job_image
from hpcdl.plan.data import check_data_kind
from hpcdl.profiles.schema import Profile
from hpcdl.remote import images
from hpcdl.remote.dirs import known_offline
from hpcdl.schedulers.base import Scheduler
from hpcdl.schedulers.executor import LOCAL, Executor, executor_for
from hpcdl.schedulers.registry import scheduler_for


@dataclass
class Cluster:
    """A profile's cluster: its scheduler and where its run directories live, both
    through one transport (``executor``: its login node's SSH connection, or this
    machine). ``profile`` is None for a run directory without its records (this
    machine's). ``planning``: a dry run's handle (its place moves nothing; requests are
    mapped without asking the cluster what a dry run can do without). The scheduler is
    made on first use, so a handle on a profile hpcdl does not submit to (PBS: its
    script is for reading) still answers the questions above."""

    profile: Profile | None
    executor: Executor
    place: RunPlace
    planning: bool = False
    _scheduler: Scheduler | None = field(default=None, repr=False)

    @property
    def scheduler(self) -> Scheduler:
        """The profile's scheduler, its commands run through the handle's transport.
        Raises UserInputError for a scheduler type hpcdl does not submit to."""
        if self._scheduler is None:
            prof = self.profile
            self._scheduler = (scheduler_for(prof.name, prof.scheduler.type, self.executor,
                                             prof.scheduler.commands)
                               if prof is not None else scheduler_for())
        return self._scheduler

    @property
    def remote(self) -> bool:
        """Whether the cluster sees other files than this machine's (its run directories
        are shipped there, its inputs are its own paths)."""
        return self.executor.remote

    def _profile(self) -> Profile:
        if self.profile is None:
            raise RuntimeError("a run directory's handle without its profile plans nothing")
        return self.profile

    # What this host's files tell, and only where the cluster sees them.

    def image_facts(self, request: JobRequest) -> ImageArchFacts | None:
        """What the request's image was built for, from its build record here (its GPU
        architectures, for the plan's check); None over a transport to elsewhere, whose
        image paths are the cluster's."""
        if self.remote:
            return None
        return preflight.image_arch_facts(job_image(self._profile(), request.container)[0])

    def runtime_mode(self, request: JobRequest) -> tuple[RuntimeMode | None, str | None]:
        """How the container runtime will run the request's ranks, and a warning when
        this host cannot run images as this user (preflight.runtime_mode). (None, None)
        for a cluster elsewhere: this machine is not its nodes (the profile's
        container.mode says)."""
        if self.remote:
            return None, None
        prof = self._profile()
        return preflight.runtime_mode(job_image(prof, request.container)[0], prof.container.binary)

    def check_inputs(self, request: JobRequest, image: str | None = None) -> None:
        """Refuse (ValidationError) a missing image, dataset or script here; a cluster
        elsewhere had its inputs checked there (for_cluster)."""
        if not self.remote:
            preflight.check_inputs(request, image=image)

    def check_data(self, request: JobRequest) -> None:
        """Refuse (ValidationError) a --data that is neither a dataset folder nor a
        packed file here (hpcdl.plan.data.check_data_kind), dry run or not; over a
        transport --data is a path on the cluster."""
        if not self.remote:
            check_data_kind(request.data)

    def many_files_warning(self, data: DataPart) -> str | None:
        """preflight.many_files_warning on this host's files, for the dataset the plan
        decided; None for a cluster elsewhere, where --data is a path on the cluster."""
        if self.remote:
            return None
        return preflight.many_files_warning(self._profile(), data)

    # What the transport allows.

    def check_code(self, code: object | None) -> None:
        """Refuse --code where the job starts where the user submits (nothing to copy)."""
        if code is not None and not self.remote:
            raise ValidationError(f"code: --code copies your code to a cluster reached over "
                                  f"SSH; profile {self._profile().name} has no login: (the "
                                  f"job starts where you submit)")

    # The request as the cluster sees it.

    def request_for(self, req: JobRequest) -> tuple[JobRequest, list[str] | None]:
        """``req`` as the cluster sees it (for_cluster), and for a planning handle the
        list of what was left unchecked (None for real)."""
        notes: list[str] | None = [] if self.planning else None
        return self.for_cluster(req, notes=notes), notes

    def for_cluster(self, req: JobRequest, *, notes: list[str] | None = None) -> JobRequest:
        """``req`` as the cluster will see it: unchanged on a login node; for a cluster
        reached through a transport, checked there before anything is written: Slurm is
        there (RemoteInputError), a local ``--image`` becomes its pushed copy on the
        cluster (`hpcdl push`; refused when it was not pushed), any other image path must
        be readable on the cluster, and a COMMAND whose script lies in the current
        directory gets that directory as its code (``--code``), which submit copies along.

        ``notes`` (a dry run): the same paths, decided without the cluster: nothing is
        asked of it (the pushed image's name from its hash computed here, the remote home
        from an earlier connection's record; only when neither login.runs/login.images nor
        that record names it is the login node asked for $HOME, which writes nothing
        there); each check left out, and that question, is appended to ``notes`` in words.
        Raises ValidationError (exit 2)."""
        profile, ex = self._profile(), self.executor
        login = profile.login
        if not ex.remote or login is None:
            return req
        if notes is not None:
            notes.append(f"not checked: that {self.scheduler.label} answers on {ex.target} "
                         f"(the live check)")
        else:
            self.scheduler.require()  # first: a login node without Slurm is said as such
        image = req.container.image
        local_image = bool(image) and Path(str(image)).expanduser().is_file()
        if notes is not None:
            needs = [login.runs] + ([login.images] if local_image else [])
            if not all(known_offline(ex, configured) for configured in needs):
                notes.append(f"asked {ex.target} for $HOME (reads only): the cluster's "
                             f"home is not known here yet (set login.runs and login.images "
                             f"to plan without a connection)")
        if image and local_image:
            copy = self._pushed_copy("image", image, notes)
            req = dataclasses.replace(req, container=dataclasses.replace(req.container, image=copy))
        elif image and not preflight.REMOTE_IMAGE.fullmatch(image):
            if notes is not None:
                notes.append(f"not checked: that {image} is readable on the cluster")
            elif not ex.run(["test", "-r", image], timeout=60, check=False).ok:
                raise ValidationError(f"image: {image} is neither a file here nor readable "
                                      f"on the cluster ({ex.target})",
                                      hint=f"push a local image first: hpcdl push IMAGE -p "
                                           f"{profile.name}")
        data = req.data.path
        if data and is_packed_name(data) and Path(data).expanduser().is_file():
            # A packed dataset here goes as an image does: pushed once, content-named there.
            copy = self._pushed_copy("data", data, notes)
            req = dataclasses.replace(req, data=dataclasses.replace(req.data, path=copy))
        if req.files.code_dir is None and req.launch.command:
            script = preflight.command_script(req.launch.command)
            if script and not Path(script).is_absolute() and Path(script).is_file():
                req = dataclasses.replace(
                    req, files=dataclasses.replace(req.files, code_dir=str(Path.cwd())))
        if req.files.code_dir is not None:
            code_dir = str(Path(req.files.code_dir).resolve())
            req = dataclasses.replace(req, files=dataclasses.replace(req.files, code_dir=code_dir))
        return req

    def _pushed_copy(self, field: str, path: str, notes: list[str] | None) -> str:
        """The cluster's copy of the local file ``path`` that `hpcdl push` made (an image
        or a packed dataset: content-named there); a dry run (``notes``) names it from the
        hash computed here and says it was not checked. Raises ValidationError when it
        was not pushed."""
        profile, ex = self._profile(), self.executor
        login = profile.login
        assert login is not None  # for_cluster's caller: a profile with a login node
        local = Path(path).expanduser().resolve()
        if notes is not None:
            there: str | None = images.pushed_path(ex, login, local)
            notes.append(f"not checked: that {path} was pushed to {there} (hpcdl push "
                         f"{path} -p {profile.name})")
        else:
            there = images.remote_image(ex, login, local)
        if there is None:
            raise ValidationError(
                f"{field}: {path} is not on the cluster yet (profile {profile.name} reaches "
                f"it through {ex.target})",
                hint=f"copy it there once: hpcdl push {path} -p {profile.name}")
        return there


def place_for(profile: Profile, executor: Executor, *,
              local_root: Path | None = None, planning: bool = False) -> RunPlace:
    """Where ``profile``'s run directories live: shipped to its login node's
    ``login.runs`` when its transport runs elsewhere, else here. ``local_root``: where
    the local copies go (default: runs_root()); ``planning``: a dry run's (see
    Shipped)."""
    if not executor.remote or profile.login is None:
        return HERE
    return Shipped(executor, profile.login.runs, local_root or runs_root(), planning)


def connect(profile: Profile, *, local_root: Path | None = None,
            dry_run: bool = False) -> Cluster:
    """The profile's Cluster; ``local_root``: where local run directories go. Opens
    nothing: a connection to a login node starts with its first command. ``dry_run``:
    the handle only plans (its place moves nothing)."""
    executor = executor_for(profile)
    return Cluster(profile, executor,
                   place_for(profile, executor, local_root=local_root, planning=dry_run),
                   planning=dry_run)


def reconnect(run: RunDir | None) -> Cluster:
    """The Cluster of a run directory written by submit, from its own records
    (profile.yaml, plan.json): a laptop closed mid-run finds its job again. A run
    without them, or none, is this machine's."""
    profile = _recorded_profile(run) if run is not None else None
    executor = executor_for(profile) if profile is not None else LOCAL
    if run is None or profile is None or not executor.remote or profile.login is None:
        if profile is not None and profile.scheduler.commands is not None:
            # This machine's cluster, whose Slurm commands are not PATH's (another
            # release's sandbox, a site's module): its job ids are that cluster's.
            return Cluster(profile, LOCAL, HERE)
        return Cluster(None, LOCAL, HERE)
    try:
        cluster = run.read_plan().run_dir
    except (OSError, ValueError):
        cluster = ""
    # The run's parent on both sides: a sweep's point maps into its sweep directory.
    root = posixpath.dirname(cluster) if cluster else profile.login.runs
    return Cluster(profile, executor, Shipped(executor, root, run.path.parent))


def _recorded_profile(run: RunDir) -> Profile | None:
    try:
        return Profile.model_validate(yaml.safe_load(run.profile_file.read_text(encoding="utf-8")))
    except (OSError, ValueError, yaml.YAMLError):
        return None
