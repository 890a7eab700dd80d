"""Learning-rate scaling and schedule: pure functions, no torch.

Goyal et al. (2017), "Accurate, Large Minibatch SGD", as the Horovod examples apply
it: the base LR is for one worker's batch; with N workers (and k batches per
allreduce) the global batch grows N*k times, so the LR is scaled by N*k (``linear``)
or by sqrt(N*k) (``sqrt``, gentler, often preferred for adaptive optimizers and very
large batches). Jumping straight to the scaled LR diverges early in training, so it
ramps up linearly from the base LR over the warm-up epochs, per step. After warm-up,
the 90-epoch ImageNet recipe divides the LR by 10 at epochs 30, 60 and 80; here the
milestones are the same fractions (1/3, 2/3, 8/9) of the run's epochs.
"""

from __future__ import annotations

import math

SCALINGS = ("linear", "sqrt", "none")
DECAY_FRACTIONS = (1 / 3, 2 / 3, 8 / 9)


def lr_scale_factor(world_size: int, batches_per_allreduce: int = 1, mode: str = "linear") -> float:
    """How many times the base LR grows for this many workers.

    Raises ValueError for an unknown mode or a non-positive size.
    """
    if world_size < 1 or batches_per_allreduce < 1:
        raise ValueError("world_size and batches_per_allreduce must be >= 1")
    n = world_size * batches_per_allreduce
    if mode == "linear":
        return float(n)
    if mode == "sqrt":
        return math.sqrt(n)
    if mode == "none":
        return 1.0
    raise ValueError(f"unknown LR scaling {mode!r}; choose from {', '.join(SCALINGS)}")


def scaled_lr(
    base_lr: float, world_size: int, batches_per_allreduce: int = 1, mode: str = "linear"
) -> float:
    return base_lr * lr_scale_factor(world_size, batches_per_allreduce, mode)


def decay_milestones(total_epochs: int) -> list[int]:
    """Epochs at which the LR drops 10x: 30/60/80 for a 90-epoch run.

    Milestones that would fall on epoch 0 (very short runs) are dropped, duplicates merged.
    """
    return sorted({m for m in (round(f * total_epochs) for f in DECAY_FRACTIONS) if m > 0})


def lr_at(
    epoch: int,
    step: int,
    steps_per_epoch: int,
    *,
    base_lr: float,
    target_lr: float,
    warmup_epochs: float,
    total_epochs: int,
) -> float:
    """The LR for optimizer step ``step`` (0-based) of epoch ``epoch`` (0-based).

    During warm-up it rises linearly from ``base_lr`` (at the first step) to
    ``target_lr`` (reached when warm-up ends); afterwards it is ``target_lr`` times
    0.1 per milestone passed.
    """
    progress = epoch + step / max(1, steps_per_epoch)
    if warmup_epochs > 0 and progress < warmup_epochs:
        return base_lr + (target_lr - base_lr) * progress / warmup_epochs
    drops = sum(1 for m in decay_milestones(total_epochs) if epoch >= m)
    return target_lr * (0.1**drops)
