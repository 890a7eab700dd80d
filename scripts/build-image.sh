#!/usr/bin/env bash
# Build the CPU image (containers/pytorch-horovod-cpu.yaml) from scratch or from cache.
#
# 1. Fill the wheelhouse the spec copies in (<cache>/wheelhouse; the cache is
#    ${HPCDL_CACHE:-/var/cache/hpcdl}, or ~/.cache/hpcdl for a user who may not write it,
#    who then reuses the site's wheelhouse when it has one: see hpcdl/container/cache.py):
#    - the pinned torch CPU wheel: pip download torch==2.13.0 --no-deps (pip's configuration
#      on these machines resolves that to the local CPU wheel);
#    - the Horovod 0.28.1 wheel with the C++17 fix, from scripts/build-horovod.sh (cached
#      under wheels/; built on first use). Exactly one Horovod wheel is kept;
#    - the spec's other pip.local requirements and every dependency (the image installs
#      from the wheelhouse with --no-index).
# 2. `hpcdl build pytorch-horovod-cpu`: a no-op (< 1 s) when the content hash of the
#    rendered definition + every copied file matches the cached image.
#
# --gpu: the GPU image (containers/pytorch-horovod-gpu-pypi.yaml) instead, from its own
#    wheelhouse (${HPCDL_CACHE}/wheelhouse-gpu): PyPI's CUDA torch + torchvision + the
#    nvidia-*-cu13 wheels, and the Horovod CUDA/NCCL wheel from scripts/build-horovod-gpu.sh.
#
# Usage: scripts/build-image.sh [--gpu] [--prepare-only] [hpcdl build options, e.g. --force -o X.sif]
# Needs Apptainer (scripts/install-apptainer.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# hpcdl's cache rule (hpcdl/container/cache.py): ${HPCDL_CACHE:-/var/cache/hpcdl} where this user
# may write it, else ~/.cache/hpcdl, reading a site cache they can only read as well.
mapfile -t CACHES < <("$PY" -c 'from hpcdl.container.cache import cache_dirs
d = cache_dirs(); print(d.write); print("\n".join(d.read))')
CACHE=${CACHES[0]}
WHEELHOUSE=$CACHE/wheelhouse
TORCH_SPEC="torch==2.13.0"
SPEC=pytorch-horovod-cpu
prepare_only=0
gpu=0
args=()
for arg in "$@"; do
  case "$arg" in
    --prepare-only) prepare_only=1 ;;
    --gpu) gpu=1 ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) args+=("$arg") ;;
  esac
done

log() { echo "[build-image] $*" >&2; }
if [ "$gpu" = 1 ]; then
  SPEC=pytorch-horovod-gpu-pypi
  WHEELHOUSE=$CACHE/wheelhouse-gpu
fi
# One preparation per wheelhouse at a time: two runs on one machine (two `make test`s,
# a test fixture and `make demo`) would otherwise download into the same wheelhouse,
# copy the same Horovod wheel and remove each other's "stale" files. The lock (fd 9,
# inherited by the `hpcdl build` exec'd below) is held to the end, so the second run
# waits and then finds everything ready: its `hpcdl build` is a no-op (hpcdl's build
# takes its own lock per target as well).
mkdir -p "$CACHE"
exec 9>>"$WHEELHOUSE.lock"
if ! flock -n 9; then
  log "waiting for another build-image.sh on $WHEELHOUSE ($WHEELHOUSE.lock)"
  flock 9
fi
# An ordinary user with no wheelhouse of their own reuses the one a site cache they may
# only read holds (`hpcdl build` reads it from there; it names a missing wheel).
if [ ! -d "$WHEELHOUSE" ]; then
  for dir in "${CACHES[@]:1}"; do
    site=$dir/$(basename "$WHEELHOUSE")
    if [ "$dir" != "$CACHE" ] && [ -f "$site/.downloaded" ]; then
      log "wheelhouse: reusing $site (a cache this user may only read)"
      [ "$prepare_only" = 1 ] && exit 0
      exec "$PY" -m hpcdl build "$SPEC" "${args[@]}"
    fi
  done
fi
mkdir -p "$WHEELHOUSE"

# torch's CUDA build resolves from the local indexes by its version alone (below).
if [ "$gpu" = 0 ] && ! ls "$WHEELHOUSE"/torch-2.13.0*.whl >/dev/null 2>&1; then
  log "wheelhouse: pip download $TORCH_SPEC --no-deps"
  "$PY" -m pip download -q "$TORCH_SPEC" --no-deps -d "$WHEELHOUSE" \
      2> >(grep -v 'is ignored: it is neither' >&2) >&2
fi

if [ "$gpu" = 1 ]; then
  hvd=$(scripts/build-horovod-gpu.sh)
else
  hvd=$(scripts/build-horovod.sh --print-wheel)
fi
[ -f "$hvd" ] || { log "the Horovod build script gave no wheel"; exit 1; }
target=$WHEELHOUSE/$(basename "$hvd")
if ! cmp -s "$hvd" "$target"; then
  log "wheelhouse: $(basename "$hvd")"
  # -p keeps the mtime, so the content hash can reuse its digest next time.
  cp -p "$hvd" "$WHEELHOUSE/.horovod.tmp"
  mv -f "$WHEELHOUSE/.horovod.tmp" "$target"
  rm -f "$WHEELHOUSE/.downloaded"
fi
for f in "$WHEELHOUSE"/horovod-*.whl; do
  [ "$f" = "$target" ] || { log "wheelhouse: removing stale $(basename "$f")"; rm -f "$f"; }
done

# The spec's pip.local requirements and all their dependencies. Horovod resolves to the
# wheel above and torch to the CPU wheel (both already in the wheelhouse).
mapfile -t reqs < <("$PY" -c '
import sys
from hpcdl.container.spec import find_spec, load_spec
print("\n".join(load_spec(find_spec(sys.argv[1])).pip.local))
' "$SPEC")
[ ${#reqs[@]} -gt 0 ] || { log "spec $SPEC lists no pip.local requirements"; exit 1; }
stamp=$WHEELHOUSE/.downloaded
want=$(printf '%s\n' "${reqs[@]}")
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  log "wheelhouse: pip download ${reqs[*]} (+ dependencies)"
  "$PY" -m pip download -q --only-binary :all: --find-links "$WHEELHOUSE" \
      -d "$WHEELHOUSE" "${reqs[@]}" 2> >(grep -v 'is ignored: it is neither' >&2) >&2
  printf '%s\n' "$want" >"$stamp"
fi

if [ "$prepare_only" = 1 ]; then
  log "wheelhouse ready: $WHEELHOUSE ($(ls "$WHEELHOUSE"/*.whl | wc -l) wheels)"
  exit 0
fi
exec "$PY" -m hpcdl build "$SPEC" "${args[@]}"
