"""Build planning without a runtime: wheelhouse checks, no-op detection, CLI dry-run."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcdl.cli import cli
from hpcdl.container.build import (
    _BuildLog,
    _check_flags,
    build_failure,
    build_options,
    build_record,
    execute,
    plan_build,
)
from hpcdl.container.runtime import Runtime, find_runtime
from hpcdl.container.spec import find_spec, load_spec
from hpcdl.container.verify import ImportCheck
from hpcdl.core.atomic import write_json_atomic
from hpcdl.errors import BuildError, ToolError, UserInputError
from tests.unit.fake_wheels import WHEELS, fill_wheelhouse


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An HPCDL_CACHE whose wheelhouse has (empty) wheels with the right names."""
    monkeypatch.setenv("HPCDL_CACHE", str(tmp_path))
    fill_wheelhouse(tmp_path / "wheelhouse")
    return tmp_path


def test_plan_defaults_to_cache_images(cache: Path) -> None:
    plan = plan_build("pytorch-horovod-cpu")
    assert plan.output == cache / "images" / "pytorch-horovod-cpu.sif"
    assert plan.log_path.name == "pytorch-horovod-cpu.sif.build.log"
    assert plan.hash_path.name == "pytorch-horovod-cpu.sif.hash"
    assert (str(cache / "wheelhouse"), "/opt/wheelhouse") in plan.files
    assert not plan.up_to_date and plan.reasons == (f"{plan.output} does not exist",)
    argv = plan.argv("apptainer", "/t/x.sif", "/t/x.def")
    assert argv == ["apptainer", "build", "--mksquashfs-args", "-comp lz4", "/t/x.sif",
                    "/t/x.def"]


def test_options_reach_the_argv(cache: Path, tmp_path: Path) -> None:
    plan = plan_build("pytorch-horovod-cpu", output=tmp_path / "o.sif", fakeroot=True,
                      remote=True)
    assert plan.argv("apptainer", "t", "d")[2:4] == ["--fakeroot", "--remote"]
    sandbox = plan_build("pytorch-horovod-cpu", sandbox=True)
    assert sandbox.output == cache / "images" / "pytorch-horovod-cpu"
    assert "--sandbox" in sandbox.argv_options
    assert sandbox.content_hash != plan.content_hash


def test_compression_option_for_dockerfiles_and_specs(cache: Path, tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text(f"FROM localimage:{tmp_path}/base.sif\nRUN true\n")
    (tmp_path / "base.sif").write_bytes(b"sif")
    ref = str(tmp_path / "Dockerfile")
    # A Dockerfile's SIF is lz4 unless told otherwise (DERIVED_COMPRESSION), not the
    # runtime's gzip: same command line and content hash as asking for lz4.
    plain = plan_build(ref, output=tmp_path / "o.sif")
    assert plain.argv("apptainer", "t", "d")[2:4] == ["--mksquashfs-args", "-comp lz4"]
    assert plain.record["options"] == ["-comp lz4"]
    lz4 = plan_build(ref, output=tmp_path / "o.sif", compression="lz4")
    assert lz4.argv("apptainer", "t", "d")[2:4] == ["--mksquashfs-args", "-comp lz4"]
    assert lz4.content_hash == plain.content_hash
    # --compression gzip asks for the runtime's codec by name: another image, another hash.
    gzip = plan_build(ref, output=tmp_path / "o.sif", compression="gzip")
    assert gzip.argv("apptainer", "t", "d")[2:4] == ["--mksquashfs-args", "-comp gzip"]
    assert gzip.content_hash != plain.content_hash
    # It replaces a spec's own compression (lz4 for the bundled spec).
    spec = plan_build("pytorch-horovod-cpu", compression="zstd")
    assert spec.argv("apptainer", "t", "d")[2:4] == ["--mksquashfs-args", "-comp zstd"]
    with pytest.raises(UserInputError, match=r"^--compression 'brotli' is not one of gzip, lz4"):
        plan_build(ref, compression="brotli")
    with pytest.raises(UserInputError, match=r"^--compression lz4: a --sandbox folder"):
        plan_build(ref, sandbox=True, compression="lz4")
    # The default is no request: a --sandbox folder of the Dockerfile is simply not squashed.
    folder = plan_build(ref, output=tmp_path / "dir", sandbox=True)
    assert "--mksquashfs-args" not in folder.argv_options
    assert folder.record["options"] == ["sandbox"]


def test_a_definition_file_defaults_to_lz4_too(cache: Path, tmp_path: Path) -> None:
    (tmp_path / "base.sif").write_bytes(b"sif")
    (tmp_path / "my.def").write_text(f"Bootstrap: localimage\nFrom: {tmp_path}/base.sif\n"
                                     "%post\n    true\n")
    plan = plan_build(str(tmp_path / "my.def"), output=tmp_path / "o.sif")
    assert plan.argv("apptainer", "t", "d")[2:4] == ["--mksquashfs-args", "-comp lz4"]
    other = plan_build(str(tmp_path / "my.def"), output=tmp_path / "o.sif", compression="zstd")
    assert other.argv("apptainer", "t", "d")[2:4] == ["--mksquashfs-args", "-comp zstd"]
    assert other.content_hash != plan.content_hash


def test_sandbox_and_remote_refused(cache: Path) -> None:
    with pytest.raises(UserInputError, match="cannot be combined"):
        plan_build("pytorch-horovod-cpu", sandbox=True, remote=True)


def test_missing_wheel_is_named(cache: Path) -> None:
    (cache / "wheelhouse" / WHEELS[1]).unlink()
    with pytest.raises(BuildError) as exc:
        plan_build("pytorch-horovod-cpu")
    assert "horovod==0.28.1" in exc.value.message
    assert exc.value.hint and "build-image.sh" in exc.value.hint


def test_missing_wheelhouse_is_bad_input_naming_field_and_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPCDL_CACHE", str(tmp_path))
    with pytest.raises(UserInputError) as exc:
        plan_build("pytorch-horovod-cpu")
    assert exc.value.exit_code == 2
    message = exc.value.message
    assert "\n" not in message
    assert "pip.wheelhouse" in message and "pip.local" in message
    assert f"{tmp_path}/wheelhouse does not exist" in message
    assert "pytorch-horovod-cpu.yaml" in message
    # the command: exit 2, one line naming the field and the path, then the hint
    result = CliRunner().invoke(cli, ["build", "pytorch-horovod-cpu", "--dry-run"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert "pip.wheelhouse" in lines[0] and f"{tmp_path}/wheelhouse" in lines[0]
    assert all(line.startswith("hint:") for line in lines[1:])


def test_unchanged_rebuild_is_a_noop_without_runtime(cache: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "img.sif"
    plan = plan_build("pytorch-horovod-cpu", output=out)
    out.write_bytes(b"SIF")
    write_json_atomic(plan.hash_path, plan.record)
    again = plan_build("pytorch-horovod-cpu", output=out)
    assert again.up_to_date and again.reasons == ()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no runtime needed for a no-op
    result = execute(again)
    assert not result.built and result.image == out
    forced = plan_build("pytorch-horovod-cpu", output=out, force=True)
    with pytest.raises(ToolError, match="neither apptainer nor singularity"):
        execute(forced)
    assert out.read_bytes() == b"SIF"  # a failed start leaves the image alone


def test_changed_wheel_triggers_rebuild(cache: Path, tmp_path: Path) -> None:
    out = tmp_path / "img.sif"
    plan = plan_build("pytorch-horovod-cpu", output=out)
    out.write_bytes(b"SIF")
    write_json_atomic(plan.hash_path, plan.record)
    (cache / "wheelhouse" / WHEELS[3]).write_bytes(b"new numpy")
    again = plan_build("pytorch-horovod-cpu", output=out)
    assert not again.up_to_date
    assert any(WHEELS[3] in r for r in again.reasons)


def test_definition_file_with_relative_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPCDL_CACHE", str(tmp_path / "cache"))
    (tmp_path / "payload").mkdir()
    (tmp_path / "payload" / "f.txt").write_text("x")
    d = tmp_path / "tiny.def"
    d.write_text("Bootstrap: localimage\nFrom: base.sif\n\n%files\n    payload /opt/payload\n")
    with pytest.raises(BuildError, match="does not exist: .*base.sif"):
        plan_build(str(d))
    (tmp_path / "base.sif").write_bytes(b"base")
    plan = plan_build(str(d))
    assert plan.name == "tiny" and plan.workdir == tmp_path
    assert plan.files == ((str(tmp_path / "payload"), "/opt/payload"),)
    # The base image is an input: a new base means a rebuild.
    first = plan.content_hash
    (tmp_path / "base.sif").write_bytes(b"base2")
    assert plan_build(str(d)).content_hash != first


def test_no_runtime_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ToolError) as exc:
        find_runtime()
    assert exc.value.message == "neither apptainer nor singularity is on PATH"
    assert exc.value.hint and "install-apptainer.sh" in exc.value.hint
    with pytest.raises(ToolError, match="not found or not executable"):
        find_runtime(str(tmp_path / "apptainer"))


def test_cli_dry_run_prints_definition_and_writes_nothing(cache: Path) -> None:
    r = CliRunner().invoke(cli, ["build", "pytorch-horovod-cpu", "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "Bootstrap: debootstrap" in r.stdout
    assert "would build" in r.stderr
    assert not (cache / "images").exists()


def test_cli_dry_run_json(cache: Path) -> None:
    r = CliRunner().invoke(cli, ["build", "pytorch-horovod-cpu", "--dry-run", "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["will_build"] is True and data["name"] == "pytorch-horovod-cpu"
    assert data["definition"].startswith("# Generated by hpcdl")


def test_cli_missing_wheel_exit_1_no_traceback(cache: Path) -> None:
    (cache / "wheelhouse" / WHEELS[0]).unlink()
    r = CliRunner().invoke(cli, ["build", "pytorch-horovod-cpu"])
    assert r.exit_code == 1
    assert "error: wheelhouse" in r.stderr and "torch==2.13.0" in r.stderr
    assert "Traceback" not in r.output


def test_cli_unknown_spec_exit_2(cache: Path) -> None:
    r = CliRunner().invoke(cli, ["build", "nope"])
    assert r.exit_code == 2 and "bundled:" in r.stderr


def test_cli_bad_spec_exit_2(tmp_path: Path, cache: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(find_spec("pytorch-horovod-cpu").read_text() + "colour: blue\n")
    r = CliRunner().invoke(cli, ["build", str(bad)])
    assert r.exit_code == 2
    assert f"{bad}: unknown key 'colour'" in r.stderr


def test_gpu_spec_renders_for_build_planning(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # The GPU image cannot be built here (no registry), but it plans: no wheelhouse needed.
    monkeypatch.setenv("HPCDL_CACHE", str(tmp_path))
    plan = plan_build("pytorch-horovod-gpu")
    assert "From: nvcr.io/nvidia/pytorch:24.10-py3" in plan.definition
    assert load_spec(find_spec("pytorch-horovod-gpu")).gpu


def test_spec_compression_reaches_mksquashfs_and_the_hash(cache: Path, tmp_path: Path) -> None:
    spec = find_spec("pytorch-horovod-cpu")
    assert load_spec(spec).compression == "lz4"
    plan = plan_build("pytorch-horovod-cpu", output=tmp_path / "o.sif")
    argv = plan.argv("apptainer", "t.sif", "d.def")
    assert argv[2:4] == ["--mksquashfs-args", "-comp lz4"]
    assert plan.record["options"] == ["-comp lz4"]
    # Another codec is another image: the content hash changes, with a reason.
    other = tmp_path / "other.yaml"
    other.write_text(spec.read_text().replace("compression: lz4", "compression: zstd"))
    zstd = plan_build(str(other), output=tmp_path / "o.sif")
    assert zstd.argv("apptainer", "t", "d")[3] == "-comp zstd"
    assert zstd.content_hash != plan.content_hash
    # A directory image is not squashed: no mksquashfs arguments.
    assert "--mksquashfs-args" not in plan_build("pytorch-horovod-cpu", sandbox=True).argv_options
    # The GPU spec keeps the runtime's default codec.
    assert "--mksquashfs-args" not in plan_build("pytorch-horovod-gpu", output=tmp_path / "g.sif").argv_options


def test_only_the_head_of_a_file_says_whether_it_is_a_definition(tmp_path):
    from hpcdl.container.build import _is_definition

    recipe = tmp_path / "recipe"
    recipe.write_text("# my recipe\nBootstrap: localimage\nFrom: /x.sif\n")
    assert _is_definition(recipe)
    # A SIF (multi-GB) is never read whole: a header past the first 4000 bytes is not seen.
    image = tmp_path / "image.sif"
    image.write_bytes(b"\x00\xff" * 2000 + b"\nBootstrap: docker\n")
    assert not _is_definition(image)


# ---- the build's stages on their own ---------------------------------------------

def test_build_options_in_the_order_dry_run_shows() -> None:
    assert build_options(sandbox=False, fakeroot=True, remote=False, squash="-comp lz4",
                         extra=("--notest",)) == [
        "--fakeroot", "--mksquashfs-args", "-comp lz4", "--notest"]
    assert build_options(sandbox=True, fakeroot=False, remote=False, squash=None) == ["--sandbox"]
    assert build_options(sandbox=False, fakeroot=False, remote=True, squash=None) == ["--remote"]


@pytest.mark.parametrize(("flags", "message"), [
    ({"sandbox": True, "remote": True, "compression": None}, "--sandbox and --remote cannot"),
    ({"sandbox": False, "remote": False, "compression": "zip"}, "--compression 'zip' is not one of"),
    ({"sandbox": True, "remote": False, "compression": "lz4"}, "a --sandbox folder is not compressed"),
])
def test_check_flags_refuses_combinations(flags: dict, message: str) -> None:
    with pytest.raises(UserInputError, match=message):
        _check_flags(**flags)


def test_check_flags_accepts_a_compressed_sif() -> None:
    _check_flags(sandbox=False, remote=True, compression="zstd")  # nothing raised


def test_build_failure_prefers_the_import_checks_own_line() -> None:
    checks = [ImportCheck(ok=False, message="torchvision 0.28.0 does not match torch 2.13.0")]
    assert build_failure(checks, "apptainer", "img", 255, "FATAL: x") == (
        "import check failed: torchvision 0.28.0 does not match torch 2.13.0")
    assert build_failure([], "apptainer", "img", 255, "noise\nFATAL: no space left\nmore") == (
        "apptainer build of img failed (exit 255): FATAL: no space left")


def test_build_log_keeps_facts_and_checks_and_passes_every_line_on(tmp_path: Path) -> None:
    seen: list[str] = []
    with (tmp_path / "log").open("w") as fh:
        lines = _BuildLog(fh, seen.append)
        for line in ('+ pip install x\n', 'HPCDL_IMAGE_FACTS {"torch": "2.13.0"}\n',
                     'INFO: HPCDL_IMPORT_CHECK ok torch 2.13.0\n'):
            lines(line)
    assert lines.image_facts == {"torch": "2.13.0"}
    assert lines.last_check == ImportCheck(ok=True, message="torch 2.13.0")
    assert len(seen) == 3 and (tmp_path / "log").read_text().splitlines()[0] == "+ pip install x"


FAKE_APPTAINER = """#!/usr/bin/env python3
import sys
target, definition = sys.argv[-2], sys.argv[-1]
print("HPCDL_IMAGE_FACTS {\\"torch\\": \\"2.13.0\\"}")
if "# fake: fail" in open(definition).read():
    print("HPCDL_IMPORT_CHECK FAIL torchvision does not match torch", flush=True)
    sys.exit(3)
print("HPCDL_IMPORT_CHECK ok torch 2.13.0")
open(target, "wb").write(b"SIF")
"""


def _fake_runtime(tmp_path: Path) -> Runtime:
    script = tmp_path / "fake-apptainer"
    script.write_text(FAKE_APPTAINER)
    script.chmod(0o755)
    return Runtime(path=str(script), name="apptainer", version="1.3.4")


def test_execute_publishes_image_log_and_record(cache: Path, tmp_path: Path) -> None:
    out = tmp_path / "img.sif"
    plan = plan_build("pytorch-horovod-cpu", output=out)
    result = execute(plan, runtime=_fake_runtime(tmp_path))
    assert result.built and out.read_bytes() == b"SIF"
    assert result.import_check == ImportCheck(ok=True, message="torch 2.13.0")
    record = json.loads(plan.hash_path.read_text())
    assert record["hash"] == plan.content_hash and record["runtime"] == "apptainer 1.3.4"
    assert record["image_facts"] == {"torch": "2.13.0"}
    assert record["import_check"] == "torch 2.13.0"
    assert plan.log_path.read_text().startswith(f"# hpcdl build {plan.source} -> {out}\n")
    assert plan.def_path.read_text() == plan.definition
    assert not list(tmp_path.glob(".img.sif.building-*"))  # its folder is gone


def test_failed_build_keeps_the_old_image_and_names_the_import_check(
        cache: Path, tmp_path: Path) -> None:
    out = tmp_path / "img.sif"
    out.write_bytes(b"OLD")
    plan = replace(plan_build("pytorch-horovod-cpu", output=out, force=True),
                   definition="# fake: fail\n")
    with pytest.raises(BuildError, match="import check failed: torchvision does not match"):
        execute(plan, runtime=_fake_runtime(tmp_path))
    assert out.read_bytes() == b"OLD" and not plan.hash_path.exists()
    assert plan.log_path.read_text().splitlines()[-1] == "# FAILED: exit 3"


def test_build_record_is_the_plan_record_and_what_the_build_said(cache: Path,
                                                                 tmp_path: Path) -> None:
    plan = plan_build("pytorch-horovod-cpu", output=tmp_path / "o.sif")
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    runtime = Runtime(path="/x", name="apptainer", version="1.4.5")
    record = build_record(plan, runtime, 12.34, at, {}, None)
    assert record == {**plan.record, "runtime": "apptainer 1.4.5",
                      "built_at": "2026-01-02T03:04:05+00:00", "build_seconds": 12.3}
