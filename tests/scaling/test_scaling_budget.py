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
    trials, _ = synthetic(joint_gap, [1, 2, 4, 8, 16, 32], [1, 2, 4, 8, 16], n_rollouts=400)
    return fit_law(trials, axis="n_envs", method="joint", n_bootstrap=300, leave_one_out=False)


def test_count_grid_is_powers_of_two_and_in_between():
    np.testing.assert_array_equal(count_grid(40), [1, 2, 3, 4, 6, 8, 12, 16, 24, 32])


def test_expensive_environments_shift_the_plan_toward_more_demos(joint_fit):
    # What exists: 32 environments x 16 demos per pair (score about 0.79); the target needs more of
    # either. Plans add to that design: more environments, more demos per pair, or both.
    cheap = recommend_budget(joint_fit, target=0.83, cost_env=1, cost_demo=0.1, confidence=0.8)
    dear = recommend_budget(joint_fit, target=0.83, cost_env=100, cost_demo=0.1, confidence=0.8)
    assert cheap.status == dear.status == "ok", (cheap.message, dear.message)
    assert dear.demos_per_pair > cheap.demos_per_pair
    assert dear.n_envs < cheap.n_envs
    assert cheap.have["n_envs"] == 32 and cheap.have["demos_per_pair"] == 16
    for plan in (cheap, dear):
        assert plan.probability >= 0.8
        assert plan.n_envs >= 32 and plan.demos_per_pair >= 16
        assert plan.score_interval[0] <= plan.expected_score <= plan.score_interval[1]
        expected_cost = plan.costs["per environment"] * plan.n_envs + 0.1 * plan.total_demos
        assert plan.total_cost == pytest.approx(expected_cost)
        # Only what is added is paid: new environments, new demos on the old pairs and on the new ones.
        new_demos = 32 * (plan.demos_per_pair - 16) + (plan.n_envs - 32) * plan.demos_per_pair
        added = plan.costs["per environment"] * (plan.n_envs - 32) + 0.1 * new_demos
        assert plan.added_cost == pytest.approx(added) and plan.plan.add_demos == new_demos
        assert plan.total_demos == plan.n_envs * plan.n_objects_per_env * plan.demos_per_pair
        assert plan.marginal_value_env > 0 and plan.marginal_value_demo > 0
        # No cheaper candidate reaches the target with the probability asked.
        assert all(p.added_cost >= plan.added_cost for p in plan.plans if p.probability >= 0.8)
    data = json.loads(json.dumps(dear.to_dict()))
    assert data["status"] == "ok" and data["law"]["method"] == "joint"
    assert data["plan"]["n_envs"] == dear.n_envs and len(data["plans"]) == len(dear.plans)
    assert "> recommended" in dear.summary() and "given as a fitted law" in dear.summary()


def test_target_above_a_clear_floor_is_out_of_reach(synthetic):
    trials, _ = synthetic(
        lambda x, d: 0.25 + 0.6 * x**-0.7, [1, 2, 4, 8, 16, 32, 64, 128], seeds=2, n_rollouts=1000
    )
    plan = recommend_budget(trials, target=0.9, cost_env=1, cost_demo=0.01, n_bootstrap=300)
    assert plan.method == "saturating" and "lowest AICc" in plan.law_reason
    assert plan.status == "unreachable"
    assert plan.n_envs is None and plan.total_cost is None
    assert plan.floor == pytest.approx(0.25, abs=0.04)
    assert plan.probability_reachable <= 1 - plan.confidence
    assert f"with probability {1 - plan.probability_reachable:.0%}" in plan.message
    assert "levels off below 0.9" in plan.message
    # A target below the ceiling 0.75 is reachable with the same law.
    assert recommend_budget(trials, target=0.7, n_bootstrap=300).status == "ok"


def test_far_extrapolation_is_flagged_not_answered(synthetic):
    trials, _ = synthetic(lambda x, d: 0.8 * x**-0.2, [1, 2, 4, 8, 16, 32], n_rollouts=2000)
    plan = recommend_budget(trials, target=0.75, method="loglog", n_bootstrap=300, max_extrapolation=4)
    assert plan.status == "extrapolation"
    assert plan.n_envs is None and plan.expected_score is None
    assert plan.extrapolation_factor > 4
    assert "extrapolation limit" in plan.message
    # The most the data can vouch for is still stated, with its probability.
    assert plan.best_in_range.n_envs == 128 and plan.best_in_range.extrapolation_factor == 4
    assert f"probability {plan.best_in_range.probability:.0%}" in plan.message
    # Allowing far more extrapolation gives a number: about (0.8 / 0.25) ** 5 = 335 environments.
    loose = recommend_budget(trials, target=0.75, method="loglog", n_bootstrap=300, max_extrapolation=1000)
    assert loose.status == "ok" and 192 <= loose.n_envs <= 2048
    assert any("held at the tested value 50" in note for note in loose.notes)
