#!/usr/bin/env bash
# Build (once) and install Horovod 0.28.1 for the pinned torch, with PyTorch, MPI and Gloo.
#
# Horovod's last release (0.28.1) fails to build against torch >= 2.1 ("C++17 or later
# compatible compiler is required"): we patch CMAKE_CXX_STANDARD to 17 in BOTH the
# top-level and horovod/torch CMakeLists.txt (patching only the torch one fails at link
# with a duplicate gloo symbol), and build without build isolation so pip never pulls
# another torch (any spec but torch==2.13.0 downloads the multi-GB CUDA build here).
#
# The wheel is cached outside the repo, keyed by torch version + python tag + this
# script's content, under ${HPCDL_CACHE:-/var/cache/hpcdl}/wheels/.
#
# Usage:
#   scripts/build-horovod.sh               build if not cached, install if not installed
#   scripts/build-horovod.sh --force       rebuild from scratch, reinstall
#   scripts/build-horovod.sh --print-wheel print the cached wheel path (builds it if missing)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
HOROVOD_VERSION=0.28.1
TORCH_SPEC="torch==2.13.0"
force=0
print_only=0
for arg in "$@"; do
  case "$arg" in
    --force) force=1 ;;
    --print-wheel) print_only=1 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "build-horovod.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

log() { if [ "$print_only" = 1 ]; then echo "$*" >&2; else echo "$*"; fi; }

# --- system packages (other engineers install concurrently: wait on the dpkg lock) ---
need_apt=()
command -v mpirun >/dev/null || need_apt+=(openmpi-bin)
command -v mpicc >/dev/null || need_apt+=(libopenmpi-dev)
command -v cmake >/dev/null || need_apt+=(cmake)
command -v g++ >/dev/null || need_apt+=(g++)
if [ ${#need_apt[@]} -gt 0 ]; then
  log "horovod: apt-get install ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=900 \
    "${need_apt[@]}" >&2
fi

# --- python build deps (torch pinned; numpy is needed by broadcast_optimizer_state) ---
if ! "$PY" -c 'import torch, numpy' 2>/dev/null; then
  log "horovod: pip install $TORCH_SPEC numpy"
  "$PY" -m pip install -q "$TORCH_SPEC" numpy >&2
fi
for mod in setuptools wheel packaging cloudpickle psutil yaml; do
  if ! "$PY" -c "import $mod" 2>/dev/null; then
    pkg=$mod; [ "$mod" = yaml ] && pkg=pyyaml
    "$PY" -m pip install -q "$pkg" >&2
  fi
done

torch_version=$("$PY" -c 'import torch; print(torch.__version__.replace("+", "_"))')
py_tag=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
script_hash=$(sha256sum "$0" | cut -c1-12)
cache=${HPCDL_CACHE:-/var/cache/hpcdl}
wheel_dir="$cache/wheels/horovod-$HOROVOD_VERSION-torch$torch_version-$py_tag-$script_hash"

find_wheel() { ls "$wheel_dir"/horovod-"$HOROVOD_VERSION"-*.whl 2>/dev/null | head -n1; }

wheel=$(find_wheel || true)
if [ "$force" = 1 ] || [ -z "$wheel" ]; then
  start=$(date +%s)
  mkdir -p "$cache/wheels"
  work=$(mktemp -d "$cache/wheels/.build-horovod.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  log "horovod: building $HOROVOD_VERSION for torch $torch_version ($py_tag) in $work"
  "$PY" -m pip download -q --no-deps --no-binary :all: -d "$work" "horovod==$HOROVOD_VERSION" >&2
  tar -xzf "$work/horovod-$HOROVOD_VERSION.tar.gz" -C "$work"
  src="$work/horovod-$HOROVOD_VERSION"
  for f in "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"; do
    sed -i -E 's/set\(CMAKE_CXX_STANDARD [0-9]+\)/set(CMAKE_CXX_STANDARD 17)/' "$f"
    grep -q 'set(CMAKE_CXX_STANDARD 17)' "$f" || { echo "horovod: C++17 patch did not apply to $f" >&2; exit 1; }
  done
  # Horovod builds RelWithDebInfo (-O3 -g): the debug information of every translation
  # unit that includes torch's headers is much of the compile's time on a fresh machine
  # (make demo) and half the wheel, and no one here debugs Horovod's C++. Same -O3 code.
  top="$src/CMakeLists.txt"
  sed -i -E '/^string\(REPLACE +"-O2" +"-O3" +CMAKE_CXX_FLAGS_RELWITHDEBINFO/a string(REPLACE "-g" "" CMAKE_CXX_FLAGS_RELWITHDEBINFO "${CMAKE_CXX_FLAGS_RELWITHDEBINFO}")\nstring(REPLACE "-g" "" CMAKE_C_FLAGS_RELWITHDEBINFO "${CMAKE_C_FLAGS_RELWITHDEBINFO}")' "$top"
  [ "$(grep -c 'REPLACE "-g" ""' "$top")" = 2 ] || { echo "horovod: the no-debug-info patch did not apply to $top" >&2; exit 1; }
  mkdir -p "$work/out"
  HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
  HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 HOROVOD_CPU_OPERATIONS=GLOO \
  MAKEFLAGS="-j$(nproc)" \
    "$PY" -m pip wheel -q --no-build-isolation --no-deps -w "$work/out" "$src" >&2
  built=$(ls "$work/out"/horovod-*.whl)
  # Publish atomically: a half-built directory never looks like a cache hit.
  stage="$work/publish"
  mkdir -p "$stage"
  cp "$built" "$stage/"
  rm -rf "$wheel_dir.old"
  [ -d "$wheel_dir" ] && mv "$wheel_dir" "$wheel_dir.old"
  mv "$stage" "$wheel_dir"
  rm -rf "$wheel_dir.old"
  wheel=$(find_wheel)
  log "horovod: built $wheel in $(( $(date +%s) - start )) s"
  force_install=1
else
  force_install=$force
fi

if [ "$print_only" = 1 ]; then
  echo "$wheel"
  exit 0
fi

installed=$("$PY" -c 'import importlib.metadata as m; print(m.version("horovod"))' 2>/dev/null || true)
if [ "$installed" != "$HOROVOD_VERSION" ] || [ "$force_install" = 1 ] \
   || ! "$PY" -c 'import horovod.torch' 2>/dev/null; then
  log "horovod: pip install $wheel"
  # --no-deps for horovod itself (its deps are installed above); torch stays as pinned.
  "$PY" -m pip install -q --force-reinstall --no-deps "$wheel"
fi

# Verify: the build must carry PyTorch, MPI and Gloo.
cb=$(horovodrun -cb 2>&1)
for want in "\[X\] PyTorch" "\[X\] MPI" "\[X\] Gloo"; do
  if ! grep -q "$want" <<<"$cb"; then
    echo "horovod: build check failed, missing ${want//\\/}:" >&2
    echo "$cb" >&2
    exit 1
  fi
done
log "horovod: $HOROVOD_VERSION ready (PyTorch, MPI, Gloo); wheel $wheel"
