#!/usr/bin/env bash
# Install (when missing) OpenSSH's server and rsync: the tests start their own sshd as a
# cluster's login node (key-only, on loopback or the sandbox's network) and reach it the
# way a laptop does (hpcdl.remote.ssh). The package's own service is never started
# (install-debs.sh keeps the machine's policy-rc.d).
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/install-debs.sh" ssh openssh-server openssh-client rsync
