"""The decision summary: what to collect next to reach a target score, and how sure that is.

One object, :class:`BudgetRecommendation` (``summary()`` text, ``to_dict()``), answers the question
for ``demoscale laws recommend``, ``demoscale laws fit --target-score`` and the demo report, so the
three never disagree. It states, in one place:

- the law used and why: the forms fitted to the same trials are compared by AICc (small-sample AIC);
  the lowest wins, and within 2 AICc of it the form with fewer parameters (the data cannot tell
  them apart, so the simpler law). A table varying demos per pair uses the joint law, the only form
  over both axes;
- the candidate plans as increments over what the results table already holds (its largest design:
  "add 32 environments"), each with its cost in the user's units, its extrapolation factor (planned
  axis value / largest tested) and the probability of reaching the target: the share of the
  bootstrap laws (refits on resampled rollouts and trials) whose predicted score reaches it;
- the verdict, at the package's one confidence level ``confidence`` (``demoscale.DEFAULT_CONFIDENCE``):
  ``ok`` the cheapest plan within ``max_extrapolation`` x the tested data reaching the target with
  probability >= ``confidence``; ``unreachable`` only when at least ``confidence`` of the bootstrap
  laws never reach the target with any amount of such data (worded with that probability);
  ``extrapolation`` when the law's central estimate needs more than ``max_extrapolation`` x the
  tested data; ``uncertain`` otherwise (reaching it is neither shown nor ruled out).

Cost model: ``cost_env`` per environment, ``cost_object`` per object (one unique object per pair, so
``n_envs * n_objects`` objects) and ``cost_demo`` per demonstration. What the table holds is paid for:
a plan costs only what it adds.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from demoscale import DEFAULT_CONFIDENCE
from demoscale.scaling.fits import LawFit, _json_safe, fit_law
from demoscale.scaling.table import AXIS_LABELS, ResultsError, ResultsTable, as_results_table

STATUSES = ("ok", "uncertain", "extrapolation", "unreachable")
# Two forms closer than this in AICc are not told apart by the data (Burnham & Anderson's rule).
AICC_TIE = 2.0
LAW_NAMES = {"loglog": "log-log", "saturating": "saturating", "joint": "joint"}
# Plan rows printed by summary() (all of them are in to_dict()).
MAX_PLAN_ROWS = 10


def count_grid(cap: float) -> np.ndarray:
    """1, 2, 3, 4, 6, 8, 12, 16, 24, ... (powers of two and the values half-way between), up to ``cap``."""
    values = {1}
    power = 1
    while power <= cap:
        values.update({power, power * 3 // 2 if power >= 2 else power})
        power *= 2
    return np.array(sorted(v for v in values if v <= cap), dtype=float)


@dataclass(frozen=True)
class Plan:
    """One candidate: the dataset after collecting (``n_envs`` ...), what that adds to the existing
    data (``add_*``, ``added_cost``), and what the law says of it."""

    n_envs: int
    n_objects_per_env: int
    demos_per_pair: float | None
    n_pairs: int
    total_demos: int | None
    add_envs: int
    add_objects: int
    add_demos: int | None
    added_cost: float
    added_cost_breakdown: dict[str, float]
    total_cost: float
    extrapolation_factor: float
    expected_score: float
    score_interval: tuple[float, float]
    probability: float

    def increment_text(self, have: dict[str, float]) -> str:
        """What the plan adds, in words ("add 32 environments", "nothing: the data you have")."""
        parts = []
        if self.add_envs:
            parts.append(f"{self.add_envs} environment{'s' * (self.add_envs != 1)}")
        if self.n_objects_per_env != have["n_objects_per_env"]:
            parts.append(f"{self.n_objects_per_env} objects per environment")
        old_demos = have.get("demos_per_pair")
        if self.demos_per_pair is not None and old_demos is not None and self.demos_per_pair > old_demos:
            parts.append(f"{self.demos_per_pair - old_demos:g} more demos per pair")
        return "add " + ", ".join(parts) if parts else "nothing (the data you have)"

    def to_dict(self) -> dict[str, Any]:
        return _json_safe({k: getattr(self, k) for k in self.__dataclass_fields__})


@dataclass(frozen=True)
class LawCandidate:
    """One law form of the comparison and its answer to the same question."""

    method: str
    fitted: bool
    note: str
    n_params: int | None = None
    n_points: int | None = None
    aicc: float | None = None
    bic: float | None = None
    loo_rmse: float | None = None
    akaike_weight: float | None = None
    comparable: bool = False
    equation: str | None = None
    required_x: float | None = None
    required_interval: tuple[float, float] | None = None
    probability_reachable: float | None = None
    probability_at_plan: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return _json_safe({k: getattr(self, k) for k in self.__dataclass_fields__})


@dataclass(frozen=True, eq=False)
class BudgetRecommendation:
    """The decision summary (see the module docstring); ``summary()`` prints it, ``to_dict()`` is JSON-safe.

    ``status`` is one of :data:`STATUSES`. With ``"ok"`` the plan fields (``n_envs``, ...,
    ``total_cost`` for the whole dataset, ``added_cost`` for what the plan adds) describe the
    recommended plan; otherwise they are None and ``best_in_range`` holds the most probable plan the
    data can vouch for (within ``max_extrapolation``). ``plans`` lists every candidate of the trusted
    range; ``comparison`` the law forms considered; ``have`` the existing design the plans add to.
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
    interval_confidence: float = DEFAULT_CONFIDENCE
    probability: float | None = None
    total_cost: float | None = None
    cost_breakdown: dict[str, float] | None = None
    added_cost: float | None = None
    marginal_value_env: float | None = None
    marginal_value_demo: float | None = None
    marginal_at: dict[str, float] | None = None
    extrapolation_factor: float | None = None
    max_extrapolation: float = 4.0
    floor: float | None = None
    floor_interval: tuple[float, float] | None = None
    probability_reachable: float | None = None
    required: dict[str, Any] | None = None
    law_reason: str = ""
    comparison: tuple[LawCandidate, ...] = ()
    have: dict[str, Any] = field(default_factory=dict)
    plan: Plan | None = None
    best_in_range: Plan | None = None
    plans: tuple[Plan, ...] = ()
    costs: dict[str, float] = field(default_factory=dict)
    cost_unit: str = ""
    notes: tuple[str, ...] = ()
    fit: LawFit | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if name == "fit":
                continue
            if isinstance(value, Plan | LawCandidate):
                value = value.to_dict()
            elif name in ("comparison", "plans"):
                value = [item.to_dict() for item in value]
            out[name] = value
        out["law"] = None if self.fit is None else self.fit.to_dict()
        return _json_safe(out)

    # -- the text ---------------------------------------------------------------------------------
    def summary(self) -> str:
        width = 78
        pct = f"{self.confidence:.0%}"
        axis_words = AXIS_LABELS.get(self.axis, self.axis)
        headline = {
            "ok": "REACHABLE",
            "uncertain": "NOT ESTABLISHED",
            "extrapolation": "BEYOND THE TESTED RANGE",
            "unreachable": "OUT OF REACH",
        }[self.status]
        lines = [
            "=" * width,
            f"Decision: score >= {self.target:g} on unseen environments, at {pct} confidence",
            "=" * width,
        ]
        lines += textwrap.wrap(
            f"{headline}: {self.message}", width, initial_indent="", subsequent_indent="  "
        )
        lines.append("-" * width)
        lines += _have_lines(self.have, self.axis)
        law = self.method + ("" if self.fit is None else f"  {self.fit.equation_text()}")
        lines.append(f"Law:  {law}")
        lines += textwrap.wrap(
            f"why: {self.law_reason}", width, initial_indent="      ", subsequent_indent="      "
        )
        if self.comparison:
            lines += _comparison_lines(self.comparison, self.target, self.axis, self.confidence)
            lines += textwrap.wrap(
                "(k parameters, n trials; AICc weight among the forms fitted to the same trials; LOO: "
                f"leave-one-design-point-out RMSE of the log gap; P(ever): share of bootstrap laws that "
                f"reach {self.target:g} with unlimited data)",
                width,
                initial_indent="      ",
                subsequent_indent="       ",
            )
        if self.floor is not None:
            low, high = self.floor_interval
            floor = 0.0 if self.floor < 1e-6 else self.floor
            lines += textwrap.wrap(
                f"Floor (the gap no amount of such data removes): E = {floor:.3g} ({pct} interval "
                f"{low:.3g} - {high:.3g}); {self.probability_reachable:.0%} of bootstrap laws ever reach "
                f"{self.target:g}",
                width,
                subsequent_indent="       ",
            )
        lines.append("-" * width)
        lines += textwrap.wrap(
            f"Plans, as increments over what you have, up to {self.max_extrapolation:g}x the largest "
            f"tested {axis_words} (P = share of the bootstrap laws reaching {self.target:g}):",
            width,
        )
        lines += _plan_lines(self, pct)
        lines += textwrap.wrap(
            "Costs: "
            + ", ".join(f"{_money(v, self.cost_unit)} {k}" for k, v in self.costs.items())
            + " (one unique object per pair; what you have is not paid again)",
            width,
            subsequent_indent="       ",
        )
        if self.marginal_value_env is not None or self.marginal_value_demo is not None:
            where = ", ".join(f"{k} {v:g}" for k, v in (self.marginal_at or {}).items())
            unit = f" ({self.cost_unit})" if self.cost_unit else ""
            lines += textwrap.wrap(
                f"Marginal value (score gain per unit of cost{unit}) at {where}:",
                width,
                subsequent_indent="  ",
            )
            lines.append(f"  one more environment:   {_fmt(self.marginal_value_env)}")
            lines.append(f"  one more demo per pair: {_fmt(self.marginal_value_demo)}")
        for note in self.notes:
            lines += textwrap.wrap(f"Note: {note}", width, subsequent_indent="      ")
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


def _money(value: float, unit: str) -> str:
    """A cost in the user's unit: a currency sign goes before the number ("$1,312"), a word after."""
    number = f"{value:,.0f}" if abs(value) >= 100 or float(value).is_integer() else f"{value:,.4g}"
    if not unit:
        return number
    if len(unit) <= 2 and not unit.isalpha():
        return f"{unit}{number}"
    return f"{number} {unit}"


def _count(value: float) -> str:
    """An axis value or factor for the text: 3.5, 763, 12,400, 1.04e+33 (a law can extrapolate wildly)."""
    if not math.isfinite(value):
        return "never"
    if value >= 1e6:
        return f"{value:.3g}"
    return f"{value:,.0f}" if value >= 10 else f"{value:.3g}"


def _have_lines(have: dict[str, Any], axis: str) -> list[str]:
    if not have:
        return []
    demos = have.get("demos_per_pair")
    demos_text = "? demos per pair" if demos is None else f"{demos:g} demos per pair"
    total = have.get("total_demos")
    line = (
        f"Have: {have['n_envs']:g} environments x {have['n_objects_per_env']:g} object(s) per environment x "
        f"{demos_text} = {have['n_pairs']:g} pairs" + ("" if total is None else f", {total:g} demos")
    )
    out = textwrap.wrap(line, 78, subsequent_indent="      ")
    if have.get("measured_score") is not None:
        out += textwrap.wrap(
            f"measured score {have['measured_score']:.3f} (mean of {have['n_trials']} trial(s) at "
            f"{axis} = {have['x']:g}); the law's estimate {have['law_score']:.3f}",
            78,
            initial_indent="      ",
            subsequent_indent="      ",
        )
    return out


def _comparison_lines(
    comparison: tuple[LawCandidate, ...], target: float, axis: str, confidence: float
) -> list[str]:
    lines = [
        f"      {'form':<11}{'k':>2}{'n':>4}{'AICc':>8}{'weight':>7}{'LOO':>7}   "
        f"{axis + ' for ' + format(target, 'g') + f' ({confidence:.0%})':<23}{'P(ever)':>7}"
    ]

    def number(value: float | None, spec: str) -> str:
        return "n/a" if value is None or not math.isfinite(value) else format(value, spec)

    for law in comparison:
        if not law.fitted:
            lines += textwrap.wrap(
                f"{law.method:<11}not fitted: {law.note}",
                78,
                initial_indent="      ",
                subsequent_indent=" " * 17,
            )
            continue
        needed = "n/a"
        if law.required_interval is not None:
            low, high = law.required_interval
            x = math.inf if law.required_x is None else law.required_x
            needed = f"{_count(x)} ({_count(low)} - {_count(high)})"
        weight = number(law.akaike_weight, ".2f") if law.comparable else "-"
        ever = "n/a" if law.probability_reachable is None else f"{law.probability_reachable:.0%}"
        lines.append(
            f"      {law.method:<11}{law.n_params:>2}{law.n_points:>4}{number(law.aicc, '.1f'):>8}{weight:>7}"
            f"{number(law.loo_rmse, '.3f'):>7}   {needed:<23}{ever:>7}"
        )
    return lines


def _plan_lines(decision: BudgetRecommendation, pct: str) -> list[str]:
    plans = list(decision.plans)
    if not plans:
        return ["  (none: no candidate within the search caps)"]
    keep = _rows_to_show(plans, decision.plan, decision.best_in_range)
    lines = [
        f"  {'add':<20}{'to (e x o x d)':>14}{'extrap.':>8}{'score (' + pct + ')':>19}{'P':>6}{'cost':>9}"
    ]
    for plan in keep:
        mark = ">" if plan is decision.plan else " "
        added = _short_increment(plan, decision.have)
        to = f"{plan.n_envs} x {plan.n_objects_per_env}"
        if plan.demos_per_pair is not None:
            to += f" x {plan.demos_per_pair:g}"
        low, high = plan.score_interval
        score = f"{plan.expected_score:.3f} ({low:.2f}-{high:.2f})"
        lines.append(
            f" {mark}{added:<20}{to:>14}{plan.extrapolation_factor:>7.1f}x{score:>19}"
            f"{plan.probability:>6.0%}{_money(plan.added_cost, ''):>9}"
        )
    unit = f"; cost in {decision.cost_unit}" if decision.cost_unit else ""
    lines.append(f"  (e x o x d: environments x objects per environment x demos per pair{unit})")
    if len(keep) < len(plans):
        lines.append(f"  ({len(plans) - len(keep)} more candidates in to_dict()['plans'])")
    if decision.plan is not None:
        lines.append(f"  > recommended: the cheapest addition reaching the target with P >= {pct}")
    return lines


def _short_increment(plan: Plan, have: dict[str, Any]) -> str:
    parts = []
    if plan.add_envs:
        parts.append(f"+{plan.add_envs} env{'s' * (plan.add_envs != 1)}")
    if plan.n_objects_per_env != have["n_objects_per_env"]:
        parts.append(f"{plan.n_objects_per_env} obj/env")
    old = have.get("demos_per_pair")
    if plan.demos_per_pair is not None and old is not None and plan.demos_per_pair > old:
        parts.append(f"+{plan.demos_per_pair - old:g} d/pair")
    text = " ".join(parts) or "nothing"
    return text if len(text) <= 19 else text[:18] + "…"


def _rows_to_show(plans: list[Plan], chosen: Plan | None, best: Plan | None) -> list[Plan]:
    """Every plan when they are few; else the cheapest way to each level of probability (the
    cost-probability frontier), at most MAX_PLAN_ROWS rows, always with the data you have, the
    recommendation and the most probable plan."""
    ordered = sorted(plans, key=lambda p: (p.added_cost, -p.probability, p.n_pairs))
    if len(ordered) <= MAX_PLAN_ROWS:
        return ordered
    frontier, best_p = [], -1.0
    for plan in ordered:
        if plan.probability > best_p + 1e-12 or plan.added_cost == 0:
            frontier.append(plan)
            best_p = max(best_p, plan.probability)
    must = [p for p in (chosen, best) if p is not None and p not in frontier]
    frontier = sorted(frontier + must, key=lambda p: (p.added_cost, p.probability))
    if len(frontier) <= MAX_PLAN_ROWS:
        return frontier
    picks = {0, len(frontier) - 1}
    picks |= {i for i, p in enumerate(frontier) if p is chosen or p is best}
    step = (len(frontier) - 1) / (MAX_PLAN_ROWS - 1)
    picks |= {round(i * step) for i in range(MAX_PLAN_ROWS)}
    return [frontier[i] for i in sorted(picks)]


# -- choosing the law ------------------------------------------------------------------------------
def _default_axis(results: ResultsTable) -> str:
    trials = results.trials
    return "n_envs" if "n_envs" in trials and trials["n_envs"].nunique() >= 2 else "n_pairs"


def _compare_and_choose(
    results: ResultsTable, axis: str, method: str | None, fit_kwargs: dict[str, Any]
) -> tuple[LawFit, str, dict[str, LawFit], list[LawCandidate]]:
    """Fit every applicable form, rank the comparable ones by AICc, and pick the law (see module doc)."""
    trials = results.trials
    varies_demos = "demos_per_pair" in trials and trials["demos_per_pair"].nunique() >= 2
    methods = ["loglog", "saturating"] + (["joint"] if varies_demos else [])
    if method is not None and method not in methods:
        methods.append(method)
    fits: dict[str, LawFit] = {}
    failures: dict[str, str] = {}
    for name in methods:
        try:
            fits[name] = fit_law(results, axis=axis, method=name, **fit_kwargs)
        except (ResultsError, RuntimeError) as error:
            failures[name] = str(error)
    if not fits:
        raise ResultsError(
            "no scaling law could be fitted: " + "; ".join(f"{k}: {v}" for k, v in failures.items())
        )
    one_axis = [m for m in ("loglog", "saturating") if m in fits]
    aicc = {m: fits[m].aicc for m in one_axis}
    finite = {m: v for m, v in aicc.items() if math.isfinite(v)}
    weights: dict[str, float] = {}
    if finite:
        best = min(finite.values())
        raw = {m: math.exp(-(v - best) / 2) for m, v in finite.items()}
        weights = {m: w / sum(raw.values()) for m, w in raw.items()}

    by_aicc = _aicc_choice(fits, finite) if len(one_axis) > 1 else None
    if method is not None:
        if method not in fits:
            raise ResultsError(f"the {method} law could not be fitted: {failures[method]}")
        chosen = method
        reason = f"asked for (method {method!r})"
        if by_aicc is not None and by_aicc[0] != method:
            reason += f"; by AICc the comparison would choose {by_aicc[0]} ({by_aicc[1]})"
        elif by_aicc is not None:
            reason += f"; the comparison agrees ({by_aicc[1]})"
    elif "joint" in fits:
        chosen = "joint"
        reason = (
            "the table varies demos per pair, and the joint law is the only form over both "
            f"{axis} and demos per pair (the one-axis forms hold demos per pair at one value)"
        )
    elif by_aicc is not None:
        chosen, reason = by_aicc
    elif len(one_axis) == 1:
        chosen = one_axis[0]
        reason = "the only form the data allow (the others: not fitted, see below)"
    else:
        chosen = one_axis[0]
        reason = "AICc is undefined for both forms (too few trials for their parameters); the simpler"

    candidates = []
    for name in methods:
        if name not in fits:
            candidates.append(LawCandidate(method=name, fitted=False, note=failures[name]))
            continue
        fit = fits[name]
        candidates.append(
            LawCandidate(
                method=name,
                fitted=True,
                note="chosen" if name == chosen else "",
                n_params=len(fit.params),
                n_points=fit.n_points,
                aicc=fit.aicc,
                bic=fit.bic,
                loo_rmse=fit.loo_rmse,
                akaike_weight=weights.get(name),
                comparable=name in finite,
                equation=fit.equation_text(),
            )
        )
    return fits[chosen], reason, fits, candidates


def _aicc_choice(fits: dict[str, LawFit], finite: dict[str, float]) -> tuple[str, str] | None:
    """The AICc choice between the one-axis forms and the reason, in words (None if none defined)."""
    if not finite:
        return None
    if len(finite) == 1:
        (only,) = finite
        other = next(m for m in ("loglog", "saturating") if m != only)
        return only, f"AICc is undefined for {other} (too few trials for its parameters)"
    ranked = sorted(finite, key=finite.get)
    best = ranked[0]
    # Within AICC_TIE of the best, the data cannot tell the forms apart: take the fewest parameters.
    tied = [m for m in ranked if finite[m] - finite[best] < AICC_TIE]
    chosen = min(tied, key=lambda m: (len(fits[m].params), finite[m]))
    other = next(m for m in ranked if m != chosen)
    delta = finite[other] - finite[chosen]
    if chosen == best:
        why = (
            f"lowest AICc ({finite[chosen]:.1f} against {finite[other]:.1f} for {other}, a difference "
            f"of {delta:.1f})"
        )
        if len(fits[chosen].params) > len(fits[other].params):
            why += ": the extra parameter pays for itself"
    else:
        why = (
            f"within {AICC_TIE:g} AICc of {other} ({finite[chosen]:.1f} against {finite[other]:.1f}): the "
            "data cannot tell them apart, so the form with fewer parameters"
        )
    return chosen, why


# -- the existing design and the candidate plans -----------------------------------------------------
def _have(fit: LawFit) -> dict[str, Any]:
    """The largest design the law was fitted on: what every plan adds to."""
    x = fit.x_max
    if fit.axis == "n_pairs":
        objects = fit.held.get("n_objects")
        if objects is None:
            objects = max(fit.design.get("n_objects", (1.0,)))
        envs = x / objects
    else:
        envs = x
        objects = fit.held.get("n_objects", (fit.design.get("n_objects") or (1.0,))[0])
    if fit.method == "joint":
        demos = fit.demos_max
    else:
        demos = fit.held.get("demos_per_pair", (fit.design.get("demos_per_pair") or (math.nan,))[-1])
    demos = None if demos is None or not math.isfinite(demos) else float(demos)
    at_max = fit.x == x
    if fit.demos is not None:
        at_max &= fit.demos == fit.demos_max
    law_score = float(1.0 - fit.gap_of(fit.param_vector, np.array([x]), _law_demos(fit, demos))[0, 0])
    return {
        "n_envs": float(envs),
        "n_objects_per_env": float(objects),
        "demos_per_pair": demos,
        "n_pairs": float(envs * objects),
        "total_demos": None if demos is None else float(envs * objects * demos),
        "x": x,
        "measured_score": float(fit.score[at_max].mean()) if at_max.any() else None,
        "n_trials": int(at_max.sum()),
        "law_score": law_score,
    }


def _law_demos(fit: LawFit, demos: float | np.ndarray | None) -> np.ndarray | None:
    if fit.method != "joint":
        return None
    return np.atleast_1d(np.asarray(fit.demos_max if demos is None else demos, float))


def recommend_budget(
    table_or_fit: LawFit | ResultsTable | pd.DataFrame | str | Path,
    target: float = 0.9,
    cost_env: float = 1.0,
    cost_object: float = 0.0,
    cost_demo: float = 0.0,
    confidence: float = DEFAULT_CONFIDENCE,
    axis: str | None = None,
    method: str | None = None,
    max_envs: int = 4096,
    max_demos_per_pair: int = 1000,
    max_extrapolation: float = 4.0,
    n_bootstrap: int = 1000,
    seed: int = 0,
    rollouts: str | Path | pd.DataFrame | None = None,
    cost_unit: str = "",
    bootstrap: str = "auto",
) -> BudgetRecommendation:
    """The decision summary for reaching ``target``: the law (chosen by comparison unless ``method``
    is given), the candidate plans as increments over the table's largest design with their
    probabilities, costs and extrapolation factors, and the verdict (see the module docstring).

    ``confidence`` is both the level of every interval and the probability a recommended plan must
    reach (default ``demoscale.DEFAULT_CONFIDENCE``). From a table, the axis defaults to ``n_envs``
    if it varies, else ``n_pairs``. A fitted :class:`LawFit` may be passed instead (no comparison).
    Candidates: environments on ``count_grid(max_envs)`` (and the existing count) from the existing
    count up; objects per environment among the tested values (a law over pairs) or held; demos per
    pair on ``count_grid(max_demos_per_pair)`` from the existing value up (joint law) or held.
    ``cost_unit`` names the unit of the costs ("$", "hours", ...) for the text; ``bootstrap`` is
    passed to :func:`fit_law`.
    """
    if not 0 < target < 1:
        raise ValueError(f"target must lie in (0, 1), got {target}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    unit_costs = (float(cost_env), float(cost_object), float(cost_demo))
    notes: list[str] = []
    fit_kwargs = {"n_bootstrap": n_bootstrap, "seed": seed, "confidence": confidence, "bootstrap": bootstrap}
    fit, reason, fits, comparison = _deciding_law(table_or_fit, rollouts, axis, method, fit_kwargs, notes)
    if fit.axis not in ("n_envs", "n_pairs"):
        raise ResultsError(f"a budget needs a law over n_envs or n_pairs, not {fit.axis!r}")
    have = _have(fit)
    candidates = _candidate_plans(fit, have, target, unit_costs, max_envs, max_demos_per_pair, notes)
    within = [p for p in candidates if p.extrapolation_factor <= max_extrapolation + 1e-9]
    chosen, best = _choose(within, confidence)
    floor, floor_interval = _floor(fit, notes)
    required = fit.required_x(target)
    reachable = float(required["share_of_bootstrap_laws_reaching"])
    comparison = [_answer(law, fits, target, chosen or best) for law in comparison]
    notes += _disagreements(comparison, fit, target, reachable)
    status, message, factor = _verdict(
        fit, have, target, confidence, max_extrapolation, cost_unit, candidates, chosen, best,
        required, floor, floor_interval,
    )  # fmt: skip
    marginal_env, marginal_demo, marginal_at = _marginals(fit, chosen, have, unit_costs, notes)
    return BudgetRecommendation(
        status=status,
        message=message,
        target=target,
        confidence=confidence,
        method=fit.method,
        axis=fit.axis,
        interval_confidence=fit.confidence,
        marginal_value_env=marginal_env,
        marginal_value_demo=marginal_demo,
        marginal_at=marginal_at,
        max_extrapolation=max_extrapolation,
        floor=floor,
        floor_interval=floor_interval,
        probability_reachable=reachable,
        required=required,
        law_reason=reason,
        comparison=tuple(comparison),
        have=have,
        plan=chosen,
        best_in_range=best,
        plans=tuple(sorted(within, key=lambda p: (p.added_cost, p.n_pairs))),
        costs={"per environment": cost_env, "per object": cost_object, "per demo": cost_demo},
        cost_unit=cost_unit,
        notes=tuple(notes),
        fit=fit,
        extrapolation_factor=factor,
        **_plan_fields(chosen, unit_costs),
    )


def _deciding_law(
    table_or_fit: LawFit | ResultsTable | pd.DataFrame | str | Path,
    rollouts: str | Path | pd.DataFrame | None,
    axis: str | None,
    method: str | None,
    fit_kwargs: dict[str, Any],
    notes: list[str],
) -> tuple[LawFit, str, dict[str, LawFit], list[LawCandidate]]:
    """The law the decision rests on, why, every form fitted, and the comparison of the forms: a
    given fit as it is, else the forms fitted on the table and one chosen by AICc (or ``method``)."""
    if not isinstance(table_or_fit, LawFit):
        results = as_results_table(table_or_fit, rollouts)
        return _compare_and_choose(results, axis or _default_axis(results), method, fit_kwargs)
    fit = table_or_fit
    if not math.isclose(fit.confidence, fit_kwargs["confidence"]):
        notes.append(
            f"the law's intervals are at {fit.confidence:.0%}, the decision at {fit_kwargs['confidence']:.0%}: "
            "refit with the same confidence for one level throughout"
        )
    return fit, "given as a fitted law (pass the results table to compare the forms)", {fit.method: fit}, []


def _choose(within: list[Plan], confidence: float) -> tuple[Plan | None, Plan | None]:
    """(recommended, best in range) among the plans within the extrapolation limit.

    Recommended: the cheapest addition reaching the target with the probability asked (ties: the
    more probable, then the smaller dataset). Best in range: the most probable plan (ties: the
    largest, so that at 0% everywhere it says how far the data reach).
    """
    reaching = [p for p in within if p.probability >= confidence]
    chosen = min(reaching, key=lambda p: (p.added_cost, -p.probability, p.n_pairs), default=None)
    best = max(within, key=lambda p: (p.probability, p.extrapolation_factor, -p.added_cost), default=None)
    return chosen, best


def _floor(fit: LawFit, notes: list[str]) -> tuple[float | None, tuple[float, float] | None]:
    """The law's floor E and its interval (None for the log-log law, which has none: noted)."""
    if fit.method == "loglog":
        notes.append(
            "the log-log law has no floor: with a falling gap every target is reached with enough data, "
            "which is why plans stop at the extrapolation limit"
        )
        return None, None
    floor_draws = fit.bootstrap_params[:, fit.param_names.index("E")]
    low, high = fit.bootstrap_interval(floor_draws, np.array([fit.floor]))
    return fit.floor, (float(low[0]), float(high[0]))


def _marginals(
    fit: LawFit,
    chosen: Plan | None,
    have: dict[str, Any],
    unit_costs: tuple[float, float, float],
    notes: list[str],
) -> tuple[Any, Any, Any]:
    """Marginal values of one more environment and one more demo per pair, at the recommended plan
    (else at what exists); the demo's is unknown (None, noted) unless the law depends on demos."""
    point = (
        (chosen.n_envs, chosen.n_objects_per_env, chosen.demos_per_pair or math.nan)
        if chosen is not None
        else (have["n_envs"], have["n_objects_per_env"], have["demos_per_pair"] or math.nan)
    )
    marginal_env, marginal_demo, marginal_at = _marginal_values(fit, point, *unit_costs)
    if fit.method != "joint":
        notes.append(
            "the law does not depend on demos per pair: the value of one more demo per pair is unknown"
        )
        marginal_demo = None
    return marginal_env, marginal_demo, marginal_at


def _plan_fields(chosen: Plan | None, unit_costs: tuple[float, float, float]) -> dict[str, Any]:
    """The recommended plan's numbers, flat, for BudgetRecommendation (none without a plan)."""
    if chosen is None:
        return {}
    cost_env, cost_object, cost_demo = unit_costs
    return {
        "n_envs": chosen.n_envs,
        "n_objects_per_env": chosen.n_objects_per_env,
        "demos_per_pair": None if chosen.demos_per_pair is None else int(chosen.demos_per_pair),
        "n_pairs": chosen.n_pairs,
        "total_demos": chosen.total_demos,
        "expected_score": chosen.expected_score,
        "score_interval": chosen.score_interval,
        "probability": chosen.probability,
        "total_cost": chosen.total_cost,
        "cost_breakdown": {
            "environments": cost_env * chosen.n_envs,
            "objects": cost_object * chosen.n_pairs,
            "demos": cost_demo * (chosen.total_demos or 0),
        },
        "added_cost": chosen.added_cost,
    }


def _candidate_plans(
    fit: LawFit,
    have: dict[str, Any],
    target: float,
    unit_costs: tuple[float, float, float],
    max_envs: int,
    max_demos_per_pair: int,
    notes: list[str],
) -> list[Plan]:
    """Every plan of the search grid from the existing design up, with what the law says of it."""
    if fit.axis == "n_pairs":
        objects_options = np.array(fit.design.get("n_objects", (have["n_objects_per_env"],)), dtype=float)
        if len(objects_options) > 1:
            notes.append(
                "a law over pairs counts a new object like a new environment; the scaling-laws study found "
                "new environments generalise better (one unique object per environment)"
            )
    else:
        objects_options = np.array([have["n_objects_per_env"]], dtype=float)
    have_demos = have["demos_per_pair"]
    if fit.method == "joint":
        demos_options = np.union1d(count_grid(max_demos_per_pair), [have_demos])
        demos_options = demos_options[demos_options >= have_demos]
    else:
        demos_options = np.array([math.nan if have_demos is None else have_demos], dtype=float)
        notes.append(
            "demos per pair held at the tested value "
            + (f"{have_demos:g}" if have_demos is not None else "(unknown: demo cost not counted)")
            + f" (the {LAW_NAMES[fit.method]} law is over {fit.axis} only)"
        )
    env_options = np.union1d(count_grid(max_envs), [have["n_envs"]])
    envs, objects, demos = (g.ravel() for g in np.meshgrid(env_options, objects_options, demos_options))
    pairs = envs * objects
    keep = (pairs >= have["n_pairs"] - 1e-9) & ((envs >= have["n_envs"]) | (fit.axis == "n_pairs"))
    envs, objects, demos, pairs = envs[keep], objects[keep], demos[keep], pairs[keep]

    x = pairs if fit.axis == "n_pairs" else envs
    law_demos = demos if fit.method == "joint" else None
    draws = 1.0 - fit.gap_of(fit.bootstrap_params, x, law_demos)  # (B, candidates) scores
    expected = np.clip(1.0 - fit.gap_of(fit.param_vector, x, law_demos)[0], 0.0, 1.0)
    low, high = fit.bootstrap_interval(draws, expected)
    probability = (draws >= target).mean(axis=0)
    extrapolation = x / fit.x_max
    if fit.method == "joint":
        extrapolation = np.maximum(extrapolation, demos / fit.demos_max)

    # What is paid: new environments, new objects (one per new pair), and new demonstrations (more
    # demos on the pairs that exist, all demos on the new ones). What the table holds is not paid again.
    cost_env, cost_object, cost_demo = unit_costs
    per_pair = np.where(np.isfinite(demos), demos, 0.0)
    old_demos = 0.0 if have_demos is None else have_demos
    add_envs = np.maximum(envs - have["n_envs"], 0.0)
    add_objects = np.maximum(pairs - have["n_pairs"], 0.0)
    add_demos = (
        np.minimum(pairs, have["n_pairs"]) * np.maximum(per_pair - old_demos, 0.0) + add_objects * per_pair
    )
    plans = []
    for i in range(len(envs)):
        d = float(demos[i]) if math.isfinite(demos[i]) else None
        plans.append(
            Plan(
                n_envs=int(envs[i]),
                n_objects_per_env=int(objects[i]),
                demos_per_pair=d,
                n_pairs=int(pairs[i]),
                total_demos=None if d is None else int(round(pairs[i] * d)),
                add_envs=int(round(add_envs[i])),
                add_objects=int(round(add_objects[i])),
                add_demos=None if have_demos is None else int(round(add_demos[i])),
                added_cost=float(
                    cost_env * add_envs[i] + cost_object * add_objects[i] + cost_demo * add_demos[i]
                ),
                added_cost_breakdown={
                    "environments": float(cost_env * add_envs[i]),
                    "objects": float(cost_object * add_objects[i]),
                    "demos": float(cost_demo * add_demos[i]),
                },
                total_cost=float(
                    cost_env * envs[i] + cost_object * pairs[i] + cost_demo * pairs[i] * per_pair[i]
                ),
                extrapolation_factor=float(extrapolation[i]),
                expected_score=float(expected[i]),
                score_interval=(float(np.clip(low[i], 0, 1)), float(np.clip(high[i], 0, 1))),
                probability=float(probability[i]),
            )
        )
    return plans


def _answer(law: LawCandidate, fits: dict[str, LawFit], target: float, at: Plan | None) -> LawCandidate:
    """A compared law's own answer: axis value for the target, P(ever), P at the decision's plan."""
    if not law.fitted:
        return law
    fit = fits[law.method]
    needed = fit.required_x(target)
    p_at = None
    if at is not None:
        x = at.n_pairs if fit.axis == "n_pairs" else at.n_envs
        scores = 1.0 - fit.gap_of(fit.bootstrap_params, [x], _law_demos(fit, at.demos_per_pair))[:, 0]
        p_at = float((scores >= target).mean())
    return replace(
        law,
        required_x=needed["x"],
        required_interval=tuple(math.inf if v is None else v for v in needed["interval"]),
        probability_reachable=needed["share_of_bootstrap_laws_reaching"],
        probability_at_plan=p_at,
    )


def _disagreements(comparison: list[LawCandidate], fit: LawFit, target: float, reachable: float) -> list[str]:
    """Notes for a credible other form (AICc weight >= 0.1) that finds the target mostly out of reach."""
    return [
        f"the {LAW_NAMES[law.method]} law (AICc weight {law.akaike_weight:.2f}) disagrees: only "
        f"{law.probability_reachable:.0%} of its bootstrap laws ever reach {target:g}; trials at larger "
        f"{fit.axis} would tell the two apart"
        for law in comparison
        if law.fitted
        and law.method != fit.method
        and law.comparable
        and (law.akaike_weight or 0.0) >= 0.1
        and (law.probability_reachable or 0.0) <= 0.5 < reachable
    ]


def _verdict(
    fit: LawFit,
    have: dict[str, Any],
    target: float,
    confidence: float,
    max_extrapolation: float,
    cost_unit: str,
    candidates: list[Plan],
    chosen: Plan | None,
    best: Plan | None,
    required: dict[str, Any],
    floor: float | None,
    floor_interval: tuple[float, float] | None,
) -> tuple[str, str, float | None]:
    """Status, message and extrapolation factor of the decision (rules in the module docstring)."""
    pct = f"{confidence:.0%}"
    axis_words = AXIS_LABELS.get(fit.axis, fit.axis)
    reachable = float(required["share_of_bootstrap_laws_reaching"])
    if chosen is not None:
        if chosen.added_cost == 0 and chosen.add_envs == 0 and chosen.add_objects == 0:
            message = (
                f"the data you have already reach {target:g} with probability {chosen.probability:.0%} "
                f"(>= {pct}): nothing to add"
            )
        else:
            to = f"{chosen.n_envs} environments x {chosen.n_objects_per_env} object(s)"
            if chosen.demos_per_pair is not None:
                to += f" x {chosen.demos_per_pair:g} demos"
            message = (
                f"{chosen.increment_text(have)} (to {to}): reaches {target:g} with probability "
                f"{chosen.probability:.0%} (>= {pct} asked), for {_money(chosen.added_cost, cost_unit)}"
            )
            if chosen.extrapolation_factor > 1:
                message += f"; {chosen.extrapolation_factor:.1f}x the largest tested {axis_words}"
        return "ok", message, chosen.extrapolation_factor
    if 1.0 - reachable >= confidence:
        floor_text = ""
        if floor is not None:
            floor_text = (
                f" (fitted floor E = {floor:.3g}, {pct} interval {floor_interval[0]:.3g} - "
                f"{floor_interval[1]:.3g}, caps the score at {1 - floor:.3f})"
            )
        message = (
            f"with probability {1 - reachable:.0%}, more of the same data will not get there: in that share "
            f"of the bootstrap laws the score levels off below {target:g}{floor_text}. More {axis_words} of "
            "this kind are not the lever; change the policy, its training budget or the kind of data."
        )
        return "unreachable", message, None

    best_text = ""
    if best is not None:
        best_text = (
            f" The most the data can vouch for, {best.increment_text(have)} (to {best.n_envs} "
            f"environments, {best.extrapolation_factor:.1f}x, {_money(best.added_cost, cost_unit)}), "
            f"reaches it with probability {best.probability:.0%}."
        )
    needed_x = math.inf if required["x"] is None else required["x"]
    low_x, high_x = (math.inf if v is None else v for v in required["interval"])
    where = (
        f"the {LAW_NAMES[fit.method]} law puts {target:g} at about {_count(needed_x)} {axis_words} "
        f"({pct} interval {_count(low_x)} - {_count(high_x)})"
    )
    # Where the law's central estimate first reaches the target on the grid (beyond the caps: inf).
    central = [p.extrapolation_factor for p in candidates if p.expected_score >= target]
    central_factor = min(central, default=math.inf)
    if central_factor > max_extrapolation and (central or math.isfinite(needed_x)):
        factor = needed_x / fit.x_max if math.isfinite(needed_x) else central_factor
        message = (
            f"{where}, {_count(factor)}x the largest tested ({fit.x_max:g}), beyond the {max_extrapolation:g}x "
            f"extrapolation limit.{best_text} Test larger datasets before trusting a number."
        )
        return "extrapolation", message, factor
    if math.isfinite(needed_x):
        message = (
            f"{where}, but no plan within {max_extrapolation:g}x the tested data reaches it with "
            f"probability {pct}.{best_text} Collect it, add the trials and ask again."
        )
    else:
        message = (
            f"the {LAW_NAMES[fit.method]} law levels off below {target:g}, but {reachable:.0%} of the "
            f"bootstrap laws reach it: the data cannot tell yet whether it is reachable.{best_text}"
        )
    return "uncertain", message, None


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
    at = {"n_envs": float(n_envs), "n_objects_per_env": float(n_objects)}
    if math.isfinite(demos):
        at["demos_per_pair"] = float(demos)
    return marginal_env, marginal_demo, at
