#!/usr/bin/env bash
# Install (when missing) the Debian packages the sandbox Slurm cluster needs:
# munge, Slurm 22.05 (controller, node daemon, client, accounting daemon),
# MariaDB for accounting, Open MPI + PMIx for `srun --mpi=pmix`.
# scripts/sandbox.sh starts the daemons itself (package installs must not).
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/install-debs.sh" slurm \
  munge slurmctld slurmd slurm-client slurmdbd mariadb-server \
  openmpi-bin libopenmpi-dev libpmix2 libpmix-dev
