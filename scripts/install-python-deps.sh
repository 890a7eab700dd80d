#!/usr/bin/env bash
# Install hpcdl (editable) with its test and training extras into the current Python.
# torch is pinned to 2.13.0: on these machines pip then takes the local CPU wheel;
# any other spec would download the multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
PY=${PYTHON:-python3}
stamp_dir=${HPCDL_CACHE:-/var/cache/hpcdl}/stamps
mkdir -p "$stamp_dir"
key=$(cat pyproject.toml | sha256sum | cut -c1-16)-$("$PY" -c 'import sys;print(sys.prefix.replace("/","_"))')
# The import checks run from / : from the checkout, `import hpcdl` would find ./hpcdl even
# when the installed (editable) hpcdl points at another, since-removed checkout.
if [ -f "$stamp_dir/python-deps-$key" ] && (cd / && "$PY" -c 'import hpcdl.cli, torch, pytest, mkdocs, material, mlflow.server, tensorboard') 2>/dev/null \
   && (cd / && "$PY" -c 'import hpcdl,os,sys; sys.exit(0 if os.path.samefile(os.path.dirname(hpcdl.__file__), sys.argv[1]) else 1)' "$root/hpcdl") 2>/dev/null; then
  echo "python deps: up to date"
  exit 0
fi
start=$(date +%s)
# mpi4py compiles against the system Open MPI: make sure its headers exist.
if ! command -v mpicc >/dev/null; then
  apt-get update -qq
  apt-get install -y -qq -o DPkg::Lock::Timeout=900 openmpi-bin libopenmpi-dev >/dev/null
fi
"$PY" -m pip install -q "torch==2.13.0"
"$PY" -m pip install -q -e '.[dev,train,tensorboard]'
# The full mlflow (not only the hpcdl[mlflow] client): tests/unit/track/test_track.py starts a
# real `mlflow server` with a sqlite store. Pinned: the version the tests were written on.
"$PY" -m pip install -q "mlflow==3.17.2"
touch "$stamp_dir/python-deps-$key"
echo "python deps: installed in $(( $(date +%s) - start )) s"
