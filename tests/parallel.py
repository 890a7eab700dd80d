"""Which tests may run side by side under pytest-xdist (`make test` runs the suite in
several workers with ``--dist loadgroup``).

A test that talks to a cluster shared by several tests keeps to one worker with every
other test of that cluster (an xdist group), one after the other as before:

- ``sandbox``: the host's 2-node sandbox (``slurm_cluster``), Slurm 22.05. Its tests
  name its nodes, fill both of them, preempt through its partitions and read its
  accounting; two of them at once would queue behind each other past their timeouts.
- ``slurm-24.11``, ``slurm-26.05``: a release sandbox of the session (conftest_releases),
  which each worker would otherwise bring up for itself.
- ``sandbox-twin``, ``sandbox-twin-2``: a second sandbox (``sandbox_twin``: shaped like
  the host's, node names of its own), for the modules whose jobs fill both nodes for
  minutes or that need nothing else of the host sandbox: the sandboxes' tests run side
  by side. Its modules are split over two groups (SECOND_TWIN) so that no group is the
  session's longest chain; a worker that runs both shares one twin (a session fixture),
  two workers bring up one each (~15 s: node names, ports and subnet of their own).
  The groups' summed times are on the durations page (docs/generated/test-durations.md):
  balance them from there.

Every other test (unit tests, image builds, a ``netns_cluster`` of its own: its own
directory, ports, subnet and node names) runs wherever a worker is free. The groups go
first, biggest first, so the longest chain starts at once and the single tests fill the
other workers around it.

Without xdist (``-p no:xdist``, ``-n 0``) nothing changes: the marks are inert.
"""

from __future__ import annotations

import pytest

SANDBOX = "sandbox"
TWIN = "sandbox-twin"
TWIN_2 = "sandbox-twin-2"
# The twin's modules of the second group (file names). Summed in the last whole run
# (load 4-10, 4 workers): test_requeue 14.3 min alone in the first with
# test_hang_watchdog 2.9 and test_headline's time limit 1.5 (both moved from the host
# sandbox, 27.1 min then); test_scale 4.2, test_gpu_derived 2.7 (from the host sandbox),
# test_sweep_requeue 1.8, test_report 1.0, test_sweep_array 0.7 here.
SECOND_TWIN = frozenset({"test_scale.py", "test_gpu_derived.py", "test_sweep_requeue.py",
                         "test_report.py", "test_sweep_array.py"})
HOST_RELEASE = "22.05"


def group_of(item: pytest.Item) -> str | None:
    """The xdist group ``item`` must run in, or None when it may run anywhere."""
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return str(mark.args[0] if mark.args else mark.kwargs["name"])
    names = set(getattr(item, "fixturenames", ()))
    params = getattr(getattr(item, "callspec", None), "params", {})
    release = params.get("slurm_release") or (params.get("release")
                                              if "release_sandboxes" in names else None)
    marked = item.get_closest_marker("slurm_release_only")
    if release is None and marked is not None:
        release = str(marked.args[0])
    if release is not None:
        return SANDBOX if release == HOST_RELEASE else f"slurm-{release}"
    if "release_sandboxes" in names:
        # Run anywhere, it would bring a release's cluster up in a second worker, whose
        # node names clash with the first's: say which release it uses.
        raise pytest.UsageError(f"{item.nodeid}: takes release_sandboxes without a "
                                "release parameter: mark it slurm_release_only(RELEASE)")
    if "sandbox_twin" in names:
        return TWIN_2 if item.path.name in SECOND_TWIN else TWIN
    if "slurm_cluster" in names:
        return SANDBOX
    return None


def pytest_configure(config: pytest.Config) -> None:
    # xdist registers the mark when it is loaded; a test that sets it itself (a release
    # sandbox's case of a parameter group_of does not read) must not warn without it.
    config.addinivalue_line("markers", "xdist_group(name): the xdist group of the test "
                                       "(tests/parallel.py)")


def xdist_running(config: pytest.Config) -> bool:
    """Is this session one of xdist's (a worker, or the controller of workers)?"""
    return bool(getattr(config, "workerinput", None)) or \
        (getattr(config.option, "numprocesses", None) or 0) > 0 or \
        getattr(config.option, "dist", "no") != "no"


@pytest.hookimpl(tryfirst=True)  # before xdist reads the marks into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not xdist_running(config):
        return
    groups: dict[str | None, list[pytest.Item]] = {}
    for item in items:
        group = group_of(item)
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))
        groups.setdefault(group, []).append(item)
    # Biggest group first (xdist's own reorder sorts by test count too: kept stable).
    ordered = sorted((g for g in groups if g is not None), key=lambda g: -len(groups[g]))
    items[:] = [item for g in ordered for item in groups[g]] + groups.get(None, [])
