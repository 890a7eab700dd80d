#!/usr/bin/env bash
# The main job. Until the sandbox cluster and the image exist this renders the
# 2-node job for the sandbox profile as a dry run.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-python-deps.sh
hpcdl submit --profile sandbox --nodes 2 --gpus 4 --dry-run
