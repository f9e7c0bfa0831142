"""Data-collection budget: the cheapest (#environments, #objects per environment, #demos per pair)
whose predicted score on unseen environments reaches a target with a stated probability.

The probability is the fraction of bootstrap laws (every refit of the law on resampled rollouts and
trials) whose predicted score reaches the target. Cost model: ``cost_env`` per environment,
``cost_object`` per object (one unique object per pair, so ``n_envs * n_objects`` objects) and
``cost_demo`` per demonstration (``n_envs * n_objects * demos_per_pair`` demonstrations).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from demoscale.scaling.fits import LawFit, _json_safe, fit_law
from demoscale.scaling.table import ResultsError, ResultsTable, as_results_table

STATUSES = ("ok", "unreachable", "extrapolation")


def count_grid(cap: float) -> np.ndarray:
    """1, 2, 3, 4, 6, 8, 12, 16, 24, ... (powers of two and the values half-way between), up to ``cap``."""
    values = {1}
    power = 1
    while power <= cap:
        values.update({power, power * 3 // 2 if power >= 2 else power})
        power *= 2
    return np.array(sorted(v for v in values if v <= cap), dtype=float)


@dataclass(frozen=True, eq=False)
class BudgetRecommendation:
    """The answer to "what should we collect to reach ``target``, and what will it cost?".

    ``status`` is ``"ok"`` (the fields below are filled in), ``"unreachable"`` (the fitted floor
    keeps the score below the target with probability above 1 - confidence) or ``"extrapolation"``
    (the target needs more than ``max_extrapolation`` times the largest tested value); in the last
    two cases the counts, cost and score are None and ``message`` says why.
    """

    status: str
    message: str
    target: float
    confidence: float
    method: str
    axis: str
    n_envs: int | None = None
    n_objects_per_env: int | None = None
    demos_per_pair: int | None = None
    n_pairs: int | None = None
    total_demos: int | None = None
    expected_score: float | None = None
    score_interval: tuple[float, float] | None = None
    interval_confidence: float = 0.9
    probability: float | None = None
    total_cost: float | None = None
    cost_breakdown: dict[str, float] | None = None
    marginal_value_env: float | None = None
    marginal_value_demo: float | None = None
    marginal_at: dict[str, float] | None = None
    extrapolation_factor: float | None = None
    max_extrapolation: float = 4.0
    floor: float | None = None
    floor_interval: tuple[float, float] | None = None
    costs: dict[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    fit: LawFit | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "fit"}
        out["law"] = None if self.fit is None else self.fit.to_dict()
        return _json_safe(out)

    def summary(self) -> str:
        width = 78
        pct = f"{self.interval_confidence * 100:g}%"
        lines = [
            "=" * width,
            f"Budget for score >= {self.target:g} on unseen environments, with probability >= {self.confidence:g}",
            f"Law: {self.method} over {self.axis}"
            + ("" if self.fit is None else f"  ({self.fit.equation_text()})"),
            "Costs: " + ", ".join(f"{k} {v:g}" for k, v in self.costs.items()),
            "=" * width,
            f"Status: {self.status.upper()} - {self.message}",
        ]
        if self.status == "ok":
            lines += [
                f"Collect: {self.n_envs} environments x {self.n_objects_per_env} object(s) per environment "
                f"x {self.demos_per_pair} demos per pair",
                f"         = {self.n_pairs} pairs, {self.total_demos} demonstrations",
                f"Expected score: {self.expected_score:.3f} ({pct} interval {self.score_interval[0]:.3f} - "
                f"{self.score_interval[1]:.3f}); P(score >= target) = {self.probability:.2f}",
                f"Total cost: {self.total_cost:.4g} ("
                + ", ".join(f"{k} {v:.4g}" for k, v in (self.cost_breakdown or {}).items())
                + ")",
            ]
        if self.floor is not None:
            low, high = self.floor_interval
            floor = 0.0 if self.floor < 1e-6 else self.floor
            lines.append(
                f"Fitted floor (gap no data removes): E = {floor:.3g} ({pct} interval {low:.3g} - {high:.3g})"
            )
        if self.marginal_value_env is not None or self.marginal_value_demo is not None:
            where = ", ".join(f"{k} {v:g}" for k, v in (self.marginal_at or {}).items())
            lines.append(f"Marginal value (score gain per unit cost) at {where}:")
            lines.append(f"  one more environment:      {_fmt(self.marginal_value_env)}")
            lines.append(f"  one more demo per pair:    {_fmt(self.marginal_value_demo)}")
        lines += [f"Note: {note}" for note in self.notes]
        lines.append("=" * width)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


def _fmt(value: float | None) -> str:
    if value is None:
        return "n/a"
    if math.isinf(value):
        return "free (zero cost)"
    return f"{value:.4g}"


def _choose_law(
    results: ResultsTable, axis: str | None, method: str | None, fit_kwargs: dict[str, Any]
) -> tuple[LawFit, list[str]]:
    trials = results.trials
    notes: list[str] = []
    if axis is None:
        axis = "n_envs" if "n_envs" in trials and trials["n_envs"].nunique() >= 2 else "n_pairs"
    varies_demos = "demos_per_pair" in trials and trials["demos_per_pair"].nunique() >= 2
    if method is None:
        method = "joint" if varies_demos else "saturating"
    try:
        fit = fit_law(results, axis=axis, method=method, **fit_kwargs)
    except ResultsError as error:
        if method == "joint":
            notes.append(f"joint law not fitted ({error}); using the one-axis saturating law")
            method = "saturating"
        if method == "saturating":
            try:
                fit = fit_law(results, axis=axis, method=method, **fit_kwargs)
            except ResultsError as second:
                notes.append(f"saturating law not fitted ({second}); using the log-log law (no floor)")
                fit = fit_law(results, axis=axis, method="loglog", **fit_kwargs)
        else:
            raise
    return fit, notes


def recommend_budget(
    table_or_fit: LawFit | ResultsTable | pd.DataFrame | str | Path,
    target: float = 0.9,
    cost_env: float = 1.0,
    cost_object: float = 0.0,
    cost_demo: float = 0.0,
    confidence: float = 0.8,
    axis: str | None = None,
    method: str | None = None,
    max_envs: int = 4096,
    max_demos_per_pair: int = 1000,
    max_extrapolation: float = 4.0,
    n_bootstrap: int = 1000,
    seed: int = 0,
    rollouts: str | Path | pd.DataFrame | None = None,
) -> BudgetRecommendation:
    """Cheapest collection plan reaching ``target`` with probability >= ``confidence``.

    From a table, the law is the joint law over ``axis`` (default ``n_envs`` if it varies, else
    ``n_pairs``) and demos per pair when the table varies ``demos_per_pair``; otherwise the one-axis
    saturating law with demos per pair held at the tested value (falling back to log-log when too
    few points). A fitted :class:`LawFit` may be passed instead. The search is a brute-force grid:
    environments ``count_grid(max_envs)``, objects per environment among the tested values (a
    pairs law) or held (an environments law), demos per pair ``count_grid(max_demos_per_pair)``
    (joint law) or held. Candidates beyond ``max_extrapolation`` x the largest tested value are
    not recommended: the status says so instead.
    """
    if not 0 < target < 1:
        raise ValueError(f"target must lie in (0, 1), got {target}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    costs = {
        "per environment": float(cost_env),
        "per object": float(cost_object),
        "per demo": float(cost_demo),
    }
    if isinstance(table_or_fit, LawFit):
        fit, notes = table_or_fit, []
    else:
        results = as_results_table(table_or_fit, rollouts)
        fit, notes = _choose_law(results, axis, method, {"n_bootstrap": n_bootstrap, "seed": seed})
    if fit.axis not in ("n_envs", "n_pairs"):
        raise ResultsError(f"a budget needs a law over n_envs or n_pairs, not {fit.axis!r}")
    interval_confidence = fit.confidence

    # -- the candidate grid -----------------------------------------------------------------------
    if fit.axis == "n_pairs":
        objects_options = np.array(fit.design.get("n_objects", (1.0,)), dtype=float)
        if len(objects_options) > 1:
            notes.append(
                "a law over pairs counts a new object like a new environment; the scaling-laws study found "
                "new environments generalise better (one unique object per environment)"
            )
    else:
        objects_options = np.array([fit.held.get("n_objects", fit.design.get("n_objects", (1.0,))[0])], float)
    tested_demos = fit.held.get("demos_per_pair", (fit.design.get("demos_per_pair") or (math.nan,))[-1])
    if fit.method == "joint":
        demos_options = count_grid(max_demos_per_pair)
    else:
        demos_options = np.array([tested_demos], dtype=float)
        notes.append(
            "demos per pair held at the tested value "
            + (f"{tested_demos:g}" if math.isfinite(tested_demos) else "(unknown: demo cost not counted)")
            + f" (the {fit.method} law is over {fit.axis} only)"
        )
    envs, objects, demos = (
        g.ravel() for g in np.meshgrid(count_grid(max_envs), objects_options, demos_options)
    )
    pairs = envs * objects
    x = pairs if fit.axis == "n_pairs" else envs
    demos_for_cost = np.where(np.isfinite(demos), demos, 0.0)
    cost = cost_env * envs + cost_object * pairs + cost_demo * pairs * demos_for_cost
    law_demos = demos if fit.method == "joint" else None
    draws = 1.0 - fit.gap_of(fit.bootstrap_params, x, law_demos)  # (B, candidates) scores
    probability = (draws >= target).mean(axis=0)
    expected = np.clip(1.0 - fit.gap_of(fit.param_vector, x, law_demos)[0], 0.0, 1.0)
    extrapolation = x / fit.x_max
    if fit.method == "joint":
        extrapolation = np.maximum(extrapolation, demos / fit.demos_max)

    # -- floor --------------------------------------------------------------------------------------
    floor = floor_interval = None
    if fit.method != "loglog":
        floor_draws = fit.bootstrap_params[:, fit.param_names.index("E")]
        floor = fit.floor
        low, high = fit.bootstrap_interval(floor_draws, np.array([floor]))
        floor_interval = (float(low[0]), float(high[0]))
        reachable_probability = float((1.0 - floor_draws >= target).mean())
    else:
        notes.append("the log-log law has no floor: any target looks reachable with enough data")
        reachable_probability = 1.0

    base = dict(
        target=target,
        confidence=confidence,
        method=fit.method,
        axis=fit.axis,
        costs=costs,
        interval_confidence=interval_confidence,
        max_extrapolation=max_extrapolation,
        floor=floor,
        floor_interval=floor_interval,
        fit=fit,
    )
    feasible = probability >= confidence
    within = extrapolation <= max_extrapolation
    best_index = None
    if feasible.any():
        candidates = np.flatnonzero(feasible & within)
        if candidates.size:
            # cheapest; among equal costs, the most probable
            best_index = candidates[np.lexsort((-probability[candidates], cost[candidates]))[0]]

    marginal_point = _marginal_point(fit, best_index, envs, objects, demos, objects_options, tested_demos)
    marginal_env, marginal_demo, marginal_at = _marginal_values(
        fit, marginal_point, cost_env, cost_object, cost_demo
    )
    if fit.method != "joint":
        notes.append(
            "the law does not depend on demos per pair: the value of one more demo per pair is unknown"
        )
        marginal_demo = None
    base.update(marginal_value_env=marginal_env, marginal_value_demo=marginal_demo, marginal_at=marginal_at)

    if reachable_probability < confidence:
        message = (
            f"target out of reach of the fitted law: the floor E = {floor:.3g} caps the score at "
            f"{1 - floor:.3f}; only {reachable_probability:.0%} of bootstrap laws allow {target:g} "
            f"(needed {confidence:.0%}). More of the same data will not get there."
        )
        return BudgetRecommendation(status="unreachable", message=message, notes=tuple(notes), **base)
    if best_index is None:
        if feasible.any():
            needed = float(extrapolation[feasible].min())
            message = (
                f"the target needs about {needed:.1f}x the largest tested {fit.axis} "
                f"({fit.x_max:g}); beyond the {max_extrapolation:g}x extrapolation limit. Test larger "
                "datasets before trusting a number."
            )
        else:
            needed = float(extrapolation.max())
            message = (
                f"no plan within the search caps (max_envs {max_envs}, max_demos_per_pair "
                f"{max_demos_per_pair}) reaches the target with probability {confidence:g}; that is more "
                f"than {needed:.0f}x the tested data, far outside it."
            )
        return BudgetRecommendation(
            status="extrapolation", message=message, extrapolation_factor=needed, notes=tuple(notes), **base
        )

    i = best_index
    per_pair_demos = int(demos[i]) if math.isfinite(demos[i]) else None
    total_demos = None if per_pair_demos is None else int(pairs[i] * demos[i])
    breakdown = {
        "environments": float(cost_env * envs[i]),
        "objects": float(cost_object * pairs[i]),
        "demos": float(cost_demo * pairs[i] * demos_for_cost[i]),
    }
    low, high = fit.bootstrap_interval(draws[:, i], np.array([expected[i]]))
    score_interval = (float(np.clip(low[0], 0, 1)), float(np.clip(high[0], 0, 1)))
    message = (
        f"collect {int(envs[i])} environments x {int(objects[i])} object(s) x "
        f"{per_pair_demos if per_pair_demos is not None else '?'} demos per pair"
    )
    if extrapolation[i] > 1:
        message += f" ({extrapolation[i]:.1f}x the largest tested value: an extrapolation)"
    return BudgetRecommendation(
        status="ok",
        message=message,
        n_envs=int(envs[i]),
        n_objects_per_env=int(objects[i]),
        demos_per_pair=per_pair_demos,
        n_pairs=int(pairs[i]),
        total_demos=total_demos,
        expected_score=float(expected[i]),
        score_interval=score_interval,
        probability=float(probability[i]),
        total_cost=float(cost[i]),
        cost_breakdown=breakdown,
        extrapolation_factor=float(extrapolation[i]),
        notes=tuple(notes),
        **base,
    )


def _marginal_point(
    fit: LawFit,
    best_index: int | None,
    envs: np.ndarray,
    objects: np.ndarray,
    demos: np.ndarray,
    objects_options: np.ndarray,
    tested_demos: float,
) -> tuple[float, float, float]:
    """Where marginal values are measured: the recommendation, else the largest tested design."""
    if best_index is not None:
        return float(envs[best_index]), float(objects[best_index]), float(demos[best_index])
    n_objects = float(objects_options.max())
    largest_envs = fit.x_max / n_objects if fit.axis == "n_pairs" else fit.x_max
    largest_demos = fit.demos_max if fit.method == "joint" else tested_demos
    return largest_envs, n_objects, largest_demos


def _marginal_values(
    fit: LawFit,
    point: tuple[float, float, float],
    cost_env: float,
    cost_object: float,
    cost_demo: float,
) -> tuple[float | None, float | None, dict[str, float]]:
    """Predicted score gain per unit cost of one more environment, and of one more demo per pair."""
    n_envs, n_objects, demos = point
    law_demos = demos if fit.method == "joint" else None

    def score(e: float, d: float | None) -> float:
        x = e * n_objects if fit.axis == "n_pairs" else e
        return float(
            1.0 - fit.gap_of(fit.param_vector, np.array([x]), None if d is None else np.array([d]))[0, 0]
        )

    demos_cost = demos if math.isfinite(demos) else 0.0
    base = score(n_envs, law_demos)
    env_cost = cost_env + cost_object * n_objects + cost_demo * n_objects * demos_cost
    gain_env = score(n_envs + 1, law_demos) - base
    marginal_env = gain_env / env_cost if env_cost > 0 else math.inf
    marginal_demo = None
    if law_demos is not None:
        demo_cost = cost_demo * n_envs * n_objects
        gain_demo = score(n_envs, law_demos + 1) - base
        marginal_demo = gain_demo / demo_cost if demo_cost > 0 else math.inf
    at = {"n_envs": n_envs, "n_objects_per_env": n_objects}
    if math.isfinite(demos):
        at["demos_per_pair"] = demos
    return marginal_env, marginal_demo, at
