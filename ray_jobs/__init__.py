"""Sweeps on Ray Tune: one trial = choose a subset of the store, train a policy, evaluate it, report.

``run_sweep(config, address=None, storage=None, resume=False) -> SweepResult`` is the entry point
(``demoscale sweep --config ...`` wraps it). See ray_jobs/README.md for the sweep file, the training
budget rule, fault tolerance, resuming and running on a cluster. Importing this package does not
import Ray or torch; they load when a sweep runs.
"""

from __future__ import annotations

from demoscale.ray_jobs.cluster import ClusterConnectionError
from demoscale.ray_jobs.config import (
    BudgetRule,
    EvalSpec,
    GridSpec,
    PolicySpec,
    SweepConfig,
    SweepConfigError,
    TrialResources,
    load_sweep_config,
    sweep_config_from_dict,
)
from demoscale.ray_jobs.grid import InfeasibleGridError, grid_points, plan_trials, train_steps, trial_id
from demoscale.ray_jobs.results import RESULT_COLUMNS, ROLLOUT_COLUMNS, ResultsFolder
from demoscale.ray_jobs.sweep import SweepError, SweepResult, run_sweep

__all__ = [
    "RESULT_COLUMNS",
    "ROLLOUT_COLUMNS",
    "BudgetRule",
    "ClusterConnectionError",
    "EvalSpec",
    "GridSpec",
    "InfeasibleGridError",
    "PolicySpec",
    "ResultsFolder",
    "SweepConfig",
    "SweepConfigError",
    "SweepError",
    "SweepResult",
    "TrialResources",
    "grid_points",
    "load_sweep_config",
    "plan_trials",
    "run_sweep",
    "sweep_config_from_dict",
    "train_steps",
    "trial_id",
]
