"""Scaling laws of robot data: fits with honest uncertainty, model comparison, plots and budgets.

Imports only numpy, scipy, statsmodels, pandas and matplotlib (never torch, Ray or MuJoCo). The
public names below load their module on first use, so ``demoscale laws --help`` starts fast and
matplotlib loads only for plots. The results-table schema is in ``scaling/README.md``.
"""

from __future__ import annotations

import importlib
from typing import Any

from demoscale.scaling.names import AXES, BOOTSTRAP_MODES, METHODS

_LAZY: dict[str, str] = {
    "ResultsError": "demoscale.scaling.table",
    "ResultsTable": "demoscale.scaling.table",
    "adjusted_gap": "demoscale.scaling.table",
    "load_results": "demoscale.scaling.table",
    "LawFit": "demoscale.scaling.fits",
    "Prediction": "demoscale.scaling.fits",
    "compare_laws": "demoscale.scaling.fits",
    "fit_law": "demoscale.scaling.fits",
    "BudgetRecommendation": "demoscale.scaling.budget",
    "LawCandidate": "demoscale.scaling.budget",
    "Plan": "demoscale.scaling.budget",
    "recommend_budget": "demoscale.scaling.budget",
    "plot_laws": "demoscale.scaling.plots",
    "plot_fits": "demoscale.scaling.plots",
    "next_round": "demoscale.scaling.allocation",
    "prediction_noise_gains": "demoscale.scaling.allocation",
}

__all__ = ["AXES", "BOOTSTRAP_MODES", "METHODS", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'demoscale.scaling' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
