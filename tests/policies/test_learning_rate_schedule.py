"""The learning-rate schedule: warm-up, cosine over the training or over ``decay_steps``."""

from __future__ import annotations

import math

import pytest
from demoscale.policies.lightning_module import OptimizerConfig, learning_rate_factor


def test_warm_up_then_cosine_to_the_floor_at_the_last_step() -> None:
    config = OptimizerConfig(warmup_steps=10, min_lr_ratio=0.1)
    factors = [learning_rate_factor(step, config, total_steps=110) for step in range(111)]
    assert factors[:10] == pytest.approx([(s + 1) / 10 for s in range(10)])
    assert factors[10] == pytest.approx(1.0)
    assert factors[60] == pytest.approx(0.1 + 0.9 * 0.5)  # half way through the cosine
    assert factors[110] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(factors[10:], factors[11:], strict=False))


def test_decay_steps_set_the_cosine_whatever_the_training_length() -> None:
    long = OptimizerConfig(warmup_steps=200, decay_steps=4000)
    # A 2,000-step training on the 4,000-step schedule is the first half of the 4,000-step one.
    for step in (0, 199, 500, 1000, 1999):
        assert learning_rate_factor(step, long, total_steps=2000) == pytest.approx(
            learning_rate_factor(step, OptimizerConfig(warmup_steps=200), total_steps=4000)
        )
    assert learning_rate_factor(2000, long, 2000) == pytest.approx(
        0.5 * (1 + math.cos(math.pi * 1800 / 3800))
    )
    # A schedule shorter than the training reaches its floor and stays there.
    short = OptimizerConfig(warmup_steps=0, decay_steps=100, min_lr_ratio=0.05)
    assert (
        learning_rate_factor(100, short, 1000)
        == learning_rate_factor(900, short, 1000)
        == pytest.approx(0.05)
    )


def test_constant_schedule_and_bad_settings() -> None:
    assert learning_rate_factor(5000, OptimizerConfig(warmup_steps=5, schedule="constant"), 10) == 1.0
    with pytest.raises(ValueError, match="'cosine' or 'constant'"):
        learning_rate_factor(0, OptimizerConfig(schedule="linear"), 10)
    with pytest.raises(ValueError, match=r"decay_steps \(100\) must exceed warmup_steps \(500\)"):
        learning_rate_factor(0, OptimizerConfig(decay_steps=100), 1000)
