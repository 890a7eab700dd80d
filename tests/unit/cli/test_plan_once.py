"""Plan once, submit exactly that plan: what `--dry-run` prints is what `job.sbatch`
holds, byte for byte, and the job-side files it prints after the script are what the run
directory's job/ holds (against the fake Slurm in tests/fakeslurm; the real sandbox's
tests are in tests/integration)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from click.testing import CliRunner

from hpcdl.cli import cli
from hpcdl.cli.submit import JOB_FILE_HEADER
from tests.fakeslurm.fixture import FakeSlurm

REQUEST = ["-p", "sandbox", "-N", "2", "-G", "2", "-J", "same job", "--synthetic",
           "--image", "/nonexistent/img.sif", "-X", "--epochs=1"]


def shown_files(stderr: str) -> dict[str, str]:
    """The job-side files a dry run prints after the script: {path: text}."""
    parts = re.split(rf"^{re.escape(JOB_FILE_HEADER)} (.+) \(written with the run; the script "
                     r"runs it\)\n", stderr, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def run_cli(*args: str):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert "Traceback" not in result.output
    return result


def test_job_sbatch_is_byte_identical_to_the_dry_run(fake_slurm: FakeSlurm, tmp_path: Path,
                                                     monkeypatch) -> None:
    monkeypatch.setenv("HPCDL_SKIP_LIVE_CHECK", "1")
    image = tmp_path / "img.sif"
    image.write_bytes(b"SIF")
    request = [*REQUEST[:-3], str(image), *REQUEST[-2:]]
    run_dir = tmp_path / "runs" / "fixed"
    dry = run_cli("submit", *request, "--run-dir", str(run_dir), "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert not run_dir.exists(), "--dry-run wrote something"
    assert f"--checkpoint-dir {run_dir}/checkpoints" in dry.stdout  # the run dir is in it

    sub = run_cli("submit", *request, "--run-dir", str(run_dir), "--json")
    assert sub.exit_code == 0, sub.output
    info = json.loads(sub.stdout)
    assert info["run_dir"] == str(run_dir)
    assert (run_dir / "job.sbatch").read_bytes() == dry.stdout.encode()
    # Everything the script runs of its own is shown after it, and staged as shown.
    files = shown_files(dry.stderr)
    assert sorted(files) == [f"{run_dir}/job/bin/hpcdl-master-port",
                             f"{run_dir}/job/bin/hpcdl-rank-env"]
    for path, text in files.items():
        assert f" {path} " in dry.stdout or f"$(/bin/sh {path})" in dry.stdout
        assert Path(path).read_bytes() == text.encode()
        assert Path(path).stat().st_mode & 0o777 == 0o755
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["script"] == dry.stdout and plan["run_dir"] == str(run_dir)
    # sbatch got that file, and the job name on its command line.
    (job,) = fake_slurm.jobs().values()
    assert job["argv"][-1] == str(run_dir / "job.sbatch")
    assert "--job-name=same job" in job["argv"]


def test_default_run_dir_is_planned_before_submission(fake_slurm: FakeSlurm, monkeypatch) -> None:
    monkeypatch.setenv("HPCDL_SKIP_LIVE_CHECK", "1")
    sub = run_cli("submit", "-p", "sandbox", "-N", "1", "-G", "0", "-J", "plain", "--json", "--", "true")
    assert sub.exit_code == 0, sub.output
    run_dir = Path(json.loads(sub.stdout)["run_dir"])
    script = (run_dir / "job.sbatch").read_text()
    assert run_dir.name.startswith("plain-")
    assert f"#SBATCH --output={run_dir}/slurm-%j.out" in script
    assert json.loads((run_dir / "plan.json").read_text())["script"] == script


def test_an_existing_run_dir_is_refused_and_nothing_submitted(fake_slurm: FakeSlurm,
                                                              tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HPCDL_SKIP_LIVE_CHECK", "1")
    taken = tmp_path / "taken"
    taken.mkdir()
    res = run_cli("submit", "-p", "sandbox", "-G", "0", "--run-dir", str(taken), "--", "true")
    assert res.exit_code == 1
    assert f"run directory {taken} already exists" in res.stderr
    assert fake_slurm.jobs() == {} and list(taken.iterdir()) == []


def test_the_headline_dry_run_is_a_short_script_and_the_files_it_runs(tmp_path: Path) -> None:
    # Without --run-dir the dry run plans with the run directory a submission made now
    # would pick under $HPCDL_RUNS (named after the job), and creates none.
    runs = Path(os.environ["HPCDL_RUNS"])
    dry = run_cli("submit", "-p", "sandbox", "-N", "2", "-G", "4", "--image",
                  "/scratch/images/pytorch-horovod-cpu.sif", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert len(dry.stdout.splitlines()) <= 45, dry.stdout  # the run directory's exports: 43
    run_dir = re.search(r"^# run directory (\S+): the name a submission made now gets",
                        dry.stderr, flags=re.M)
    assert run_dir is not None, dry.stderr
    job = f"{run_dir[1]}/job"
    assert Path(run_dir[1]).parent == runs.resolve()
    assert Path(run_dir[1]).name.startswith("hpcdl-horovod-")
    files = shown_files(dry.stderr)
    assert sorted(files) == [f"{job}/bin/hpcdl-master-port", f"{job}/bin/hpcdl-rank-env"]
    assert f"MASTER_PORT=$(/bin/sh {job}/bin/hpcdl-master-port)\n" in dry.stdout
    assert f" /bin/sh {job}/bin/hpcdl-rank-env python3 /hpcdl/examples/" in dry.stdout
    assert f"export HPCDL_RUN_DIR={run_dir[1]}\n" in dry.stdout
    assert all(text.startswith("#!/bin/sh\n") for text in files.values())
    assert not runs.exists() or list(runs.iterdir()) == []


def test_a_dry_run_without_run_dir_is_the_submission_in_the_same_directory(
        fake_slurm: FakeSlurm, monkeypatch) -> None:
    # The dry run's run directory has a clock-and-random name; a submission made with
    # that name pinned (--run-dir) must write the same bytes the dry run printed.
    monkeypatch.setenv("HPCDL_SKIP_LIVE_CHECK", "1")
    runs = Path(os.environ["HPCDL_RUNS"])
    request = ["-p", "sandbox", "-N", "2", "-G", "2", "-J", "same job", "--synthetic",
               "--no-image", "-X", "--epochs=1"]
    dry = run_cli("submit", *request, "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert not runs.exists() or list(runs.iterdir()) == [], "--dry-run created something"
    found = re.search(r"^# run directory (\S+): ", dry.stderr, flags=re.M)
    assert found is not None, dry.stderr
    run_dir = Path(found[1])
    assert run_dir.parent == runs.resolve() and run_dir.name.startswith("same-job-")
    sub = run_cli("submit", *request, "--run-dir", str(run_dir), "--json")
    assert sub.exit_code == 0, sub.output
    assert (run_dir / "job.sbatch").read_bytes() == dry.stdout.encode()
    for path, text in shown_files(dry.stderr).items():
        assert Path(path).read_bytes() == text.encode()
