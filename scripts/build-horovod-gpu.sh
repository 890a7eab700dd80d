#!/usr/bin/env bash
# Build (once) Horovod 0.28.1 with CUDA and NCCL GPU operations for the CUDA build of
# torch 2.14.1, as a wheel for the GPU image (containers/pytorch-horovod-gpu-pypi.yaml).
#
# Where: a host venv (${HPCDL_CACHE}/venvs/torch-2.14.1-cp311) holding PyPI's CUDA torch,
# so the build never touches the system python (which carries the CPU torch the CPU
# image and the native tests use). The C++ standard fix of scripts/build-horovod.sh,
# one step further: C++17 at the top level, C++20 for horovod/torch (torch 2.14's
# headers require it), and the CUDA kernels' CMAKE_CUDA_STANDARD 11 -> 17 (CUDA 13's
# CCCL headers refuse anything older than C++17).
#   CUDA:  nvcc from $CUDA_HOME (default /usr/local/cuda-13.0)
#   NCCL:  nccl.h + libnccl.so.2 from the nvidia-nccl-cu13 wheel (the one torch loads),
#          linked shared, so the process holds a single NCCL
#   archs: HOROVOD_BUILD_CUDA_CC_LIST (and TORCH_CUDA_ARCH_LIST) = the sm_XX that torch was
#          compiled for, so Horovod's kernels cover exactly the GPUs torch runs on
#
# The wheel is cached under ${HPCDL_CACHE:-/var/cache/hpcdl}/wheels/, keyed by torch
# version + CUDA + python tag + this script's content; published atomically.
#
# Usage:
#   scripts/build-horovod-gpu.sh               build if not cached; print the wheel path
#   scripts/build-horovod-gpu.sh --force       rebuild from scratch
set -euo pipefail
cd "$(dirname "$0")/.."
HOROVOD_VERSION=0.28.1
TORCH_VERSION=2.14.1
# What the venv needs to build Horovod (numpy: broadcast_optimizer_state).
BUILD_REQS=("torch==$TORCH_VERSION" numpy==2.4.6 setuptools wheel packaging cloudpickle psutil pyyaml)
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda-13.0}
cache=${HPCDL_CACHE:-/var/cache/hpcdl}
force=0
for arg in "$@"; do
  case "$arg" in
    --force) force=1 ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "build-horovod-gpu.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done
log() { echo "[horovod-gpu] $*" >&2; }

[ -x "$CUDA_HOME/bin/nvcc" ] || {
  log "no nvcc at $CUDA_HOME/bin/nvcc: set CUDA_HOME to a CUDA 13 toolkit"; exit 1; }

host_py=${PYTHON:-python3}
py_tag=$("$host_py" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
venv=$cache/venvs/torch-$TORCH_VERSION-$py_tag
VPY=$venv/bin/python
if ! "$VPY" -c "import torch, numpy, setuptools, wheel, packaging, cloudpickle, psutil, yaml
assert torch.__version__.split('+')[0] == '$TORCH_VERSION' and torch.version.cuda" 2>/dev/null; then
  log "venv $venv: pip install ${BUILD_REQS[*]} (CUDA torch, from the local wheels)"
  t0=$SECONDS
  # Completeness is the import check above, so a half-done install is redone next time.
  [ -x "$VPY" ] || "$host_py" -m venv "$venv"
  "$VPY" -m pip install -q "${BUILD_REQS[@]}" 2> >(grep -v 'is ignored: it is neither' >&2) >&2
  log "venv ready in $(( SECONDS - t0 )) s"
fi

read -r torch_cuda arch_list nccl_dir < <("$VPY" - <<'EOF'
import os, torch
import nvidia.nccl
d = os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0]
# torch.cuda.get_arch_list() is [] without a GPU; the flags it reads are compiled in.
flags = (torch._C._cuda_getArchFlags() or "").split()
archs = sorted({int(a.split("_")[1]) for a in flags if a.startswith("sm_")})
assert archs, f"torch {torch.__version__} reports no sm_ architectures: {flags}"
print(torch.version.cuda, ",".join(map(str, archs)), d)
EOF
)
[ -f "$nccl_dir/include/nccl.h" ] || { log "no nccl.h under $nccl_dir (nvidia-nccl-cu13 wheel)"; exit 1; }
script_hash=$(sha256sum "$0" | cut -c1-12)
wheel_dir="$cache/wheels/horovod-$HOROVOD_VERSION-torch${TORCH_VERSION}_cu${torch_cuda//./}-$py_tag-$script_hash"
find_wheel() { ls "$wheel_dir"/horovod-"$HOROVOD_VERSION"-*.whl 2>/dev/null | head -n1; }
wheel=$(find_wheel || true)
if [ "$force" = 1 ] || [ -z "$wheel" ]; then
  start=$SECONDS
  mkdir -p "$cache/wheels"
  work=$(mktemp -d "$cache/wheels/.build-horovod-gpu.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  log "building Horovod $HOROVOD_VERSION for torch $TORCH_VERSION (CUDA $torch_cuda, sm $arch_list) in $work"
  "$VPY" -m pip download -q --no-deps --no-binary :all: -d "$work" "horovod==$HOROVOD_VERSION" \
      2> >(grep -v 'is ignored: it is neither' >&2) >&2
  tar -xzf "$work/horovod-$HOROVOD_VERSION.tar.gz" -C "$work"
  src="$work/horovod-$HOROVOD_VERSION"
  # torch >= 2.14's headers need C++20 (ATen.h: "C++20 or later compatible compiler is
  # required"); the rest of Horovod (gloo, flatbuffers) stays at the C++17 known to build.
  f="$src/CMakeLists.txt"
  sed -i -E 's/set\(CMAKE_CXX_STANDARD [0-9]+\)/set(CMAKE_CXX_STANDARD 17)/' "$f"
  grep -q 'set(CMAKE_CXX_STANDARD 17)' "$f" || { log "C++17 patch did not apply to $f"; exit 1; }
  f="$src/horovod/torch/CMakeLists.txt"
  sed -i -E 's/set\(CMAKE_CXX_STANDARD [0-9]+\)/set(CMAKE_CXX_STANDARD 20)/' "$f"
  grep -q 'set(CMAKE_CXX_STANDARD 20)' "$f" || { log "C++20 patch did not apply to $f"; exit 1; }
  f="$src/horovod/common/ops/cuda/CMakeLists.txt"
  sed -i -E 's/set\(CMAKE_CUDA_STANDARD [0-9]+\)/set(CMAKE_CUDA_STANDARD 17)/' "$f"
  grep -q 'set(CMAKE_CUDA_STANDARD 17)' "$f" || { log "CUDA C++17 patch did not apply to $f"; exit 1; }
  # No debug information (scripts/build-horovod.sh says why): the same -O3 code.
  f="$src/CMakeLists.txt"
  sed -i -E '/^string\(REPLACE +"-O2" +"-O3" +CMAKE_CUDA_FLAGS_RELWITHDEBINFO/a string(REPLACE "-g" "" CMAKE_CXX_FLAGS_RELWITHDEBINFO "${CMAKE_CXX_FLAGS_RELWITHDEBINFO}")\nstring(REPLACE "-g" "" CMAKE_C_FLAGS_RELWITHDEBINFO "${CMAKE_C_FLAGS_RELWITHDEBINFO}")\nstring(REPLACE "-g" "" CMAKE_CUDA_FLAGS_RELWITHDEBINFO "${CMAKE_CUDA_FLAGS_RELWITHDEBINFO}")' "$f"
  [ "$(grep -c 'REPLACE "-g" ""' "$f")" = 3 ] || { log "the no-debug-info patch did not apply to $f"; exit 1; }
  # The wheel ships libnccl.so.2 only; CMake's find_library wants the unversioned name.
  mkdir -p "$work/nccl/lib"
  ln -s "$nccl_dir/lib/libnccl.so.2" "$work/nccl/lib/libnccl.so"
  mkdir -p "$work/out"
  PATH="$CUDA_HOME/bin:$PATH" CUDA_HOME="$CUDA_HOME" HOROVOD_CUDA_HOME="$CUDA_HOME" \
  HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
  HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 HOROVOD_CPU_OPERATIONS=GLOO \
  HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_LINK=SHARED \
  HOROVOD_NCCL_INCLUDE="$nccl_dir/include" HOROVOD_NCCL_LIB="$work/nccl/lib" \
  HOROVOD_BUILD_CUDA_CC_LIST="$arch_list" TORCH_CUDA_ARCH_LIST="$(sed -E 's/([0-9]+)([0-9])(,|$)/\1.\2;/g; s/;$//' <<<"$arch_list")" \
  MAKEFLAGS="-j$(nproc)" \
    "$VPY" -m pip wheel -v --no-build-isolation --no-deps -w "$work/out" "$src" \
      >"$work/build.log" 2>&1 || {
        mkdir -p "$cache/logs"
        cp "$work/build.log" "$cache/logs/build-horovod-gpu.failed.log"
        grep -E -B2 -A8 'error:|Error [0-9]' "$work/build.log" | head -n 80 >&2 || true
        log "build failed; full log: $cache/logs/build-horovod-gpu.failed.log"; exit 1; }
  built=$(ls "$work/out"/horovod-*.whl)
  stage="$work/publish"
  mkdir -p "$stage"
  cp "$built" "$stage/"
  printf 'torch %s\ncuda %s\nsm %s\nnccl %s\nseconds %s\n' "$TORCH_VERSION" "$torch_cuda" \
    "$arch_list" "$nccl_dir" "$(( SECONDS - start ))" >"$stage/BUILD-INFO"
  rm -rf "$wheel_dir.old"
  [ -d "$wheel_dir" ] && mv "$wheel_dir" "$wheel_dir.old"
  mv "$stage" "$wheel_dir"
  rm -rf "$wheel_dir.old"
  wheel=$(find_wheel)
  log "built $wheel in $(( SECONDS - start )) s"
  # Verify in the venv: PyTorch, MPI, Gloo and NCCL must all be there.
  "$VPY" -m pip install -q --force-reinstall --no-deps "$wheel" >&2
  cb=$("$venv/bin/horovodrun" -cb 2>&1)
  for want in "\[X\] PyTorch" "\[X\] MPI" "\[X\] Gloo" "\[X\] NCCL"; do
    grep -q "$want" <<<"$cb" || { log "build check failed, missing ${want//\\/}:"; echo "$cb" >&2; exit 1; }
  done
fi
echo "$wheel"
