"""LR scaling and warm-up: pure functions of the examples (no torch)."""

from __future__ import annotations

import math

import pytest
from trainkit.schedule import decay_milestones, lr_at, lr_scale_factor, scaled_lr


def test_linear_and_sqrt_scaling() -> None:
    assert scaled_lr(0.0125, 8) == pytest.approx(0.1)
    assert scaled_lr(0.0125, 4, batches_per_allreduce=2) == pytest.approx(0.1)
    assert scaled_lr(0.1, 16, mode="sqrt") == pytest.approx(0.4)
    assert scaled_lr(0.1, 2, mode="sqrt") == pytest.approx(0.1 * math.sqrt(2))
    assert scaled_lr(0.1, 64, mode="none") == pytest.approx(0.1)
    assert lr_scale_factor(1) == 1.0


@pytest.mark.parametrize(("args", "mode"), [((0,), "linear"), ((2, 0), "linear"), ((2,), "cube")])
def test_scaling_rejects_bad_input(args: tuple[int, ...], mode: str) -> None:
    with pytest.raises(ValueError):
        lr_scale_factor(*args, mode=mode)


def test_milestones_follow_the_90_epoch_recipe() -> None:
    assert decay_milestones(90) == [30, 60, 80]
    assert decay_milestones(9) == [3, 6, 8]
    assert decay_milestones(1) == [1]  # 1/3 rounds to 0 (dropped), 2/3 and 8/9 to 1 (merged)
    assert decay_milestones(2) == [1, 2]


def test_warmup_ramps_linearly_per_step_then_decays() -> None:
    kw = dict(base_lr=0.1, target_lr=0.8, warmup_epochs=5, total_epochs=90)
    # Start: the unscaled base LR; end of warm-up: the scaled LR.
    assert lr_at(0, 0, 100, **kw) == pytest.approx(0.1)
    assert lr_at(2, 50, 100, **kw) == pytest.approx(0.1 + 0.7 * 2.5 / 5)
    assert lr_at(4, 99, 100, **kw) == pytest.approx(0.1 + 0.7 * 4.99 / 5)
    assert lr_at(5, 0, 100, **kw) == pytest.approx(0.8)
    # Monotone during warm-up.
    ramp = [lr_at(e, s, 10, **kw) for e in range(5) for s in range(10)]
    assert all(b > a for a, b in zip(ramp, ramp[1:], strict=False))
    # Step decay after the milestones.
    assert lr_at(29, 99, 100, **kw) == pytest.approx(0.8)
    assert lr_at(30, 0, 100, **kw) == pytest.approx(0.08)
    assert lr_at(60, 0, 100, **kw) == pytest.approx(0.008)
    assert lr_at(85, 0, 100, **kw) == pytest.approx(0.0008)


def test_no_warmup_starts_at_target() -> None:
    assert lr_at(0, 0, 10, base_lr=0.1, target_lr=0.4, warmup_epochs=0, total_epochs=90) == 0.4
