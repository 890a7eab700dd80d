"""hpcdl/schedulers/slurm/adapter.py through a scripted executor (the adapter takes one:
the Slurm boundary): what it reads once per scheduler (release, config, tools), the live
check of several jobs with each refusal labelled, an unreachable controller in one line,
and the profile's commands directory in front of every Slurm command."""

from __future__ import annotations

import pytest

from hpcdl.errors import ToolError, ValidationError
from hpcdl.profiles.schema import Profile
from hpcdl.schedulers.base import Demand
from hpcdl.schedulers.slurm.adapter import SlurmScheduler
from tests.unit.schedulers.scripted import Slurm

# The cluster's nodes have 2 GPUs where the profile claims 4.
PARTITIONS = ("PartitionName=gpu MaxNodes=2 MaxTime=01:00:00 TotalNodes=2 State=UP\n",
              "gpu|gpu:a100:2|32|2\n")
PROFILE = Profile.model_validate({"name": "site", "partitions": [
    {"name": "gpu", "nodes": 2, "gpus_per_node": 4, "cpus_per_node": 32, "max_time": "01:00:00"}]})


def test_release_and_config_are_read_once():
    ex = Slurm({"sbatch": (0, "slurm 24.11.3\n"), "scontrol": (0, "MaxArraySize = 1001\n")})
    sched = SlurmScheduler("site", ex)
    assert sched.release().behaviour.release == "24.11" and sched.release() is sched.release()
    assert sched.max_array_size() == 1001 and sched.max_array_size() == 1001
    assert [c[0] for c in ex.calls] == ["sbatch", "scontrol"]


def test_the_live_check_labels_each_jobs_refusal():
    ex = Slurm({"scontrol": (0, PARTITIONS[0]), "sinfo": (0, PARTITIONS[1])})
    sched = SlurmScheduler("site", ex)
    fits = Demand("gpu", 2, 2, 8, 3600)
    assert sched.check(PROFILE, {"a": fits}) == [
        "GPUs per node: profile site partition gpu claims 4, the cluster has 2"]
    four = Demand("gpu", 1, 4, 1, 60)
    with pytest.raises(ValidationError) as err:
        sched.check(PROFILE, {"a": fits, "point n1-g4": four})
    assert err.value.message == ("point n1-g4: live check: GPUs per node: profile site "
                                 "partition gpu claims 4, the cluster has 2 (the request needs 4)")
    with pytest.raises(ValidationError) as err:  # one job: no label
        sched.check(PROFILE, {"only": four})
    assert err.value.message.startswith("live check: GPUs per node")


def test_an_unreachable_controller_is_one_line_with_the_fix():
    down = "slurm_load_partitions: Unable to contact slurm controller (connect failure)"
    sched = SlurmScheduler("sandbox", Slurm({"scontrol": (1, down)}))
    with pytest.raises(ToolError) as err:
        sched.check(PROFILE, {"a": Demand("gpu", 1, 1, 1, 60)})
    assert err.value.message.startswith("Slurm's controller is not reachable (profile sandbox)")
    assert err.value.hint == "start the local sandbox cluster: hpcdl sandbox up"
    with pytest.raises(ToolError, match="not reachable"):
        sched.max_array_size()


def test_the_commands_directory_serves_every_slurm_command_and_tools_are_found_once():
    ex = Slurm({t: (0, "") for t in ("sbatch", "squeue", "sacct", "scontrol", "scancel")})
    sched = SlurmScheduler("site", ex, commands_dir="/opt/slurm/bin")
    assert sched.available() and sched.available()
    sched.require()
    sched.cancel(["5"])
    assert ex.calls[-1] == ["/opt/slurm/bin/scancel", "5"]
    missing = SlurmScheduler("site", Slurm({}))
    assert not missing.available()
    with pytest.raises(ToolError, match="Slurm's commands are not on PATH"):
        missing.require()
