"""The Slurm adapter's pure parts: state table, output parsers, live-check
comparison, refusal hints, exit statuses and run directories. No Slurm needed.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hpcdl.errors import SubmitError, ValidationError
from hpcdl.jobs import rundir
from hpcdl.jobs.submit import exit_status
from hpcdl.plan import JobRequest, build_plan
from hpcdl.profiles import load_profile
from hpcdl.schedulers.base import FINAL_STATES, JobState, is_final
from hpcdl.schedulers.slurm import livecheck
from hpcdl.schedulers.slurm.adapter import SlurmScheduler
from hpcdl.schedulers.slurm.commands import refusal_hint, sbatch
from hpcdl.schedulers.slurm.parse import (
    JobStatus,
    gpus_in_gres,
    is_sacct_placeholder,
    parse_exit_code,
    parse_job_id,
    parse_key_values,
    parse_sacct,
    parse_scontrol_exit,
    parse_squeue,
    parse_squeue_status,
    wait_status,
)
from hpcdl.schedulers.slurm.states import (
    SLURM_TO_HPCDL,
    may_come_back,
    normalize_slurm_state,
    to_hpcdl,
)


@pytest.mark.parametrize("raw, state", [
    ("PENDING", "PENDING"), ("CONFIGURING", "PENDING"), ("REQUEUED", "PENDING"),
    ("RUNNING", "RUNNING"), ("COMPLETING", "RUNNING"),
    ("SUSPENDED", "SUSPENDED"),
    ("COMPLETED", "COMPLETED"),
    ("FAILED", "FAILED"), ("NODE_FAIL", "FAILED"), ("OUT_OF_MEMORY", "FAILED"),
    ("BOOT_FAIL", "FAILED"),
    ("CANCELLED", "CANCELLED"), ("CANCELLED by 0", "CANCELLED"), ("PREEMPTED", "CANCELLED"),
    ("TIMEOUT", "TIMEOUT"), ("DEADLINE", "TIMEOUT"),
    ("CANCELLED+", "CANCELLED"), ("running", "RUNNING"),
    ("SOMETHING_NEW", "UNKNOWN"), ("", "UNKNOWN"), ("   ", "UNKNOWN"),
])
def test_state_table(raw: str, state: str) -> None:
    assert to_hpcdl(raw) == state


def test_a_preempted_or_requeued_job_may_come_back() -> None:
    assert may_come_back("PREEMPTED") and may_come_back("REQUEUED") and may_come_back("NODE_FAIL")
    assert not may_come_back("CANCELLED by 0") and not may_come_back("COMPLETED")
    preempted = parse_sacct("9|PREEMPTED|0:15|n1|00:00:05|00:10:00|debug|x\n")[0]
    assert SlurmScheduler().may_come_back(preempted)


def test_job_status_records_keep_their_key() -> None:
    # result.json has always carried the scheduler's word as slurm_state: a record
    # written before the field was renamed still loads, and new ones read the same.
    old = {"job_id": "3", "name": "n", "state": "TIMEOUT", "slurm_state": "DEADLINE",
           "exit_code": 0, "signal": 15}
    status = JobStatus.from_dict(old)
    assert (status.state, status.native_state) == (JobState.TIMEOUT, "DEADLINE")
    assert status.to_dict()["slurm_state"] == "DEADLINE" and "native_state" not in status.to_dict()
    assert JobStatus.from_dict(status.to_dict()) == status
    assert JobStatus.from_dict({"job_id": "4", "name": "", "state": "ODD"}).state == "UNKNOWN"



def test_state_table_targets_are_hpcdl_states() -> None:
    assert set(SLURM_TO_HPCDL.values()) <= set(JobState)
    assert FINAL_STATES == {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}
    assert not is_final("UNKNOWN") and not is_final("RUNNING") and is_final("TIMEOUT")
    assert normalize_slurm_state("CANCELLED by 12345") == "CANCELLED"


@pytest.mark.parametrize("out, job", [("123\n", "123"), ("456;cluster\n", "456"),
                                      ("sbatch: warning: x\n789\n", "789")])
def test_parse_job_id(out: str, job: str) -> None:
    assert parse_job_id(out) == job


@pytest.mark.parametrize("out", ["", "Submitted batch job 5\n", "abc"])
def test_parse_job_id_refuses_garbage(out: str) -> None:
    with pytest.raises(SubmitError, match="no job id"):
        parse_job_id(out)


def test_exit_codes() -> None:
    assert parse_exit_code("3:0") == (3, 0)
    assert parse_exit_code("0:15") == (0, 15)
    assert parse_exit_code("") == (None, None)
    assert parse_exit_code("n/a") == (None, None)


def test_squeue_rows_keep_a_name_with_pipes_whole() -> None:
    out = ("12|RUNNING|None|n[1-2]|0:05|30:00|debug|a|b c\n"
           "13|PENDING|Resources||0:00|5:00|short|plain\n")
    a, b = parse_squeue(out)
    assert (a.job_id, a.state, a.nodes, a.name, a.reason) == ("12", "RUNNING", "n[1-2]", "a|b c", "")
    assert (b.state, b.reason, b.partition) == ("PENDING", "Resources", "short")


def test_sacct_rows() -> None:
    out = ("4|FAILED|3:0|n1|00:00:01|00:10:00|debug|x|y\n"
           "5|CANCELLED by 0|0:15|n2|00:00:03|00:10:00|debug|sleepy\n"
           "5.batch|CANCELLED|0:15|n2|00:00:03||| batch\n"
           "garbage line\n")
    rows = parse_sacct(out)
    assert [(r.job_id, r.state, r.exit_code, r.signal, r.name) for r in rows] == [
        ("4", "FAILED", 3, 0, "x|y"), ("5", "CANCELLED", 0, 15, "sleepy")]


def _st(state: str, name: str = "job") -> JobStatus:
    return JobStatus(job_id="1", name=name, state=JobState(state), native_state=state)


def test_sacct_placeholder_detection() -> None:
    # Seen on the sandbox: a finished job's row is named "allocation" for a few seconds.
    assert is_sacct_placeholder(_st("PENDING", "allocation"), _st("COMPLETED"))
    assert is_sacct_placeholder(_st("COMPLETED", "allocation"), _st("COMPLETED", "load-1"))
    assert is_sacct_placeholder(_st("UNKNOWN"), None)
    assert not is_sacct_placeholder(_st("COMPLETED"), _st("COMPLETED"))
    assert not is_sacct_placeholder(_st("PENDING"), _st("PENDING"))
    # squeue has forgotten the job: the database is the truth, whatever the name.
    assert not is_sacct_placeholder(_st("COMPLETED", "allocation"), None)


def test_scontrol_exit_ignores_a_lying_job_name() -> None:
    line = ("JobId=4 JobName=x JobState=COMPLETED Reason=None ExitCode=0:0 UserId=root(0) "
            "JobState=FAILED Reason=NonZeroExitCode Dependency=(null) ExitCode=3:0 RunTime=0")
    assert parse_scontrol_exit(line, "FAILED") == (3, 0)
    assert parse_scontrol_exit(line, "RUNNING") == (None, None)


def test_key_values_and_gres() -> None:
    kv = parse_key_values("PartitionName=debug MaxNodes=2 MaxTime=00:30:00 Nodes=n[1-2]")
    assert kv["MaxTime"] == "00:30:00" and kv["Nodes"] == "n[1-2]"
    assert gpus_in_gres("gpu:fake:4") == 4
    assert gpus_in_gres("gpu:a100:8(S:0-1)") == 8
    assert gpus_in_gres("gpu:4,tmpdisk:100") == 4
    assert gpus_in_gres("(null)") == 0


SCONTROL = """\
PartitionName=debug Default=YES MaxNodes=2 MaxTime=00:30:00 Nodes=n[1-2] TotalCPUs=16 TotalNodes=2
PartitionName=gpu MaxNodes=UNLIMITED MaxTime=02:00:00 Nodes=n[1-2] TotalNodes=2
PartitionName=short MaxNodes=1 MaxTime=00:05:00 Nodes=n[1-2] TotalNodes=2
PartitionName=lowprio MaxNodes=2 MaxTime=00:10:00 Nodes=n[1-2] TotalNodes=2
PartitionName=urgent MaxNodes=2 MaxTime=00:05:00 Nodes=n[1-2] TotalNodes=2
"""
SINFO = ("debug|gpu:fake:4|8|2\ngpu|gpu:fake:4|8|2\nshort|gpu:fake:4|8|2\n"
         "lowprio|gpu:fake:4|8|2\nurgent|gpu:fake:4|8|2\n")


def test_parse_partitions() -> None:
    parts = livecheck.parse_partitions(SCONTROL, SINFO)
    assert parts["debug"].max_nodes == 2 and parts["debug"].max_seconds == 1800
    assert parts["gpu"].max_nodes is None and parts["gpu"].gpus_per_node == 4
    assert parts["short"].cpus_per_node == 8


def test_sandbox_profile_matches_the_sandbox_cluster() -> None:
    errors, warnings = livecheck.compare(load_profile("sandbox"),
                                         livecheck.parse_partitions(SCONTROL, SINFO))
    assert errors == [] and warnings == []


def _liar():
    prof = load_profile("sandbox")
    debug = prof.partition("debug")
    assert debug is not None
    liar_debug = debug.model_copy(update={"gpus_per_node": 8, "max_time": "04:00:00"})
    huge = debug.model_copy(update={"name": "huge", "default": False})
    return prof.model_copy(update={"name": "liar", "partitions": [
        liar_debug, *[p for p in prof.partitions if p.name != "debug"], huge]})


def test_live_check_errors_only_for_what_the_request_needs() -> None:
    liar = _liar()
    cluster = livecheck.parse_partitions(SCONTROL, SINFO)
    small = build_plan(liar, JobRequest.of(nodes=1, gpus=2, partition="debug"))
    warnings = livecheck.check_demand(liar, small.demand(), cluster)
    assert any("GPUs per node: profile liar partition debug claims 8, the cluster has 4" in w
               for w in warnings)
    big = build_plan(liar, JobRequest.of(nodes=1, gpus=8, partition="debug"))
    with pytest.raises(ValidationError, match=r"claims 8, the cluster has 4 \(the request needs 8\)"):
        livecheck.check_demand(liar, big.demand(), cluster)
    long = build_plan(liar, JobRequest.of(nodes=1, gpus=1, partition="debug", time="03:00:00"))
    with pytest.raises(ValidationError, match="cluster's limit is 00:30:00"):
        livecheck.check_demand(liar, long.demand(), cluster)
    missing = build_plan(liar, JobRequest.of(nodes=1, gpus=1, partition="huge"))
    with pytest.raises(ValidationError, match="huge does not exist on the cluster"):
        livecheck.check_demand(liar, missing.demand(), cluster)


@pytest.mark.parametrize("message, needle", [
    ("sbatch: error: Batch job submission failed: Requested node configuration is not available",
     "sinfo"),
    ("sbatch: error: Batch job submission failed: Requested time limit is invalid", "MaxTime"),
    ("sbatch: error: invalid partition specified: x", "sinfo -s"),
    ("sbatch: error: something new", "--dry-run"),
])
def test_refusal_hints(message: str, needle: str) -> None:
    assert needle in refusal_hint(message)


def test_exit_status() -> None:
    assert exit_status(JobStatus("1", "j", "COMPLETED", "COMPLETED", 0, 0)) == 0
    assert exit_status(JobStatus("1", "j", "FAILED", "FAILED", 3, 0)) == 3
    assert exit_status(JobStatus("1", "j", "CANCELLED", "CANCELLED", 0, 15)) == 143
    # A time-out exits 124 like timeout(1), whatever signal ended the job (hpcdl.jobs.timelimit).
    assert exit_status(JobStatus("1", "j", "TIMEOUT", "TIMEOUT", 0, 0)) == 124


def test_sbatch_argument_handling_with_a_fake_sbatch(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # Fast unit check of argv and output handling; the real thing is in tests/integration.
    fake = tmp_path / "sbatch"
    fake.write_text(f"#!{sys.executable}\nimport sys, json\n"
                    f"open({str(tmp_path / 'argv')!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
                    "if '--refuse' in sys.argv:\n"
                    "    sys.stderr.write('sbatch: error: Batch job submission failed: '\n"
                    "                     'Requested node configuration is not available\\n')\n"
                    "    sys.exit(1)\n"
                    "print('42;sandbox')\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert sbatch(["sbatch", "--parsable", "--job-name=a b $(x)", "job.sbatch"]) == "42"
    assert json.loads((tmp_path / "argv").read_text()) == [
        "--parsable", "--job-name=a b $(x)", "job.sbatch"]
    with pytest.raises(SubmitError) as err:
        sbatch(["sbatch", "--refuse"])
    assert err.value.message == ("sbatch refused the job: sbatch: error: Batch job submission "
                                 "failed: Requested node configuration is not available")
    assert err.value.hint and "sinfo" in err.value.hint


def test_run_dirs_are_unique_under_concurrency(tmp_path: Path) -> None:
    with ThreadPoolExecutor(max_workers=8) as pool:
        dirs = list(pool.map(lambda _: rundir.create_run_dir("same $(name)", tmp_path).path,
                             range(200)))
    assert len(set(dirs)) == 200
    assert all(d.is_dir() and d.parent == tmp_path.resolve() for d in dirs)
    assert all(d.name.startswith("same-name-") for d in dirs)


def test_new_run_path_creates_nothing(tmp_path: Path) -> None:
    path = rundir.new_run_path("a job", tmp_path / "runs")
    assert path.parent == (tmp_path / "runs").resolve() and path.name.startswith("a-job-")
    assert not (tmp_path / "runs").exists()
    assert rundir.make_run_dir(path).path.is_dir()
    with pytest.raises(FileExistsError):
        rundir.make_run_dir(path)


def test_write_atomic_and_find_run(tmp_path: Path) -> None:
    run = rundir.create_run_dir("job", tmp_path)
    script = run.write_plan("#!/bin/bash\necho hi\n",
                            {"job_name": "job", "nodes": 1, "gpus_per_node": 0, "ntasks": 1})
    assert script == run.path / "job.sbatch"
    assert script.read_text() == "#!/bin/bash\necho hi\n" and os.access(script, os.X_OK)
    assert run.read_plan() == rundir.PlanRecord(nodes=1, gpus_per_node=0, ntasks=1,
                                                job_name="job")
    assert run.read_job() is None
    run.write_job(rundir.JobRecord.now("77", ["sbatch", str(script)]))
    job = run.read_job()
    assert job is not None and (job.job_id, job.argv) == ("77", ["sbatch", str(script)])
    assert json.loads(run.job_file.read_text())["submitted_at"] == job.submitted_at
    assert rundir.find_run("77", tmp_path) == run
    assert rundir.find_run("78", tmp_path) is None
    assert not [p for p in run.path.iterdir() if p.name.endswith(".tmp")]
    assert run.logs("77") == (run.path / "slurm-77.out", run.path / "slurm-77.err")
    assert run.read_result() is None
    run.write_result({"state": "COMPLETED"})
    assert run.read_result() == {"state": "COMPLETED"}


def test_record_inputs_keeps_profile_and_image_provenance(tmp_path: Path) -> None:
    image = tmp_path / "img.sif"
    image.write_bytes(b"SIF" * 100)
    record = {"version": 1, "hash": "c0ffee", "spec": "pytorch-horovod-cpu",
              "built_at": "2026-11-22T08:04:54+00:00", "runtime": "apptainer 1.4.5",
              "definition_sha256": "d3f", "files": {}}
    (tmp_path / "img.sif.hash").write_text(json.dumps(record))
    (tmp_path / "img.sif.def").write_text("Bootstrap: debootstrap\n")
    profile = load_profile("sandbox")
    run = rundir.create_run_dir("job", tmp_path / "runs")
    run.record_inputs(profile.model_dump(mode="json"), str(image))
    info = json.loads(run.image_file.read_text())
    assert info["content_hash"] == "c0ffee" and info["size"] == 300
    assert info["path"] == str(image) and info["spec"] == "pytorch-horovod-cpu"
    assert run.image_def.read_text() == "Bootstrap: debootstrap\n"
    # The dumped profile loads again, as the same profile.
    again = load_profile(str(run.profile_file))
    assert again == profile


def test_record_inputs_without_build_record(tmp_path: Path) -> None:
    image = tmp_path / "other.sif"
    image.write_bytes(b"x")
    run = rundir.create_run_dir("job", tmp_path / "runs")
    run.record_inputs({"name": "p"}, str(image))
    info = json.loads(run.image_file.read_text())
    assert info["content_hash"] is None and "apptainer inspect --deffile" in info["note"]
    assert not run.image_def.exists()
    run.record_inputs({"name": "p"}, None)  # no image: profile only
    assert sorted(p.name for p in run.path.iterdir()) == ["image.json", "profile.yaml"]


def test_wait_status_from_squeue_exit_code() -> None:
    assert wait_status("768") == (3, 0)      # exit 3 (scontrol: ExitCode=3:0)
    assert wait_status("15") == (0, 15)      # killed by SIGTERM (ExitCode=0:15)
    assert wait_status("32512") == (127, 0)  # command not found
    assert wait_status("") == (None, None) and wait_status("N/A") == (None, None)


def test_squeue_status_rows_carry_the_exit_code_of_ended_jobs_only() -> None:
    out = ("7|N/A|FAILED|NonZeroExitCode|n1|0:03|10:00|debug|768|a|b\n"
           "8|N/A|RUNNING|None|n[1-2]|0:01|10:00|debug|0|job\n"
           "garbage\n")
    failed, running = parse_squeue_status(out)
    assert (failed.job_id, failed.state, failed.exit_code, failed.signal) == ("7", "FAILED", 3, 0)
    assert failed.name == "a|b" and failed.reason == "NonZeroExitCode"
    assert (running.state, running.exit_code, running.reason) == ("RUNNING", None, "")


def test_squeue_status_names_an_array_task_as_slurm_does() -> None:
    # squeue -r -O ArrayJobID,ArrayTaskID,...: a task is ARRAY_TASK, a plain job its id.
    out = ("410|2|PENDING|JobArrayTaskLimit||0:00|10:00|debug|0|sweep\n"
           "410|0|COMPLETED|None|n1|0:03|10:00|debug|256|sweep\n"
           "405|N/A|RUNNING|None|n2|0:01|10:00|debug|0|other\n")
    pending, done, plain = parse_squeue_status(out)
    assert (pending.job_id, pending.state, pending.reason) == ("410_2", "PENDING",
                                                               "JobArrayTaskLimit")
    assert (done.job_id, done.exit_code) == ("410_0", 1)
    assert plain.job_id == "405"


def test_an_array_as_a_whole_runs_while_a_task_runs_and_ends_as_its_worst_task() -> None:
    from hpcdl.schedulers.slurm.parse import array_of, parse_sacct

    rows = parse_sacct("410_0|COMPLETED|0:0|n1|00:00:03|10:00|debug|s\n"
                       "410_1|FAILED|1:0|n2|00:00:03|10:00|debug|s\n"
                       "4100_1|RUNNING|0:0|n2|00:00:03|10:00|debug|other\n")
    whole = array_of("410", rows, "sacct")
    assert whole is not None
    assert (whole.job_id, whole.state, whole.exit_code) == ("410", "FAILED", 1)
    assert whole.reason == "array of 2 tasks: 1 COMPLETED, 1 FAILED"
    running = array_of("410", [*rows, *parse_sacct("410_2|RUNNING|0:0|n1|0:01|10:00|debug|s\n")],
                       "sacct")
    assert running is not None and running.state == "RUNNING" and running.exit_code is None
    assert array_of("999", rows, "sacct") is None
