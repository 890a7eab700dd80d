"""The rules between two parts of a request or a plan, in one place: what one part's
value allows or forbids in another's (spares and the probe or a chain, the hang
watchdog and a chain or spares, -X and the command, a feature and the scheduler or
launcher that has to carry it out). Each part's own checks are in its module
(hpcdl.plan.request for the value checks, partition, data, resilience); check_request
and build_plan's stages call these where the rule's first broken value is named, so
that the first broken rule of a request stays the one reported. Pure; each raises
ValidationError (one line: the option, the value, why).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import PurePosixPath

from hpcdl.errors import ValidationError
from hpcdl.hang.actions import DEFAULT_HANG_ACTION
from hpcdl.plan.data import DataPart
from hpcdl.plan.partition import PlacementRequest
from hpcdl.probe.request import check_nodes
from hpcdl.profiles.schema import Profile
from hpcdl.schedulers.base import ScriptDialect
from hpcdl.schedulers.launchers import RankLauncher


def probe_nodes(placement: PlacementRequest, *, probe_first: bool) -> None:
    """The probe measures links between nodes: enough of them. With spares the
    --probe-first step measures them too (every healthy node)."""
    nodes = placement.nodes
    check_nodes(nodes + (placement.spares or 0) if probe_first else nodes)


def probe_first(profile: Profile, placement: PlacementRequest, first: bool | None
                ) -> tuple[bool, PlacementRequest]:
    """Whether `submit`'s probe runs first (--probe-first, else the profile's default)
    and the placement it measures. The default is for an allocation the probe can
    measure (2 nodes or more, its spares counted); --probe-first asks for it whatever
    the size (and probe_nodes refuses it below 2 nodes)."""
    spares = placement.spares
    if first is None:
        allocated = placement.nodes + (profile.scheduler.spares if spares is None else spares)
        first = profile.scheduler.probe_first and allocated >= 2
    if first and spares is None:
        # (the probe's size check counts the spares the request names: the profile's, then)
        placement = replace(placement, spares=profile.scheduler.spares)
    return first, placement


def example_args_not_for_probe(example_args: tuple[str, ...], *, probe_only: bool) -> None:
    """-X is for the bundled example, not for the probe job."""
    if probe_only and example_args:
        raise ValidationError("example-arg: applies to the bundled example, not to the probe")


def example_args_not_for_command(example_args: tuple[str, ...], command: tuple[str, ...]) -> None:
    if example_args and command:
        raise ValidationError("example-arg: only applies to the bundled example, not to a COMMAND")


def spares_for_training(placement: PlacementRequest, *, probe_only: bool, chain: int) -> None:
    """Spare nodes replace a failed node inside the training's allocation: not for the
    probe (it measures the nodes it is given), not for a chain (a new allocation each)."""
    spares = placement.spares
    if spares and probe_only:
        raise ValidationError("spares: the probe measures the nodes it is given; spares are "
                              "for training")
    if spares and chain > 1:
        raise ValidationError(f"spares: --chain {chain} submits a new allocation per job; "
                              f"use --requeue with --spares")


def hang_follows_one_job(chain: int) -> None:
    """The watchdog follows one job; a chain submits several."""
    if chain > 1:
        raise ValidationError(f"hang-timeout: the watchdog follows one job; --chain {chain} "
                              f"submits {chain}")


def relaunch_needs_spares(action: str | None, spares: int) -> None:
    """--hang-action relaunch restarts the training on the spare nodes."""
    if action == "relaunch" and not spares:
        raise ValidationError("hang-action: relaunch restarts the training inside the job's "
                              "allocation; it needs spare nodes (--spares S)")


def hang_action(action: str | None, spares: int) -> str:
    """The watchdog's action: --hang-action, else relaunch for a job with spares (its
    node guard restarts the training) and cancel for the others."""
    relaunch_needs_spares(action, spares)
    return action or ("relaunch" if spares else DEFAULT_HANG_ACTION)


def spares_supported(profile: Profile, dialect: ScriptDialect, launcher: RankLauncher) -> None:
    """A job with spares needs a scheduler whose script can guard its nodes and a
    launcher that can start on the healthy ones."""
    if refused := dialect.unsupported(profile, "spares"):
        raise ValidationError(refused)
    if refused := launcher.spares_refusal():
        raise ValidationError(refused)


def launcher_runs_job(profile: Profile, dialect: ScriptDialect, launcher: RankLauncher, *,
                      probe: bool, probe_only: bool, runs_example: bool, backend: str) -> None:
    """The scheduler can run the probe, and the launcher can start what the job runs."""
    if probe and (refused := dialect.unsupported(profile, "probe")):
        raise ValidationError(refused)
    if refused := launcher.refusal(probe_only=probe_only, runs_example=runs_example,
                                   backend=backend):
        raise ValidationError(refused)


def launcher_on_scheduler(profile: Profile, dialect: ScriptDialect,
                          launcher: RankLauncher) -> None:
    """The scheduler's script can carry out what the launcher needs (torchrun's
    rendezvous, for one)."""
    if launcher.feature and (refused := dialect.unsupported(profile, launcher.feature)):
        raise ValidationError(refused)


def check_shared_paths(profile: Profile, run_dir: str | None, binds: tuple[str, ...],
                       image: str | None, data: DataPart) -> None:
    """Refuse what the compute nodes cannot see: a run directory, image, dataset (the
    host's path of ``data``, DataPart.host_path) or --bind source outside the profile's
    paths.shared (no check when it lists none)."""
    shared = profile.paths.shared
    if not shared:
        return
    checks = [("--run-dir", run_dir), ("--image", image), ("--data", data.host_path(image)),
              *(("--bind", b.split(":", 1)[0]) for b in binds)]
    for name, path in checks:
        if path and not on_shared_path(path, shared):
            raise ValidationError(
                f"{name}: {path} is not on a path the compute nodes share (profile "
                f"{profile.name}: paths.shared = {', '.join(shared)}): the nodes cannot see it")


def on_shared_path(path: str, shared: list[str]) -> bool:
    """``path`` (made absolute against the current directory) is one of ``shared`` or
    below one of them."""
    where = PurePosixPath(os.path.normpath(os.path.abspath(path)))
    return any(where == PurePosixPath(s) or PurePosixPath(s) in where.parents for s in shared)
