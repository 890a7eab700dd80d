"""Plan once, submit exactly that plan: what `--dry-run` prints is what `job.sbatch`
holds, byte for byte (against the fake Slurm in tests/fakeslurm; the real sandbox's
tests are in tests/integration)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from hpcdl.cli import cli
from tests.fakeslurm.fixture import FakeSlurm

REQUEST = ["-p", "sandbox", "-N", "2", "-G", "2", "-J", "same job", "--synthetic",
           "--image", "/nonexistent/img.sif", "-X", "--epochs=1"]


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
