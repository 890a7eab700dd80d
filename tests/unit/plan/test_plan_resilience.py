"""hpcdl/plan/resilience.py: --requeue/--chain into the requeue spec (and the profile's
defaults), the template blocks they fill for Slurm and PBS, and --hang-timeout's part,
exports, block (quoted) and warning, on profiles built here."""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from hpcdl.errors import ValidationError
from hpcdl.plan.resilience import (
    HangRequest,
    ResilienceRequest,
    hang_block,
    hang_exports,
    hang_part,
    hang_warnings,
    max_restarts,
    progress_block,
    requeue_block,
    requeue_spec,
)
from hpcdl.plan.rules import hang_action
from hpcdl.profiles.schema import Profile
from hpcdl.schedulers.dialects import DIALECTS

SLURM, PBS = DIALECTS["slurm"], DIALECTS["pbs"]


def profile(**scheduler: Any) -> Profile:
    return Profile.model_validate({"name": "site", "scheduler": scheduler, "partitions": [
        {"name": "p", "nodes": 2, "gpus_per_node": 0, "cpus_per_node": 2, "max_time": "01:00:00"}]})


def test_requeue_follows_the_request_else_the_profile():
    assert requeue_spec(profile(), ResilienceRequest(), SLURM) is None
    spec = requeue_spec(profile(requeue=True, max_restarts=5), ResilienceRequest(), SLURM)
    assert (spec.signal, spec.lead, spec.chain, spec.max_restarts) == ("USR2", 120, 1, 5)
    spec = requeue_spec(profile(), ResilienceRequest(requeue=True, signal="TERM@300",
                                                    max_restarts=1), SLURM)
    assert (spec.signal, spec.lead, spec.max_restarts) == ("TERM", 300, 1)
    assert requeue_spec(profile(requeue=True), ResilienceRequest(requeue=False), SLURM) is None
    # A chain checkpoints on the signal too, and restarts by its next job, not by requeue.
    chain = requeue_spec(profile(), ResilienceRequest(chain=3), SLURM)
    assert (chain.chain, chain.max_restarts) == (3, 0)
    # PBS scripts are not submitted by hpcdl: no requeue, but a chain still renders.
    assert requeue_spec(profile(requeue=True), ResilienceRequest(), PBS) is None
    assert max_restarts(profile(max_restarts=7), ResilienceRequest()) == 7
    assert max_restarts(profile(max_restarts=7), ResilienceRequest(max_restarts=0)) == 0


def test_the_requeue_and_progress_blocks():
    spec = requeue_spec(profile(), ResilienceRequest(requeue=True, signal="USR2@120"), SLURM)
    block = requeue_block(spec, "/runs/a b", SLURM)
    assert block["run_dir"] == "'/runs/a b'" and block["signal"] == "USR2" and block["lead"] == 120
    assert 0 < block["wait_s"] <= 120
    assert requeue_block(spec, None, SLURM)["run_dir"] == SLURM.submit_dir
    assert requeue_block(None, "/r", SLURM) is None
    assert progress_block("/runs/a b", None, SLURM)["path"] == "'/runs/a b/progress'"
    assert progress_block(None, spec, SLURM)["path"] == f"{SLURM.submit_dir}/progress"
    assert progress_block(None, None, SLURM) is None and progress_block("/r", spec, PBS) is None


def test_the_hang_part_and_its_action():
    def part(req: HangRequest, spares: int):
        return hang_part(req, hang_action(req.action, spares))

    assert part(HangRequest(), spares=0) is None
    assert part(HangRequest(timeout=300), spares=0).action == "cancel"
    assert part(HangRequest(timeout=300), spares=1).action == "relaunch"
    assert part(HangRequest(timeout=300, action="requeue"), spares=1).action == "requeue"
    with pytest.raises(ValidationError):
        part(HangRequest(timeout=300, action="relaunch"), spares=0)


def test_hang_exports_block_and_warning():
    req = HangRequest(timeout=600)
    assert hang_exports(HangRequest(), (), "/r") == []
    assert hang_exports(req, (), "/r") == [("HPCDL_PID_DIR", "/r/pids"),
                                           ("HPCDL_HEARTBEAT_DIR", "/r/heartbeat"),
                                           ("PYTHONUNBUFFERED", "1")]
    assert len(hang_exports(req, (("PYTHONUNBUFFERED", "0"),), "/r")) == 2  # the user's stays
    prof = profile()
    block = hang_block(prof, "/runs/x y", hang_part(req, hang_action(None, 0)), "/img/a b.sif")
    assert shlex.split(block["args_q"]) == ["--run-dir", "/runs/x y", "--timeout", "600",
                                            "--action", "cancel", "--runtime", "apptainer",
                                            "--image", "/img/a b.sif"]
    assert shlex.split(block["job_dir_q"]) == ["/runs/x y/job"]
    assert hang_block(prof, None, None, None) is None
    assert hang_warnings(req, 600) == ["hang-timeout: 600 s is not shorter than the job's time "
                                       "limit 00:10:00: the watchdog cannot fire before it"]
    assert hang_warnings(req, 601) == [] and hang_warnings(req, None) == []
