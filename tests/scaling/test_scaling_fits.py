"""Scaling-law fits: exactness of the study's method, interval coverage, recovery of known laws."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from demoscale.scaling import ResultsTable, compare_laws, fit_law, load_results
from demoscale.scaling.models import JOINT, SATURATING, batched_robust_lm
from scipy.optimize import least_squares


def power_gap(beta: float, alpha: float):
    return lambda x, d: beta * x**alpha


def test_loglog_equals_direct_ols_on_log_values(synthetic):
    trials, rollouts = synthetic(power_gap(0.6, -0.4), [1, 2, 4, 8, 16, 32], seeds=3)
    fit = fit_law(trials, axis="n_envs", method="loglog", rollouts=rollouts, n_bootstrap=200)
    assert not fit.adjusted.any()
    log_x, log_gap = np.log(trials["n_envs"].to_numpy()), np.log(1 - trials["score"].to_numpy())
    design = np.column_stack([np.ones_like(log_x), log_x])
    (intercept, slope), *_ = np.linalg.lstsq(design, log_gap, rcond=None)
    assert fit.params["alpha"] == pytest.approx(slope, abs=1e-9)
    assert fit.params["beta"] == pytest.approx(np.exp(intercept), abs=1e-9)
    assert fit.r == pytest.approx(np.corrcoef(log_x, log_gap)[0, 1], abs=1e-9)
    assert fit.n_points == 18 and fit.n_design_points == 6
    assert any("all 18 trials" in note for note in fit.notes)
    # OLS interval is symmetric around alpha on the log scale; beta's is exp of the intercept's.
    low, high = fit.conf_int["alpha"]
    assert low < fit.params["alpha"] < high
    assert (low + high) / 2 == pytest.approx(fit.params["alpha"], abs=1e-9)


def _coverage(replicates: int, n_bootstrap: int) -> tuple[float, float]:
    """Fraction of replicates whose 90% intervals (OLS, bootstrap) contain the true alpha."""
    alpha, beta, n = -0.4, 0.6, 40
    x = np.array([1, 2, 4, 8, 16, 32], float)
    gap = beta * x**alpha
    rng = np.random.default_rng(123)
    # Validate the layout once; each replicate only swaps in new scores.
    template = load_results(pd.DataFrame({"n_envs": x, "score": 0.5, "n_rollouts": n}))
    hits_ols = hits_boot = 0
    for replicate in range(replicates):
        trials = template.trials.assign(score=rng.binomial(n, 1 - gap) / n)
        table = ResultsTable(trials=trials)
        fit = fit_law(table, method="loglog", n_bootstrap=n_bootstrap, seed=replicate, leave_one_out=False)
        low, high = fit.conf_int["alpha"]
        hits_ols += low <= alpha <= high
        low, high = fit.bootstrap_conf_int["alpha"]
        hits_boot += low <= alpha <= high
    return hits_ols / replicates, hits_boot / replicates


def test_loglog_interval_coverage_under_binomial_rollout_noise():
    ols, boot = _coverage(replicates=200, n_bootstrap=400)
    assert 0.85 <= ols <= 0.95, ols
    assert 0.85 <= boot <= 0.95, boot


@pytest.mark.slow
def test_loglog_interval_coverage_many_replicates():
    ols, boot = _coverage(replicates=1000, n_bootstrap=1000)
    assert 0.87 <= ols <= 0.93, ols
    assert 0.87 <= boot <= 0.93, boot


def test_saturating_recovers_known_floor(synthetic):
    floor = 0.1
    trials, _ = synthetic(
        lambda x, d: floor + 0.6 * x**-0.6, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512], n_rollouts=4000
    )
    fit = fit_law(trials, method="saturating", n_bootstrap=300)
    assert fit.params["E"] == pytest.approx(floor, abs=0.015)
    assert fit.params["alpha"] == pytest.approx(-0.6, abs=0.1)
    low, high = fit.conf_int["E"]
    assert low <= floor <= high
    assert fit.bootstrap_mode == "rollouts"  # one trial per point, rollout counts known
    # The floor makes the saturating law fit better than the straight log-log line.
    loglog = fit_law(trials, method="loglog", n_bootstrap=100)
    assert fit.aic < loglog.aic
    prediction = fit.predict(1e6)
    assert prediction.score[0] == pytest.approx(1 - fit.params["E"], abs=1e-3)
    beyond = fit.required_x(0.95)  # above the ceiling 1 - E = 0.9: never reached
    assert beyond["x"] is None and beyond["share_of_bootstrap_laws_reaching"] < 0.1


def test_joint_recovers_known_exponents(synthetic):
    truth = {"E": 0.02, "A": 0.5, "a": 0.5, "B": 0.4, "b": 0.7}
    trials, _ = synthetic(
        lambda x, d: truth["E"] + truth["A"] * x ** -truth["a"] + truth["B"] * d ** -truth["b"],
        envs=[1, 2, 4, 8, 16, 32, 64],
        demos_per_pair=[2, 4, 8, 16, 32, 64, 128],
        n_rollouts=5000,
    )
    fit = fit_law(trials, axis="n_envs", method="joint", n_bootstrap=200, leave_one_out=False)
    assert fit.params["a"] == pytest.approx(truth["a"], abs=0.08)
    assert fit.params["b"] == pytest.approx(truth["b"], abs=0.12)
    for name in ("a", "b"):
        low, high = fit.conf_int[name]
        assert low < truth[name] < high, (name, low, high)
    assert fit.demos is not None and fit.n_design_points == 49


def test_zero_and_one_scores_follow_the_rule():
    table = pd.DataFrame(
        {"n_envs": [1, 2, 4, 8, 16, 32], "score": [0.0, 0.3, 0.6, 0.8, 1.0, 1.0], "n_rollouts": [40] * 6}
    )
    for method in ("loglog", "saturating"):
        fit = fit_law(table, method=method, n_bootstrap=200)
        assert np.isfinite(list(fit.params.values())).all()
        np.testing.assert_array_equal(fit.adjusted, [True, False, False, False, True, True])
        assert fit.gap[4] == pytest.approx(0.5 / 41)  # (k + 0.5) / (n + 1), k = 0
        assert fit.gap[0] == pytest.approx(40.5 / 41)  # k = 40
        assert fit.gap[1] == pytest.approx(0.7)  # interior points untouched
        assert "applied to 3 trial(s)" in fit.summary()
    # Without n_rollouts the rule assumes the study's 40 rollouts and says so.
    fit = fit_law(table.drop(columns="n_rollouts"), method="loglog", n_bootstrap=100)
    assert fit.gap[4] == pytest.approx(0.5 / 41)
    assert any("assumed 40 rollouts" in note for note in fit.notes)


def test_rollout_bootstrap_is_seeded_and_wider_than_trials_alone(synthetic):
    trials, rollouts = synthetic(power_gap(0.6, -0.4), [1, 2, 4, 8, 16, 32], seeds=3)
    both = fit_law(trials, rollouts=rollouts, n_bootstrap=400, seed=7, bootstrap="both")
    again = fit_law(trials, rollouts=rollouts, n_bootstrap=400, seed=7, bootstrap="both")
    np.testing.assert_array_equal(both.bootstrap_params, again.bootstrap_params)
    trials_only = fit_law(trials, rollouts=rollouts, n_bootstrap=400, seed=7, bootstrap="trials")
    rollouts_only = fit_law(trials, rollouts=rollouts, n_bootstrap=400, seed=7, bootstrap="rollouts")
    width = lambda f: np.diff(f.bootstrap_conf_int["alpha"])[0]  # noqa: E731
    assert width(both) > width(trials_only)
    assert width(rollouts_only) > 0
    # A single trial per point and no rollout information: residual bootstrap.
    bare = trials.groupby("n_envs", as_index=False)["score"].mean()
    assert fit_law(bare, n_bootstrap=100).bootstrap_mode == "residuals"


def test_batched_solver_agrees_with_least_squares():
    rng = np.random.default_rng(5)
    x = np.repeat([1.0, 2, 4, 8, 16, 32, 64, 128], 2)
    targets = np.log(0.05 + 0.6 * x**-0.5) + rng.normal(0, 0.15, size=(20, x.size))
    start = np.tile([0.02, 0.5, -0.4], (20, 1))
    batched = batched_robust_lm(SATURATING, start, x, None, targets, "soft_l1", 0.2)
    for row in range(20):
        result = least_squares(
            lambda p, y=targets[row]: SATURATING.log_gap_and_jacobian(p[None], x)[0][0] - y,
            start[row],
            bounds=(SATURATING.lower, SATURATING.upper),
            loss="soft_l1",
            f_scale=0.2,
            xtol=1e-12,
            ftol=1e-12,
        )
        np.testing.assert_allclose(batched[row], result.x, atol=2e-3)
    assert JOINT.param_names == ("E", "A", "a", "B", "b")


def test_predict_intervals_and_json(synthetic):
    trials, rollouts = synthetic(power_gap(0.6, -0.4), [1, 2, 4, 8, 16, 32], seeds=2)
    fit = fit_law(trials, rollouts=rollouts, n_bootstrap=300)
    for interval in ("bootstrap", "confidence", "prediction"):
        prediction = fit.predict([4, 64, 512], interval=interval)
        assert (prediction.low <= prediction.score).all() and (prediction.score <= prediction.high).all()
    narrow = fit.predict(64, interval="confidence")
    wide = fit.predict(64, interval="prediction")
    assert wide.high[0] - wide.low[0] > narrow.high[0] - narrow.low[0]
    data = json.loads(json.dumps(fit.to_dict()))
    assert {"alpha", "beta", "r", "conf_int", "n_points"} <= set(data)
    # The study's extrapolation: the x where the law reaches a score, and back again.
    needed = fit.required_x(0.95)
    assert fit.predict(needed["x"], interval=None).score[0] == pytest.approx(0.95, abs=1e-9)
    assert needed["interval"][0] <= needed["x"] <= needed["interval"][1]
    assert needed["extrapolation_factor"] == pytest.approx(needed["x"] / 32)
    with pytest.raises(ValueError, match="not available"):
        fit_law(trials, method="saturating", n_bootstrap=50).predict(4, interval="prediction")


def test_compare_laws_side_by_side(synthetic):
    trials, _ = synthetic(
        lambda x, d: 0.15 + 0.6 * x**-0.8, [1, 2, 4, 8, 16, 32, 64, 128], seeds=2, n_rollouts=400
    )
    table = compare_laws(trials, axis="n_envs", n_bootstrap=100)
    assert list(table.index) == ["loglog", "saturating"]
    assert {"aic", "bic", "loo_rmse", "delta_aic"} <= set(table.columns)
    assert table.loc["saturating", "delta_aic"] == 0.0  # the true form wins
    assert table.loc["saturating", "loo_rmse"] < table.loc["loglog", "loo_rmse"]
