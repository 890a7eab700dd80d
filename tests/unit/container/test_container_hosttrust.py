"""hpcdl/container/hosttrust.py as properties: a proxy's password never reaches what is
shown, every proxy that discover accepts is passed as it is and one it refuses is not
shown; pip's configuration files read from real files; --bake-ca's sections. (The
order of the CA sources and the build's use: test_build_host_trust.py.)"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcdl.container.hosttrust import (
    BAKED_CA,
    CA_ENV,
    CA_IN_BUILD,
    HostTrust,
    bake_sections,
    discover,
    read_pip_configs,
    redact,
)
from hpcdl.errors import UserInputError

WORD = st.from_regex(r"[A-Za-z0-9._~-]{1,12}", fullmatch=True)


@given(st.sampled_from(["http://", "https://", "socks5h://", ""]), WORD, WORD,
       st.from_regex(r"[a-z0-9.-]{1,12}(:[0-9]{1,5})?", fullmatch=True))
def test_a_proxy_password_is_never_shown(scheme, user, password, host):
    url = f"{scheme}{user}:{password}@{host}"
    trust = discover({"HTTPS_PROXY": url}, [], lambda p: False)
    assert trust.proxies == (("HTTPS_PROXY", url),)
    assert trust.build_env()["APPTAINERENV_HTTPS_PROXY"] == url  # the build gets it whole
    shown = " ".join([trust.summary(), *trust.shown_env().values(), str(trust.to_dict())])
    assert f"{user}:{password}@" not in shown and f"{scheme}***@{host}" in shown
    assert redact(f"{host}") == host


@given(st.tuples(st.text(max_size=8), st.sampled_from(list(" '\"`\\\n")), st.text(max_size=8))
       .map("".join))
def test_a_proxy_that_is_no_url_is_refused_without_its_value(value):
    with pytest.raises(UserInputError) as err:
        discover({"http_proxy": value}, [], lambda p: False)
    assert err.value.message == "build: http_proxy on this host is not a proxy URL (value not shown)"


def test_the_build_env_points_every_ca_variable_at_the_bound_copy():
    trust = HostTrust(ca_bundle="/etc/ssl/proxy-ca.pem", ca_from="PIP_CERT",
                      proxies=(("NO_PROXY", "localhost,.site.org"),))
    env = trust.build_env()
    assert {env[f"APPTAINERENV_{n}"] for n in CA_ENV} == {CA_IN_BUILD}
    assert env["APPTAINERENV_NO_PROXY"] == "localhost,.site.org"
    assert trust.bind("/tmp/build-1") == ["--bind", "/tmp/build-1:/mnt:ro"]
    assert HostTrust().empty and HostTrust().build_env() == {} and HostTrust().bind("/x") == []
    assert HostTrust().summary() == "no CA bundle found"


def test_pip_configs_are_read_from_real_files_and_broken_ones_skipped(tmp_path):
    good = tmp_path / "pip.conf"
    good.write_text("[global]\ncert = /etc/ca.pem\n[install]\ntrusted-host = pypi.site\n")
    broken = tmp_path / "broken.conf"
    broken.write_text("no section header\n")
    latin = tmp_path / "latin.conf"
    latin.write_bytes(b"[global]\ncert = /\xe9\n")
    got = read_pip_configs([str(good), str(broken), str(latin), str(tmp_path / "none.conf")])
    assert got == [(str(good), {"global": {"cert": "/etc/ca.pem"},
                                "install": {"trusted-host": "pypi.site"}})]


def test_bake_ca_keeps_the_bundle_in_the_image():
    text = bake_sections("/etc/ssl/proxy-ca.pem")
    assert f"%files\n    /etc/ssl/proxy-ca.pem {BAKED_CA}\n" in text
    assert all(f"{n}={BAKED_CA}" in text for n in CA_ENV)
    for bad in ("relative.pem", "/a b.pem", "/x\n%post\nrm -rf /"):
        with pytest.raises(UserInputError, match="bake-ca: .* is not an absolute path"):
            bake_sections(bad)
