"""Where the next rollouts should go: the points whose noise most blurs the law's prediction.

A fitted log-log law ``log(1 - score) = log(beta) + alpha * log(x)`` predicts the score at a count
``at`` (the recommended plan's, say) as a weighted sum of the points' log gaps: OLS gives each point
``i`` a weight ``h_i``, so the rollout noise of the points reaches the prediction as
``sum_i h_i^2 var(y_i)``, with ``var(y_i)`` the variance of point ``i``'s mean score over its
``n_i`` rollouts on the log-gap scale (delta method). A round of ``r`` more rollouts on point ``i``
removes ``h_i^2 var_1(y_i) (1 / n_i - 1 / (n_i + r))`` of it; :func:`next_round` picks the point
where that is largest. Far outside the tested range the end points carry the largest weights, and a
noisy point near the end carries the most.

This is the measurement-noise share of the prediction's uncertainty only (the trials' own scatter
about the law is not reduced by more rollouts); it ranks points, it does not promise an interval.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["next_round", "prediction_noise_gains"]


def _log_gap_variance(scores: np.ndarray) -> float:
    """Variance of one rollout's contribution to the point's log gap ``log(1 - mean score)``.

    Scores of 0..1 (success or staged score). The mean is shrunk towards 1/2 by half a rollout each
    way, so that a point with every rollout failed (or succeeded) still has a finite, positive
    variance, as its interval does."""
    n = len(scores)
    mean = (float(np.sum(scores)) + 0.5) / (n + 1)
    spread = float(np.var(scores, ddof=1)) if n > 1 else 0.0
    spread = max(spread, mean * (1 - mean) / (n + 1))
    return spread / (1 - mean) ** 2


def prediction_noise_gains(
    counts: Sequence[float], scores: Sequence[Sequence[float]], at: float, round_size: int
) -> np.ndarray:
    """Per point, how much ``round_size`` more rollouts would shrink the rollout-noise variance of
    the log-log law's predicted log gap at count ``at`` (see the module note).

    ``counts`` are the points' x (several points may share one, e.g. seeds), ``scores`` each
    point's rollout scores so far (at least one each)."""
    x = np.log(np.asarray(counts, dtype=float))
    if len(x) != len(scores):
        raise ValueError(f"{len(x)} counts but {len(scores)} score lists")
    if len(np.unique(x)) < 2:
        raise ValueError("a law needs at least two distinct counts")
    if any(len(s) == 0 for s in scores):
        raise ValueError("every point needs at least one rollout")
    if round_size < 1:
        raise ValueError(f"round_size must be at least 1, got {round_size}")
    design = np.column_stack([np.ones_like(x), x])
    weights = np.array([1.0, np.log(at)]) @ np.linalg.pinv(design)  # h: prediction = h @ y
    n = np.array([len(s) for s in scores], dtype=float)
    per_rollout = np.array([_log_gap_variance(np.asarray(s, dtype=float)) for s in scores])
    return weights**2 * per_rollout * (1 / n - 1 / (n + round_size))


def next_round(
    counts: Sequence[float],
    scores: Sequence[Sequence[float]],
    at: float,
    round_size: int,
    eligible: Sequence[bool] | None = None,
) -> int | None:
    """Index of the point whose next ``round_size`` rollouts most sharpen the prediction at ``at``,
    among the ``eligible`` ones (default all); None when none is."""
    gains = prediction_noise_gains(counts, scores, at, round_size)
    if eligible is not None:
        gains = np.where(np.asarray(eligible, dtype=bool), gains, -np.inf)
    if not np.isfinite(gains).any():
        return None
    return int(np.argmax(gains))
