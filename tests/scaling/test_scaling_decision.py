"""The decision summary: one answer for `laws fit --target-score`, `laws recommend` and the demo report.

The demo-shaped table is the default demo's eight trials (README): its gain flattens between 16 and
32 environments, which used to make the saturating law call a 0.9 target "out of reach" from a
floor whose interval was 0-0.3, and a 0.8 target "unreachable" at 77% against 80% while the fit
predicted 0.81 at 128 environments.
"""

from __future__ import annotations

import json

import pytest
from demoscale import DEFAULT_CONFIDENCE
from demoscale.scaling import fit_law, recommend_budget
from demoscale.scaling.cli import main

DEMO_COSTS = {"cost_env": 25.0, "cost_object": 10.0, "cost_demo": 1.0, "cost_unit": "$"}
DEMO_FLAGS = ["--cost-env", "25", "--cost-object", "10", "--cost-demo", "1", "--cost-unit", "$"]


def test_demo_table_at_090_is_beyond_the_tested_range_not_out_of_reach(demo_shaped_results):
    decision = recommend_budget(demo_shaped_results, target=0.9, n_bootstrap=400, **DEMO_COSTS)
    assert decision.status == "extrapolation", decision.message
    assert "will not get there" not in decision.message
    # The law, and why: both one-axis forms fitted to the same 8 trials, compared by AICc.
    assert decision.method == "loglog" and "lowest AICc" in decision.law_reason
    laws = {law.method: law for law in decision.comparison}
    assert set(laws) == {"loglog", "saturating"} and all(law.n_points == 8 for law in laws.values())
    assert laws["loglog"].aicc < laws["saturating"].aicc
    assert sum(law.akaike_weight for law in laws.values()) == pytest.approx(1.0)
    # The saturating floor is not evidence of a ceiling: many of its bootstrap laws do reach 0.9.
    assert laws["saturating"].probability_reachable > 1 - decision.confidence
    # Plans are increments over the 32 environments trained, costed in the user's dollars.
    assert decision.have["n_envs"] == 32 and decision.have["demos_per_pair"] == 6
    assert [plan.add_envs for plan in decision.plans] == [0, 16, 32, 64, 96]
    for plan in decision.plans:
        assert plan.added_cost == pytest.approx(plan.add_envs * (25 + 10 + 6 * 1))
        assert plan.extrapolation_factor == pytest.approx(plan.n_envs / 32)
        assert 0.0 <= plan.probability <= 1.0
    probabilities = [plan.probability for plan in decision.plans]
    assert probabilities == sorted(probabilities)  # more environments never lower the chance
    assert decision.required["x"] / 32 > decision.max_extrapolation
    assert decision.extrapolation_factor == pytest.approx(decision.required["x"] / 32)
    text = decision.summary()
    for expected in (
        "BEYOND THE TESTED RANGE",
        "at 90% confidence",
        "+32 envs",
        "1,312",
        "$25 per environment",
    ):
        assert expected in text, expected


def test_demo_table_at_080_states_its_probability_instead_of_unreachable(demo_shaped_results):
    decision = recommend_budget(demo_shaped_results, target=0.8, n_bootstrap=400, **DEMO_COSTS)
    assert decision.status == "uncertain", decision.message
    best = decision.best_in_range
    assert best.n_envs == 128 and best.add_envs == 96 and best.added_cost == pytest.approx(96 * 41)
    assert best.expected_score > 0.8  # the law's central estimate gets there ...
    assert 0.5 < best.probability < decision.confidence  # ... but not with 90% probability
    assert f"probability {best.probability:.0%}" in decision.message
    # The same evidence at a lower confidence level is a plan: the cheapest addition that clears it.
    loose = recommend_budget(demo_shaped_results, target=0.8, confidence=0.6, n_bootstrap=400, **DEMO_COSTS)
    assert loose.status == "ok" and loose.plan.add_envs > 0 and loose.probability >= 0.6
    assert loose.message.startswith(f"add {loose.plan.add_envs} environments")
    assert loose.fit.confidence == 0.6  # one level: the law's intervals follow the decision's


def test_data_that_already_reach_the_target_need_nothing(demo_shaped_results):
    decision = recommend_budget(demo_shaped_results, target=0.6, n_bootstrap=400, **DEMO_COSTS)
    assert decision.status == "ok" and decision.plan.add_envs == 0 and decision.added_cost == 0
    assert "nothing to add" in decision.message


def test_fit_target_score_prints_the_decision_recommend_prints(demo_shaped_results, capsys):
    common = [str(demo_shaped_results), "--n-bootstrap", "300", *DEMO_FLAGS]
    assert main(["fit", *common, "--target-score", "0.9"]) == 0
    from_fit = capsys.readouterr().out
    assert main(["recommend", *common, "--target", "0.9"]) == 0
    from_recommend = capsys.readouterr().out
    decision = from_recommend[from_recommend.index("Decision: score >= 0.9") :]
    assert decision in from_fit  # the very same text, law choice included
    assert "Scaling law (loglog)" in from_fit  # after the fit's own summary

    assert main(["fit", *common, "--target-score", "0.9", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["decision"]["status"] == "extrapolation"
    assert payload["decision"]["confidence"] == payload["confidence"] == DEFAULT_CONFIDENCE
    assert [p["add_envs"] for p in payload["decision"]["plans"]] == [0, 16, 32, 64, 96]


def test_a_law_asked_for_is_used_and_the_comparison_still_said(demo_shaped_results):
    decision = recommend_budget(demo_shaped_results, target=0.9, method="saturating", n_bootstrap=300)
    assert decision.method == "saturating"
    assert decision.law_reason.startswith("asked for") and "would choose loglog" in decision.law_reason
    # Its floor interval reaches 0, so even this law does not show the target out of reach.
    assert decision.floor_interval[0] < 1e-3 and decision.status != "unreachable"


def test_pure_power_law_keeps_the_simpler_form(synthetic):
    trials, _ = synthetic(lambda x, d: 0.7 * x**-0.35, [1, 2, 4, 8, 16, 32, 64], seeds=2, n_rollouts=400)
    decision = recommend_budget(trials, target=0.8, n_bootstrap=300)
    assert decision.method == "loglog", decision.law_reason


def test_a_fitted_law_at_another_level_is_flagged(demo_shaped_results):
    fit = fit_law(demo_shaped_results, confidence=0.95, n_bootstrap=200)
    decision = recommend_budget(fit, target=0.9)
    assert decision.comparison == () and "given as a fitted law" in decision.law_reason
    assert any("95%" in note and "90%" in note for note in decision.notes)
