"""hpcdl/schedulers/pbs/script.py: every value that reaches a #PBS directive is a plain
token or refused in one line (property), the walltime reads back as its seconds
(property), the directives of a request, mpiexec's line, and the refusals."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcdl.core.duration import parse_time
from hpcdl.errors import UserInputError, ValidationError
from hpcdl.profiles.schema import Profile
from hpcdl.schedulers.pbs.script import (
    directives,
    job_name,
    mpiexec_tokens,
    refusal,
    walltime,
    warnings,
)

TOKEN = re.compile(r"[A-Za-z0-9_.+\-]+")


def profile(**scheduler: object) -> Profile:
    return Profile.model_validate({"name": "polaris", "scheduler": {"type": "pbs", **scheduler},
                                   "partitions": [{"name": "prod", "nodes": 10, "gpus_per_node": 4,
                                                   "cpus_per_node": 32, "max_time": "24:00:00"}]})


@given(st.text(min_size=1, max_size=300))
def test_any_job_name_becomes_a_pbs_name(name):
    got = job_name(name)
    assert TOKEN.fullmatch(got) and got[0].isalpha() and len(got) <= 201


@given(st.integers(1, 10**7))
def test_the_walltime_reads_back_as_its_seconds(seconds):
    text = walltime(seconds)
    assert re.fullmatch(r"\d{2,}:\d{2}:\d{2}", text) and parse_time(text) == seconds


def test_an_unlimited_time_is_refused():
    with pytest.raises(ValidationError, match="PBS needs a finite walltime"):
        walltime(None)


def test_the_directives_of_a_request():
    prof = profile(account="proj1", filesystems=["home", "eagle"])
    got = directives(prof, prof.partitions[0], nodes=2, gpus=4, tasks_per_node=4,
                     cpus_per_task=8, time_seconds=90000, run_dir="/runs/j-1")
    assert got == ["-l select=2:ncpus=32:ngpus=4", "-l place=scatter", "-l walltime=25:00:00",
                   "-q prod", "-A proj1", "-l filesystems=home:eagle", "-o /runs/j-1/",
                   "-e /runs/j-1/"]
    cpu = directives(profile(), prof.partitions[0], nodes=1, gpus=0, tasks_per_node=1,
                     cpus_per_task=4, time_seconds=60, run_dir=None)
    assert cpu == ["-l select=1:ncpus=4", "-l place=scatter", "-l walltime=00:01:00", "-q prod"]


@given(st.text(min_size=1, max_size=20).filter(lambda t: not re.fullmatch(r"/?[A-Za-z0-9_.+\-]+(/[A-Za-z0-9_.+\-]+)*/?", t)))
def test_a_run_dir_that_is_no_plain_path_is_refused(run_dir):
    prof = profile()
    with pytest.raises(ValidationError) as err:
        directives(prof, prof.partitions[0], nodes=1, gpus=0, tasks_per_node=1, cpus_per_task=1,
                   time_seconds=60, run_dir=run_dir)
    assert err.value.message.startswith("run-dir: ") and "cannot go into a #PBS directive" in \
        err.value.message


def test_mpiexec_starts_every_rank():
    assert [str(t) for t in mpiexec_tokens(ntasks=8, tasks_per_node=4, cpus_per_task=8)] == \
        ["mpiexec", "-n", "8", "--ppn", "4", "--depth", "8", "--cpu-bind", "depth"]


def test_what_pbs_profiles_are_told():
    assert warnings(profile())[0].startswith("profile polaris uses PBS Pro: hpcdl renders the "
                                             "qsub script for reading")
    assert len(warnings(profile(qos="debug"))) == 2
    err = refusal(profile(), "submit")
    assert isinstance(err, UserInputError)
    assert err.message == ("scheduler: profile polaris uses pbs; hpcdl submit works with Slurm "
                           "only (use --dry-run to print the PBS script, then qsub it yourself)")
    assert "qsub -I" in refusal(profile(), "alloc").message
