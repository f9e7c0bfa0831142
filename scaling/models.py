"""The non-linear law forms, their Jacobians on the log scale, and a batched robust solver.

Both forms are fitted on log values: a residual is ``log(model gap) - log(observed gap)``, as in the
log-log method, so that relative (not absolute) misfit counts and the forms are comparable by AIC.
The point estimate uses ``scipy.optimize.least_squares``; the bootstrap refits thousands of replicates
at once with :func:`batched_robust_lm`, a Levenberg-Marquardt iteration on the same robust objective
vectorised over replicates (agreement with ``least_squares`` is tested).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

_TINY = 1e-300


@dataclass(frozen=True)
class LawModel:
    """A law ``gap = f(params; x, d)`` with box bounds, evaluated for many parameter rows at once."""

    name: str
    param_names: tuple[str, ...]
    lower: np.ndarray
    upper: np.ndarray
    equation: str
    _terms: Callable[[np.ndarray, np.ndarray, np.ndarray | None], tuple[np.ndarray, np.ndarray]]

    def gap(self, params: np.ndarray, x: np.ndarray, d: np.ndarray | None = None) -> np.ndarray:
        """Model gap, shape ``(n_rows, n_points)`` for params of shape ``(n_rows, k)``."""
        return self._terms(np.atleast_2d(params), np.asarray(x, float), d)[0]

    def log_gap_and_jacobian(
        self, params: np.ndarray, x: np.ndarray, d: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """``log gap`` (B, n) and its Jacobian with respect to the parameters (B, n, k)."""
        gap, gap_jacobian = self._terms(np.atleast_2d(params), np.asarray(x, float), d)
        gap = np.maximum(gap, _TINY)
        return np.log(gap), gap_jacobian / gap[..., None]


def _saturating_terms(
    params: np.ndarray, x: np.ndarray, d: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    floor, beta, alpha = (params[:, i : i + 1] for i in range(3))
    log_x = np.log(x)[None, :]
    power = np.exp(alpha * log_x)
    gap = floor + beta * power
    jacobian = np.stack(np.broadcast_arrays(np.ones_like(gap), power, beta * power * log_x), axis=-1)
    return gap, jacobian


def _joint_terms(params: np.ndarray, x: np.ndarray, d: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    if d is None:
        raise ValueError("the joint law needs demos per pair (d) as well as x")
    floor, a_coef, a_exp, b_coef, b_exp = (params[:, i : i + 1] for i in range(5))
    log_x = np.log(x)[None, :]
    log_d = np.log(np.asarray(d, float))[None, :]
    x_term = np.exp(-a_exp * log_x)
    d_term = np.exp(-b_exp * log_d)
    gap = floor + a_coef * x_term + b_coef * d_term
    parts = (np.ones_like(gap), x_term, -a_coef * x_term * log_x, d_term, -b_coef * d_term * log_d)
    return gap, np.stack(np.broadcast_arrays(*parts), axis=-1)


SATURATING = LawModel(
    name="saturating",
    param_names=("E", "beta", "alpha"),
    lower=np.array([0.0, 1e-9, -5.0]),
    upper=np.array([1.0, 1e3, 0.0]),
    equation="1 - score = E + beta * x^alpha",
    _terms=_saturating_terms,
)
JOINT = LawModel(
    name="joint",
    param_names=("E", "A", "a", "B", "b"),
    lower=np.array([0.0, 0.0, 0.0, 0.0, 0.0]),
    upper=np.array([1.0, 1e3, 4.0, 1e3, 4.0]),
    equation="1 - score = E + A * x^-a + B * d^-b",
    _terms=_joint_terms,
)


def robust_rho(z: np.ndarray, loss: str) -> tuple[np.ndarray, np.ndarray]:
    """Robust loss ``rho(z)`` and ``rho'(z)`` of squared scaled residuals, as in ``least_squares``."""
    if loss == "soft_l1":
        root = np.sqrt(1.0 + z)
        return 2.0 * (root - 1.0), 1.0 / root
    if loss == "huber":
        root = np.sqrt(np.maximum(z, 1e-300))
        small = z <= 1.0
        return np.where(small, z, 2.0 * root - 1.0), np.where(small, 1.0, 1.0 / root)
    if loss == "linear":
        return z, np.ones_like(z)
    raise ValueError(f"loss {loss!r} unknown (soft_l1, huber, linear)")


def robust_cost(residuals: np.ndarray, loss: str, f_scale: float) -> np.ndarray:
    """The objective ``least_squares`` minimises (up to its factor 1/2), per row."""
    rho, _ = robust_rho((residuals / f_scale) ** 2, loss)
    return (f_scale**2 * rho).sum(axis=-1)


def batched_robust_lm(
    model: LawModel,
    start: np.ndarray,
    x: np.ndarray,
    d: np.ndarray | None,
    targets: np.ndarray,
    loss: str,
    f_scale: float,
    max_iter: int = 60,
    tol: float = 1e-9,
) -> np.ndarray:
    """Minimise the robust log-scale objective for every row of ``targets`` (B, n) at once.

    Levenberg-Marquardt with iteratively reweighted Gauss-Newton steps, parameters clipped to the
    model's bounds and parameters held at an active bound frozen for the step. Returns (B, k).
    """
    lower, upper = model.lower, model.upper
    params = np.clip(np.array(start, dtype=float), lower, upper)
    n_rows, k = params.shape
    damping = np.full(n_rows, 1e-3)
    log_gap, jacobian = model.log_gap_and_jacobian(params, x, d)
    cost = robust_cost(log_gap - targets, loss, f_scale)
    active = np.ones(n_rows, dtype=bool)
    eye = np.eye(k)
    for _ in range(max_iter):
        if not active.any():
            break
        rows = np.flatnonzero(active)
        residuals = log_gap[rows] - targets[rows]
        _, weights = robust_rho((residuals / f_scale) ** 2, loss)
        jac = jacobian[rows]
        gradient = np.einsum("bn,bn,bnk->bk", weights, residuals, jac)
        hessian = np.einsum("bn,bnk,bnl->bkl", weights, jac, jac)
        p = params[rows]
        frozen = ((p <= lower + 1e-12) & (gradient > 0)) | ((p >= upper - 1e-12) & (gradient < 0))
        gradient = np.where(frozen, 0.0, gradient)
        keep = (~frozen)[:, :, None] & (~frozen)[:, None, :]
        diagonal = np.einsum("bkk->bk", hessian)
        damped = (
            np.where(keep, hessian, 0.0)
            + eye * (damping[rows, None] * np.maximum(diagonal, 1e-12) + frozen + 1e-12)[:, None, :]
        )
        step = -np.linalg.solve(damped, gradient[..., None])[..., 0]
        candidate = np.clip(p + step, lower, upper)
        new_log_gap, new_jacobian = model.log_gap_and_jacobian(candidate, x, d)
        new_cost = robust_cost(new_log_gap - targets[rows], loss, f_scale)
        better = np.isfinite(new_cost) & (new_cost < cost[rows])
        moved = np.abs(candidate - p).max(axis=1) / (1.0 + np.abs(p).max(axis=1))
        gained = (cost[rows] - new_cost) / np.maximum(cost[rows], 1e-300)
        upd = rows[better]
        params[upd], log_gap[upd], jacobian[upd], cost[upd] = (
            candidate[better],
            new_log_gap[better],
            new_jacobian[better],
            new_cost[better],
        )
        damping[rows] = np.where(better, damping[rows] / 3.0, damping[rows] * 5.0)
        done = (better & ((moved < tol) | (gained < tol))) | (damping[rows] > 1e10)
        active[rows[done]] = False
    return params
