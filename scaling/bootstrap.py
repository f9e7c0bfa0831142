"""Bootstrap replicates of trial scores: resampling rollouts within trials, trials within design points.

A score from 40 rollouts is itself uncertain, and so is the training seed behind a trial. The
replicates built here are a matrix ``(n_bootstrap, n_trials)`` of scores; every law is refitted on
each row, so intervals carry both sources of noise. Modes:

- ``"rollouts"``: each trial keeps its place; its score is recomputed from a resample (with
  replacement, same size) of its own rollouts. Without a rollouts table, a trial with a known
  ``n_rollouts`` gets a parametric draw ``Binomial(n, score) / n`` instead.
- ``"trials"``: trials are resampled with replacement within each design point (the same axis
  values), so the design is kept and no replicate loses an axis value.
- ``"both"``: trials within design points, then rollouts within each drawn trial (two-stage).
- ``"residuals"``: for tables with one trial per design point and no rollout information; the
  fit's log-scale residuals are resampled and added to the fitted values (done by the fit).
- ``"auto"``: with rollout information, ``"both"`` when some design point has several trials and
  ``"rollouts"`` otherwise; without it, ``"trials"`` when some design point has several trials, else
  ``"residuals"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from demoscale.scaling.names import BOOTSTRAP_MODES


@dataclass(frozen=True, eq=False)
class Resamples:
    """Bootstrap replicates of the trial scores (``scores`` is None for the residual mode)."""

    scores: np.ndarray | None
    mode: str
    description: str


def resolve_mode(mode: str, has_rollout_info: bool, has_repeats: bool) -> str:
    """Turn ``"auto"`` into a concrete mode; reject unknown names."""
    if mode not in BOOTSTRAP_MODES:
        raise ValueError(f"bootstrap mode {mode!r} unknown; choose one of {BOOTSTRAP_MODES}")
    if mode != "auto":
        return mode
    if has_rollout_info:
        return "both" if has_repeats else "rollouts"
    return "trials" if has_repeats else "residuals"


def _rollout_means(
    rng: np.random.Generator,
    n_bootstrap: int,
    trial_index: int,
    scores: np.ndarray,
    rollout_scores: dict[int, np.ndarray],
    n_rollouts: np.ndarray | None,
) -> np.ndarray:
    """``n_bootstrap`` rollout-resampled scores of one trial (its score repeated if nothing is known)."""
    outcomes = rollout_scores.get(trial_index)
    if outcomes is not None and len(outcomes):
        draws = rng.integers(0, len(outcomes), size=(n_bootstrap, len(outcomes)))
        return outcomes[draws].mean(axis=1)
    if n_rollouts is not None and np.isfinite(n_rollouts[trial_index]):
        n = int(n_rollouts[trial_index])
        return rng.binomial(n, scores[trial_index], size=n_bootstrap) / n
    return np.full(n_bootstrap, scores[trial_index])


def resample_scores(
    scores: np.ndarray,
    strata: np.ndarray,
    mode: str,
    n_bootstrap: int,
    seed: int,
    rollouts: pd.DataFrame | None = None,
    trial_ids: np.ndarray | None = None,
    n_rollouts: np.ndarray | None = None,
) -> Resamples:
    """Replicate trial scores; ``strata`` labels each trial's design point (trials share a stratum
    when all their axis values are equal). ``mode`` must already be resolved (not ``"auto"``)."""
    scores = np.asarray(scores, dtype=float)
    if mode == "residuals":
        return Resamples(
            None, mode, "log-scale residuals of the fit resampled (one trial per point, no rollouts)"
        )
    rng = np.random.default_rng(seed)
    n_trials = len(scores)
    rollout_scores: dict[int, np.ndarray] = {}
    if rollouts is not None and trial_ids is not None:
        position = {tid: i for i, tid in enumerate(trial_ids)}
        for tid, group in rollouts.groupby("trial_id", sort=False):
            if tid in position:
                rollout_scores[position[tid]] = group["score"].to_numpy(dtype=float)

    if mode == "rollouts":
        out = np.empty((n_bootstrap, n_trials))
        for i in range(n_trials):
            out[:, i] = _rollout_means(rng, n_bootstrap, i, scores, rollout_scores, n_rollouts)
        source = "rollout tables" if rollout_scores else "binomial draws from n_rollouts"
        return Resamples(out, mode, f"rollouts resampled within each trial ({source})")

    out = np.empty((n_bootstrap, n_trials))
    for stratum in np.unique(strata):
        members = np.flatnonzero(strata == stratum)
        picks = rng.integers(0, len(members), size=(n_bootstrap, len(members)))
        if mode == "trials":
            out[:, members] = scores[members][picks]
            continue
        if mode != "both":
            raise ValueError(f"bootstrap mode {mode!r} unknown")
        # Two-stage: every slot gets its own rollout resample of whichever trial it drew.
        for slot, target in enumerate(members):
            column = np.empty(n_bootstrap)
            for choice, source_trial in enumerate(members):
                chosen = picks[:, slot] == choice
                if chosen.any():
                    column[chosen] = _rollout_means(
                        rng, n_bootstrap, source_trial, scores, rollout_scores, n_rollouts
                    )[chosen]
            out[:, target] = column
    description = {
        "trials": "trials resampled within each design point",
        "both": "trials resampled within each design point, then rollouts within each drawn trial",
    }[mode]
    return Resamples(out, mode, description)


def bias_corrected_interval(
    draws: np.ndarray, estimate: np.ndarray, confidence: float
) -> tuple[np.ndarray, np.ndarray]:
    """Bias-corrected percentile (BC) interval of bootstrap ``draws`` (B, m) around ``estimate`` (m,).

    The percentiles are shifted by the bootstrap's median bias, ``z0 = Phi^-1(share of draws below
    the estimate)`` (ties count half), to ``Phi(2 z0 -+ z)``. With ``z0 = 0`` this is the plain
    percentile interval. Returns (low, high), each of shape (m,).
    """
    from scipy.special import ndtr, ndtri

    draws = np.asarray(draws, float)
    if draws.ndim == 1:
        draws = draws[:, None]
    estimate = np.broadcast_to(np.asarray(estimate, float), draws.shape[1:])
    n_draws = draws.shape[0]
    below = (draws < estimate).mean(axis=0) + 0.5 * (draws == estimate).mean(axis=0)
    z0 = ndtri(np.clip(below, 1.0 / (n_draws + 1), n_draws / (n_draws + 1)))
    z = ndtri((1 + confidence) / 2)
    ordered = np.sort(draws, axis=0)
    columns = np.arange(draws.shape[1])

    def quantile(level: np.ndarray) -> np.ndarray:
        position = np.clip(level, 0.0, 1.0) * (n_draws - 1)
        lower = np.floor(position).astype(int)
        upper = np.minimum(lower + 1, n_draws - 1)
        weight = position - lower
        return ordered[lower, columns] * (1 - weight) + ordered[upper, columns] * weight

    return quantile(ndtr(2 * z0 - z)), quantile(ndtr(2 * z0 + z))


def percentile_interval(draws: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Plain percentile interval of bootstrap ``draws`` (B, m): (low, high), each of shape (m,)."""
    draws = np.asarray(draws, float)
    if draws.ndim == 1:
        draws = draws[:, None]
    low, high = np.quantile(draws, [(1 - confidence) / 2, (1 + confidence) / 2], axis=0)
    return low, high


def bootstrap_interval(
    kind: str, draws: np.ndarray, estimate: np.ndarray, confidence: float
) -> tuple[np.ndarray, np.ndarray]:
    """``"bc"`` (bias-corrected percentile) or ``"percentile"`` interval of bootstrap draws."""
    if kind == "bc":
        return bias_corrected_interval(draws, estimate, confidence)
    if kind == "percentile":
        return percentile_interval(draws, confidence)
    raise ValueError(f"bootstrap interval kind {kind!r} unknown (bc, percentile)")


def mean_difference_interval(
    arm: Sequence[np.ndarray],
    reference: Sequence[np.ndarray],
    confidence: float,
    draws: int = 4000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """The difference of pooled mean outcomes (``arm`` minus ``reference``), with a two-stage
    bootstrap percentile interval at ``confidence``: each draw resamples each side's seeds (its
    per-seed arrays of rollout outcomes, when it has several), then the rollouts of every drawn
    seed. Returns (difference, low, high)."""
    arm = [np.asarray(values, float) for values in arm]
    reference = [np.asarray(values, float) for values in reference]
    if not arm or not reference or any(v.size == 0 for v in (*arm, *reference)):
        raise ValueError("both sides need at least one seed with at least one rollout")
    rng = np.random.default_rng(seed)

    def draw(groups: list[np.ndarray]) -> float:
        chosen = [groups[i] for i in rng.integers(0, len(groups), len(groups))]
        return float(np.concatenate([v[rng.integers(0, v.size, v.size)] for v in chosen]).mean())

    differences = np.array([draw(arm) - draw(reference) for _ in range(draws)])
    low, high = np.quantile(differences, [(1 - confidence) / 2, (1 + confidence) / 2])
    estimate = float(np.concatenate(arm).mean() - np.concatenate(reference).mean())
    return estimate, float(low), float(high)
