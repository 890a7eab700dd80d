#!/usr/bin/env bash
# Install hpcdl (editable) into the current Python ($PYTHON, default python3).
#
#   scripts/install-python-deps.sh          what `make demo` runs: hpcdl + its `train` extra
#                                           (torch, numpy, pillow: the dataset and the Horovod
#                                           build on the host); the demo imports nothing else
#   scripts/install-python-deps.sh --test   what `make test` needs on top (scripts/setup.sh):
#                                           the dev extra (pytest, ruff, mypy, mpi4py,
#                                           playwright, mkdocs), TensorBoard and the full MLflow
#
# The test part was 162 s of a 717 s fresh `make demo` that never used it. Each part has
# its own stamp (pyproject.toml's hash + the Python's prefix) and import check, so a
# demo's install does not count as the test's and the test's reuses the demo's.
# torch is pinned to 2.13.0: on these machines pip then takes the local CPU wheel;
# any other spec would download the multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
PY=${PYTHON:-python3}
part=demo
case "${1:-}" in
  "") ;;
  --test) part=test ;;
  -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
  *) echo "install-python-deps.sh: unknown argument '$1' (--test or nothing)" >&2; exit 2 ;;
esac
stamp_dir=${HPCDL_CACHE:-/var/cache/hpcdl}/stamps
mkdir -p "$stamp_dir"
key=$(cat pyproject.toml | sha256sum | cut -c1-16)-$("$PY" -c 'import sys;print(sys.prefix.replace("/","_"))')

# up_to_date PART MODULES: the part's stamp is there, its modules import and the installed
# hpcdl is this checkout's. The import checks run from / : from the checkout, `import
# hpcdl` would find ./hpcdl even when the installed (editable) hpcdl points at another,
# since-removed checkout.
up_to_date() {
  [ -f "$stamp_dir/python-deps-$1-$key" ] && (cd / && "$PY" -c "import $2") 2>/dev/null \
    && (cd / && "$PY" -c 'import hpcdl,os,sys; sys.exit(0 if os.path.samefile(os.path.dirname(hpcdl.__file__), sys.argv[1]) else 1)' "$root/hpcdl") 2>/dev/null
}

DEMO_MODULES="hpcdl.cli, torch, numpy, PIL"
TEST_MODULES="pytest, xdist, hypothesis, mpi4py, playwright, mkdocs, material, mlflow.server, tensorboard"

if up_to_date demo "$DEMO_MODULES"; then
  echo "python deps (demo): up to date"
else
  start=$(date +%s)
  "$PY" -m pip install -q "torch==2.13.0"
  "$PY" -m pip install -q -e '.[train]'
  touch "$stamp_dir/python-deps-demo-$key"
  echo "python deps (demo): installed in $(( $(date +%s) - start )) s"
fi
[ "$part" = test ] || exit 0

if up_to_date test "$TEST_MODULES"; then
  echo "python deps (test): up to date"
  exit 0
fi
start=$(date +%s)
# mpi4py (dev) compiles against the system Open MPI: make sure its headers exist.
if ! command -v mpicc >/dev/null; then
  apt-get update -qq
  apt-get install -y -qq -o DPkg::Lock::Timeout=900 openmpi-bin libopenmpi-dev >/dev/null
fi
"$PY" -m pip install -q -e '.[dev,train,tensorboard]'
# The full mlflow (not only the hpcdl[mlflow] client): tests/unit/track/test_track.py starts a
# real `mlflow server` with a sqlite store. Pinned: the version the tests were written on.
"$PY" -m pip install -q "mlflow==3.17.2"
touch "$stamp_dir/python-deps-test-$key"
echo "python deps (test): installed in $(( $(date +%s) - start )) s"
