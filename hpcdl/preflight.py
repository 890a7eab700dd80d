"""Checks on the submitting host before a job is queued: things a user will hit
(an image that was never built, a dataset path with a typo) are cheaper to report
now than after the job waited in the queue and died.

Cluster filesystems are shared between login and compute nodes, so a path that is
missing here is missing in the job too.
"""

from __future__ import annotations

from pathlib import Path

from hpcdl.errors import ValidationError
from hpcdl.plan import JobRequest


def check_inputs(req: JobRequest) -> None:
    """Raise ValidationError (exit 2) with the fix when the image or dataset is missing."""
    if req.image:
        image = Path(req.image).expanduser()
        if not image.exists():
            raise ValidationError(
                f"image: {req.image!r} does not exist",
                hint=f"build it first: hpcdl build pytorch-horovod-cpu -o {req.image} "
                f"(in a checkout, scripts/build-image.sh -o {req.image} also fills the "
                "wheelhouse the CPU spec installs from)",
            )
    if req.data and not req.command:
        data = Path(req.data).expanduser()
        if not data.is_dir():
            raise ValidationError(
                f"data: dataset folder {req.data!r} does not exist",
                hint=f"make a tiny one for a test run: hpcdl data make-tiny {req.data}",
            )
        if not (data / "train").is_dir():
            raise ValidationError(
                f"data: {req.data!r} has no train/ folder (ImageNet layout: train/ and val/, "
                f"one folder per class)",
                hint=f"make a tiny one for a test run: hpcdl data make-tiny {req.data}",
            )
