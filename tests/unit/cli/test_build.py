"""hpcdl.cli.build's pieces: what `hpcdl build` says at the end, before a build, and for
--resolve-only (the command's whole runs are in tests/unit/container)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from hpcdl.cli import build as cli_build
from hpcdl.container.build import BuildResult, plan_build
from hpcdl.container.verify import ImportCheck
from tests.unit.fake_wheels import fill_wheelhouse


@pytest.fixture
def plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HPCDL_CACHE", str(tmp_path))
    fill_wheelhouse(tmp_path / "wheelhouse")
    return plan_build("pytorch-horovod-cpu", output=tmp_path / "img.sif")


def test_result_text_of_a_build_names_size_and_import_check(plan, tmp_path: Path) -> None:
    image = tmp_path / "img.sif"
    image.write_bytes(b"x" * (3 * 2**20))
    result = BuildResult(image, True, 61.4, plan.content_hash, plan.log_path, "apptainer 1.4",
                         ImportCheck(ok=True, message="torch 2.13.0, horovod 0.28.1"))
    assert cli_build.result_text(plan, result, as_json=False) == (
        f"built {image} in 61 s (3 MiB)\nimport check: torch 2.13.0, horovod 0.28.1")
    bare = replace(result, import_check=None, image=tmp_path / "absent.sif")
    assert cli_build.result_text(plan, bare, as_json=False) == (
        f"built {tmp_path / 'absent.sif'} in 61 s")


def test_result_text_when_up_to_date_and_as_json(plan, tmp_path: Path) -> None:
    result = BuildResult(tmp_path / "img.sif", False, 0.0, "ab" * 32, None, None)
    assert cli_build.result_text(plan, result, as_json=False) == (
        f"{tmp_path / 'img.sif'} is up to date (content hash {'ab' * 8}); --force rebuilds")
    data = json.loads(cli_build.result_text(plan, result, as_json=True))
    assert data["built"] is False and data["seconds"] == 0.0
    assert data["import_check_result"] is None and data["output"] == str(tmp_path / "img.sif")


def test_resolved_text_without_wheels(plan) -> None:
    assert plan.wheels is None
    assert cli_build.resolved_text(plan, as_json=False) == (
        f"{plan.source}: no pip.packages to resolve")
    assert json.loads(cli_build.resolved_text(plan, as_json=True)) == {"wheels": None}


def test_announce_says_why_and_force(plan, capsys: pytest.CaptureFixture[str]) -> None:
    cli_build._announce(plan, force=False, ordinary_user=False, binary=None)
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"building pytorch-horovod-cpu -> {plan.output} (log: {plan.log_path})",
        f"  because: {plan.output} does not exist"]
    cli_build._announce(replace(plan, up_to_date=True, reasons=()), force=True,
                        ordinary_user=False, binary=None)
    assert capsys.readouterr().err.splitlines()[-1] == "  because: --force"


def test_progress_shows_the_runtimes_stage_lines_unless_verbose(
        capsys: pytest.CaptureFixture[str]) -> None:
    quiet = cli_build._progress(verbose=False)
    quiet("+ pip install torch\n")
    quiet("INFO:    Creating SIF file...\n")
    err = capsys.readouterr().err
    assert "pip install" not in err and err.rstrip().endswith("] INFO:    Creating SIF file...")
    cli_build._progress(verbose=True)("+ pip install torch\n")
    assert capsys.readouterr().err.rstrip().endswith("s] + pip install torch")
