"""Doctor verdicts for an ordinary user: each failure it can detect named with its real
cause and fix (container access, an unreadable image), never "build it" for an image
that exists. Crafted facts; the real user is tests/integration/test_cluster_user_images.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hpcdl.container.runtime import RuntimeFacts
from hpcdl.doctor.host import HostFacts
from hpcdl.doctor.image import ImageFacts
from hpcdl.doctor.verdicts import Verdict, verdicts
from tests.unit.runtime_facts import STARTER, USER

IMG = "/var/cache/hpcdl/images/pytorch-horovod-cpu.sif"
FUSE_OK = replace(USER, fuse_mode="0666", fuse_error=None)
PROBE_FAILED = ("probe failed in the image (exit 255): FATAL:   container creation failed: "
                "image driver mount failure: ... fuse: failed to open /dev/fuse: "
                "Permission denied")


def host(access: RuntimeFacts | None) -> HostFacts:
    return HostFacts(runtime="apptainer", runtime_version="1.4.5",
                     runtime_path="/usr/bin/apptainer", access=access,
                     slurm_tools={t: True for t in ("sbatch", "srun", "squeue")})


def topic(vs: list[Verdict], name: str, level: str | None = None) -> Verdict:
    found = [v for v in vs if v.topic == name and (level is None or v.level == level)]
    assert len(found) == 1, f"{name}/{level}: {vs}"
    return found[0]


def no_build_advice(vs: list[Verdict]) -> None:
    for v in vs:
        assert "hpcdl build" not in (v.fix or ""), v


def test_dev_fuse_0600_no_setuid_names_cause_and_every_way_out() -> None:
    vs = verdicts(host(USER))
    v = topic(vs, "container access", "problem")
    assert "no setuid starter" in v.message
    assert "/dev/fuse is 0600 root:root" in v.message and "Permission denied" in v.message
    assert v.fix is not None
    assert "chmod 0666 /dev/fuse" in v.fix  # the admin's fix, as distributions ship it
    assert "starter-suid" in v.fix  # or the setuid starter
    assert "--unsquash" in v.fix and "20-60 s" in v.fix  # the user's own, with its cost
    assert "sysctl" not in v.fix  # user namespaces are fine: not part of the fix


@pytest.mark.parametrize("change, sysctl", [
    ({"max_user_namespaces": 0}, "sysctl -w user.max_user_namespaces=15000"),
    ({"unprivileged_userns_clone": 0}, "sysctl -w kernel.unprivileged_userns_clone=1"),
    ({"userns_error": "unshare --user failed: Operation not permitted"},
     "kernel.apparmor_restrict_unprivileged_userns=0"),
])
def test_no_user_namespaces_names_the_sysctl_and_no_unsquash(change: dict, sysctl: str) -> None:
    v = topic(verdicts(host(replace(FUSE_OK, **change))), "container access", "problem")
    assert v.fix is not None and sysctl in v.fix and "/etc/sysctl.d/" in v.fix
    assert "chmod" not in v.fix  # FUSE is open: not part of the fix
    assert "--unsquash" not in v.fix  # it needs user namespaces too


def test_no_squashfuse_and_no_fuse_device() -> None:
    v = topic(verdicts(host(replace(FUSE_OK, squashfuse=None))), "container access", "problem")
    assert "squashfuse is not installed" in v.message
    assert v.fix and "apt install squashfuse" in v.fix
    gone = replace(USER, fuse_mode=None, fuse_owner=None, fuse_error=None)
    v = topic(verdicts(host(gone)), "container access", "problem")
    assert "/dev/fuse does not exist" in v.message and v.fix and "modprobe fuse" in v.fix


@pytest.mark.parametrize("facts, words", [
    (FUSE_OK, "unprivileged"),
    (replace(USER, suid_starter=STARTER, suid_starter_owner=0, suid_starter_setuid=True),
     "setuid"),
    (replace(USER, euid=0), "root"),
])
def test_working_modes_are_ok(facts: RuntimeFacts, words: str) -> None:
    vs = verdicts(host(facts))
    assert topic(vs, "container access", "ok").message.startswith(words)
    assert not [v for v in vs if v.level == "problem"]


def test_unprivileged_without_fuse2fs_warns_about_overlays() -> None:
    v = topic(verdicts(host(replace(FUSE_OK, fuse2fs=None))), "container access", "warning")
    assert "--overlay" in v.message and v.fix and "fuse2fs" in v.fix


def test_without_access_facts_nothing_is_said() -> None:
    assert not [v for v in verdicts(host(None)) if v.topic == "container access"]


def test_shared_loop_devices_does_not_apply_to_an_unprivileged_user() -> None:
    h = replace(host(FUSE_OK), shared_loop_devices=False)
    v = topic(verdicts(h), "image mounts")
    assert v.level == "ok" and "own squashfuse" in v.message
    root = replace(host(replace(USER, euid=0)), shared_loop_devices=False)
    assert topic(verdicts(root), "image mounts").level == "warning"


def test_an_existing_image_that_will_not_start_is_never_rebuilt() -> None:
    img = ImageFacts(path=IMG, user="hpcuser", file_mode="0755", file_owner="root:root",
                     error=PROBE_FAILED)
    vs = verdicts(host(USER), img)
    v = topic(vs, "image", "problem")
    assert "cannot start it as hpcuser" in v.message and "/dev/fuse" in v.message
    assert v.fix and "container access" in v.fix
    assert f"apptainer exec --unsquash {IMG}" in v.fix
    no_build_advice(vs)


def test_an_image_failing_for_another_reason_points_at_the_runtimes_message() -> None:
    img = ImageFacts(path=IMG, user="hpcuser", error="probe failed in the image (exit 1): boom")
    vs = verdicts(host(FUSE_OK), img)
    v = topic(vs, "image", "problem")
    assert v.fix and f"apptainer exec {IMG} python3 -V" in v.fix
    no_build_advice(vs)


def test_unreadable_image_names_mode_owner_and_the_chmod() -> None:
    img = ImageFacts(path="/shared/img.sif", readable=False, user="hpcuser",
                     file_mode="0600", file_owner="alice:physics")
    vs = verdicts(host(FUSE_OK), img)
    v = topic(vs, "image", "problem")
    assert v.message == "/shared/img.sif is not readable by hpcuser (mode 0600, owner alice:physics)"
    assert v.fix and "ask alice" in v.fix and "chmod o+r /shared/img.sif" in v.fix
    assert "group physics" in v.fix
    no_build_advice(vs)


def test_image_behind_a_closed_directory_names_the_directory() -> None:
    img = ImageFacts(path="/root/imgs/x.sif", readable=False, user="hpcuser",
                     blocked_dir="/root", file_mode="0700", file_owner="root:root")
    v = topic(verdicts(host(FUSE_OK), img), "image", "problem")
    assert "directory /root is 0700 root:root" in v.message
    assert v.fix and "chmod o+x /root" in v.fix


def test_a_missing_image_still_says_build_it() -> None:
    v = topic(verdicts(host(FUSE_OK), ImageFacts(path="/x.sif", exists=False)), "image")
    assert v.fix == "build it: hpcdl build SPEC -o /x.sif"


def test_an_image_without_a_runtime_says_install_one() -> None:
    h = HostFacts(runtime_error="neither apptainer nor singularity is on PATH",
                  access=replace(USER, runtime=None))
    v = topic(verdicts(h, ImageFacts(path=IMG, error="no container runtime to look inside it")),
              "image")
    assert v.fix and "install Apptainer" in v.fix
