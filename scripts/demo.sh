#!/usr/bin/env bash
# `make demo`: hpcdl's main job on a fresh machine, end to end.
#   install what is missing -> sandbox Slurm (n1, n2) -> tiny ImageNet-format dataset
#   -> CPU image (reused when its content hash matches) -> 2 nodes x 4 "GPUs" = 8 ranks of
#   ResNet-50 under `srun --mpi=pmix apptainer exec --nv`, followed to the end -> result table.
# Every stage prints how long it took; a second run reuses everything and only runs the job.
#
# The example's sizes (32 px, batch 4, 10 steps, ...) are the sandbox profile's defaults
# for it (`examples:` in hpcdl/profiles/bundled/sandbox.yaml), so this is the README's
# headline command plus the demo's dataset.
# Knobs (environment): HPCDL_DEMO_BACKEND=horovod|ddp, HPCDL_DEMO_ARCH=resnet50|resnet18,
# HPCDL_DEMO_STEPS (default: the profile's 10), HPCDL_DEMO_DIR (dataset and runs),
# HPCDL_CACHE (image), HPCDL_DEMO_IMAGE (where the nodes read it: under /scratch).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${HPCDL_CACHE:-/var/cache/hpcdl}
# The sandbox's nodes see the host's /home and /scratch only (sandbox.yaml paths.shared):
# the dataset, the runs and the image the ranks read live on /scratch.
DEMO_DIR=${HPCDL_DEMO_DIR:-/scratch/hpcdl-demo}
BUILT=$CACHE/images/pytorch-horovod-cpu.sif
IMAGE=${HPCDL_DEMO_IMAGE:-/scratch/images/pytorch-horovod-cpu.sif}
DATA=$DEMO_DIR/tiny-imagenet
BACKEND=${HPCDL_DEMO_BACKEND:-horovod}
ARCH=${HPCDL_DEMO_ARCH:-resnet50}
# -X only for what differs from the profile's defaults (a -X replaces the default).
EXTRA=()
[ "$ARCH" = resnet50 ] || EXTRA+=(-X "--arch=$ARCH")
[ -z "${HPCDL_DEMO_STEPS:-}" ] || EXTRA+=(-X "--max-steps=$HPCDL_DEMO_STEPS")
export HPCDL_RUNS=${HPCDL_RUNS:-$DEMO_DIR/runs}

total=$SECONDS
stage() {
  local name=$1; shift
  local t0=$SECONDS
  printf '\n==> [%s] %s\n' "$(date +%H:%M:%S)" "$name"
  "$@"
  printf '==> %s: %d s\n' "$name" $(( SECONDS - t0 ))
}

make_data() {
  if [ -d "$DATA/train" ]; then
    echo "dataset: reusing $DATA"
  else
    hpcdl data make-tiny "$DATA" --classes 10 --per-class 16 --size 48
  fi
}

mkdir -p "$DEMO_DIR"
stage "install: python packages" scripts/install-python-deps.sh
stage "install: Slurm" scripts/install-slurm.sh
stage "install: Apptainer" scripts/install-apptainer.sh
stage "sandbox cluster" hpcdl sandbox up
stage "dataset" make_data
publish() {  # the built image (and its build record) where the nodes read it: hard links
  local suffix
  mkdir -p "$(dirname "$IMAGE")"
  for suffix in "" .hash .def; do
    [ "$BUILT$suffix" -ef "$IMAGE$suffix" ] && continue  # published already (a second demo)
    ln -f "$BUILT$suffix" "$IMAGE$suffix.tmp" 2>/dev/null || cp "$BUILT$suffix" "$IMAGE$suffix.tmp"
    chmod 644 "$IMAGE$suffix.tmp" && mv -f "$IMAGE$suffix.tmp" "$IMAGE$suffix"
  done
  echo "image: $IMAGE"
}
stage "image (Horovod wheel + CPU image)" scripts/build-image.sh -o "$BUILT"
stage "image on the shared filesystem" publish
# --cpus-per-task 1: the sandbox nodes announce 8 CPUs each but share this machine's cores.
stage "job: 2 nodes x 4 GPUs, $ARCH, $BACKEND" \
  hpcdl submit --profile sandbox --nodes 2 --gpus 4 --cpus-per-task 1 --time 00:20:00 \
    --image "$IMAGE" --backend "$BACKEND" --data "$DATA" --bind "$DEMO_DIR" \
    --job-name "demo-$ARCH-$BACKEND" --wait ${EXTRA[@]+"${EXTRA[@]}"}
printf '\ndemo: done in %d s (runs under %s)\n' $(( SECONDS - total )) "$HPCDL_RUNS"
