"""The two-stage bootstrap of a difference of mean outcomes (seeds, then rollouts), used to compare
learning-curve variants and the study's recommended plan with its equal-cost alternative."""

from __future__ import annotations

import numpy as np
import pytest
from demoscale.scaling.bootstrap import mean_difference_interval


def test_a_certain_difference_has_no_width_and_a_null_one_holds_zero() -> None:
    estimate, low, high = mean_difference_interval([np.ones(40)], [np.zeros(40)], 0.9)
    assert (estimate, low, high) == (1.0, 1.0, 1.0)
    rng = np.random.default_rng(0)
    outcomes = rng.integers(0, 2, 200).astype(float)
    estimate, low, high = mean_difference_interval([outcomes], [outcomes.copy()], 0.9)
    assert estimate == 0.0 and low < 0 < high
    # Binomial noise of 200 rollouts per side: the half-width is about 1.645 * sqrt(2 * 0.25 / 200).
    assert high - low == pytest.approx(2 * 1.645 * np.sqrt(0.5 / 200), rel=0.15)


def test_seeds_that_disagree_widen_the_interval() -> None:
    # The same 80 outcomes, as one seed or as two seeds that disagree completely.
    one_seed = [np.r_[np.ones(40), np.zeros(40)]]
    two_seeds = [np.ones(40), np.zeros(40)]
    reference = [np.full(80, 0.5)]
    _, low_one, high_one = mean_difference_interval(one_seed, reference, 0.9)
    _, low_two, high_two = mean_difference_interval(two_seeds, reference, 0.9)
    assert high_two - low_two > 3 * (high_one - low_one)
    assert low_two == -0.5 and high_two == 0.5  # a draw of both seeds the same gives 0 or 1


def test_empty_sides_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one seed"):
        mean_difference_interval([], [np.ones(3)], 0.9)
    with pytest.raises(ValueError, match="at least one rollout"):
        mean_difference_interval([np.ones(3)], [np.array([])], 0.9)
