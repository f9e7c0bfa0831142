"""Budget recommendations: cost trade-offs, unreachable targets, refusing far extrapolation."""

from __future__ import annotations

import json

import numpy as np
import pytest
from demoscale.scaling import fit_law, recommend_budget
from demoscale.scaling.budget import count_grid


def joint_gap(x, d):
    return 0.02 + 0.5 * x**-0.5 + 0.3 * d**-0.4


@pytest.fixture(scope="module")
def joint_fit(synthetic):
    trials, _ = synthetic(joint_gap, [1, 2, 4, 8, 16, 32], [5, 10, 20, 40, 80], n_rollouts=200)
    return fit_law(trials, axis="n_envs", method="joint", n_bootstrap=300, leave_one_out=False)


def test_count_grid_is_powers_of_two_and_in_between():
    np.testing.assert_array_equal(count_grid(40), [1, 2, 3, 4, 6, 8, 12, 16, 24, 32])


def test_expensive_environments_shift_the_plan_toward_more_demos(joint_fit):
    cheap = recommend_budget(joint_fit, target=0.8, cost_env=1, cost_demo=0.1, confidence=0.8)
    dear = recommend_budget(joint_fit, target=0.8, cost_env=100, cost_demo=0.1, confidence=0.8)
    assert cheap.status == dear.status == "ok", (cheap.message, dear.message)
    assert dear.demos_per_pair > cheap.demos_per_pair
    assert dear.n_envs < cheap.n_envs
    for plan in (cheap, dear):
        assert plan.probability >= 0.8
        assert plan.score_interval[0] <= plan.expected_score <= plan.score_interval[1]
        expected_cost = plan.costs["per environment"] * plan.n_envs + 0.1 * plan.total_demos
        assert plan.total_cost == pytest.approx(expected_cost)
        assert plan.total_demos == plan.n_envs * plan.n_objects_per_env * plan.demos_per_pair
        assert plan.marginal_value_env > 0 and plan.marginal_value_demo > 0
    data = json.loads(json.dumps(dear.to_dict()))
    assert data["status"] == "ok" and data["law"]["method"] == "joint"
    assert "Collect:" in dear.summary()


def test_target_above_the_floor_is_unreachable(synthetic):
    trials, rollouts = synthetic(lambda x, d: 0.2 + 0.5 * x**-0.7, [1, 2, 4, 8, 16, 32, 64], n_rollouts=400)
    plan = recommend_budget(trials, target=0.9, cost_env=1, cost_demo=0.01, n_bootstrap=300)
    assert plan.method == "saturating"
    assert plan.status == "unreachable"
    assert plan.n_envs is None and plan.total_cost is None
    assert plan.floor == pytest.approx(0.2, abs=0.04)
    assert "floor" in plan.message
    # A target below the ceiling 0.8 is reachable with the same law.
    assert recommend_budget(trials, target=0.7, n_bootstrap=300).status == "ok"


def test_far_extrapolation_is_flagged_not_answered(synthetic):
    trials, _ = synthetic(lambda x, d: 0.8 * x**-0.2, [1, 2, 4, 8, 16, 32], n_rollouts=2000)
    plan = recommend_budget(trials, target=0.75, method="loglog", n_bootstrap=300, max_extrapolation=4)
    assert plan.status == "extrapolation"
    assert plan.n_envs is None and plan.expected_score is None
    assert plan.extrapolation_factor > 4
    assert "extrapolation limit" in plan.message
    # Allowing far more extrapolation gives a number: about (0.8 / 0.25) ** 5 = 335 environments.
    loose = recommend_budget(trials, target=0.75, method="loglog", n_bootstrap=300, max_extrapolation=1000)
    assert loose.status == "ok" and 192 <= loose.n_envs <= 2048
    assert any("held at the tested value 50" in note for note in loose.notes)
