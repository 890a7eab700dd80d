"""hpcdl/plan/container.py: the image the ranks run in and where it came from, every -B
in its order (the site's, scratch once, the user's, the run directory, the job-side
files, the data), on profiles built here. (Staging: test_image_stage.py.)"""

from __future__ import annotations

from typing import Any

from hpcdl.core.resources import PACKAGE_DIR, examples_dir
from hpcdl.plan.container import JOB_PROJECT_DIR, ContainerRequest, container_binds, job_image
from hpcdl.profiles.schema import Profile


def profile(container: dict[str, Any] | None = None, **paths: Any) -> Profile:
    return Profile.model_validate({"name": "site", "container": container or {}, "paths": paths,
                                   "partitions": [{"name": "p", "nodes": 1, "gpus_per_node": 0,
                                                   "cpus_per_node": 2, "max_time": "01:00:00"}]})


def test_the_image_and_where_it_came_from():
    with_default = profile({"default_image": "/img/site.sif"})
    assert job_image(with_default, ContainerRequest()) == ("/img/site.sif", "profile default_image")
    assert job_image(with_default, ContainerRequest(image="/me.sif")) == ("/me.sif", "--image")
    assert job_image(with_default, ContainerRequest(no_image=True)) == (None, None)
    assert job_image(profile(), ContainerRequest()) == (None, None)
    # --image wins over --no-image's default-dropping: it names an image outright.
    assert job_image(with_default, ContainerRequest(image="/me.sif", no_image=True))[0] == "/me.sif"


def test_binds_in_their_order_with_scratch_once():
    prof = profile({"binds": ["/projects", "/tmp/local"]}, local_scratch="/tmp/local")
    req = ContainerRequest(binds=("/home/me/data:/data:ro",))
    got = container_binds(prof, req, "/runs/r1", ["/d/x.sqfs:/data:image-src=/"], project=True)
    assert got == ["/projects", "/tmp/local", "/home/me/data:/data:ro", "/runs/r1",
                   f"/runs/r1/job:{JOB_PROJECT_DIR}:ro", "/d/x.sqfs:/data:image-src=/"]
    prof = profile({"binds": ["/projects"]}, local_scratch="/scratch/local")
    assert container_binds(prof, ContainerRequest(), None, [], project=False) == [
        "/projects", "/scratch/local"]


def test_without_a_run_directory_the_installed_files_are_bound():
    got = container_binds(profile(), ContainerRequest(), None, [], project=True)
    assert got == [f"{examples_dir()}:{JOB_PROJECT_DIR}/examples:ro",
                   f"{PACKAGE_DIR}:{JOB_PROJECT_DIR}/hpcdl:ro"]
