"""hpcdl.sweep.arrays' pure parts: the points' names, the array's size limits and the
throttle (the whole `hpcdl sweep` against a fake Slurm is test_sweep_array.py)."""

from __future__ import annotations

import pytest
import yaml

from hpcdl.core.resources import PACKAGE_DIR
from hpcdl.errors import ValidationError
from hpcdl.profiles.loader import load_profile_file
from hpcdl.profiles.schema import Profile
from hpcdl.sweep.arrays import (
    array_limits,
    check_array_size,
    check_retry_size,
    point_name,
    point_width,
)


def _profile(tmp_path, **limits: int) -> Profile:
    """The bundled sandbox profile with ``limits`` on every partition."""
    data = yaml.safe_load((PACKAGE_DIR / "profiles" / "bundled" / "sandbox.yaml").read_text())
    data["name"] = "limited"
    for part in data["partitions"]:
        part.update(limits)
    path = tmp_path / "limited.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_profile_file(path)


@pytest.mark.parametrize(("count", "width", "last"), [
    (1, 3, "point-000"), (1000, 3, "point-999"), (1001, 4, "point-1000"), (0, 3, None)])
def test_point_names_are_zero_padded_to_at_least_three_digits(count, width, last):
    assert point_width(count) == width
    if last is not None:
        assert point_name(count - 1, width) == last
    assert point_name(7, width) == "point-" + "7".zfill(width)


def test_array_size_names_the_strictest_known_limit(tmp_path):
    prof = _profile(tmp_path, max_array_size=100, max_submit_jobs=20)
    assert check_array_size(prof, "debug", 10) == "at most 20 points: the profile's max_submit_jobs"
    assert check_array_size(prof, "debug", 10, cluster_max=15) == (
        "at most 15 points: the cluster's MaxArraySize")
    plain = _profile(tmp_path)
    assert check_array_size(plain, "debug", 10_000) == ""  # nothing known: nothing refused


def test_array_size_refuses_in_one_line_naming_the_field(tmp_path):
    prof = _profile(tmp_path, max_array_size=4)
    with pytest.raises(ValidationError) as err:
        check_array_size(prof, "debug", 5)
    assert str(err.value.message) == (
        "points: 5 points, but partition debug allows 4 (max_array_size in profile limited: "
        "Slurm's MaxArraySize); split the sweep")
    with pytest.raises(ValidationError, match=r"the cluster allows 3 \(MaxArraySize = 3 in "):
        check_array_size(prof, "debug", 4, cluster_max=3)


def test_throttle_from_the_flag_or_the_partitions_job_limit(tmp_path):
    prof = _profile(tmp_path, max_jobs_per_user=2)
    assert array_limits(prof, "debug", 5, 3) == (3, "--max-concurrent")
    assert array_limits(prof, "debug", 5, None) == (2, "partition debug's max_jobs_per_user")
    assert array_limits(prof, "debug", 2, None)[0] is None  # every point fits at once
    with pytest.raises(ValidationError, match="max-concurrent: 0 must be 1 or more"):
        array_limits(prof, "debug", 5, 0)


def test_a_retried_point_must_be_a_task_id_the_cluster_takes():
    check_retry_size([3, 5], None)  # not known: nothing checked
    check_retry_size([3, 999], 1000)
    with pytest.raises(ValidationError, match=r"point 1000 is array task 1000, but the cluster "
                                              r"allows tasks 0-999"):
        check_retry_size([3, 1000], 1000)
    with pytest.raises(ValidationError, match="allows no job array"):
        check_retry_size([0], 0)
