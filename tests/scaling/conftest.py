"""Synthetic results tables drawn from known laws with binomial rollout noise (seeded)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest


def draw_table(
    gap_of: Callable[[np.ndarray, np.ndarray], np.ndarray],
    envs: list[float],
    demos_per_pair: list[float] | None = None,
    seeds: int = 1,
    n_rollouts: int = 40,
    rng: np.random.Generator | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A results table (one row per trial) and its rollouts table; rollout i of a trial fails with
    probability gap(n_envs, demos_per_pair)."""
    rng = rng or np.random.default_rng(0)
    demos = demos_per_pair or [50.0]
    trials, rollouts = [], []
    for n_envs in envs:
        for dpp in demos:
            gap = float(gap_of(np.array([n_envs], float), np.array([dpp], float))[0])
            for seed in range(seeds):
                trial_id = f"e{n_envs:g}-d{dpp:g}-s{seed}"
                success = rng.random(n_rollouts) >= gap
                trials.append({
                    "trial_id": trial_id, "policy": "diffusion", "n_envs": n_envs, "n_objects": 1,
                    "n_pairs": n_envs, "demos_per_pair": dpp, "total_demos": n_envs * dpp, "seed": seed,
                    "score": success.mean(), "success_rate": success.mean(), "n_rollouts": n_rollouts,
                })  # fmt: skip
                rollouts += [
                    {"trial_id": trial_id, "rollout_index": i, "score": float(s), "success": bool(s)}
                    for i, s in enumerate(success)
                ]
    return pd.DataFrame(trials), pd.DataFrame(rollouts)


@pytest.fixture(scope="session")
def synthetic() -> Callable[..., tuple[pd.DataFrame, pd.DataFrame]]:
    return draw_table
