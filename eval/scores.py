"""Import a lab's own real-robot rollout results into the results-table shape.

Input: a CSV with one row per real-robot rollout. Columns (names are case-sensitive):

==================  ========  =================================================================
column              required  meaning
==================  ========  =================================================================
``run_id``          yes       the trained policy / data configuration the rollout belongs to
``n_envs``          yes       training environments of that run
``n_objects``       yes       training objects per environment of that run
``demos_per_pair``  yes       demonstrations per (environment, object) pair of that run
``env_id``          yes       the evaluation environment of this rollout
``object_id``       yes       the evaluation object of this rollout
``score``           one of    the rollout's score: in [0, 1], or raw points with ``max_score``
``stage_<k>``       one of    per-stage points (e.g. ``stage_1``..``stage_3``); their sum is the score
``max_score``       no        the maximum score (default 1 for ``score``, the number of stage columns
                              for stage points); scores are divided by it
``success``         no        1/0, true/false, yes/no; default: normalised score == 1
``policy``          no        policy family name (default ``real``)
``seed``            no        training seed of the run (default 0)
``rollout_index``   no        index within the run (default: order in the file)
``n_pairs``, ``total_demos``, ``checkpoint``, ``train_steps``, ``steps``: carried over when present
==================  ========  =================================================================

Output: ``results.csv`` (one row per run: trial_id, policy, n_envs, n_objects, n_pairs,
demos_per_pair, total_demos, seed, score, score_ci_low, score_ci_high, success_rate,
success_ci_low, success_ci_high, confidence, n_rollouts, env_ids, object_ids, train_steps,
samples_seen, wall_time_s, checkpoint; both intervals are Wilson intervals at ``confidence``, see
:func:`demoscale.eval.rollout.mean_interval`; the id lists are JSON lists of strings) and ``rollouts.csv`` (trial_id, rollout_index, env_id, object_id, seed,
score, success, steps, + ``stage_<k>`` columns).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd
from demoscale import DEFAULT_CONFIDENCE
from demoscale.eval.rollout import mean_interval, wilson_interval

# ``confidence`` is the level of both intervals of the row (score and success rate).
RESULT_COLUMNS = [
    "trial_id", "policy", "n_envs", "n_objects", "n_pairs", "demos_per_pair", "total_demos", "seed",
    "score", "score_ci_low", "score_ci_high", "success_rate", "success_ci_low", "success_ci_high",
    "confidence", "n_rollouts", "env_ids", "object_ids", "train_steps", "samples_seen", "wall_time_s",
    "attempts", "checkpoint",
]  # fmt: skip
ROLLOUT_COLUMNS = ["trial_id", "rollout_index", "env_id", "object_id", "seed", "score", "success", "steps"]
REQUIRED = ["run_id", "n_envs", "n_objects", "demos_per_pair", "env_id", "object_id"]
_STAGE = re.compile(r"^stage_(\d+)$")
_TRUE = {"1", "true", "yes", "y", "t", "success", "1.0"}
_FALSE = {"0", "false", "no", "n", "f", "failure", "fail", "0.0"}


class ScoreFileError(ValueError):
    """A score file that cannot be imported; the message names the file, column and row."""


def _parse_success(values: pd.Series, path: str) -> pd.Series:
    parsed = []
    for row, value in values.items():
        text = str(value).strip().lower()
        if text in _TRUE:
            parsed.append(True)
        elif text in _FALSE:
            parsed.append(False)
        else:
            raise ScoreFileError(
                f"{path}: column 'success', row {row + 2}: {value!r} is not 1/0/true/false/yes/no"
            )
    return pd.Series(parsed, index=values.index)


def _numeric(
    frame: pd.DataFrame, column: str, path: str, *, integer: bool = False, minimum: float | None = None
) -> pd.Series:
    """A column as finite numbers (integers, at least ``minimum``, when asked); errors name the row."""
    values = pd.to_numeric(frame[column], errors="coerce")
    checks = [
        (values.isna(), "is not a number"),
        (~np.isfinite(values.fillna(0).to_numpy(dtype=float)), "is not a finite number"),
    ]
    if integer:
        checks.append((values.fillna(0) != np.round(values.fillna(0)), "is not a whole number"))
    if minimum is not None:
        checks.append((values.fillna(minimum) < minimum, f"is below {minimum:g}"))
    for bad, problem in checks:
        bad = np.asarray(bad, dtype=bool)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise ScoreFileError(
                f"{path}: column {column!r}, row {row + 2}: {frame[column].iloc[row]!r} {problem}"
            )
    return values


# A cell a spreadsheet would run as a formula when results.csv is opened (CSV injection).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def escape_formula(value: object) -> object:
    """Prefix ``'`` to a text cell that a spreadsheet would treat as a formula (numbers pass)."""
    if not isinstance(value, str) or not value.startswith(_FORMULA_START):
        return value
    try:
        float(value)
        return value  # "-1.5" is a number, not a formula
    except ValueError:
        return "'" + value


def _escaped(frame: pd.DataFrame) -> pd.DataFrame:
    out = frame.copy()
    for column in out.columns:
        if out[column].dtype == object or pd.api.types.is_string_dtype(out[column]):
            out[column] = out[column].map(escape_formula)
    return out


def read_score_file(path: str | os.PathLike) -> pd.DataFrame:
    """Read and check a score file; returns the per-rollout table (``ROLLOUT_COLUMNS`` + run columns)."""
    path = str(path)
    if not os.path.exists(path):
        raise ScoreFileError(f"score file {path} does not exist")
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except pd.errors.EmptyDataError:
        raise ScoreFileError(f"{path}: empty file (expected a CSV header and one row per rollout)") from None
    except (UnicodeDecodeError, pd.errors.ParserError, ValueError) as error:
        raise ScoreFileError(f"{path}: not a CSV text file ({type(error).__name__}: {error})") from None
    if frame.empty:
        raise ScoreFileError(f"{path}: no rows")
    missing = [c for c in REQUIRED if c not in frame.columns]
    if missing:
        raise ScoreFileError(
            f"{path}: missing required column(s) {missing}; see the column table in eval/README.md"
        )
    stage_columns = sorted((c for c in frame.columns if _STAGE.match(c)), key=lambda c: int(c.split("_")[1]))
    if "score" not in frame.columns and not stage_columns:
        raise ScoreFileError(f"{path}: needs a 'score' column or 'stage_<k>' columns")
    for column in ("n_envs", "n_objects"):
        frame[column] = _numeric(frame, column, path, integer=True, minimum=1)
    frame["demos_per_pair"] = _numeric(frame, "demos_per_pair", path)
    if (frame["demos_per_pair"] <= 0).any():
        row = int(np.flatnonzero((frame["demos_per_pair"] <= 0).to_numpy())[0])
        raise ScoreFileError(f"{path}: column 'demos_per_pair', row {row + 2}: must be positive")
    for column in ("run_id", "env_id", "object_id"):
        empty = (frame[column].str.strip() == "").to_numpy()
        if empty.any():
            raise ScoreFileError(f"{path}: column {column!r}, row {int(np.flatnonzero(empty)[0]) + 2}: empty")
    for column, minimum in (("n_pairs", 1), ("total_demos", 1), ("train_steps", 0)):
        if column in frame.columns:  # optional: empty cells take the default
            filled = frame[column].where(frame[column].str.strip() != "", str(minimum))
            _numeric(frame.assign(**{column: filled}), column, path, integer=True, minimum=minimum)
    stages = {c: _numeric(frame, c, path) for c in stage_columns}
    raw = _numeric(frame, "score", path) if "score" in frame.columns else sum(stages.values())
    if "max_score" in frame.columns:
        max_score = _numeric(frame, "max_score", path)
    else:
        max_score = pd.Series(
            float(len(stage_columns)) if "score" not in frame.columns else 1.0, index=frame.index
        )
    if (max_score <= 0).any():
        raise ScoreFileError(f"{path}: column 'max_score' must be positive")
    score = raw / max_score
    out_of_range = (score < 0) | (score > 1 + 1e-9)
    if out_of_range.any():
        row = int(np.flatnonzero(out_of_range.to_numpy())[0])
        raise ScoreFileError(
            f"{path}: row {row + 2}: score {raw.iloc[row]} is outside [0, max_score={max_score.iloc[row]}]"
            + ("" if "max_score" in frame.columns else " (add a 'max_score' column for raw points)")
        )
    success = _parse_success(frame["success"], path) if "success" in frame.columns else score >= 1 - 1e-9
    rollouts = pd.DataFrame(
        {
            "trial_id": frame["run_id"].astype(str),
            "rollout_index": (
                _numeric(frame, "rollout_index", path, integer=True, minimum=0).astype(int)
                if "rollout_index" in frame.columns
                else frame.groupby("run_id").cumcount()
            ),
            "env_id": frame["env_id"].astype(str),
            "object_id": frame["object_id"].astype(str),
            "seed": _numeric(frame, "seed", path, integer=True).astype(int) if "seed" in frame.columns else 0,
            "score": score.astype(float),
            "success": success.astype(bool),
            "steps": _numeric(frame, "steps", path, minimum=0) if "steps" in frame.columns else np.nan,
        }
    )
    for column, values in stages.items():
        rollouts[column] = values.astype(float)
    for column in (
        "n_envs",
        "n_objects",
        "demos_per_pair",
        "policy",
        "n_pairs",
        "total_demos",
        "checkpoint",
        "train_steps",
    ):
        if column in frame.columns:
            rollouts["_" + column] = frame[column]
    return rollouts


def _run_value(group: pd.DataFrame, column: str, path: str):
    values = group[column].unique()
    if len(values) > 1:
        raise ScoreFileError(
            f"{path}: run {group['trial_id'].iloc[0]!r} has several values of {column.lstrip('_')!r}: {list(values)}"
        )
    return values[0]


def import_scores(
    path: str | os.PathLike,
    out_dir: str | os.PathLike | None = None,
    confidence: float = DEFAULT_CONFIDENCE,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Turn a real-robot score file into (results, rollouts) tables; write both CSVs to ``out_dir``.

    Each run's score and success rate get Wilson intervals at ``confidence``."""
    path = str(path)
    rollouts = read_score_file(path)
    rows = []
    for trial_id, group in rollouts.groupby("trial_id", sort=False):
        n_envs = int(_run_value(group, "_n_envs", path))
        n_objects = int(_run_value(group, "_n_objects", path))
        demos_per_pair = float(_run_value(group, "_demos_per_pair", path))
        n = len(group)
        successes = int(group["success"].sum())
        low, high = wilson_interval(successes, n, confidence)
        score_low, score_high = mean_interval(group["score"].to_numpy(), confidence)
        optional = {
            c: _run_value(group, "_" + c, path) if "_" + c in group.columns else None
            for c in ("policy", "n_pairs", "total_demos", "checkpoint", "train_steps")
        }
        n_pairs = (
            int(float(optional["n_pairs"])) if optional["n_pairs"] not in (None, "") else n_envs * n_objects
        )
        total = (
            int(float(optional["total_demos"]))
            if optional["total_demos"] not in (None, "")
            else int(round(n_pairs * demos_per_pair))
        )
        rows.append(
            {
                "trial_id": str(trial_id),
                "policy": optional["policy"] or "real",
                "n_envs": n_envs,
                "n_objects": n_objects,
                "n_pairs": n_pairs,
                "demos_per_pair": int(demos_per_pair) if demos_per_pair.is_integer() else demos_per_pair,
                "total_demos": total,
                "seed": int(group["seed"].iloc[0]),
                "score": float(group["score"].mean()),
                "score_ci_low": score_low,
                "score_ci_high": score_high,
                "success_rate": successes / n,
                "success_ci_low": low,
                "success_ci_high": high,
                "confidence": confidence,
                "n_rollouts": n,
                "env_ids": json.dumps(sorted(group["env_id"].unique().tolist())),
                "object_ids": json.dumps(sorted(group["object_id"].unique().tolist())),
                "train_steps": optional["train_steps"] or None,
                "samples_seen": None,
                "wall_time_s": None,
                "attempts": None,
                "checkpoint": optional["checkpoint"] or None,
            }
        )
    results = pd.DataFrame(rows)[RESULT_COLUMNS]
    stage_columns = [c for c in rollouts.columns if _STAGE.match(c)]
    rollouts = rollouts[ROLLOUT_COLUMNS + stage_columns]
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        # Text cells that a spreadsheet would run as formulas are written with a leading "'".
        _escaped(results).to_csv(out / "results.csv", index=False)
        _escaped(rollouts).to_csv(out / "rollouts.csv", index=False)
    return results, rollouts
