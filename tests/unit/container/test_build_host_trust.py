"""The host's CA bundle and proxies for a build's %post (hpcdl.container.hosttrust), the
import check's %test and its one line (hpcdl.container.verify), as plain values."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcdl.cli import cli
from hpcdl.container.build import BuildPlan, plan_build
from hpcdl.container.hosttrust import (
    CA_IN_BUILD,
    HostTrust,
    discover,
    pip_config_files,
    read_pip_configs,
    redact,
)
from hpcdl.container.verify import (
    check_section,
    find_import_check,
    import_check_source,
    parse_import_check,
)
from hpcdl.errors import UserInputError

SYSTEM = "/etc/ssl/certs/ca-certificates.crt"


def only(*paths: str):  # type: ignore[no-untyped-def]
    return lambda p: p in paths


def test_pip_cert_wins_over_pip_config_and_the_rest() -> None:
    env = {"PIP_CERT": "/a.pem", "REQUESTS_CA_BUNDLE": "/b.pem"}
    configs = [("/etc/pip.conf", {"global": {"cert": "/c.pem"}})]
    t = discover(env, configs, only("/a.pem", "/b.pem", "/c.pem", SYSTEM))
    assert (t.ca_bundle, t.ca_from) == ("/a.pem", "PIP_CERT")


def test_pip_config_last_file_and_install_section_win() -> None:
    configs = [("/etc/pip.conf", {"global": {"cert": "/g.pem"}}),
               ("/home/u/.config/pip/pip.conf", {"global": {"cert": "/u.pem"},
                                                 "install": {"cert": "/i.pem"}})]
    t = discover({"SSL_CERT_FILE": "/s.pem"}, configs, only("/g.pem", "/u.pem", "/i.pem", "/s.pem"))
    assert t.ca_bundle == "/i.pem"
    assert t.ca_from == "pip config /home/u/.config/pip/pip.conf [install] cert"


def test_env_then_system_bundle_and_missing_files_are_noted() -> None:
    t = discover({"PIP_CERT": "/gone.pem", "REQUESTS_CA_BUNDLE": "/r.pem"}, [], only("/r.pem"))
    assert (t.ca_bundle, t.ca_from) == ("/r.pem", "REQUESTS_CA_BUNDLE")
    assert t.notes == ("PIP_CERT names /gone.pem, which does not exist",)
    t = discover({}, [], only(SYSTEM))
    assert (t.ca_bundle, t.ca_from) == (SYSTEM, "the system bundle")
    assert discover({}, [], only()).empty


def test_explicit_bundle_first_and_must_exist() -> None:
    t = discover({"PIP_CERT": SYSTEM}, [], only(SYSTEM, "/mine.pem"), ca_bundle="/mine.pem")
    assert (t.ca_bundle, t.ca_from) == ("/mine.pem", "--ca-bundle")
    with pytest.raises(UserInputError, match="not a file"):
        discover({}, [], only(SYSTEM), ca_bundle="/nope.pem")


def test_proxies_upper_and_lower_case_are_passed_and_redacted() -> None:
    env = {"HTTPS_PROXY": "http://alice:s3cret@proxy.corp:3128", "http_proxy": "proxy.corp:3128",
           "NO_PROXY": "localhost,127.0.0.1,.corp,10.0.0.0/8", "UNRELATED": "x"}
    t = discover(env, [], only(SYSTEM))
    assert dict(t.proxies) == {k: v for k, v in env.items() if k != "UNRELATED"}
    build_env = t.build_env()
    assert build_env["APPTAINERENV_HTTPS_PROXY"] == env["HTTPS_PROXY"]  # the real value runs
    assert build_env["APPTAINERENV_PIP_CERT"] == CA_IN_BUILD
    assert build_env["APPTAINERENV_SSL_CERT_FILE"] == CA_IN_BUILD
    shown = json.dumps([t.shown_env(), t.summary(), t.to_dict()])
    assert "s3cret" not in shown and "alice" not in shown
    assert "http://***@proxy.corp:3128" in shown


@pytest.mark.parametrize("value", ["http://p:1\nexport X=1", "http://p:1 $(id)", "http://p'1"])
def test_a_proxy_that_is_not_a_url_is_refused_without_its_value(value: str) -> None:
    with pytest.raises(UserInputError) as exc:
        discover({"HTTPS_PROXY": value}, [], only(SYSTEM))
    assert "HTTPS_PROXY" in exc.value.message and value not in exc.value.message


def test_redact() -> None:
    assert redact("https://u:p@h:8080/") == "https://***@h:8080/"
    assert redact("u@h:3128") == "***@h:3128"
    assert redact("http://h:3128") == "http://h:3128"


def test_pip_config_files_in_pips_order(tmp_path: Path) -> None:
    files = pip_config_files({"XDG_CONFIG_HOME": "/x"}, "/home/u", prefix="/venv")
    assert files == ["/etc/xdg/pip/pip.conf", "/etc/pip.conf", "/home/u/.pip/pip.conf",
                     "/x/pip/pip.conf", "/venv/pip.conf"]
    assert pip_config_files({"PIP_CONFIG_FILE": "/dev/null"}, "/h") == []
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\ncert = /c.pem\n")
    assert read_pip_configs([str(conf), str(tmp_path / "none")]) == [
        (str(conf), {"global": {"cert": "/c.pem"}})]


def test_bind_is_read_only_at_mnt_and_refuses_unsafe_folders() -> None:
    t = HostTrust(ca_bundle=SYSTEM, ca_from="x")
    assert t.bind("/c/.x.building-1/host-ca") == ["--bind", "/c/.x.building-1/host-ca:/mnt:ro"]
    with pytest.raises(UserInputError, match="--bind"):
        t.bind("/c/a,b/host-ca")
    assert HostTrust().bind("/c") == []


def test_plan_passes_trust_outside_the_hash(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setenv("PIP_CERT", str(ca))
    monkeypatch.setenv("HTTPS_PROXY", "http://u:pw@proxy:3128")
    definition = tmp_path / "d.def"
    definition.write_text("Bootstrap: docker\nFrom: debian:12\n%post\n    pip install tqdm\n")
    plan = plan_build(str(definition), output=tmp_path / "o.sif")
    bare = plan_build(str(definition), output=tmp_path / "o.sif", host=False, import_check=False)
    assert plan.content_hash == bare.content_hash  # neither is part of the image's content
    assert plan.trust and plan.trust.ca_bundle == str(ca) and bare.trust is None
    argv = plan.argv("apptainer", "t.sif", "d.def", "/b/host-ca")
    assert argv[-4:] == ["--bind", "/b/host-ca:/mnt:ro", "t.sif", "d.def"]
    # (a .def's SIF is lz4 by default: hpcdl.container.build.DERIVED_COMPRESSION)
    assert bare.argv("apptainer", "t.sif", "d.def", "/b/host-ca")[1:] == [
        "build", "--mksquashfs-args", "-comp lz4", "t.sif", "d.def"]
    shown = plan.shown_command()
    assert "APPTAINERENV_HTTPS_PROXY=http://***@proxy:3128" in shown and "pw" not in shown
    assert f"--bind {BuildPlan.STAGED_CA}:/mnt:ro" in shown
    assert plan.definition.startswith(bare.definition) and "%test" in plan.definition[len(bare.definition):]
    remote = plan_build(str(definition), output=tmp_path / "r.sif", remote=True)
    assert remote.trust is None  # a remote builder is another machine


def test_dry_run_shows_what_is_passed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    monkeypatch.setenv("https_proxy", "http://bob:hunter2@p:8080")
    definition = tmp_path / "d.def"
    definition.write_text("Bootstrap: docker\nFrom: debian:12\n")
    r = CliRunner().invoke(cli, ["build", str(definition), "-o", str(tmp_path / "o.sif"),
                                 "--ca-bundle", str(ca), "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "hunter2" not in r.output
    assert f"# host trust: CA bundle {ca} (from --ca-bundle) bound at {CA_IN_BUILD}" in r.output
    assert "APPTAINERENV_https_proxy=http://***@p:8080" in r.output
    r = CliRunner().invoke(cli, ["build", str(definition), "-o", str(tmp_path / "o.sif"),
                                 "--no-host-trust", "--no-import-check", "--dry-run", "--json"])
    plan = json.loads(r.stdout)
    assert plan["host_trust"] is None and plan["import_check"] is False
    assert "%test" not in plan["definition"]


def test_import_check_line_parser() -> None:
    line = ("HPCDL_IMPORT_CHECK FAIL torchvision 0.28.0 does not match torch 2.13.0+cpu: "
            "operator torchvision::nms does not exist")
    check = parse_import_check("+ " + line + "\n")
    assert check and not check.ok
    assert check.message.startswith("torchvision 0.28.0 does not match torch 2.13.0+cpu")
    ok = parse_import_check("HPCDL_IMPORT_CHECK ok torch 2.13.0+cpu, horovod 0.28.1")
    assert ok and ok.ok and ok.message == "torch 2.13.0+cpu, horovod 0.28.1"
    assert parse_import_check('MARK = "HPCDL_IMPORT_CHECK"') is None
    assert find_import_check(f"noise\n{line}\nFATAL: exit 1\n") == check
    assert find_import_check("nothing") is None


def test_check_section_is_one_test_section_running_the_shipped_script() -> None:
    text = check_section()
    assert text.startswith("\n%test\n")
    assert text.count("\n%") == 1  # no line of the script opens a section
    body = import_check_source().split('"""', 2)[2].strip()
    assert body in text


# `make test` only: a Python start that imports torch (~2 s), the script run as a whole
# program; the tests above check its parts and its line's parsing in process.
@pytest.mark.slow
def test_the_script_reports_on_this_python(tmp_path: Path) -> None:
    """On the host's python (torch CPU, no torchvision here, or whatever is there): one
    line, ok or FAIL, and the exit code agrees with it."""
    r = subprocess.run([sys.executable, "-c", import_check_source()], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    check = find_import_check(r.stdout)
    assert check is not None, r.stdout + r.stderr
    assert (r.returncode == 0) == check.ok


def test_bake_ca_keeps_it_in_the_image_and_in_the_hash(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    monkeypatch.setenv("PIP_CERT", str(ca))
    definition = tmp_path / "d.def"
    definition.write_text("Bootstrap: docker\nFrom: debian:12\n")
    bound = plan_build(str(definition), output=tmp_path / "o.sif")
    baked = plan_build(str(definition), output=tmp_path / "o.sif", bake_ca=True)
    assert (str(ca), "/etc/hpcdl/host-ca.crt") in baked.files
    assert f"%files\n    {ca} /etc/hpcdl/host-ca.crt" in baked.definition
    assert "export PIP_CERT=/etc/hpcdl/host-ca.crt REQUESTS_CA_BUNDLE=" in baked.definition
    assert baked.content_hash != bound.content_hash
    with pytest.raises(UserInputError, match="--bake-ca"):
        plan_build(str(definition), output=tmp_path / "r.sif", remote=True, bake_ca=True)


def test_doctor_reports_the_same_check() -> None:
    from hpcdl.container.verify import ImportCheck
    from hpcdl.doctor.verdicts import verdicts
    from tests.unit.doctor.test_container_doctor import host, image, problem

    why = ("torchvision 0.28.0 does not match torch 2.13.0+cpu: operator torchvision::nms "
           "does not exist")
    vs = verdicts(host(), image(import_check=ImportCheck(False, why)))
    v = problem(vs, "imports")
    assert v.message == why and "pytorch-horovod-gpu-pypi" in (v.fix or "")
    ok = verdicts(host(), image(import_check=ImportCheck(True, "torch 2.13.0+cpu")))
    assert [v.message for v in ok if v.topic == "imports"] == ["load together: torch 2.13.0+cpu"]
