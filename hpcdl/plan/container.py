"""The request's container part (--image, --no-image, --bind, --stage-image) planned:
the image the ranks run in and where it came from, its binds (one list: the one the
plan records is the one the ranks get), and the copy of the image to every node before
the ranks start. Pure; raises ValidationError.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from hpcdl.core.resources import PACKAGE_DIR, examples_dir
from hpcdl.core.templating import Raw
from hpcdl.errors import ValidationError
from hpcdl.launch.staging import job_dir
from hpcdl.profiles.schema import Profile
from hpcdl.schedulers.base import JobSpec, ScriptDialect

# Where a job sees the bundled examples and the stdlib-only hpcdl modules they import
# (hpcdl.jobside.errors, hpcdl.jobside.world, hpcdl.jobside.imagefolder): staged into the run
# directory (hpcdl.launch.staging) and bound read-only from there at job time (from the
# installed hpcdl when the plan has no run directory), so the examples run in any image
# (a site's NGC image has no copy
# of hpcdl; images built from containers/*.yaml carry one in /opt/hpcdl) and always
# match the hpcdl that rendered the job.
JOB_PROJECT_DIR = PurePosixPath("/hpcdl")


@dataclass(frozen=True)
class ContainerRequest:
    """The request's container part, as given."""

    image: str | None = None
    no_image: bool = False  # run natively even when the profile names a default_image
    binds: tuple[str, ...] = ()
    # Copy the image to every node's local scratch with sbcast before the ranks start
    # (--stage-image); None: the profile's container.stage.
    stage: bool | None = None


def job_image(profile: Profile, req: ContainerRequest) -> tuple[str | None, str | None]:
    """The image the ranks run in and where it came from (``--image`` or the profile's
    ``container.default_image``); (None, None) for a native run."""
    if req.image:
        return req.image, "--image"
    if req.no_image or not profile.container.default_image:
        return None, None
    return profile.container.default_image, "profile default_image"


def container_binds(profile: Profile, req: ContainerRequest, run_dir: str | None,
                    data_binds: list[str], *, project: bool) -> list[str]:
    """Every -B of an image run, in order: the site's, node-local scratch (where
    --stage-to copies), the user's, the run directory (logs and checkpoints: the ranks
    must see it), the job-side files (``project``: the bundled example's or the probe
    worker's, not a user's COMMAND) and the packed dataset's (``data_binds``: the
    plan's DataPart.image_binds)."""
    scratch = profile.paths.local_scratch
    site = [*profile.container.binds,
            *([scratch] if scratch and scratch not in profile.container.binds else [])]
    return [*site, *req.binds, *([run_dir] if run_dir else []),
            *(_project_binds(run_dir) if project else []), *data_binds]


def _project_binds(run_dir: str | None) -> list[str]:
    """The read-only bind that brings the bundled examples (and the hpcdl modules they
    import, or the probe worker) into the container: the run directory's staged copy, or
    without a run directory the installed hpcdl's files."""
    if run_dir:
        return [f"{job_dir(run_dir)}:{JOB_PROJECT_DIR}:ro"]
    return [f"{examples_dir()}:{JOB_PROJECT_DIR}/examples:ro",
            f"{PACKAGE_DIR}:{JOB_PROJECT_DIR}/hpcdl:ro"]


def image_stage(profile: Profile, req: ContainerRequest, image: str | None, spec: JobSpec,
                dialect: ScriptDialect) -> dict[str, Any] | None:
    """How the script copies the image to every node before the ranks start (the
    template's ``stage``, spelled by the dialect), or None.

    --stage-image, else the profile's container.stage. Staging needs an image and the
    profile's node-local scratch; asked for explicitly without them it is refused (a
    profile default simply does not apply to a native run). Raises ValidationError.
    """
    wanted = profile.container.stage == "sbcast" if req.stage is None else req.stage
    if not wanted:
        return None
    source = "--stage-image" if req.stage else "container.stage: sbcast"
    if not image:
        if req.stage is None:
            return None
        raise ValidationError("stage-image: no image to stage (give --image, or a profile with "
                    "container.default_image; --no-image runs natively)")
    local = profile.paths.local_scratch
    if not local:
        raise ValidationError(f"stage-image: profile {profile.name} has no paths.local_scratch (the "
                    f"node-local directory {source} copies the image to)")
    if refused := dialect.unsupported(profile, "stage"):
        raise ValidationError(refused)
    return {**dialect.stage_file(spec, local, PurePosixPath(image).name, "image"),
            "what": "image", "shown_what": "the image", "source": Raw('"$HPCDL_IMAGE"'),
            "var": "HPCDL_IMAGE"}
