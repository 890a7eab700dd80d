#!/usr/bin/env bash
# Install (when missing) everything `make test` needs, each step idempotent and timed.
set -euo pipefail
cd "$(dirname "$0")/.."
step() {
  local name=$1; shift
  local t0=$SECONDS
  echo "==> $name"
  "$@"
  echo "==> $name: done in $(( SECONDS - t0 )) s"
}
# --test: the demo's part (hpcdl + train) and the tests' (dev, TensorBoard, the full MLflow).
step "python deps" scripts/install-python-deps.sh --test
# Apptainer before the sandbox: its nodes see the host's software as it is when they start.
step "apptainer" scripts/install-apptainer.sh
step "slurm sandbox" scripts/sandbox.sh up
# Debian's Chromium: `hpcdl report`'s HTML is checked in a real headless browser.
step "browser" scripts/install-browser.sh
# OpenSSH's server and rsync: a login node reached over SSH (hpcdl.remote.ssh's tests).
step "ssh" scripts/install-ssh.sh
# Horovod on the host too (the examples' tests run horovodrun/mpirun natively); the
# image step below reuses the same cached wheel.
step "horovod" scripts/build-horovod.sh
# The CPU image: Horovod wheel (built once, cached by content) + image (reused when its
# content hash matches; ~2 min build otherwise).
step "cpu image" scripts/build-image.sh
# The GPU image from PyPI wheels (CUDA torch + torchvision + NCCL + Horovod with NCCL):
# its Horovod wheel is compiled with nvcc in a host venv (cached by content, like the CPU
# one), then a multi-GB image is packed; both are no-ops when cached. Never skipped: a
# missing nvcc is a failure (see docs/guide/build.md, "GPU image built here").
step "gpu image" scripts/build-image.sh --gpu
