"""`hpcdl sandbox up --slurm RELEASE`'s pure parts: its names (directory, cluster,
nodes, profile) stay apart from the host release's clusters and each other's, its
profile names the release's command directory (scheduler.commands) and passes the
schema, slurm.conf takes the root's plugins, and an unknown release is one line. The
running cluster is tests/integration/test_slurm_releases.py's."""

from __future__ import annotations

import pytest
import yaml

from hpcdl import sandbox as shape
from hpcdl.cli.sandbox import _expedite
from hpcdl.errors import ValidationError
from hpcdl.profiles.schema import Profile
from hpcdl.sandbox.cluster import Cluster, parse_shape
from hpcdl.sandbox.render import render_files
from tests.unit.sandbox.test_sandbox_nodes import BUNDLED


def test_release_names_differ_from_every_other_cluster():
    names = {r: (shape.cluster_dir(2, r), shape.cluster_name(2, r), shape.profile_name(2, r),
                 tuple(shape.node_names(2, r))) for r in shape.RELEASES}
    names["host"] = (shape.cluster_dir(2), shape.cluster_name(2), shape.profile_name(2),
                     tuple(shape.node_names(2)))
    for i in range(4):
        column = [v[i] for v in names.values()]
        assert len(set(column)) == len(column), column
    assert names["24.11"][3] == ("v2411n1", "v2411n2")
    assert names["26.05"][2] == "sandbox-26.05"


def test_release_profile_names_its_commands(tmp_path):
    data = shape.profile_data(BUNDLED, 2, tmp_path, "24.11", pmix=True)
    prof = Profile.model_validate(data)
    assert prof.name == "sandbox-24.11"
    assert prof.scheduler.commands == str(tmp_path / "bin")
    assert prof.scheduler.release == "24.11"
    # A root whose mpi/pmix plugin reads its own PMIx keeps the bundled pmix; one
    # without the plugin (forky's 26.05) starts ranks without a PMI.
    assert prof.mpi.srun_mpi == "pmix"
    bare = Profile.model_validate(shape.profile_data(BUNDLED, 2, tmp_path, "26.05"))
    assert bare.mpi.srun_mpi == "none" and bare.scheduler.release == "26.05"
    # The host release's profiles keep PATH's commands and their PMIx.
    plain = Profile.model_validate(shape.profile_data(BUNDLED, 2, tmp_path))
    assert plain.scheduler.commands is None and plain.mpi.srun_mpi == "pmix"
    assert plain.scheduler.release is None


def test_root_has_pmix_reads_the_roots_link_file(tmp_path):
    assert not shape.root_has_pmix(None) and not shape.root_has_pmix(str(tmp_path))
    (tmp_path / "hpcdl").mkdir()
    (tmp_path / "hpcdl" / "pmix-link").write_text("/run/hpcdl-pmix-24.11 /x\n")
    assert shape.root_has_pmix(str(tmp_path))


@pytest.mark.parametrize("bad", ["24.11.5", "24", "v24.11", "24.11\n", ""])
def test_a_profile_release_is_yy_mm(tmp_path, bad):
    data = shape.profile_data(BUNDLED, 2, tmp_path, "24.11")
    data["scheduler"]["release"] = bad
    with pytest.raises(Exception, match="release"):
        Profile.model_validate(data)


def test_release_environment_and_slurm_conf(tmp_path):
    root = "/var/cache/hpcdl/slurm-rootfs/24.11-0123456789ab"
    env = shape.environment(tmp_path, 2, 17999, "24.11", root)
    assert env["HPCDL_SANDBOX_SLURM_ROOT"] == root
    assert env["HPCDL_SANDBOX_CLUSTER"] == "hpcdl-slurm2411"
    text = shape.shape_text(2, "10.91.9", "24.11")
    cluster = Cluster.from_env(env, text)
    files = render_files(cluster, "host")
    assert f"PluginDir={root}/usr/lib/x86_64-linux-gnu/slurm-wlm\n" in files["slurm.conf"]
    assert f"SLURM_ROOT={root}\n" in files["cluster.sh"]
    assert [n.name for n in parse_shape(text).nodes] == ["v2411n1", "v2411n2"]
    # The host's release: no PluginDir (its compiled-in one), no root.
    plain = render_files(Cluster.from_env(shape.environment(tmp_path, 2, 17999), text), "host")
    assert "PluginDir" not in plain["slurm.conf"]
    assert "SLURM_ROOT=''\n" in plain["cluster.sh"]


def test_a_root_that_is_not_a_plain_directory_is_refused(tmp_path):
    env = {**shape.environment(tmp_path, 2, 17999), "HPCDL_SANDBOX_SLURM_ROOT": "/x; rm -rf /"}
    with pytest.raises(ValidationError, match="HPCDL_SANDBOX_SLURM_ROOT"):
        Cluster.from_env(env, shape.shape_text(2, "10.91.9", "24.11"))


@pytest.mark.parametrize("release", ["22.05", "21.08", "27.05", "24.11.5", ""])
def test_unknown_release_is_one_line(release):
    with pytest.raises(ValidationError) as err:
        shape.check_release(release)
    assert "\n" not in err.value.message and "24.11, 26.05" in err.value.message


def test_the_profile_yaml_round_trips(tmp_path):
    data = shape.profile_data(BUNDLED, 3, tmp_path, "26.05")
    again = Profile.model_validate(yaml.safe_load(yaml.safe_dump(data, sort_keys=False)))
    assert again.partitions[0].nodes == 3


def test_expedited_requeue_is_enabled_where_the_release_has_it(tmp_path):
    """26.05 (25.11 on): slurm.conf enables --requeue=expedite and the profile says so
    (hpcdl then asks for it); 24.11 and the host's release: neither."""
    for release, enabled in (("24.11", False), ("26.05", True), (None, False)):
        assert _expedite(release) is enabled
        env = shape.environment(tmp_path, 3, 17999, release, "/var/cache/x" if release else None,
                                _expedite(release))
        conf = render_files(Cluster.from_env(env, shape.shape_text(3, "10.91.9", release)),
                            "host")["slurm.conf"]
        params = next(line for line in conf.splitlines()
                      if line.startswith("SlurmctldParameters="))
        assert ("enable_expedited_requeue" in params) is enabled, (release, params)
        assert "preempt_send_user_signal" in params
        data = shape.profile_data(BUNDLED, 3, tmp_path, release, expedite=_expedite(release))
        prof = Profile.model_validate(data)
        assert prof.scheduler.requeue_expedite is enabled, release


def test_a_release_cluster_has_the_preempting_pair(tmp_path):
    """lowprio (requeued by) urgent, over every node, beside debug, in slurm.conf and the
    profile; the host release's N-node clusters keep their one partition."""
    parts = {p.name: p for p in shape.shape(3, "10.91.9", "26.05").partitions}
    assert list(parts) == ["debug", "lowprio", "urgent"]
    assert parts["lowprio"].preempt_mode == "REQUEUE" and parts["urgent"].priority_tier == 10
    assert parts["lowprio"].node_names() == ["v2605n1", "v2605n2", "v2605n3"]
    assert {p.max_nodes for p in parts.values()} == {3}
    prof = Profile.model_validate(shape.profile_data(BUNDLED, 3, tmp_path, "24.11"))
    assert [p.name for p in prof.partitions] == ["debug", "lowprio", "urgent"]
    assert [p.name for p in shape.shape(3, "10.91.9").partitions] == ["debug"]


def test_a_bad_release_in_the_environment_is_one_line(tmp_path):
    env = {**shape.environment(tmp_path, 2, 17999), "HPCDL_SANDBOX_EXPEDITE": "1"}
    with pytest.raises(ValidationError, match="HPCDL_SANDBOX_EXPEDITE"):
        Cluster.from_env(env, shape.shape_text(2, "10.91.9", "26.05"))


def test_a_release_cluster_runs_its_own_accounting(tmp_path):
    """With accounting ports (what `sandbox up --slurm` gives a release's cluster): its
    slurm.conf stores to its own slurmdbd on that port, whose slurmdbd.conf loads the
    release root's plugins and stores in MariaDB on the other port; without them (the
    N-node clusters): no accounting, as before."""
    root = "/var/cache/hpcdl/slurm-rootfs/26.05-0123456789ab"
    env = shape.environment(tmp_path, 3, 17999, "26.05", root, True, (17801, 17802))
    assert env["HPCDL_SANDBOX_ACCOUNTING"] == "slurmdbd"
    files = render_files(Cluster.from_env(env, shape.shape_text(3, "10.91.9", "26.05")), "host")
    conf = files["slurm.conf"].splitlines()
    assert "AccountingStorageType=accounting_storage/slurmdbd" in conf
    assert "AccountingStoragePort=17801" in conf
    dbd = files["slurmdbd.conf"].splitlines()
    assert {"DbdPort=17801", "StoragePort=17802",
            f"PluginDir={root}/usr/lib/x86_64-linux-gnu/slurm-wlm"} <= set(dbd)
    assert "ACCOUNTING=slurmdbd" in files["cluster.sh"].splitlines()
    plain = shape.environment(tmp_path, 3, 17999)
    assert plain["HPCDL_SANDBOX_ACCOUNTING"] == "none" and "HPCDL_SANDBOX_DBD_PORT" not in plain
    host = render_files(Cluster.from_env(plain, shape.shape_text(3, "10.91.9")), "host")
    assert "PluginDir" not in host["slurmdbd.conf"]
