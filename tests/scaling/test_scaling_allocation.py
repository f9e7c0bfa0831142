"""Where the next rollouts go: the points whose rollout noise most blurs the law's prediction."""

from __future__ import annotations

import numpy as np
import pytest
from demoscale.scaling import next_round, prediction_noise_gains

COUNTS = [1, 2, 4, 8, 16]


def _coins(p: float, n: int, seed: int) -> np.ndarray:
    """n rollouts whose mean is p (to the rollout), shuffled."""
    k = round(p * n)
    return np.random.default_rng(seed).permutation(np.r_[np.ones(k), np.zeros(n - k)])


def test_beyond_the_tested_range_the_far_end_gets_the_next_round() -> None:
    scores = [_coins(0.5, 20, i) for i in range(5)]
    gains = prediction_noise_gains(COUNTS, scores, at=64, round_size=8)
    assert next_round(COUNTS, scores, at=64, round_size=8) == 4  # 16: the largest OLS weight at 64
    assert gains[4] > gains[0] > gains[2]  # the ends matter, the middle (log 4) least
    # Below the range the other end does.
    assert next_round(COUNTS, scores, at=0.25, round_size=8) == 0


def test_at_the_centre_the_noisiest_least_sampled_point_gets_it() -> None:
    # At the geometric mean of the counts every OLS weight is 1/5: only the noise differs.
    scores = [
        _coins(0.5, 40, 0),
        _coins(0.5, 12, 1),
        _coins(0.9, 40, 2),
        _coins(0.5, 40, 3),
        _coins(0.5, 40, 4),
    ]
    assert next_round(COUNTS, scores, at=4.0, round_size=8) == 1
    # A point with every rollout a success still has a (shrunk) variance, so it can be chosen.
    perfect = [np.ones(8)] + [_coins(0.5, 60, i) for i in range(1, 5)]
    assert np.all(prediction_noise_gains(COUNTS, perfect, at=4.0, round_size=8) > 0)


def test_only_eligible_points_are_chosen() -> None:
    scores = [_coins(0.5, 20, i) for i in range(5)]
    assert next_round(COUNTS, scores, 64, 8, eligible=[True, True, True, True, False]) == 0
    assert next_round(COUNTS, scores, 64, 8, eligible=[False] * 5) is None


def test_a_law_needs_two_counts_and_a_rollout_per_point() -> None:
    with pytest.raises(ValueError, match="two distinct counts"):
        prediction_noise_gains([4, 4], [np.ones(3), np.zeros(3)], at=8, round_size=4)
    with pytest.raises(ValueError, match="at least one rollout"):
        prediction_noise_gains([1, 2], [np.ones(3), np.zeros(0)], at=8, round_size=4)
