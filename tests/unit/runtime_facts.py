"""Crafted container-runtime facts shared by the unit tests of the runtime mode and of
the doctor: an ordinary user on a host like this one (no setuid starter, user namespaces
on, squashfuse installed, /dev/fuse 0600 root:root)."""

from __future__ import annotations

from hpcdl.container.runtime import RuntimeFacts

STARTER = "/usr/libexec/apptainer/bin/starter-suid"
USER = RuntimeFacts(
    euid=1001, runtime="apptainer", runtime_path="/usr/bin/apptainer", runtime_version="1.4.5",
    conf_path="/etc/apptainer/apptainer.conf", allow_setuid=True,
    max_user_namespaces=96365, squashfuse="/usr/bin/squashfuse_ll", fuse2fs="/usr/bin/fuse2fs",
    unsquashfs="/usr/bin/unsquashfs", fuse_mode="0600", fuse_owner="root:root",
    fuse_error="Permission denied",
)
