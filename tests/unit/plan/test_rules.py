"""hpcdl.plan.rules: each rule between two parts of a request, called alone (the CLI
tests reach them through whole requests, where an earlier rule can hide a later one).
Real bundled profiles, their real dialects and the real launcher registry."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

from hpcdl.errors import ValidationError
from hpcdl.plan import rules
from hpcdl.plan.data import DataRequest, decide_data
from hpcdl.plan.partition import PlacementRequest
from hpcdl.profiles import load_profile
from hpcdl.schedulers.dialects import dialect_for
from hpcdl.schedulers.launchers import REGISTRY, launcher_for

SANDBOX = load_profile("sandbox")  # slurm; paths.shared = /home, /scratch
POLARIS = load_profile("polaris")  # pbs
NO_DATA = decide_data(None, DataRequest(synthetic=True))


def test_the_probe_counts_the_spares_only_when_it_runs_first():
    rules.probe_nodes(PlacementRequest(nodes=2, spares=None), probe_first=False)
    # 1 node + 1 spare: two to measure
    rules.probe_nodes(PlacementRequest(nodes=1, spares=1), probe_first=True)
    with pytest.raises(ValidationError, match=r"^nodes: the probe .* needs 2 or more \(got 1\)"):
        rules.probe_nodes(PlacementRequest(nodes=1, spares=1), probe_first=False)
    with pytest.raises(ValidationError, match=r"\(got 1\)"):
        rules.probe_nodes(PlacementRequest(nodes=1, spares=0), probe_first=True)


def test_example_args_go_to_the_bundled_example_only():
    rules.example_args_not_for_probe((), probe_only=True)
    rules.example_args_not_for_probe(("--epochs=1",), probe_only=False)
    with pytest.raises(ValidationError, match="^example-arg: applies to the bundled example"):
        rules.example_args_not_for_probe(("--epochs=1",), probe_only=True)
    rules.example_args_not_for_command(("--epochs=1",), ())
    rules.example_args_not_for_command((), ("python3", "train.py"))
    with pytest.raises(ValidationError, match="not to a COMMAND$"):
        rules.example_args_not_for_command(("--epochs=1",), ("python3", "train.py"))


@pytest.mark.parametrize("spares, probe_only, chain, why", [
    (1, True, 1, "^spares: the probe measures the nodes it is given"),
    (2, False, 3, r"^spares: --chain 3 submits a new allocation per job; use --requeue"),
])
def test_spares_are_for_one_training_allocation(spares, probe_only, chain, why):
    with pytest.raises(ValidationError, match=why):
        rules.spares_for_training(PlacementRequest(spares=spares), probe_only=probe_only,
                                  chain=chain)


@pytest.mark.parametrize("spares, probe_only, chain", [(1, False, 1), (0, True, 5), (None, True, 2)])
def test_no_spares_or_one_training_job_passes(spares, probe_only, chain):
    assert rules.spares_for_training(PlacementRequest(spares=spares), probe_only=probe_only,
                                     chain=chain) is None


def test_the_watchdog_and_relaunch_rules():
    rules.hang_follows_one_job(1)
    with pytest.raises(ValidationError, match=r"^hang-timeout: .*--chain 2 submits 2$"):
        rules.hang_follows_one_job(2)
    rules.relaunch_needs_spares("relaunch", 1)
    rules.relaunch_needs_spares("cancel", 0)
    rules.relaunch_needs_spares(None, 0)
    with pytest.raises(ValidationError, match=r"^hang-action: relaunch .*\(--spares S\)$"):
        rules.relaunch_needs_spares("relaunch", 0)
    # The action the watchdog takes: the one given, else relaunch where spares can.
    assert rules.hang_action(None, 1) == "relaunch"
    assert rules.hang_action(None, 0) == "cancel"
    assert rules.hang_action("cancel", 2) == "cancel"
    with pytest.raises(ValidationError, match=r"^hang-action: relaunch "):
        rules.hang_action("relaunch", 0)


@pytest.mark.parametrize("nodes, spares, given, first, decided", [
    # The profile's default: for an allocation of 2 nodes or more, spares counted.
    (1, None, None, False, None), (2, None, None, True, 0), (1, 1, None, True, 1),
    # --probe-first asks whatever the size (probe_nodes refuses it below 2).
    (1, None, True, True, 0), (4, 2, False, False, 2),
])
def test_submit_probes_first_by_the_profiles_default_for_two_nodes_or_more(
        nodes, spares, given, first, decided):
    profile = SANDBOX.model_copy(update={"scheduler": SANDBOX.scheduler.model_copy(
        update={"probe_first": True, "spares": 0})})
    runs, placement = rules.probe_first(profile, PlacementRequest(nodes=nodes, spares=spares),
                                        given)
    assert runs is first
    # With the probe, the spares it measures are decided (the profile's when none named).
    assert placement.spares == decided if first else placement.spares == spares


def test_spares_need_a_slurm_script_and_a_launcher_that_starts_on_healthy_nodes():
    slurm = dialect_for(SANDBOX.scheduler.type)
    rules.spares_supported(SANDBOX, slurm, launcher_for("srun"))
    rules.spares_supported(SANDBOX, slurm, launcher_for("torchrun"))
    with pytest.raises(ValidationError, match="^spares: launcher mpirun starts ranks on every node"):
        rules.spares_supported(SANDBOX, slurm, launcher_for("mpirun"))
    with pytest.raises(ValidationError, match="^spares: .*profile polaris is pbs$"):
        rules.spares_supported(POLARIS, dialect_for(POLARIS.scheduler.type), launcher_for("srun"))


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_launcher_runs_the_example_on_slurm_and_only_srun_runs_the_probe(name):
    slurm, launcher = dialect_for(SANDBOX.scheduler.type), launcher_for(name)
    rules.launcher_runs_job(SANDBOX, slurm, launcher, probe=False, probe_only=False,
                            runs_example=True, backend="ddp")
    rules.launcher_on_scheduler(SANDBOX, slurm, launcher)
    probe = partial(rules.launcher_runs_job, SANDBOX, slurm, launcher, probe=True,
                    probe_only=True, runs_example=False, backend="ddp")
    if name == "srun":
        assert probe() is None
    else:
        with pytest.raises(ValidationError, match=rf"^launcher: .*srun \(got {name}\)$"):
            probe()


def test_a_pbs_profile_refuses_the_probe_and_torchrun_and_torchrun_refuses_horovod():
    pbs = dialect_for(POLARIS.scheduler.type)
    with pytest.raises(ValidationError, match="^probe: .*profile polaris is pbs$"):
        rules.launcher_runs_job(POLARIS, pbs, launcher_for("mpirun"), probe=True,
                                probe_only=False, runs_example=True, backend="horovod")
    with pytest.raises(ValidationError, match=r"^launcher: torchrun .*\(use --launcher mpirun\)$"):
        rules.launcher_on_scheduler(POLARIS, pbs, launcher_for("torchrun"))
    rules.launcher_on_scheduler(POLARIS, pbs, launcher_for("mpirun"))
    with pytest.raises(ValidationError, match="--backend horovod needs: use --backend ddp"):
        rules.launcher_runs_job(SANDBOX, dialect_for(SANDBOX.scheduler.type),
                                launcher_for("torchrun"), probe=False, probe_only=False,
                                runs_example=True, backend="horovod")


@pytest.mark.parametrize("path, inside", [
    ("/scratch", True), ("/scratch/", True), ("/home/u/run", True),
    ("/scratch/../etc/x", False),  # normalised before it is compared
    ("/scratchy/x", False), ("/homes", False), ("/", False), ("/tmp/x", False),
])
def test_on_shared_path_compares_whole_path_components(path, inside):
    assert rules.on_shared_path(path, ["/home", "/scratch"]) is inside


def test_a_relative_path_is_judged_where_it_resolves(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert rules.on_shared_path("run", [str(tmp_path)])
    assert not rules.on_shared_path("../elsewhere", [str(tmp_path)])


def test_check_shared_paths_names_the_first_option_the_nodes_cannot_see():
    ok = ("/scratch/run", ("/home/u/ds:/data",), "/scratch/img.sif")
    rules.check_shared_paths(SANDBOX, *ok, NO_DATA)
    for args, name, value in [
        (("/tmp/run", (), None), "--run-dir", "/tmp/run"),
        (("/scratch/run", (), "/opt/img.sif"), "--image", "/opt/img.sif"),
        (("/scratch/run", ("/srv/ds:/data",), None), "--bind", "/srv/ds"),
    ]:
        with pytest.raises(ValidationError) as err:
            rules.check_shared_paths(SANDBOX, *args, NO_DATA)
        assert err.value.message == (
            f"{name}: {value} is not on a path the compute nodes share (profile sandbox: "
            f"paths.shared = /home, /scratch): the nodes cannot see it")
    native = decide_data(None, DataRequest(path="/data/imagenet"))
    with pytest.raises(ValidationError, match="^--data: /data/imagenet is not on a path"):
        rules.check_shared_paths(SANDBOX, "/scratch/run", (), None, native)
    # In an image --data is the container's path (a --bind makes it): not checked here.
    rules.check_shared_paths(SANDBOX, "/scratch/run", (), "/scratch/img.sif", native)


def test_a_profile_without_shared_paths_checks_nothing():
    outside = ("/tmp/run", ("/srv:/srv",), "/opt/x.sif", NO_DATA)
    with pytest.raises(ValidationError, match="^--run-dir: /tmp/run"):
        rules.check_shared_paths(SANDBOX, *outside)
    open_profile = SANDBOX.model_copy(update={"paths": SANDBOX.paths.model_copy(
        update={"shared": []})})
    assert rules.check_shared_paths(open_profile, *outside) is None
