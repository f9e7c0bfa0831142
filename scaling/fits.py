"""Scaling-law fits: the study's log-log OLS, a saturating law with a floor, a joint two-factor law.

Every fit works on the optimality gap ``1 - score`` of each trial (all trials, not means), with the
0/1 rule of :func:`demoscale.scaling.table.adjusted_gap`, and returns a frozen :class:`LawFit`
carrying estimates, standard errors, intervals, goodness of fit and the bootstrap parameter draws.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from demoscale import DEFAULT_CONFIDENCE
from demoscale.scaling.bootstrap import bootstrap_interval, resample_scores, resolve_mode
from demoscale.scaling.models import JOINT, SATURATING, LawModel, batched_robust_lm, robust_cost
from demoscale.scaling.names import METHODS
from demoscale.scaling.table import (
    AXES,
    AXIS_LABELS,
    ResultsError,
    ResultsTable,
    adjusted_gap,
    as_results_table,
    select_slice,
)
from scipy.optimize import least_squares

EQUATIONS = {
    "loglog": "1 - score = beta * x^alpha",
    "saturating": SATURATING.equation,
    "joint": JOINT.equation,
}
ZERO_ONE_RULE = "scores of exactly 0 or 1: gap replaced by (k + 0.5) / (n + 1), k = n * gap, n = n_rollouts"


def _json_safe(value: Any) -> Any:
    """Plain Python values for json.dumps: NaN/inf become None, numpy scalars become floats/ints."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, np.ndarray):
        return _json_safe(value.tolist())
    if isinstance(value, np.bool_ | bool):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        value = float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, Path):
        return str(value)
    return value


@dataclass(frozen=True, eq=False)
class Prediction:
    """Predicted score (and gap) at some axis values, with an interval (``low`` <= ``score`` <= ``high``)."""

    x: np.ndarray
    demos_per_pair: np.ndarray | None
    score: np.ndarray
    low: np.ndarray
    high: np.ndarray
    interval: str | None
    confidence: float

    @property
    def gap(self) -> np.ndarray:
        return 1.0 - self.score

    def to_frame(self) -> pd.DataFrame:
        frame = pd.DataFrame(
            {"x": self.x, "score": self.score, "score_low": self.low, "score_high": self.high}
        )
        if self.demos_per_pair is not None:
            frame.insert(1, "demos_per_pair", self.demos_per_pair)
        return frame

    def to_dict(self) -> dict[str, Any]:
        return _json_safe(
            {"interval": self.interval, "confidence": self.confidence, **self.to_frame().to_dict("list")}
        )


@dataclass(frozen=True, eq=False)
class LawFit:
    """A fitted scaling law (statsmodels-like): estimates, errors, intervals, fit quality, bootstrap.

    ``params``/``bse``/``conf_int`` are keyed by parameter name. For ``loglog`` the standard errors
    and intervals are the OLS ones (the study's method; ``beta``'s by the delta method and by
    exponentiating the intercept's interval); for the other forms they are bootstrap standard
    deviations and percentile intervals. ``bootstrap_conf_int`` always holds the bootstrap ones.
    Goodness of fit is measured on the log gap: ``rmse_log``, ``r_squared``, Gaussian ``aic``/
    ``aicc``/``bic`` (``n log(SSR/n) + penalty``, same data => comparable across forms) and
    ``loo_rmse`` (leave one design point out, refit, predict it).
    """

    method: str
    axis: str
    params: dict[str, float]
    bse: dict[str, float]
    conf_int: dict[str, tuple[float, float]]
    bootstrap_conf_int: dict[str, tuple[float, float]]
    confidence: float
    n_points: int
    n_design_points: int
    r: float | None
    r_squared: float
    rmse_log: float
    aic: float
    aicc: float
    bic: float
    loo_rmse: float
    x: np.ndarray
    demos: np.ndarray | None
    score: np.ndarray
    gap: np.ndarray
    adjusted: np.ndarray
    n_rollouts: np.ndarray | None
    bootstrap_params: np.ndarray
    bootstrap_mode: str
    bootstrap_description: str
    seed: int
    held: dict[str, float]
    notes: tuple[str, ...]
    design: dict[str, tuple[float, ...]] = field(default_factory=dict)
    loss: str | None = None
    f_scale: float | None = None
    ols: Any = field(default=None, repr=False)

    # -- the law itself -------------------------------------------------------------------------
    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(self.params)

    @property
    def equation(self) -> str:
        return EQUATIONS[self.method]

    @property
    def x_max(self) -> float:
        return float(np.max(self.x))

    @property
    def demos_max(self) -> float | None:
        return None if self.demos is None else float(np.max(self.demos))

    @property
    def floor(self) -> float:
        """The irreducible gap (0 for the log-log law, which has none)."""
        return float(self.params.get("E", 0.0))

    def gap_of(
        self, params: np.ndarray, x: np.ndarray, demos_per_pair: np.ndarray | None = None
    ) -> np.ndarray:
        """Model gaps for parameter rows ``(B, k)`` at points ``x`` (and ``demos_per_pair``): ``(B, n)``."""
        params = np.atleast_2d(np.asarray(params, float))
        x = np.atleast_1d(np.asarray(x, float))
        if self.method == "loglog":
            return params[:, 1:2] * np.exp(params[:, 0:1] * np.log(x)[None, :])
        if self.method == "saturating":
            return SATURATING.gap(params, x)
        d = np.broadcast_to(np.asarray(demos_per_pair, float), x.shape)
        return JOINT.gap(params, x, d)

    def bootstrap_interval(
        self, draws: np.ndarray, estimate: np.ndarray, confidence: float | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Interval of draws derived from ``bootstrap_params`` (BC for log-log, else percentile)."""
        kind = INTERVAL_KIND[self.method]
        return bootstrap_interval(
            kind, draws, estimate, self.confidence if confidence is None else confidence
        )

    @property
    def param_vector(self) -> np.ndarray:
        return np.array([self.params[name] for name in self.param_names])

    def predict(
        self,
        x: float | np.ndarray,
        demos_per_pair: float | np.ndarray | None = None,
        interval: str | None = "bootstrap",
        confidence: float | None = None,
    ) -> Prediction:
        """Predicted score at ``x`` with an interval: ``"bootstrap"`` (percentiles of the bootstrap laws),
        for ``loglog`` also ``"confidence"`` (OLS mean) or ``"prediction"`` (OLS new observation),
        or None. The joint law also needs ``demos_per_pair`` (default: the largest tested value).
        Scores are clipped to [0, 1]."""
        confidence = self.confidence if confidence is None else confidence
        x_arr = np.atleast_1d(np.asarray(x, float))
        demos = None
        if self.method == "joint":
            demos = np.broadcast_to(
                np.asarray(self.demos_max if demos_per_pair is None else demos_per_pair, float), x_arr.shape
            ).copy()
            x_arr = np.broadcast_to(x_arr, demos.shape).copy()
        gap = self.gap_of(self.param_vector, x_arr, demos)[0]
        if interval is None:
            gap_low = gap_high = np.full_like(gap, np.nan)
        elif interval == "bootstrap":
            draws = self.gap_of(self.bootstrap_params, x_arr, demos)
            gap_low, gap_high = self.bootstrap_interval(draws, gap, confidence)
        elif interval in ("confidence", "prediction") and self.method == "loglog":
            frame = self.ols.get_prediction(np.column_stack([np.ones_like(x_arr), np.log(x_arr)]))
            table = frame.summary_frame(alpha=1 - confidence)
            prefix = "mean_ci" if interval == "confidence" else "obs_ci"
            gap_low = np.exp(table[f"{prefix}_lower"].to_numpy())
            gap_high = np.exp(table[f"{prefix}_upper"].to_numpy())
        else:
            raise ValueError(
                f"interval {interval!r} not available for {self.method} (bootstrap, None"
                + (", confidence, prediction)" if self.method == "loglog" else ")")
            )
        clip = lambda g: np.clip(1.0 - g, 0.0, 1.0)  # noqa: E731
        return Prediction(x_arr, demos, clip(gap), clip(gap_high), clip(gap_low), interval, confidence)

    def required_x(self, target: float, demos_per_pair: float | None = None) -> dict[str, Any]:
        """The axis value at which the law reaches score ``target`` (the study's extrapolation, e.g.
        how many pairs for 0.99), with a bootstrap interval; ``inf`` where the law never gets there
        (alpha >= 0, or a floor above ``1 - target``). Closed form for every form."""
        gap = 1.0 - target
        params = np.vstack([self.param_vector, self.bootstrap_params])
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            if self.method == "loglog":
                alpha, beta = params[:, 0], params[:, 1]
                x = np.where(alpha < 0, (gap / beta) ** (1.0 / alpha), np.inf)
            elif self.method == "saturating":
                floor, beta, alpha = params.T
                x = np.where((alpha < 0) & (floor < gap), ((gap - floor) / beta) ** (1.0 / alpha), np.inf)
            else:
                d = self.demos_max if demos_per_pair is None else float(demos_per_pair)
                floor, a_coef, a_exp, b_coef, b_exp = params.T
                room = gap - floor - b_coef * d**-b_exp
                x = np.where((a_exp > 0) & (room > 0), (room / a_coef) ** (-1.0 / a_exp), np.inf)
        x = np.where(np.isnan(x), np.inf, np.maximum(x, 0.0))
        levels = [(1 - self.confidence) / 2, (1 + self.confidence) / 2]
        low, high = np.quantile(x[1:], levels, method="inverted_cdf")  # no interpolation across inf
        return _json_safe(
            {
                "target": target,
                "x": float(x[0]),
                "interval": [float(low), float(high)],
                "confidence": self.confidence,
                "share_of_bootstrap_laws_reaching": float(np.isfinite(x[1:]).mean()),
                "extrapolation_factor": float(x[0] / self.x_max),
            }
        )

    # -- reporting ------------------------------------------------------------------------------
    def equation_text(self, digits: int = 3) -> str:
        """The fitted equation with numbers, for legends and summaries (a floor below 1e-6 reads 0)."""
        p = {k: (0.0 if k == "E" and abs(v) < 1e-6 else v) for k, v in self.params.items()}
        if self.method == "loglog":
            return f"1-s = {p['beta']:.{digits}g}·x^{p['alpha']:.{digits}g}"
        if self.method == "saturating":
            return f"1-s = {p['E']:.{digits}g} + {p['beta']:.{digits}g}·x^{p['alpha']:.{digits}g}"
        return (
            f"1-s = {p['E']:.{digits}g} + {p['A']:.{digits}g}·x^-{p['a']:.{digits}g}"
            f" + {p['B']:.{digits}g}·d^-{p['b']:.{digits}g}"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe summary: the parameters at top level too (``alpha``, ``beta``, ``E``, ...)."""
        out: dict[str, Any] = {
            "method": self.method,
            "axis": self.axis,
            "equation": self.equation,
            "fitted_equation": self.equation_text(),
            **self.params,
            "params": self.params,
            "bse": self.bse,
            "conf_int": {k: list(v) for k, v in self.conf_int.items()},
            "bootstrap_conf_int": {k: list(v) for k, v in self.bootstrap_conf_int.items()},
            "interval_source": "ols" if self.method == "loglog" else "bootstrap",
            "bootstrap_interval": INTERVAL_KIND[self.method],
            "confidence": self.confidence,
            "n_points": self.n_points,
            "n_design_points": self.n_design_points,
            "x_range": [float(np.min(self.x)), float(np.max(self.x))],
            "r": self.r,
            "r_squared": self.r_squared,
            "rmse_log": self.rmse_log,
            "aic": self.aic,
            "aicc": self.aicc,
            "bic": self.bic,
            "loo_rmse": self.loo_rmse,
            "n_adjusted_points": int(self.adjusted.sum()),
            "zero_one_rule": ZERO_ONE_RULE,
            "bootstrap": {
                "mode": self.bootstrap_mode,
                "description": self.bootstrap_description,
                "n": int(len(self.bootstrap_params)),
                "seed": self.seed,
            },
            "held": self.held,
            "design": {k: list(v) for k, v in self.design.items()},
            "loss": self.loss,
            "f_scale": self.f_scale,
            "notes": list(self.notes),
        }
        if self.demos is not None:
            out["demos_range"] = [float(np.min(self.demos)), float(np.max(self.demos))]
        return _json_safe(out)

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def summary(self) -> str:
        """A printable report in the manner of statsmodels' ``summary()``."""
        width = 78
        pct = f"{self.confidence * 100:g}%"
        label = AXIS_LABELS.get(self.axis, self.axis)
        lines = [
            "=" * width,
            f"Scaling law ({self.method}): {self.equation}",
            f"x = {self.axis} ({label})" + ("; d = demos_per_pair" if self.method == "joint" else ""),
            "=" * width,
            f"Data: {self.n_points} trials at {self.n_design_points} design points; "
            f"x from {np.min(self.x):g} to {np.max(self.x):g}"
            + (
                f"; d from {np.min(self.demos):g} to {np.max(self.demos):g}" if self.demos is not None else ""
            ),
        ]
        if self.held:
            lines.append("Held fixed: " + ", ".join(f"{k} = {v:g}" for k, v in self.held.items()))
        source = {"bc": "bootstrap bias-corrected percentile", "percentile": "bootstrap percentile"}
        source = "OLS (statsmodels)" if self.method == "loglog" else source[INTERVAL_KIND[self.method]]
        lines += [
            f"Bootstrap: {len(self.bootstrap_params)} replicates, {self.bootstrap_description} (seed {self.seed})",
            f"Intervals: {pct}, {source}"
            + (f"; robust loss {self.loss}, f_scale {self.f_scale:.3g}" if self.loss else ""),
            "-" * width,
            f"{'param':<8}{'estimate':>12}{'std err':>12}{'[' + pct:>12}{pct + ']':>12}"
            + ("   bootstrap (BC) " + pct if self.method == "loglog" else ""),
        ]
        for name in self.param_names:
            low, high = self.conf_int[name]
            row = f"{name:<8}{self.params[name]:>12.4g}{self.bse[name]:>12.4g}{low:>12.4g}{high:>12.4g}"
            if self.method == "loglog":
                b_low, b_high = self.bootstrap_conf_int[name]
                row += f"   [{b_low:.4g}, {b_high:.4g}]"
            lines.append(row)
        lines.append("-" * width)
        quality = [f"R²(log) = {self.r_squared:.3f}", f"RMSE(log) = {self.rmse_log:.3f}"]
        if self.r is not None:
            quality.insert(0, f"Pearson r (log-log) = {self.r:.3f}")
        lines.append("Fit: " + "   ".join(quality))
        lines.append(
            f"     AIC = {self.aic:.2f}   AICc = {self.aicc:.2f}   BIC = {self.bic:.2f}   "
            f"LOO RMSE(log) = {self.loo_rmse:.3f}"
        )
        n_adjusted = int(self.adjusted.sum())
        lines.append(f"0/1 rule: {ZERO_ONE_RULE}; applied to {n_adjusted} trial(s)")
        lines += [f"Note: {note}" for note in self.notes]
        lines.append("=" * width)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


# -- fitting ------------------------------------------------------------------------------------
def _robust_scale(residuals: np.ndarray) -> float:
    """Normal-consistent MAD of residuals, floored so that a near-perfect fit still has a scale."""
    residuals = np.asarray(residuals, float)
    mad = np.median(np.abs(residuals - np.median(residuals))) * 1.4826
    return float(max(mad, 0.02))


def _ols_coefficients(design: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """OLS coefficients for every row of ``targets`` (B, n) on one design (n, p): (B, p)."""
    return targets @ np.linalg.pinv(design).T


def _fit_nonlinear(
    model: LawModel,
    x: np.ndarray,
    d: np.ndarray | None,
    y: np.ndarray,
    starts: list[np.ndarray],
    loss: str,
    f_scale: float,
) -> np.ndarray:
    """Best of several ``least_squares`` runs (robust loss, bounds) on log-scale residuals."""

    def residuals(p: np.ndarray) -> np.ndarray:
        return model.log_gap_and_jacobian(p[None], x, d)[0][0] - y

    def jacobian(p: np.ndarray) -> np.ndarray:
        return model.log_gap_and_jacobian(p[None], x, d)[1][0]

    best, best_cost = None, np.inf
    for start in starts:
        start = np.clip(start, model.lower + 1e-9, model.upper - 1e-9)
        result = least_squares(
            residuals, start, jac=jacobian, bounds=(model.lower, model.upper), loss=loss, f_scale=f_scale
        )
        cost = float(robust_cost(result.fun[None], loss, f_scale)[0])
        if np.isfinite(cost) and cost < best_cost:
            best, best_cost = result.x, cost
    if best is None:
        raise RuntimeError(f"{model.name} fit failed from every starting point")
    return best


def _saturating_starts(x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    slope, intercept = np.polyfit(np.log(x), y, 1)
    alpha0 = float(np.clip(slope, -3.0, -0.05))
    min_gap = float(np.exp(y).min())
    return [np.array([floor, np.exp(intercept), alpha0]) for floor in (0.0, 0.3 * min_gap, 0.7 * min_gap)]


def _joint_starts(x: np.ndarray, d: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    gaps = np.exp(y)
    min_gap, scale = float(gaps.min()), float(np.median(gaps))
    starts = []
    for floor in (0.0, 0.5 * min_gap):
        for a0 in (0.1, 0.4, 1.0):
            for b0 in (0.1, 0.4, 1.0):
                starts.append(np.array([floor, scale * x.min() ** a0, a0, 0.5 * scale * d.min() ** b0, b0]))
    return starts


def _design_keys(x: np.ndarray, d: np.ndarray | None) -> np.ndarray:
    keys = x if d is None else x * 1e6 + d  # axis values are counts; this pairs them uniquely
    return np.unique(keys, return_inverse=True)[1]


# Interval kind per form, chosen by simulated coverage of alpha (binomial rollout noise, 40 rollouts):
# the log-log percentile interval under-covers (the log's bias is doubled; 0.865 for a nominal 0.9),
# bias-corrected it covers 0.89; for the saturating form, whose parameters often sit on a bound,
# the bias correction over-corrects (0.80) while the percentile interval covers 0.875.
INTERVAL_KIND = {"loglog": "bc", "saturating": "percentile", "joint": "percentile"}


def _bootstrap_intervals(
    kind: str, draws: np.ndarray, estimate: np.ndarray, names: tuple[str, ...], confidence: float
) -> dict[str, tuple[float, float]]:
    low, high = bootstrap_interval(kind, draws, estimate, confidence)
    return {name: (float(low[i]), float(high[i])) for i, name in enumerate(names)}


def _information(ssr: float, n: int, k: int) -> tuple[float, float, float]:
    ssr = max(ssr, 1e-300)
    aic = n * math.log(ssr / n) + 2 * k
    aicc = aic + (2 * k * (k + 1) / (n - k - 1) if n - k - 1 > 0 else math.inf)
    bic = n * math.log(ssr / n) + k * math.log(n)
    return aic, aicc, bic


def _prepare(
    results: ResultsTable, axis: str, method: str, where: dict[str, float] | None
) -> tuple[pd.DataFrame, dict[str, float], list[str]]:
    trials = results.trials
    if method == "joint":
        if axis in ("demos_per_pair", "total_demos"):
            raise ResultsError("the joint law's x axis is n_pairs or n_envs (d is demos_per_pair)")
        if "demos_per_pair" not in trials or trials["demos_per_pair"].nunique() < 2:
            raise ResultsError("the joint law needs a 'demos_per_pair' column with at least two values")
        rows, held, notes = select_slice(trials, axis, where, free=("demos_per_pair",))
    else:
        rows, held, notes = select_slice(trials, axis, where)
    return rows, held, notes


def fit_law(
    table: ResultsTable | pd.DataFrame | str | Path,
    axis: str = "n_envs",
    method: str = "loglog",
    rollouts: str | Path | pd.DataFrame | None = None,
    n_bootstrap: int = 1000,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
    bootstrap: str = "auto",
    where: dict[str, float] | None = None,
    loss: str | None = None,
    f_scale: float | None = None,
    leave_one_out: bool = True,
) -> LawFit:
    """Fit a scaling law of the optimality gap ``1 - score`` over ``axis``.

    ``method``: ``"loglog"`` (the study's OLS of log gap on log x, with Pearson r and statsmodels
    intervals), ``"saturating"`` (``gap = E + beta x^alpha``, robust ``least_squares``, soft-L1 loss,
    E >= 0, bootstrap intervals) or ``"joint"`` (``gap = E + A x^-a + B d^-b`` over ``axis`` and
    ``demos_per_pair``, Huber loss on log values, best of 18 starts, bootstrap intervals).

    Every trial is a point (several seeds per axis value are all used, not their mean). Other factors
    are held at one value (see :func:`~demoscale.scaling.table.select_slice`, or give ``where``).
    ``bootstrap`` picks how replicates are drawn (see :mod:`demoscale.scaling.bootstrap`);
    ``f_scale`` defaults to 1.345 x the MAD of the log-scale residuals of a linear fit.
    """
    if method not in METHODS:
        raise ValueError(f"method {method!r} unknown; choose one of {METHODS}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    results = as_results_table(table, rollouts)
    data = _fit_data(results, axis, method, where)
    estimate = _point_estimate(method, data, loss, f_scale)
    draws, replicas = _bootstrap_draws(method, data, estimate, results, bootstrap, n_bootstrap, seed)
    names = estimate.names
    boot_ci = _bootstrap_intervals(INTERVAL_KIND[method], draws, estimate.point, names, confidence)
    params = {name: float(v) for name, v in zip(names, estimate.point, strict=True)}
    if method == "loglog":
        bse, conf_int = _ols_uncertainty(estimate.ols, params["beta"], confidence)
    else:
        bse = {name: float(v) for name, v in zip(names, draws.std(axis=0, ddof=1), strict=True)}
        conf_int = boot_ci

    # Goodness of fit, on the log gap.
    x, d, y, n = data.x, data.d, data.y, len(data.y)
    residuals = y - estimate.fitted
    ssr = float(residuals @ residuals)
    r_squared = 1.0 - ssr / float(((y - y.mean()) ** 2).sum()) if np.ptp(y) > 0 else float("nan")
    aic, aicc, bic = _information(ssr, n, len(names))
    pearson = float(np.corrcoef(np.log(x), y)[0, 1]) if method == "loglog" and np.ptp(y) > 0 else None
    loo = float("nan")
    if leave_one_out:
        loo = _leave_one_out(
            method, estimate.model, x, d, y, data.keys, estimate.point, estimate.loss, estimate.scale
        )

    return LawFit(
        method=method,
        axis=axis,
        params=params,
        bse=bse,
        conf_int=conf_int,
        bootstrap_conf_int=boot_ci,
        confidence=confidence,
        n_points=n,
        n_design_points=data.n_design,
        r=pearson,
        r_squared=float(r_squared),
        rmse_log=math.sqrt(ssr / n),
        aic=aic,
        aicc=aicc,
        bic=bic,
        loo_rmse=loo,
        x=x,
        demos=d,
        score=data.score,
        gap=data.gap,
        adjusted=data.adjusted,
        n_rollouts=data.counts,
        bootstrap_params=draws,
        bootstrap_mode=replicas.mode,
        bootstrap_description=replicas.description,
        seed=seed,
        held=data.held,
        notes=tuple(data.notes),
        loss=estimate.loss,
        f_scale=estimate.scale,
        ols=estimate.ols,
        design={c: tuple(float(v) for v in np.unique(data.rows[c])) for c in AXES if c in data.rows},
    )


@dataclass
class _FitData:
    """The trials a law is fitted to: their axis values, scores and log gaps, and notes about them."""

    rows: pd.DataFrame
    held: dict[str, float]
    notes: list[str]
    x: np.ndarray
    d: np.ndarray | None  # demos per pair (joint law only)
    score: np.ndarray
    counts: np.ndarray | None  # rollouts per trial, where known
    gap: np.ndarray
    adjusted: np.ndarray
    y: np.ndarray  # log gap
    keys: np.ndarray  # design point of each trial
    n_design: int


def _fit_data(results: ResultsTable, axis: str, method: str, where: dict[str, float] | None) -> _FitData:
    """Select the trials (other factors held at one value), check there are enough design points, and
    take their gaps (0/1 rule applied)."""
    rows, held, notes = _prepare(results, axis, method, where)
    x = rows[axis].to_numpy(float)
    d = rows["demos_per_pair"].to_numpy(float) if method == "joint" else None
    n_distinct = len(np.unique(x))
    needed = {"loglog": 3, "saturating": 4, "joint": 2}[method]
    if n_distinct < needed:
        raise ResultsError(
            f"{results.source}: {method} fit over {axis} needs at least {needed} distinct values, "
            f"found {n_distinct} ({', '.join(f'{v:g}' for v in np.unique(x))})"
        )
    keys = _design_keys(x, d)
    n_design = int(keys.max()) + 1
    if method == "joint" and n_design < 7:
        raise ResultsError(
            f"{results.source}: the joint law needs at least 7 (x, d) design points, found {n_design}"
        )
    score = rows["score"].to_numpy(float)
    all_counts = results.n_rollouts()
    counts = None if all_counts is None else all_counts[rows.index.to_numpy()]
    gap, adjusted = adjusted_gap(score, counts)
    if len(gap) > n_design:
        notes.append(
            f"fitted on all {len(gap)} trials ({n_design} design points, several trials each), not on means"
        )
    if adjusted.any() and counts is None:
        notes.append("n_rollouts unknown: the 0/1 rule assumed 40 rollouts per trial")
    return _FitData(rows, held, notes, x, d, score, counts, gap, adjusted, np.log(gap), keys, n_design)


@dataclass
class _Estimate:
    """A law's point estimate and how it was made."""

    names: tuple[str, ...]
    point: np.ndarray
    fitted: np.ndarray  # fitted log gap of each trial
    linear_design: np.ndarray  # [1, log x (, log d)]: the OLS design, also for the loglog bootstrap
    model: LawModel | None = None  # None for the loglog OLS
    loss: str | None = None
    scale: float | None = None
    ols: Any = None  # statsmodels results of the loglog fit


def _point_estimate(method: str, data: _FitData, loss: str | None, f_scale: float | None) -> _Estimate:
    """The loglog OLS, or the robust nonlinear fit of the saturating or joint law (noting parameters
    that end at their bounds)."""
    x, d, y = data.x, data.d, data.y
    linear_design = np.column_stack([np.ones(len(y)), np.log(x)] + ([np.log(d)] if d is not None else []))
    if method == "loglog":
        from statsmodels.regression.linear_model import OLS

        ols = OLS(y, linear_design).fit()
        point = np.array([ols.params[1], math.exp(ols.params[0])])
        return _Estimate(("alpha", "beta"), point, ols.fittedvalues, linear_design, ols=ols)
    model = SATURATING if method == "saturating" else JOINT
    linear_residuals = y - linear_design @ np.linalg.lstsq(linear_design, y, rcond=None)[0]
    loss_used = loss or ("soft_l1" if method == "saturating" else "huber")
    scale = float(f_scale) if f_scale is not None else 1.345 * _robust_scale(linear_residuals)
    starts = _saturating_starts(x, y) if method == "saturating" else _joint_starts(x, d, y)
    point = _fit_nonlinear(model, x, d, y, starts, loss_used, scale)
    fitted = model.log_gap_and_jacobian(point[None], x, d)[0][0]
    if method == "saturating" and point[2] >= -1e-6:
        data.notes.append(
            "alpha hit its bound 0: the gap does not fall with x here; E and beta are not identified"
        )
    if point[0] <= 1e-6:
        data.notes.append("E = 0 (its bound): no floor is detected in these data")
    if method == "joint":
        for index, name in ((2, "a"), (4, "b")):
            if point[index] >= model.upper[index] - 1e-6:
                term = "x" if name == "a" else "d"
                data.notes.append(
                    f"{name} hit its bound {model.upper[index]:g}: the {term} term acts as a step and is "
                    "poorly determined by these data (see its interval)"
                )
    return _Estimate(model.param_names, point, fitted, linear_design, model, loss_used, scale)


def _bootstrap_draws(
    method: str,
    data: _FitData,
    estimate: _Estimate,
    results: ResultsTable,
    bootstrap: str,
    n_bootstrap: int,
    seed: int,
) -> tuple[np.ndarray, Any]:
    """Parameter draws refitted on bootstrap replicates (rollouts, trials or residuals; failed
    replicates dropped with a note), and the replicates' description."""
    n = len(data.y)
    has_rollout_info = results.has_rollout_outcomes() or data.counts is not None
    mode = resolve_mode(bootstrap, has_rollout_info, n > data.n_design)
    replicas = resample_scores(
        data.score,
        data.keys,
        mode,
        n_bootstrap,
        seed,
        rollouts=results.rollouts,
        trial_ids=data.rows["trial_id"].to_numpy(),
        n_rollouts=data.counts,
    )
    if replicas.scores is None:
        rng = np.random.default_rng(seed)
        centred = (data.y - estimate.fitted) - np.mean(data.y - estimate.fitted)
        targets = estimate.fitted[None, :] + centred[rng.integers(0, n, size=(n_bootstrap, n))]
    else:
        targets = np.log(adjusted_gap(replicas.scores, data.counts)[0])
    if method == "loglog":
        coefficients = _ols_coefficients(estimate.linear_design, targets)
        draws = np.column_stack([coefficients[:, 1], np.exp(coefficients[:, 0])])
    else:
        starts = np.tile(estimate.point, (n_bootstrap, 1))
        draws = batched_robust_lm(
            estimate.model, starts, data.x, data.d, targets, estimate.loss, estimate.scale
        )
    finite = np.isfinite(draws).all(axis=1)
    if not finite.all():
        data.notes.append(f"{int((~finite).sum())} bootstrap replicate(s) failed and were dropped")
        draws = draws[finite]
    return draws, replicas


def _ols_uncertainty(ols: Any, beta: float, confidence: float) -> tuple[dict[str, float], dict[str, tuple]]:
    """Standard errors and intervals of the loglog law's alpha and beta from the OLS (beta = e^intercept)."""
    se_log_beta, se_alpha = (float(v) for v in ols.bse)
    ci = ols.conf_int(alpha=1 - confidence)
    bse = {"alpha": se_alpha, "beta": beta * se_log_beta}
    conf_int = {"alpha": (float(ci[1, 0]), float(ci[1, 1])), "beta": (math.exp(ci[0, 0]), math.exp(ci[0, 1]))}
    return bse, conf_int


def _leave_one_out(
    method: str,
    model: LawModel | None,
    x: np.ndarray,
    d: np.ndarray | None,
    y: np.ndarray,
    keys: np.ndarray,
    point: np.ndarray,
    loss: str | None,
    scale: float | None,
) -> float:
    """RMSE (log gap) of predicting each design point's mean from a fit without that point."""
    errors = []
    n_params = 2 if model is None else len(model.param_names)
    for key in np.unique(keys):
        keep = keys != key
        if len(np.unique(keys[keep])) < n_params + 1 or len(np.unique(x[keep])) < 2:
            continue
        held_out = ~keep
        if model is None:
            slope, intercept = np.polyfit(np.log(x[keep]), y[keep], 1)
            prediction = intercept + slope * np.log(x[held_out][0])
        else:
            d_keep = None if d is None else d[keep]
            params = _fit_nonlinear(model, x[keep], d_keep, y[keep], [point], loss, scale)
            d_out = None if d is None else d[held_out][:1]
            prediction = model.log_gap_and_jacobian(params[None], x[held_out][:1], d_out)[0][0, 0]
        errors.append(prediction - y[held_out].mean())
    return float(np.sqrt(np.mean(np.square(errors)))) if errors else float("nan")


def compare_laws(
    table: ResultsTable | pd.DataFrame | str | Path,
    axis: str = "n_envs",
    methods: tuple[str, ...] | None = None,
    **fit_kwargs: Any,
) -> pd.DataFrame:
    """Fit each applicable form and return a side-by-side table (one row per method).

    Columns: n_params, n_points, rmse_log, r_squared, r, aic, aicc, bic, loo_rmse, delta_aic (to the
    best comparable form), same_data (AIC is only comparable between fits on the same trials) and
    a note. ``joint`` is included when ``demos_per_pair`` varies (it uses more trials than the
    one-axis forms, so its AIC is not compared; its LOO error is shown for reference).
    """
    results = as_results_table(table, fit_kwargs.pop("rollouts", None))
    if methods is None:
        methods = ("loglog", "saturating")
        if "demos_per_pair" in results.trials and results.trials["demos_per_pair"].nunique() >= 2:
            if axis not in ("demos_per_pair", "total_demos"):
                methods += ("joint",)
    rows = []
    reference_points = None
    for method in methods:
        try:
            fit = fit_law(results, axis=axis, method=method, **fit_kwargs)
        except (ResultsError, RuntimeError) as error:
            rows.append({"method": method, "note": f"not fitted: {error}"})
            continue
        if reference_points is None:
            reference_points = fit.n_points
        rows.append(
            {
                "method": method,
                "n_params": len(fit.params),
                "n_points": fit.n_points,
                "rmse_log": fit.rmse_log,
                "r_squared": fit.r_squared,
                "r": fit.r,
                "aic": fit.aic,
                "aicc": fit.aicc,
                "bic": fit.bic,
                "loo_rmse": fit.loo_rmse,
                "same_data": fit.n_points == reference_points and method != "joint",
                "note": fit.equation_text(),
            }
        )
    frame = pd.DataFrame(rows)
    if "aic" in frame and frame["same_data"].fillna(False).any():
        comparable = frame["same_data"].fillna(False).astype(bool)
        best = frame.loc[comparable, "aic"].min()
        frame["delta_aic"] = np.where(comparable, frame["aic"] - best, np.nan)
    frame.attrs["axis"] = axis
    return frame.set_index("method")
