"""LR schedule: linear warm-up, then constant / linear / cosine decay over the job's optimizer steps."""

import pytest

from tgc_rl.config import OptimSpec
from tgc_rl.learner.schedule import lr_factor


def test_warmup_rises_linearly_to_the_peak():
    o = OptimSpec(warmup_steps=3)
    assert [lr_factor(s, o, 10) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]


def test_constant_schedule_stays_at_the_peak():
    o = OptimSpec(schedule="constant")
    assert {lr_factor(s, o, 10) for s in range(10)} == {1.0}


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_decay_schedules_fall_monotonically_and_stay_positive(schedule):
    o = OptimSpec(schedule=schedule, warmup_steps=2)
    f = [lr_factor(s, o, 20) for s in range(20)]
    assert f[2] == 1.0
    assert all(a >= b for a, b in zip(f[2:], f[3:], strict=False))
    assert 0 < f[-1] < 0.1


def test_cosine_is_half_way_at_mid_decay():
    o = OptimSpec(schedule="cosine")
    assert lr_factor(50, o, 100) == pytest.approx(0.5)
