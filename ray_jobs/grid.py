"""Grid expansion: axis values -> trial points with deterministic ids, subsets and step budgets.

Subsets are chosen here, in the driver, before any trial starts: the choice is deterministic
(``select_subset`` is nested for a fixed seed), it lets an infeasible grid fail before Ray does any
work, and each trial then carries its episode list and step budget with it.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import fsspec
import pandas as pd
import yaml
from demoscale.ray_jobs.config import BudgetRule, SweepConfig, SweepConfigError


class InfeasibleGridError(ValueError):
    """The grid asks for more environments, objects, pairs or demos than the store holds."""


def trial_id(
    policy: str,
    n_envs: int | None,
    n_objects: int | None,
    n_pairs: int | None,
    demos_per_pair: int | None,
    seed: int,
) -> str:
    """The deterministic key of one grid point; rows of the results table are keyed by it."""
    size = f"p{n_pairs}" if n_pairs is not None else f"e{n_envs}-o{n_objects}"
    demos = "all" if demos_per_pair is None else str(demos_per_pair)
    return f"{policy}-{size}-d{demos}-s{seed}"


def grid_points(config: SweepConfig) -> list[dict[str, Any]]:
    """The axis values of every trial, in a stable order (policy, size, demos, seed)."""
    grid = config.grid
    sizes: list[tuple[int | None, int | None, int | None]]
    if grid.n_pairs:
        sizes = [(None, None, n) for n in grid.n_pairs]
    else:
        sizes = [(e, o, None) for e, o in itertools.product(grid.n_envs, grid.n_objects)]
    points = []
    for policy, (n_envs, n_objects, n_pairs), demos, seed in itertools.product(
        grid.policy, sizes, grid.demos_per_pair, grid.seed
    ):
        points.append(
            {
                "trial_id": trial_id(policy, n_envs, n_objects, n_pairs, demos, seed),
                "policy": policy,
                "n_envs": n_envs,
                "n_objects": n_objects,
                "n_pairs": n_pairs,
                "demos_per_pair": demos,
                "seed": seed,
            }
        )
    return points


def train_steps(rule: BudgetRule, n_frames: int, batch_size: int) -> int:
    """Training steps for a subset of ``n_frames`` frames under ``rule`` (documented in README)."""
    if rule.rule == "fixed":
        return int(rule.steps)
    steps = math.ceil(rule.epochs * n_frames / batch_size)
    steps = max(int(rule.min_steps), steps)
    if rule.max_steps is not None:
        steps = min(int(rule.max_steps), steps)
    return steps


def _check_feasible(point: dict[str, Any], episodes: pd.DataFrame, store: str) -> None:
    """Raise ``InfeasibleGridError`` naming the axis that overflows and its largest feasible value."""
    from demoscale.datasets import subset_capacity

    def fail(axis: str, asked: int, largest: int, given: str = "") -> None:
        raise InfeasibleGridError(
            f"grid point {point['trial_id']} asks for {axis}={asked}{given}, more than store {store} holds: "
            f"the largest feasible {axis} is {largest}"
        )

    seed = point["seed"]
    capacity = subset_capacity(episodes, seed=seed)
    if point["n_pairs"] is not None:
        if point["n_pairs"] > capacity["n_pairs"]:
            fail("n_pairs", point["n_pairs"], capacity["n_pairs"])
        capacity = subset_capacity(episodes, n_pairs=point["n_pairs"], seed=seed)
        given = f" (for {point['n_pairs']} pairs)"
    else:
        if point["n_envs"] > capacity["n_envs"]:
            fail("n_envs", point["n_envs"], capacity["n_envs"])
        capacity = subset_capacity(episodes, n_envs=point["n_envs"], seed=seed)
        if point["n_objects"] > capacity["n_objects_per_env"]:
            fail(
                "n_objects",
                point["n_objects"],
                capacity["n_objects_per_env"],
                f" per env (for {point['n_envs']} envs)",
            )
        capacity = subset_capacity(
            episodes, n_envs=point["n_envs"], n_objects_per_env=point["n_objects"], seed=seed
        )
        given = f" (for {point['n_envs']} envs x {point['n_objects']} objects)"
    if point["demos_per_pair"] is not None and point["demos_per_pair"] > capacity["demos_per_pair"]:
        fail("demos_per_pair", point["demos_per_pair"], capacity["demos_per_pair"], given)


def policy_batch_size(config: SweepConfig, policy: str) -> int:
    """The batch size the epochs rule divides by: ``budget.batch_size``, else the policy's
    ``data.batch_size`` (its overrides first, then its training config file)."""
    if config.budget.batch_size is not None:
        return int(config.budget.batch_size)
    spec = config.policies[policy]
    if "data.batch_size" in spec.overrides:
        return int(spec.overrides["data.batch_size"])
    path = config.resolve(spec.config)
    with fsspec.open(path, "r") as handle:
        training = yaml.safe_load(handle) or {}
    value = (training.get("data") or {}).get("batch_size")
    if value is None:
        raise SweepConfigError(
            f"budget.rule 'epochs' needs a batch size: set budget.batch_size or data.batch_size in {path}"
        )
    return int(value)


def plan_trials(config: SweepConfig, episodes: pd.DataFrame, store: str) -> list[dict[str, Any]]:
    """Every grid point with its subset (episode indices, env/object ids) and step budget.

    Raises ``InfeasibleGridError`` naming the first point the store cannot satisfy and the largest
    feasible value of the axis that overflowed (``demoscale.datasets.subset_capacity``).
    """
    from demoscale.datasets import select_subset

    # Only the epochs rule divides by a batch size; a fixed budget never reads the training config.
    batch_sizes = {
        name: policy_batch_size(config, name) if config.budget.rule == "epochs" else 0
        for name in config.grid.policy
    }
    lengths = dict(zip(episodes["episode_index"].astype(int), episodes["length"].astype(int), strict=True))
    planned = []
    for point in grid_points(config):
        _check_feasible(point, episodes, store)
        if point["n_pairs"] is not None:
            # Pairs drawn from every environment: the pairs axis spreads over as many envs as it can.
            n_all_envs = int(episodes["env_id"].nunique())
            subset = select_subset(
                episodes,
                n_all_envs,
                n_pairs=point["n_pairs"],
                demos_per_pair=point["demos_per_pair"],
                seed=point["seed"],
            )
        else:
            subset = select_subset(
                episodes,
                point["n_envs"],
                n_objects_per_env=point["n_objects"],
                demos_per_pair=point["demos_per_pair"],
                seed=point["seed"],
            )
        indices = [int(i) for i in subset.episode_indices]
        n_frames = int(sum(lengths[i] for i in indices))
        env_ids = sorted({str(e) for e in subset.env_ids})
        n_pairs = len(subset.pairs)
        planned.append(
            {
                **point,
                "n_envs": point["n_envs"] if point["n_envs"] is not None else len(env_ids),
                "n_objects": point["n_objects"]
                if point["n_objects"] is not None
                else n_pairs / max(len(env_ids), 1),
                "n_pairs": n_pairs,
                "episode_indices": indices,
                "env_ids": env_ids,
                "object_ids": sorted({str(o) for o in subset.object_ids}),
                "total_demos": len(indices),
                "n_frames": n_frames,
                "train_steps": train_steps(config.budget, n_frames, batch_sizes[point["policy"]]),
            }
        )
    return planned
