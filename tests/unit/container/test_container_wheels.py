"""pip.packages resolved on the host (hpcdl build --offline, pip.resolve: host): the
target and its platform tags, the pip download argv, the content key, the rendered
install, the content hash over the resolved wheels, and the refusals (exit 2, one line,
nothing written). No network and no runtime: the resolutions here are folders the
tests make, and the one pip failure is a stand-in program printing pip's own lines
(the real refusal runs in tests/integration/test_build_offline.py)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcdl.cli import cli
from hpcdl.container.build import WheelOptions, execute, plan_build
from hpcdl.container.spec import parse_spec
from hpcdl.container.wheels import (
    Resolution,
    Target,
    check_root,
    parse_probe,
    resolution_for,
    resolve,
    target_for,
)
from hpcdl.errors import BuildError, ConfigError, ToolError, UserInputError

SPEC = """\
name: offline-test
gpu: false
base: {bootstrap: debootstrap, os_version: bookworm}
apt_packages: [python3, python3-pip]
mpi: {flavour: openmpi, version: 4.1.4, source: apt}
project: false
pip:
  resolve: RESOLVE
  packages: [tqdm, msgpack==1.2.4]
"""
TARGET = Target("3.11", "2.36", "x86_64", "test")


def spec_file(tmp_path: Path, resolve: str = "host", extra: str = "") -> Path:
    path = tmp_path / "offline-test.yaml"
    path.write_text(SPEC.replace("RESOLVE", resolve) + extra)
    return path


def test_platforms_are_what_the_images_pip_accepts_newest_first() -> None:
    plats = TARGET.platforms()
    assert plats[0] == "manylinux_2_36_x86_64" and plats[-1] == "linux_x86_64"
    # pip does not expand a PEP 600 tag: every older glibc is listed, with the legacy
    # names where they alias (a manylinux2014-only wheel is found).
    assert plats.index("manylinux2014_x86_64") == plats.index("manylinux_2_17_x86_64") + 1
    assert plats.index("manylinux2010_x86_64") == plats.index("manylinux_2_12_x86_64") + 1
    assert plats[-2:] == ["manylinux1_x86_64", "linux_x86_64"]
    assert "manylinux_2_37_x86_64" not in plats and len(plats) == 32 + 3 + 1
    arm = Target("3.12", "2.28", "aarch64").platforms()
    assert arm[0] == "manylinux_2_28_aarch64" and "manylinux2014_aarch64" in arm
    assert "manylinux_2_16_aarch64" not in arm and not any("manylinux1" in p for p in arm)
    assert TARGET.abi == "cp311" and TARGET.describe() == "CPython 3.11 on manylinux_2_36_x86_64"


@pytest.mark.parametrize("field,value", [("python", "3.11; rm -rf /"), ("python", "311"),
                                         ("glibc", "2.36\n"), ("machine", "x86_64 --pre")])
def test_a_target_value_that_is_not_a_token_is_refused(field: str, value: str) -> None:
    values = {"python": "3.11", "glibc": "2.36", "machine": "x86_64"} | {field: value}
    with pytest.raises(UserInputError) as exc:
        Target(**values, source="base image /x.sif")
    assert exc.value.exit_code == 2 and repr(value) in exc.value.message
    assert "\n" not in exc.value.message


@pytest.mark.parametrize("pip,field", [
    ("{resolve: cloud, packages: [tqdm]}", "resolve"),
    ("{packages: [tqdm], target: {python: '3.11\\nrm', glibc: '2.36'}}", "python"),
    ("{packages: [tqdm], target: {python: '3.11', glibc: '2.36', machine: sparc}}", "machine"),
    ("{packages: [tqdm], target: {python: 3.11, glibc: '2.36'}}", "python"),
])
def test_spec_fields_are_checked(pip: str, field: str) -> None:
    text = SPEC.split("pip:")[0] + f"pip: {pip}\n"
    with pytest.raises(ConfigError) as exc:
        parse_spec(text, source="s.yaml")
    assert field in str(exc.value.message) and "s.yaml" in exc.value.message


def test_the_target_comes_from_the_spec_then_the_release(tmp_path: Path) -> None:
    spec = parse_spec(SPEC.replace("RESOLVE", "host"))
    assert target_for(spec, machine="aarch64") == Target("3.11", "2.36", "aarch64")
    assert target_for(spec).source == "debootstrap bookworm"
    pinned = parse_spec(SPEC.replace("RESOLVE", "host")
                        + "  target: {python: '3.12', glibc: '2.39'}\n")
    assert target_for(pinned) == Target("3.12", "2.39", "x86_64")
    docker = parse_spec(SPEC.replace("RESOLVE", "host").replace(
        "{bootstrap: debootstrap, os_version: bookworm}",
        "{bootstrap: docker, image: nvcr.io/nvidia/pytorch, tag: 24.10-py3}"))
    with pytest.raises(UserInputError) as exc:
        target_for(docker)
    assert exc.value.exit_code == 2 and "pip.target" in exc.value.message
    assert "nvcr.io/nvidia/pytorch:24.10-py3" in exc.value.message


def test_the_base_images_answer_is_checked() -> None:
    good = 'INFO: x\n{"python": "3.11", "implementation": "cpython", "libc": "glibc", ' \
           '"glibc": "2.36", "machine": "x86_64"}\n'
    assert parse_probe(good, "/b.sif") == Target("3.11", "2.36", "x86_64")
    with pytest.raises(UserInputError, match="CPython on glibc"):
        parse_probe(good.replace('"glibc", "glibc"', '"glibc", ""').replace(
            '"libc": "glibc"', '"libc": ""'), "/b.sif")
    with pytest.raises(UserInputError, match="not a python version"):
        parse_probe(good.replace('"3.11"', '"3.11 --index-url http://x"'), "/b.sif")
    with pytest.raises(UserInputError, match="printed no target"):
        parse_probe("Traceback ...\n", "/b.sif")


def test_pip_download_argv_and_content_key(tmp_path: Path) -> None:
    spec = parse_spec(SPEC.replace("RESOLVE", "host")
                      + "  index_url: https://download.pytorch.org/whl/cpu\n")
    res = resolution_for(spec, tmp_path, TARGET)
    argv = res.argv(python="python3")
    assert argv[:5] == ["python3", "-m", "pip", "download", "--only-binary=:all:"]
    assert argv[5:11] == ["--implementation", "cp", "--python-version", "3.11", "--abi", "cp311"]
    assert argv.count("--platform") == len(TARGET.platforms())
    assert argv[-4:] == ["-d", str(res.path), "tqdm", "msgpack==1.2.4"]
    assert argv[argv.index("--index-url") + 1] == "https://download.pytorch.org/whl/cpu"
    shown = res.shown()
    assert "--platform manylinux_2_36_x86_64 [34 more --platform" in shown
    assert shown.endswith("--platform linux_x86_64 --index-url https://download.pytorch.org/"
                          f"whl/cpu -d {res.path} tqdm msgpack==1.2.4")
    # The key is content: the same anywhere, different for other packages or targets.
    assert resolution_for(spec, tmp_path / "elsewhere", TARGET).key == res.key
    assert resolution_for(spec, tmp_path, Target("3.12", "2.36", "x86_64")).key != res.key
    assert resolution_for(spec, tmp_path, TARGET, ["tqdm"]).key != res.key
    assert res.path == tmp_path / res.key and not res.resolved


@pytest.mark.parametrize("root", ["/tmp/with space", "/tmp/a:b", "/tmp/a,b", "/tmp/$HOME"])
def test_a_wheelhouse_root_percent_files_cannot_carry_is_refused(root: str) -> None:
    with pytest.raises(UserInputError) as exc:
        check_root(root)
    assert exc.value.exit_code == 2 and "--wheelhouse" in exc.value.message


def fake_pip(tmp_path: Path, stderr: str, code: int = 1, wheel: str = "") -> str:
    """A stand-in for `python -m pip download` printing pip's own failure lines (or
    writing ``wheel`` into the -d folder)."""
    script = tmp_path / "fake-python"
    body = ('d=""; while [ $# -gt 0 ]; do [ "$1" = -d ] && d=$2; shift; done\n'
            + (f'echo x > "$d/{wheel}"\n' if wheel else "")
            + f"printf '%s\\n' {stderr!r} >&2\nexit {code}\n")
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_a_package_without_a_wheel_is_one_line_exit_2_and_nothing_written(
        tmp_path: Path) -> None:
    root = tmp_path / "wheelhouses"
    res = Resolution(("tqdm", "pycrypto"), TARGET, None, (), root)
    python = fake_pip(tmp_path, "ERROR: Could not find a version that satisfies the "
                      "requirement pycrypto (from versions: 2.6.1)\nERROR: No matching "
                      "distribution found for pycrypto")
    with pytest.raises(UserInputError) as exc:
        resolve(res, python=python)
    assert exc.value.exit_code == 2
    assert exc.value.message == ("pip.packages: no wheel of 'pycrypto' for CPython 3.11 on "
                                 "manylinux_2_36_x86_64 (glibc 2.36; resolving on the host "
                                 "takes binary wheels only)")
    assert not root.exists()


def test_another_pip_failure_is_a_tool_error_with_pips_line(tmp_path: Path) -> None:
    (tmp_path / "wh").mkdir()
    res = Resolution(("tqdm",), TARGET, None, (), tmp_path / "wh")
    python = fake_pip(tmp_path, "ERROR: HTTP error 503 while getting https://x/tqdm.whl")
    with pytest.raises(ToolError) as exc:
        resolve(res, python=python)
    assert exc.value.exit_code == 1 and "HTTP error 503" in exc.value.message
    assert list((tmp_path / "wh").iterdir()) == []


def test_a_resolve_appears_whole_with_its_record_and_is_reused(tmp_path: Path) -> None:
    res = Resolution(("tqdm",), TARGET, None, (), tmp_path / "wh")
    resolve(res, python=fake_pip(tmp_path, "Saved", 0, wheel="tqdm-4.70.1-py3-none-any.whl"))
    assert [p.name for p in res.path.iterdir()] == ["tqdm-4.70.1-py3-none-any.whl"]
    assert stat.S_IMODE(res.path.stat().st_mode) == 0o755  # readable where it is shared
    record = json.loads(res.record_path.read_text())
    assert record["target"]["abi"] == "cp311" and list(record["wheels"]) == [
        "tqdm-4.70.1-py3-none-any.whl"]
    # resolved: pip is not run again (this one would fail)
    resolve(res, python=fake_pip(tmp_path, "ERROR: No matching distribution found for tqdm"))
    assert sorted(p.name for p in res.root.iterdir()) == sorted([res.key, f"{res.key}.json"])


def test_plan_renders_the_no_index_install_and_hashes_the_wheels(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPCDL_CACHE", str(tmp_path / "cache"))
    path = spec_file(tmp_path)
    out = tmp_path / "o.sif"
    # --dry-run before resolving: the pip download is shown, nothing runs or is written.
    dry = plan_build(str(path), output=out, host=False, wheels=WheelOptions(resolve=False))
    res = dry.wheels
    assert res is not None and not res.resolved
    assert res.root == tmp_path / "cache" / "wheelhouses"
    assert not res.root.exists()
    assert "pip.packages not resolved yet" in dry.reasons[0] and not dry.up_to_date
    assert (str(res.path), "/opt/hpcdl-wheels") in dry.files
    assert ("    python3 -m pip install --no-index --find-links /opt/hpcdl-wheels tqdm "
            "msgpack==1.2.4\n    rm -rf /opt/hpcdl-wheels\n") in dry.definition
    assert "Resolved on the host for CPython 3.11 on manylinux_2_36_x86_64" in dry.definition
    assert dry.to_dict()["wheels"]["pip_download"][-2:] == ["tqdm", "msgpack==1.2.4"]
    with pytest.raises(BuildError, match="not resolved on the host"):
        execute(dry)
    # resolved (a folder the test makes): the wheels' bytes are part of the content hash
    res.path.mkdir(parents=True)
    wheel = res.path / "msgpack-1.2.4-cp311-cp311-manylinux2014_x86_64.whl"
    wheel.write_bytes(b"one")
    first = plan_build(str(path), output=out, host=False)
    assert first.wheels == res and first.wheels.resolved
    wheel.write_bytes(b"two")
    os.utime(wheel, ns=(1, 1))
    second = plan_build(str(path), output=out, host=False)
    assert second.content_hash != first.content_hash
    # the folder's place on this host is not content: another root, same wheels, same hash
    other = plan_build(str(path), output=out, host=False,
                       wheels=WheelOptions(root=str(tmp_path / "shared"), resolve=False))
    assert other.wheels is not None
    other.wheels.path.mkdir(parents=True)
    (other.wheels.path / wheel.name).write_bytes(b"two")
    again = plan_build(str(path), output=out, host=False,
                       wheels=WheelOptions(root=str(tmp_path / "shared")))
    assert again.content_hash == second.content_hash


def test_offline_is_a_flag_or_the_spec_and_only_for_specs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPCDL_CACHE", str(tmp_path / "cache"))
    online = spec_file(tmp_path, resolve="build")
    plan = plan_build(str(online), output=tmp_path / "o.sif", host=False)
    assert plan.wheels is None and "    python3 -m pip install tqdm msgpack==1.2.4\n" \
        in plan.definition
    flagged = plan_build(str(online), output=tmp_path / "o.sif", host=False,
                         wheels=WheelOptions(offline=True, resolve=False))
    assert flagged.wheels is not None and "--no-index --find-links" in flagged.definition
    (tmp_path / "x.def").write_text("Bootstrap: docker\nFrom: debian:12\n")
    with pytest.raises(UserInputError, match="offline: resolves an image spec's pip.packages"):
        plan_build(str(tmp_path / "x.def"), wheels=WheelOptions(offline=True))


def test_cli_dry_run_shows_the_pip_download_and_the_copy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPCDL_CACHE", str(tmp_path / "cache"))
    path = spec_file(tmp_path, resolve="build")
    r = CliRunner().invoke(cli, ["build", str(path), "--wheelhouse", str(tmp_path / "wh"),
                                 "--dry-run", "--no-host-trust"])
    assert r.exit_code == 0, r.output
    assert "pip download --only-binary=:all: --implementation cp --python-version 3.11" \
        in r.output
    assert "(from debootstrap bookworm), not resolved yet" in r.output
    assert f"# wheelhouse: {tmp_path}/wh/" in r.output and "-> /opt/hpcdl-wheels" in r.output
    assert not (tmp_path / "wh").exists()
    bad = CliRunner().invoke(cli, ["build", str(path), "--wheelhouse", "/tmp/a b",
                                   "--dry-run"])
    assert bad.exit_code == 2 and bad.output.startswith("error: --wheelhouse: '/tmp/a b'")
