"""runtime_mode: how (and whether) this user can run SIF images, decided from crafted
facts; and gather_runtime_facts on this host, checked against what the host shows."""

from __future__ import annotations

import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from hpcdl.container.runtime import (
    build_mode,
    can_unsquash,
    gather_runtime_facts,
    has_subid_range,
    parse_buildcfg,
    parse_conf_bool,
    runtime_mode,
    runtime_mode_reason,
)
from tests.unit.runtime_facts import STARTER, USER

SETUID = replace(USER, suid_starter=STARTER, suid_starter_owner=0, suid_starter_setuid=True)
FUSE_OK = replace(USER, fuse_mode="0666", fuse_error=None)


def test_root_is_root_whatever_else_is_missing() -> None:
    assert runtime_mode(replace(USER, euid=0)) == "root"


def test_no_runtime_is_unusable_for_everyone() -> None:
    facts = replace(USER, euid=0, runtime=None)
    assert runtime_mode(facts) == "unusable"
    assert "neither apptainer nor singularity" in runtime_mode_reason(facts)


def test_setuid_starter_owned_by_root_with_the_bit_and_allowed() -> None:
    assert runtime_mode(SETUID) == "setuid"
    assert STARTER in runtime_mode_reason(SETUID)


@pytest.mark.parametrize("change, words", [
    ({"suid_starter_setuid": False}, "not a root-owned setuid program"),
    ({"suid_starter_owner": 1001}, "not a root-owned setuid program"),
    ({"allow_setuid": False}, "allow setuid = no"),
    ({"allow_setuid": None}, "allow setuid = no"),
])
def test_a_setuid_starter_that_cannot_be_used_is_not_setuid(change: dict, words: str) -> None:
    facts = replace(SETUID, **change)
    assert runtime_mode(facts) == "unusable"  # and FUSE is closed: nothing else works
    assert words in runtime_mode_reason(facts)
    assert runtime_mode(replace(facts, fuse_mode="0666", fuse_error=None)) == "unprivileged"


def test_unprivileged_needs_userns_squashfuse_and_an_openable_dev_fuse() -> None:
    assert runtime_mode(FUSE_OK) == "unprivileged"
    # fuse2fs only serves ext3 overlays: a SIF runs without it
    assert runtime_mode(replace(FUSE_OK, fuse2fs=None)) == "unprivileged"


def test_dev_fuse_0600_without_setuid_is_unusable_and_says_why() -> None:
    assert runtime_mode(USER) == "unusable"
    reason = runtime_mode_reason(USER)
    assert "no setuid starter" in reason
    assert "/dev/fuse is 0600 root:root" in reason and "Permission denied" in reason


def test_no_dev_fuse_at_all() -> None:
    facts = replace(USER, fuse_mode=None, fuse_owner=None, fuse_error=None)
    assert runtime_mode(facts) == "unusable"
    assert "/dev/fuse does not exist" in runtime_mode_reason(facts)


@pytest.mark.parametrize("change, words", [
    ({"max_user_namespaces": 0}, "user.max_user_namespaces = 0"),
    ({"max_user_namespaces": None}, "user.max_user_namespaces = unreadable"),
    ({"unprivileged_userns_clone": 0}, "kernel.unprivileged_userns_clone = 0"),
    ({"userns_error": "unshare --user failed: Operation not permitted"}, "blocked"),
])
def test_no_user_namespaces_is_unusable_even_with_fuse(change: dict, words: str) -> None:
    facts = replace(FUSE_OK, **change)
    assert runtime_mode(facts) == "unusable"
    assert words in runtime_mode_reason(facts)
    assert not can_unsquash(facts)
    assert runtime_mode(replace(facts, suid_starter=STARTER, suid_starter_owner=0,
                                suid_starter_setuid=True)) == "setuid"


def test_unprivileged_userns_clone_1_is_fine() -> None:
    assert runtime_mode(replace(FUSE_OK, unprivileged_userns_clone=1)) == "unprivileged"


def test_no_squashfuse() -> None:
    facts = replace(FUSE_OK, squashfuse=None)
    assert runtime_mode(facts) == "unusable"
    assert "squashfuse is not installed" in runtime_mode_reason(facts)


def test_every_missing_piece_is_named_at_once() -> None:
    facts = replace(USER, max_user_namespaces=0, squashfuse=None)
    reason = runtime_mode_reason(facts)
    for words in ("no setuid starter", "max_user_namespaces = 0", "squashfuse", "/dev/fuse"):
        assert words in reason


def test_unsquash_needs_user_namespaces_and_unsquashfs_not_fuse() -> None:
    assert can_unsquash(USER)
    assert not can_unsquash(replace(USER, unsquashfs=None))
    assert not can_unsquash(replace(USER, runtime=None))


def test_parse_conf_bool_last_uncommented_setting_wins() -> None:
    conf = "# allow setuid = no\nallow setuid = yes\n  allow setuid = no\n"
    assert parse_conf_bool(conf, "allow setuid", True) is False
    assert parse_conf_bool("# allow setuid = no\n", "allow setuid", True) is True
    assert parse_conf_bool("", "allow setuid", False) is False


def test_parse_buildcfg() -> None:
    cfg = parse_buildcfg("PACKAGE_NAME=apptainer\nLIBEXECDIR=/usr/lib/x86_64-linux-gnu\n"
                         "SYSCONFDIR=/etc\nnot a line\n")
    assert cfg["LIBEXECDIR"] == "/usr/lib/x86_64-linux-gnu"
    assert cfg["SYSCONFDIR"] == "/etc"
    assert "not a line" not in cfg


def test_gathered_facts_match_this_host() -> None:
    facts = gather_runtime_facts()
    assert facts.euid == os.geteuid()
    max_ns = Path("/proc/sys/user/max_user_namespaces").read_text().strip()
    assert facts.max_user_namespaces == int(max_ns)
    if os.path.exists("/dev/fuse"):
        assert facts.fuse_mode == f"{stat.S_IMODE(os.stat('/dev/fuse').st_mode):04o}"
    else:
        assert facts.fuse_mode is None
    if facts.suid_starter:
        st = os.stat(facts.suid_starter)
        assert facts.suid_starter_setuid == bool(st.st_mode & stat.S_ISUID)
    if os.geteuid() == 0:
        assert runtime_mode(facts) == ("root" if facts.runtime else "unusable")


# --- building as an ordinary user ------------------------------------------------------

def test_build_as_root() -> None:
    assert build_mode(replace(USER, euid=0)) == ("root", "running as root")


def test_build_with_a_subuid_range() -> None:
    mode, how = build_mode(replace(USER, subuid=True, newuidmap_setuid=True))
    assert mode == "fakeroot" and "/etc/subuid range" in how


def test_build_without_subuid_uses_a_root_mapped_namespace() -> None:
    mode, how = build_mode(replace(USER, fakeroot_command="/usr/bin/fakeroot"))
    assert mode == "fakeroot" and "root-mapped" in how and "fakeroot command" in how
    mode, how = build_mode(replace(USER, subuid=True))  # newuidmap not setuid: no mapping
    assert mode == "fakeroot" and "may fail" in how


def test_build_without_user_namespaces() -> None:
    facts = replace(USER, max_user_namespaces=0, subuid=True, newuidmap_setuid=True)
    mode, how = build_mode(facts)
    assert mode == "unusable" and how.startswith("cannot build as this user: ")
    assert "user.max_user_namespaces = 0" in how
    assert build_mode(replace(SETUID, max_user_namespaces=0, subuid=True))[0] == "fakeroot"
    mode, how = build_mode(replace(SETUID, max_user_namespaces=0))
    assert mode == "unusable" and "no /etc/subuid range" in how


def test_subid_range() -> None:
    text = "alice:100000:65536\n1002:165536:65536\nbob:231072:1000\n"
    assert has_subid_range(text, "alice", 1001)
    assert has_subid_range(text, "carol", 1002)  # by uid
    assert not has_subid_range(text, "bob", 1003)  # too small for a distribution's packages
    assert not has_subid_range(text, "dave", 1004)
