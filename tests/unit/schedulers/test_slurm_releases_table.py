"""The table of Slurm releases (hpcdl.schedulers.slurm.releases): each behaviour flips
at the release SchedMD's notes name, versions parse from every form sbatch prints, and
an unknown release gets one line naming it and what was tried, with the nearest known
behaviour."""

from __future__ import annotations

import stat

import pytest

from hpcdl.errors import ValidationError
from hpcdl.schedulers.executor import LOCAL
from hpcdl.schedulers.slurm import releases
from hpcdl.schedulers.slurm.adapter import SlurmScheduler


@pytest.mark.parametrize(("text", "want"), [
    ("slurm 22.05.8\n", (22, 5, 8)),
    ("slurm-wlm 24.11.5\n", (24, 11, 5)),
    ("slurm 25.11.0-0rc1", (25, 11, 0)),
    ("slurm-wlm 26.05.5", (26, 5, 5)),
])
def test_versions_parse(text, want):
    assert releases.parse_version(text) == want


@pytest.mark.parametrize("text", ["", "sbatch: command not found", "slurm 24", "24.11"])
def test_no_version_is_one_line(text):
    with pytest.raises(ValidationError) as err:
        releases.parse_version(text)
    assert "\n" not in err.value.message and "sbatch --version" in err.value.message


# release: (cpus env, gpus exclusive, tres-bind, expedite, no-kill bug, sigterm teardown)
TABLE = {
    "22.05.8": ("SRUN_CPUS_PER_TASK", False, False, False, True, False),
    "23.02.2": ("SRUN_CPUS_PER_TASK", False, False, False, True, False),
    "23.02.3": ("SRUN_CPUS_PER_TASK", False, False, False, False, False),
    "23.11.1": ("SLURM_CPUS_PER_TASK", False, True, False, False, False),
    "24.05.4": ("SLURM_CPUS_PER_TASK", False, True, False, False, False),
    "24.11.5": ("SLURM_CPUS_PER_TASK", False, True, False, False, False),
    "25.05.0": ("SLURM_CPUS_PER_TASK", False, True, False, False, False),
    "25.11.2": ("SLURM_CPUS_PER_TASK", False, True, True, False, False),
    "26.05.5": ("SLURM_CPUS_PER_TASK", True, True, True, False, True),
}


@pytest.mark.parametrize(("version", "row"), TABLE.items())
def test_each_known_release(version, row):
    rel = releases.release_of(f"slurm {version}")
    b = rel.behaviour
    assert rel.note is None and rel.version == version
    assert (b.cpus_per_task_env, b.gpus_exclusive, b.tres_bind, b.requeue_expedite,
            b.no_kill_step_bug, b.sigterm_teardown) == row


def test_the_table_covers_every_release_from_22_05_to_26_05():
    assert list(releases.KNOWN) == ["22.05", "23.02", "23.11", "24.05", "24.11", "25.05",
                                    "25.11", "26.05"]


@pytest.mark.parametrize(("version", "nearest"), [
    ("21.08.8", "22.05"), ("20.11.9", "22.05"), ("27.05.0", "26.05"), ("27.11.1", "26.05"),
    ("24.08.1", "24.05"),  # never released: the older neighbour
])
def test_unknown_release_one_line_and_nearest(version, nearest):
    rel = releases.release_of(f"slurm {version}", tried="sbatch --version")
    assert rel.behaviour.release == nearest
    assert rel.note is not None and "\n" not in rel.note
    assert version in rel.note and "sbatch --version" in rel.note
    assert f"uses {nearest}'s behaviour" in rel.note


def test_the_adapter_reads_the_release_once(tmp_path):
    calls = tmp_path / "calls"
    sbatch = tmp_path / "sbatch"
    sbatch.write_text(f"#!/bin/sh\necho x >> {calls}\necho 'slurm-wlm 24.11.5'\n")
    sbatch.chmod(sbatch.stat().st_mode | stat.S_IXUSR)
    sched = SlurmScheduler("p", LOCAL, str(tmp_path))
    assert sched.release().behaviour.cpus_per_task_env == "SLURM_CPUS_PER_TASK"
    assert sched.release().version == "24.11.5"
    assert calls.read_text() == "x\n"


# ---- the table where it renders: the profile's scheduler.release --------------------

def _profile(**scheduler):
    from hpcdl.profiles import load_profile

    prof = load_profile("sandbox")
    return prof.model_copy(update={"scheduler": prof.scheduler.model_copy(update=scheduler)})


def test_a_profile_without_a_release_renders_as_22_05():
    assert releases.profile_behaviour(None) == releases.KNOWN["22.05"]
    assert releases.profile_behaviour("24.11").cpus_per_task_env == "SLURM_CPUS_PER_TASK"
    # An unknown YY.MM: the nearest known release's (27.05 -> 26.05's).
    assert releases.profile_behaviour("27.05") == releases.KNOWN["26.05"]


@pytest.mark.parametrize("release,enabled,expected", [
    ("24.11", True, "--requeue"),         # no expedite before 25.11, enabled or not
    ("25.11", False, "--requeue"),        # the cluster does not enable it
    ("25.11", True, "--requeue=expedite"),
    ("26.05", True, "--requeue=expedite"),
    (None, True, "--requeue"),
])
def test_requeue_expedite_needs_the_release_and_the_cluster(release, enabled, expected):
    from hpcdl.plan import JobRequest, build_plan

    plan = build_plan(_profile(release=release, requeue_expedite=enabled),
                      JobRequest.of(nodes=1, gpus=1, requeue=True, run_dir="/scratch/runs/x"))
    lines = [line for line in plan.script.splitlines() if line.startswith("#SBATCH --requeue")]
    assert lines == [f"#SBATCH {expected}"]
    # An expedite job that hpcdl does not requeue tells Slurm not to either (26.05.5 holds
    # it requeued, REQUEUE_HOLD, otherwise), not once it requeued itself; a plain
    # --requeue job's script ends with a plain exit. Either records that it requeued
    # itself (and then says nothing of "not requeued").
    expedite = expected.endswith("expedite")
    assert ('scontrol update JobId="$hpcdl_job" Requeue=0' in plan.script) is expedite
    assert 'scontrol requeue "$hpcdl_job" && hpcdl_requeued=1 && sleep 300' in plan.script
    assert ('hpcdl_final "$hpcdl_rc"' in plan.script) is expedite


@pytest.mark.parametrize("gpu_request,extra", [("gres", "gpus-per-node"), ("gpus-per-node", "gres"),
                                               ("gres", "gpus")])
def test_26_05_refuses_two_gpu_requests_in_one_line(gpu_request, extra):
    from hpcdl.plan import JobRequest, build_plan

    req = JobRequest.of(nodes=1, gpus=1, run_dir="/scratch/runs/x")
    prof = _profile(release="26.05", gpu_request=gpu_request, extra_options={extra: "gpu:1"})
    with pytest.raises(ValidationError) as err:
        build_plan(prof, req)
    assert "\n" not in err.value.message and "26.05" in err.value.message
    # 24.11 takes both (Slurm does), as it always did.
    build_plan(_profile(release="24.11", gpu_request=gpu_request,
                        extra_options={extra: "gpu:1"}), req)


@pytest.mark.parametrize("text,expected", [
    ("(null)", False), ("enable_expedited_requeue", True),
    ("idle_on_node_suspend,enable_expedited_requeue", True),
    ("enable_expedited_requeue_not", False), ("", False)])
def test_expedite_enabled_reads_slurmctld_parameters(text, expected):
    assert releases.expedite_enabled(text) is expected


def test_differences_name_what_changes_and_nothing_on_22_05():
    assert releases.differences(releases.KNOWN["22.05"]) == []
    lines = releases.differences(releases.KNOWN["26.05"])
    assert any("SLURM_CPUS_PER_TASK" in line for line in lines)
    assert any("expedite" in line for line in lines)
    assert all("\n" not in line for line in lines)
