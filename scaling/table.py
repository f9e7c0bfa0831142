"""Reading and checking results tables (one row per trial) and rollout tables (one row per rollout).

The schema is described in ``scaling/README.md``. Everything downstream works on a
:class:`ResultsTable`, which holds both tables after validation, with derived columns filled in
(``n_pairs`` from ``n_envs * n_objects``, ``total_demos`` from ``n_pairs * demos_per_pair``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from demoscale.scaling.names import AXES

AXIS_LABELS: dict[str, str] = {
    "n_envs": "training environments",
    "n_objects": "objects per environment",
    "n_pairs": "environment-object pairs",
    "demos_per_pair": "demonstrations per pair",
    "total_demos": "total demonstrations",
}
# When fitting over one axis, these other factors are held at one value (see ``select_slice``).
CONTROLS: dict[str, tuple[str, ...]] = {
    "n_envs": ("n_objects", "demos_per_pair"),
    "n_objects": ("n_envs", "demos_per_pair"),
    "n_pairs": ("demos_per_pair",),
    "demos_per_pair": ("n_pairs",),
    "total_demos": ("n_pairs",),
}
# Used by the 0/1 rule when a trial does not say how many rollouts its score came from
# (the scaling-laws study evaluated every policy with 40 rollouts).
DEFAULT_N_ROLLOUTS = 40


class ResultsError(ValueError):
    """A results or rollouts table is missing a column or holds values a fit cannot use."""


@dataclass(frozen=True, eq=False)
class ResultsTable:
    """A validated results table and, when available, its per-rollout outcomes.

    ``trials`` has one row per trial with a unique string ``trial_id``, a ``score`` in [0, 1] and
    positive axis columns; ``rollouts`` (or None) has ``trial_id`` and ``score`` per rollout.
    """

    trials: pd.DataFrame
    rollouts: pd.DataFrame | None = None
    source: str = "<DataFrame>"

    @property
    def axes_present(self) -> list[str]:
        """Axis columns that take at least two distinct values (the ones a law can be fitted over)."""
        return [a for a in AXES if a in self.trials and self.trials[a].nunique() >= 2]

    def has_rollout_outcomes(self) -> bool:
        return self.rollouts is not None and len(self.rollouts) > 0

    def n_rollouts(self) -> np.ndarray | None:
        """Rollouts behind each trial's score (float array, NaN where unknown) or None if never known."""
        counts = pd.Series(np.nan, index=self.trials.index, dtype=float)
        if "n_rollouts" in self.trials:
            counts = self.trials["n_rollouts"].astype(float)
        if self.has_rollout_outcomes():
            per_trial = self.rollouts.groupby("trial_id").size()
            from_rollouts = self.trials["trial_id"].map(per_trial).astype(float)
            counts = counts.where(counts.notna(), from_rollouts)
        return None if counts.isna().all() else counts.to_numpy(dtype=float)


def _read_table(path: Path) -> pd.DataFrame:
    suffix = path.suffix.lower()
    if not path.exists():
        raise ResultsError(f"{path}: file not found")
    if suffix == ".csv":
        return pd.read_csv(path)
    if suffix in {".parquet", ".pq"}:
        return pd.read_parquet(path)
    raise ResultsError(f"{path}: unsupported table format {suffix!r} (use .csv or .parquet)")


def _rows_text(frame: pd.DataFrame, mask: np.ndarray, limit: int = 5) -> str:
    rows = frame.loc[mask]
    ids = rows["trial_id"] if "trial_id" in rows else rows.index
    shown = ", ".join(str(v) for v in list(ids)[:limit])
    more = f" and {len(rows) - limit} more" if len(rows) > limit else ""
    return shown + more


def _validate_trials(frame: pd.DataFrame, source: str) -> pd.DataFrame:
    frame = frame.copy()
    if "score" not in frame:
        if "success_rate" in frame:
            frame["score"] = frame["success_rate"]
        else:
            raise ResultsError(
                f"{source}: no 'score' column (nor 'success_rate'); columns are {list(frame.columns)}"
            )
    if "trial_id" not in frame:
        frame["trial_id"] = [f"row{i}" for i in range(len(frame))]
    frame["trial_id"] = frame["trial_id"].astype(str)
    duplicated = frame["trial_id"].duplicated(keep=False).to_numpy()
    if duplicated.any():
        raise ResultsError(f"{source}: duplicate trial_id values: {_rows_text(frame, duplicated)}")
    score = pd.to_numeric(frame["score"], errors="coerce")
    bad = (score.isna() | (score < 0) | (score > 1)).to_numpy()
    if bad.any():
        raise ResultsError(
            f"{source}: column 'score' must be a number in [0, 1]; bad value in trial(s) {_rows_text(frame, bad)}"
        )
    frame["score"] = score.astype(float)

    # Fill derived axes so that a table written with only the independent factors still works.
    if "n_pairs" not in frame and {"n_envs", "n_objects"} <= set(frame):
        frame["n_pairs"] = frame["n_envs"] * frame["n_objects"]
    if "total_demos" not in frame and {"n_pairs", "demos_per_pair"} <= set(frame):
        frame["total_demos"] = frame["n_pairs"] * frame["demos_per_pair"]
    present = [a for a in AXES if a in frame]
    if not present:
        raise ResultsError(f"{source}: no axis column; expected at least one of {list(AXES)}")
    for axis in present:
        values = pd.to_numeric(frame[axis], errors="coerce")
        bad = (values.isna() | (values <= 0)).to_numpy()
        if bad.any():
            raise ResultsError(
                f"{source}: axis column {axis!r} must be a positive number; bad value in trial(s) "
                f"{_rows_text(frame, bad)}"
            )
        frame[axis] = values.astype(float)
    if "n_rollouts" in frame:
        counts = pd.to_numeric(frame["n_rollouts"], errors="coerce")
        bad = (counts.notna() & (counts < 1)).to_numpy()
        if bad.any():
            raise ResultsError(
                f"{source}: 'n_rollouts' must be >= 1; bad value in trial(s) {_rows_text(frame, bad)}"
            )
        frame["n_rollouts"] = counts.astype(float)
    return frame.reset_index(drop=True)


def _validate_rollouts(rollouts: pd.DataFrame, trials: pd.DataFrame, source: str) -> pd.DataFrame:
    rollouts = rollouts.copy()
    if "trial_id" not in rollouts:
        raise ResultsError(
            f"{source}: rollouts table needs a 'trial_id' column; columns are {list(rollouts.columns)}"
        )
    if "score" not in rollouts:
        if "success" not in rollouts:
            raise ResultsError(f"{source}: rollouts table needs a 'score' (or 'success') column")
        rollouts["score"] = rollouts["success"].astype(float)
    rollouts["trial_id"] = rollouts["trial_id"].astype(str)
    score = pd.to_numeric(rollouts["score"], errors="coerce")
    bad = (score.isna() | (score < 0) | (score > 1)).to_numpy()
    if bad.any():
        rows = ", ".join(str(i) for i in np.flatnonzero(bad)[:5])
        raise ResultsError(
            f"{source}: rollout 'score' must be a number in [0, 1]; bad value at row(s) {rows}"
        )
    rollouts["score"] = score.astype(float)
    unknown = sorted(set(rollouts["trial_id"]) - set(trials["trial_id"]))
    if unknown:
        raise ResultsError(
            f"{source}: rollouts refer to trial_id(s) missing from the results table: {unknown[:5]}"
        )
    return rollouts.reset_index(drop=True)


def _sibling_rollouts(path: Path) -> Path | None:
    for name in ("rollouts.parquet", "rollouts.csv"):
        candidate = path.with_name(name)
        if candidate.exists() and candidate != path:
            return candidate
    return None


def load_results(
    path: str | Path | pd.DataFrame,
    rollouts: str | Path | pd.DataFrame | None = None,
    find_rollouts: bool = True,
) -> ResultsTable:
    """Read and validate a results table (CSV or Parquet) and its optional per-rollout table.

    ``rollouts`` may be a path or a DataFrame; when omitted and ``find_rollouts`` is true, a
    ``rollouts.parquet`` or ``rollouts.csv`` next to the results file is used. Raises
    :class:`ResultsError` naming the file, the column and the trial(s) when something is wrong.
    """
    if isinstance(path, pd.DataFrame):
        frame, source, results_path = path, "<DataFrame>", None
    else:
        results_path = Path(path)
        frame, source = _read_table(results_path), str(results_path)
    trials = _validate_trials(frame, source)

    rollout_frame, rollout_source = None, None
    if isinstance(rollouts, pd.DataFrame):
        rollout_frame, rollout_source = rollouts, "<rollouts DataFrame>"
    elif rollouts is not None:
        rollout_frame, rollout_source = _read_table(Path(rollouts)), str(rollouts)
    elif find_rollouts and results_path is not None:
        sibling = _sibling_rollouts(results_path)
        if sibling is not None:
            rollout_frame, rollout_source = _read_table(sibling), str(sibling)
    if rollout_frame is not None:
        rollout_frame = _validate_rollouts(rollout_frame, trials, rollout_source)
    return ResultsTable(trials=trials, rollouts=rollout_frame, source=source)


def as_results_table(
    table: ResultsTable | pd.DataFrame | str | Path, rollouts: str | Path | pd.DataFrame | None = None
) -> ResultsTable:
    """Accept a :class:`ResultsTable`, a DataFrame or a path; attach ``rollouts`` when given."""
    if isinstance(table, ResultsTable):
        if rollouts is None:
            return table
        return load_results(table.trials, rollouts=rollouts)
    return load_results(table, rollouts=rollouts)


def adjusted_gap(score: np.ndarray, n_rollouts: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Optimality gap ``1 - score`` with the 0/1 rule applied; returns (gap, adjusted_mask).

    A gap of exactly 0 (score 1) or exactly 1 (score 0) is replaced by ``(k + 0.5) / (n + 1)``
    with ``k = n * gap`` failures out of ``n`` rollouts (``n`` = the trial's ``n_rollouts``, or
    ``DEFAULT_N_ROLLOUTS`` where unknown): 0.5 / (n + 1) and (n + 0.5) / (n + 1). Every other gap is
    used as it is, so interior points follow the study's method exactly and no log of zero is taken.
    Works elementwise on arrays of any shape whose last axis runs over trials.
    """
    score = np.asarray(score, dtype=float)
    gap = 1.0 - score
    if n_rollouts is None:
        n = np.full(score.shape[-1], float(DEFAULT_N_ROLLOUTS))
    else:
        n = np.where(np.isfinite(n_rollouts), n_rollouts, DEFAULT_N_ROLLOUTS).astype(float)
    n = np.broadcast_to(n, gap.shape)
    boundary = (gap <= 0.0) | (gap >= 1.0)
    replaced = (np.clip(gap, 0.0, 1.0) * n + 0.5) / (n + 1.0)
    return np.where(boundary, replaced, gap), boundary


def select_slice(
    trials: pd.DataFrame, axis: str, where: dict[str, float] | None = None, free: tuple[str, ...] = ()
) -> tuple[pd.DataFrame, dict[str, float], list[str]]:
    """Rows used for a one-axis law: the other factors held at one value each.

    Returns (rows, held, notes). ``where`` fixes factors explicitly. Otherwise, for each control
    factor of ``axis`` (see ``CONTROLS``) that varies in the table, the value that leaves the most
    distinct axis values is kept (ties: the largest, i.e. the most data, as the study did).
    Factors in ``free`` are left to vary (the joint law's second axis).
    """
    if axis not in trials:
        raise ResultsError(
            f"axis {axis!r} is not a column of the results table; present: {[a for a in AXES if a in trials]}"
        )
    rows = trials
    held: dict[str, float] = {}
    notes: list[str] = []
    for column, value in (where or {}).items():
        if column not in rows:
            raise ResultsError(f"where: column {column!r} is not in the results table")
        rows = rows[np.isclose(rows[column].astype(float), float(value))]
        held[column] = float(value)
        if rows.empty:
            raise ResultsError(f"where: no trial has {column} = {value}")
    for control in CONTROLS.get(axis, ()):
        if control in free:
            continue
        if control in held or control not in rows or rows[control].nunique() <= 1:
            if control in rows and control not in held and len(rows):
                held[control] = float(rows[control].iloc[0])
            continue
        spread = rows.groupby(control)[axis].nunique()
        best = max(spread.index, key=lambda v: (spread[v], v))
        rows = rows[rows[control] == best]
        held[control] = float(best)
        notes.append(f"{control} varies in the table; held at {best:g} (leaves {spread[best]} {axis} values)")
    return rows, held, notes
