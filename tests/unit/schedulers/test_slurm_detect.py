"""`hpcdl profiles detect/diff` without a cluster: the parsers and the profile writer on
outputs captured from real Slurm 22.05 clusters (tests/unit/slurm_outputs/):

- sandbox/: the shared two-node sandbox (scripts/sandbox.sh up, default shape)
- c2/: the second cluster the integration test starts (shape.txt there): typed GPUs of
  two kinds, a heterogeneous partition, a DOWN node, a node drained for missing GRES
  files, a partition without nodes, a hidden one, a DOWN and a DRAIN partition, no
  default partition, no slurmdbd.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hpcdl.core.duration import parse_time
from hpcdl.errors import ConfigError, ToolError
from hpcdl.profiles import load_profile
from hpcdl.schedulers.slurm import detect as sd
from hpcdl.schedulers.slurm.describe import Leaf, Map, Seq, describe, to_yaml
from hpcdl.schedulers.slurm.livecheck import differences

OUT = Path(__file__).resolve().parents[1] / "slurm_outputs"
QOS_DOWN = "sacctmgr failed (exit 1): You are not running a supported accounting_storage plugin"


def captures(name: str, **errors: str) -> dict[str, sd.Capture]:
    folder = OUT / name
    out = {}
    for key, argv in sd.COMMANDS.items():
        if key in errors:
            out[key] = sd.Capture(argv, error=errors[key])
        else:
            out[key] = sd.Capture(argv, stdout=(folder / f"{key}.txt").read_text())
    out["runtime"] = sd.Capture(("/usr/bin/apptainer", "--version"),
                                stdout=(OUT / "sandbox" / "apptainer-version.txt").read_text())
    out["runtime_name"] = sd.Capture(("apptainer",), stdout="apptainer")
    return out


def sandbox_facts() -> sd.ClusterFacts:
    return sd.facts_from(captures("sandbox"))


def c2_facts() -> sd.ClusterFacts:
    return sd.facts_from(captures("c2", qos=QOS_DOWN))


# ---- parsers -------------------------------------------------------------------------


def test_records_keep_values_with_blanks():
    line = ("NodeName=x1 CPUTot=8 OS=Linux 6.1.0 #1 SMP PREEMPT_DYNAMIC State=DOWN* "
            "Reason=Not responding [root@2026-01-01T00:00:00] CfgTRES=cpu=8,gres/gpu=4")
    rec = sd.parse_records(line)[0]
    assert rec["OS"] == "Linux 6.1.0 #1 SMP PREEMPT_DYNAMIC"
    assert rec["Reason"] == "Not responding [root@2026-01-01T00:00:00]"
    assert rec["CfgTRES"] == "cpu=8,gres/gpu=4"  # gres/gpu= inside a value is no key
    assert rec["State"] == "DOWN*"


@pytest.mark.parametrize("text,expected", [
    ("gpu:fake:4", [sd.Gres("gpu", "fake", 4)]),
    ("gpu:a100:8(S:0-1)", [sd.Gres("gpu", "a100", 8)]),
    ("gpu:2", [sd.Gres("gpu", None, 2)]),
    ("gpu:a100:2(S:0,1),gpu:v100:1", [sd.Gres("gpu", "a100", 2), sd.Gres("gpu", "v100", 1)]),
    ("gpu:a100:2,nvme:1", [sd.Gres("gpu", "a100", 2), sd.Gres("nvme", None, 1)]),
    ("(null)", []),
    ("", []),
])
def test_gres(text, expected):
    assert sd.parse_gres(text) == expected


def test_sandbox_nodes_and_partitions():
    facts = sandbox_facts()
    assert [n.name for n in facts.nodes] == ["n1", "n2"]
    n1 = facts.nodes[0]
    assert (n1.cpus, n1.memory_mb, n1.gpus, n1.gpu_types) == (8, 4096, 4, ("fake",))
    assert n1.partitions == ("debug", "gpu", "short", "lowprio", "urgent")
    parts = {p.name: p for p in facts.partitions}
    assert list(parts) == ["debug", "gpu", "short", "lowprio", "urgent"]
    assert parts["debug"].default and not parts["gpu"].default
    assert parts["short"].max_nodes == 1 and parts["short"].max_time == "00:05:00"
    assert parts["debug"].default_time == "00:10:00"
    assert parts["gpu"].total_gpus == 8 and parts["gpu"].total_cpus == 16
    assert facts.cluster_name == "hpcdl-sandbox" and facts.slurm_version == "22.05.8"
    assert facts.config["MpiDefault"] == "none"
    assert facts.gaps == {}


def test_mpi_list_22_05():
    mpi = sd.parse_mpi_list((OUT / "sandbox" / "mpi.txt").read_text())
    assert "pmix" in mpi.types and "pmi2" in mpi.types and "none" in mpi.types
    assert mpi.pmix_versions == ("pmix_v4",)


def test_mpi_list_other_layouts():
    # 23.x lists several PMIx versions comma-separated; Slurm 20 printed "srun: NAME" lines.
    newer = "MPI plugin types are...\n\tnone\n\tpmix\nspecific pmix plugin versions available: pmix_v4,pmix_v5\n"
    assert sd.parse_mpi_list(newer) == sd.MpiPlugins(("none", "pmix"), ("pmix_v4", "pmix_v5"))
    old = "srun: MPI types are...\nsrun: none\nsrun: pmi2\n"
    assert sd.parse_mpi_list(old).types == ("none", "pmi2")
    # Before 21 a PMIx version is a type of its own; before 20 the names had "mpi/".
    assert sd.parse_mpi_list("srun: MPI types are...\nsrun: none\nsrun: pmix_v3\nsrun: pmix\n"
                             ) == sd.MpiPlugins(("none", "pmix_v3", "pmix"), ("pmix_v3",))
    assert sd.parse_mpi_list("srun: MPI types are...\nsrun: mpi/none\nsrun: mpi/pmi2\n"
                             ).types == ("none", "pmi2")


def test_qos_limits():
    normal = sd.parse_qos((OUT / "sandbox" / "qos.txt").read_text())["normal"]
    assert normal == sd.Qos("normal", None, None, None)
    # Captured after `sacctmgr modify qos normal set MaxTRESPerUser=gres/gpu=8 ...` and
    # `sacctmgr add qos gpulow MaxTRESPerUser=gres/gpu=2,cpu=16 MaxJobsPerUser=1`.
    limits = sd.parse_qos((OUT / "qos-limits.txt").read_text())
    assert limits["normal"] == sd.Qos("normal", 4, 8, "1-00:00:00")
    assert limits["gpulow"] == sd.Qos("gpulow", 1, 2, None)


def test_runtime_version():
    assert sd.parse_runtime_version("apptainer version 1.4.5\n") == "1.4.5"
    assert sd.parse_runtime_version("singularity-ce version 4.1.2-jammy") == "4.1.2-jammy"
    assert sd.parse_runtime_version("nothing") is None


# ---- gaps ------------------------------------------------------------------------------


def test_unreadable_partitions_is_one_error():
    caps = captures("sandbox", partitions="scontrol: command not found")
    with pytest.raises(ToolError) as err:
        sd.facts_from(caps)
    assert err.value.message == "cannot read the cluster: scontrol: command not found"


def test_capture_stops_when_the_controller_does_not_answer():
    asked: list[tuple[str, ...]] = []

    def run(argv: tuple[str, ...], timeout: float) -> sd.Capture:
        asked.append(argv)
        return sd.Capture(argv, error="slurm_load_partitions error: Unable to contact slurm controller")

    caps = sd.capture_all(run=run, env_path=lambda _name: None)
    assert asked == [sd.COMMANDS["partitions"]]
    with pytest.raises(ToolError, match="Unable to contact slurm controller"):
        sd.facts_from(caps)


def test_missing_node_records_fall_back_to_partition_totals():
    facts = sd.facts_from(captures("sandbox", nodes="scontrol failed (exit 1): boom",
                                   mpi="srun: command not found"))
    found = describe(facts, name="sandbox")
    debug = found.profile.partition("debug")
    assert debug is not None
    assert (debug.gpus_per_node, debug.cpus_per_node, debug.gpu_type) == (4, 8, None)
    assert "GAP: per-node detail unknown: scontrol failed (exit 1): boom" in found.text
    assert found.profile.mpi.srun_mpi is None
    assert "GAP: mpi: srun: command not found" in found.notes


# ---- the written profile ----------------------------------------------------------------


def test_sandbox_profile_matches_the_bundled_one():
    found = describe(sandbox_facts(), name="sandbox", when="2026-01-01 00:00 UTC")
    bundled = load_profile("sandbox")
    assert differences(bundled, found.profile, mpi_offered=("pmix", "pmi2", "none")) == []
    for mine, theirs in zip(found.profile.partitions, bundled.partitions, strict=True):
        assert (mine.name, mine.nodes, mine.gpus_per_node, mine.gpu_type, mine.cpus_per_node,
                mine.mem_per_node_gb, mine.node_limit, mine.default) == (
            theirs.name, theirs.nodes, theirs.gpus_per_node, theirs.gpu_type,
            theirs.cpus_per_node, theirs.mem_per_node_gb, theirs.node_limit, theirs.default)
        assert mine.max_seconds == theirs.max_seconds
    assert found.profile.scheduler.default_time == "00:10:00"
    assert found.profile.mpi.srun_mpi == "pmix"
    assert found.profile.container.runtime == "apptainer" and found.profile.container.nv


def test_every_value_has_a_comment():
    text = describe(sandbox_facts(), name="sandbox").text
    for line in text.splitlines():
        if line.startswith("#") or line.rstrip().endswith(":"):
            continue  # header comments, and the keys that only open a section
        assert "  # " in line, f"no source comment: {line!r}"


def test_c2_profile_is_honest_about_the_odd_parts():
    found = describe(c2_facts())
    prof = found.profile
    assert prof.name == "c2"
    assert [p.name for p in prof.partitions] == ["a100", "v100", "mixed", "cpu", "hid", "broken",
                                                 "maint"]
    assert prof.default_partition is None
    mixed = prof.partition("mixed")
    assert mixed is not None
    # Heterogeneous: g1 has 4 a100 and 8 CPUs, g2 2 v100 and 4 CPUs -> the smaller node.
    assert (mixed.gpus_per_node, mixed.cpus_per_node, mixed.gpu_type) == (2, 4, None)
    assert "GPUs per node: heterogeneous (2: g2; 4: g1): the smallest node decides" in found.text
    assert "GPU types differ (a100: g1; v100: g2)" in found.text
    a100 = prof.partition("a100")
    assert a100 is not None and (a100.nodes, a100.gpu_type, a100.max_time) == (2, "a100", "01:00:00")
    assert "1 not usable now: x1 DOWN" in found.text
    cpu = prof.partition("cpu")
    assert cpu is not None and (cpu.gpus_per_node, cpu.max_time) == (0, "infinite")
    hid = prof.partition("hid")
    assert hid is not None and "hidden partition" in (hid.description or "")
    broken = prof.partition("broken")
    assert broken is not None and broken.gpus_per_node == 2
    assert "gres/gpu count reported lower than configured" in found.text
    assert any(n.startswith("partition empty: no nodes") for n in found.notes)
    assert "partition closed: State=DRAIN, Slurm takes no new jobs: left out" in found.notes
    maint = prof.partition("maint")
    assert maint is not None and "State=DOWN: Slurm queues jobs here" in (maint.description or "")
    assert any(n.startswith("no default partition") for n in found.notes)
    assert f"GAP: qos: {QOS_DOWN}" in found.notes
    assert all(p.max_gpus_per_user is None for p in prof.partitions)
    # No default partition, and only some set DefaultTime: the shortest one.
    assert prof.scheduler.default_time == "00:05:00"


def test_no_describable_partition_is_one_error():
    facts = c2_facts()
    only_empty = sd.ClusterFacts(
        partitions=[p for p in facts.partitions if p.name == "empty"], nodes=facts.nodes,
        config=facts.config, mpi=facts.mpi, qos=facts.qos, runtime=facts.runtime)
    with pytest.raises(ConfigError, match="no partition can be described"):
        describe(only_empty)


def test_writer_quotes_strings_and_flattens_comments():
    doc = Map((
        ("a", Leaf('x"y\\z\nnext: 1 # not a comment', "line one\nline two")),
        ("b", Leaf("é ✓ $(rm -rf /)", "")),
        ("c", Leaf(None, "null")),
        ("d", Seq((Leaf("p q"), Leaf("r")), "inline")),
        ("e", Seq((Map((("k", Leaf(1, "one")), ("l", Leaf(True)))),), "maps")),
    ))
    text = to_yaml(doc, ["header\nsecond"])
    assert yaml.safe_load(text) == {
        "a": 'x"y\\z\nnext: 1 # not a comment', "b": "é ✓ $(rm -rf /)", "c": None,
        "d": ["p q", "r"], "e": [{"k": 1, "l": True}],
    }
    assert "# line one line two" in text and "# header second" in text


def test_diff_names_each_disagreement():
    found = describe(sandbox_facts(), name="sandbox")
    bundled = load_profile("sandbox")
    edited = bundled.model_copy(update={"partitions": [
        bundled.partitions[0].model_copy(update={"gpus_per_node": 2, "gpu_type": "a100"}),
        bundled.partitions[1].model_copy(update={"cpus_per_node": 16, "max_time": "03:00:00"}),
    ]})
    lines = differences(edited, found.profile, mpi_offered=("pmi2", "none"))
    assert any(line.startswith("CPUs per node: profile sandbox partition gpu claims 16") for line in lines)
    assert any(line.startswith("max time: profile sandbox partition gpu claims 03:00:00") for line in lines)
    assert any(line.startswith("GPUs per node: partition debug: profile says 2, the cluster has 4")
               for line in lines)
    assert any(line.startswith("GPU type: partition debug: profile says a100") for line in lines)
    assert "partitions: the cluster has short, lowprio, urgent, the profile does not" in lines
    assert "mpi.srun_mpi: profile says pmix, srun --mpi=list offers pmi2, none" in lines


def test_time_format_is_slurms():
    found = describe(c2_facts())
    for p in found.profile.partitions:
        assert p.max_time == "infinite" or parse_time(p.max_time) is not None


# ---- the command line (checks that come before Slurm is asked) ---------------------------


def test_detect_refuses_a_bad_name_and_an_existing_file(tmp_path):
    from click.testing import CliRunner

    from hpcdl.cli import cli

    res = CliRunner().invoke(cli, ["profiles", "detect", "--name", "a b\nc"])
    assert res.exit_code == 2
    assert res.output.splitlines()[0].startswith("error: name: 'a b\\nc' is not a profile name")
    existing = tmp_path / "p.yaml"
    existing.write_text("keep me\n")
    res = CliRunner().invoke(cli, ["profiles", "detect", "-o", str(existing)])
    assert res.exit_code == 2
    assert res.output.strip() == f"error: output: {existing} exists (pass --force to overwrite it)"
    assert existing.read_text() == "keep me\n"


def test_detect_with_a_missing_slurm_conf_is_one_line(monkeypatch, tmp_path):
    from click.testing import CliRunner

    from hpcdl.cli import cli

    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "nope.conf"))
    res = CliRunner().invoke(cli, ["profiles", "detect"])
    assert res.exit_code == 1
    assert res.output.splitlines()[0] == f"error: cannot read the cluster: SLURM_CONF={tmp_path / 'nope.conf'} does not exist"


def test_partition_qos_decides_per_user_limits():
    caps = captures("sandbox")
    caps["qos"] = sd.Capture(sd.COMMANDS["qos"], stdout=(OUT / "qos-limits.txt").read_text())
    # The gpu partition gets its own QOS (PartitionName=... QOS=gpulow in slurm.conf).
    text = caps["partitions"].stdout.replace("PartitionName=gpu AllowGroups=ALL AllowAccounts=ALL "
                                             "AllowQos=ALL AllocNodes=ALL Default=NO QoS=N/A",
                                             "PartitionName=gpu AllowGroups=ALL AllowAccounts=ALL "
                                             "AllowQos=ALL AllocNodes=ALL Default=NO QoS=gpulow")
    assert text != caps["partitions"].stdout
    caps["partitions"] = sd.Capture(sd.COMMANDS["partitions"], stdout=text)
    prof = describe(sd.facts_from(caps), name="sandbox").profile
    limits = {p.name: (p.max_gpus_per_user, p.max_jobs_per_user) for p in prof.partitions}
    assert limits == {"debug": (8, 4), "gpu": (2, 1), "short": (8, 4), "lowprio": (8, 4),
                      "urgent": (8, 4)}


# ---- the release (scheduler.release, from scontrol show config's SLURM_VERSION) ------

def _with_config(**config: str) -> sd.ClusterFacts:
    from dataclasses import replace

    facts = sandbox_facts()
    return replace(facts, config={**facts.config, **config})


def test_detect_records_the_release_and_what_differs():
    found = describe(_with_config(SLURM_VERSION="22.05.8"), name="x")
    assert found.profile.scheduler.release == "22.05"
    assert not found.profile.scheduler.requeue_expedite
    assert not any(n.startswith("Slurm 22.05:") for n in found.notes)  # nothing differs
    assert 'release: "22.05"  # SLURM_VERSION=22.05.8 (scontrol show config)' in found.text
    newer = describe(_with_config(SLURM_VERSION="26.05.5"), name="x", commands="/opt/slurm/bin")
    assert newer.profile.scheduler.release == "26.05"
    assert newer.profile.scheduler.commands == "/opt/slurm/bin"
    assert any("SLURM_CPUS_PER_TASK" in n for n in newer.notes)


@pytest.mark.parametrize("version,params,expected", [
    ("25.11.2", "enable_expedited_requeue", True),
    ("25.11.2", "(null)", False),
    ("24.11.5", "enable_expedited_requeue", False),  # no --requeue=expedite before 25.11
])
def test_detect_reads_whether_expedite_is_enabled(version, params, expected):
    found = describe(_with_config(SLURM_VERSION=version, SlurmctldParameters=params), name="x")
    assert found.profile.scheduler.requeue_expedite is expected


def test_an_unknown_release_is_a_note_and_the_nearest_known():
    found = describe(_with_config(SLURM_VERSION="27.11.0"), name="x")
    assert found.profile.scheduler.release == "26.05"
    assert any("27.11.0" in n and "not a release hpcdl knows" in n for n in found.notes)


def test_diff_names_a_release_the_profile_does_not_follow():
    bundled = load_profile("sandbox")  # no scheduler.release: 22.05's scripts
    on_22 = describe(_with_config(SLURM_VERSION="22.05.8"), name="sandbox").profile
    assert not any("release" in d for d in differences(bundled, on_22, mpi_offered=("pmix",)))
    on_26 = describe(_with_config(SLURM_VERSION="26.05.5",
                                  SlurmctldParameters="enable_expedited_requeue"),
                     name="sandbox").profile
    lines = differences(bundled, on_26, mpi_offered=("pmix",))
    assert ("scheduler.release: profile says nothing (22.05 scripts), the cluster runs Slurm "
            "26.05 (the job scripts follow the profile)") in lines
    assert any(d.startswith("scheduler.requeue_expedite: profile says false") for d in lines)
    followed = bundled.model_copy(update={"scheduler": bundled.scheduler.model_copy(
        update={"release": "26.05", "requeue_expedite": True})})
    assert not any("release" in d or "expedite" in d
                   for d in differences(followed, on_26, mpi_offered=("pmix",)))
