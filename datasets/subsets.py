"""Nested subsets of a store's episodes by number of environments, objects, pairs and demos per pair.

Every axis is chosen by taking a prefix of a seeded ranking that does not depend on the requested
sizes, so for a fixed seed a larger request always contains a smaller one (4 environments contain
the 2 chosen for a 2-environment run; 20 demos per pair contain the 10 of a smaller run):
- environments: a seeded permutation of all env ids, prefix of ``n_envs``;
- objects: one seeded ranking of all object ids; each environment keeps its first
  ``n_objects_per_env`` objects in that ranking;
- pairs: one seeded ranking of all (env, object) pairs; the first ``n_pairs`` of the pairs allowed by
  the two choices above (nested in ``n_pairs``; with ``n_pairs`` set, more environments means the same
  number of pairs spread wider, so nesting in ``n_envs`` holds only with ``n_pairs=None``);
- demos: one seeded ranking of all episodes; each pair keeps its first ``demos_per_pair`` episodes.
Only the metadata columns ``episode_index``, ``env_id`` and ``object_id`` are used.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from demoscale.datasets.schema import StoreError


class SubsetError(StoreError, ValueError):
    """A subset request the store cannot satisfy; the message says what is available."""


@dataclass
class Subset:
    """The chosen episodes and the environments, objects and pairs they come from."""

    episode_indices: list[int]
    env_ids: list[str]
    object_ids: list[str]
    pairs: list[tuple[str, str]] = field(default_factory=list)

    @property
    def n_episodes(self) -> int:
        return len(self.episode_indices)

    def to_dict(self) -> dict:
        """JSON-ready form (pairs as [env, object] lists)."""
        return {
            "episode_indices": list(self.episode_indices),
            "env_ids": list(self.env_ids),
            "object_ids": list(self.object_ids),
            "pairs": [list(p) for p in self.pairs],
        }


def _rank(values: list, seed: int, salt: int) -> dict:
    """A seeded ranking of distinct values, independent of any requested size."""
    ordered = sorted(values)
    order = np.random.default_rng([seed, salt]).permutation(len(ordered))
    return {ordered[i]: rank for rank, i in enumerate(order)}


def _table(episodes_df: pd.DataFrame) -> pd.DataFrame:
    missing = [c for c in ("env_id", "object_id") if c not in episodes_df.columns]
    if missing:
        raise SubsetError(f"episode table lacks column(s) {missing}; it has {list(episodes_df.columns)}")
    index = episodes_df["episode_index"] if "episode_index" in episodes_df.columns else episodes_df.index
    return pd.DataFrame(
        {
            "episode_index": np.asarray(index, dtype=np.int64),
            "env_id": episodes_df["env_id"].astype(str).to_numpy(),
            "object_id": episodes_df["object_id"].astype(str).to_numpy(),
        }
    )


def _positive(name: str, value: int | None) -> None:
    if value is not None and int(value) < 1:
        raise SubsetError(f"{name} must be at least 1, got {value}")


def _preview(values: list, limit: int = 12) -> str:
    shown = ", ".join(repr(v) for v in values[:limit])
    return shown + (f", ... ({len(values)} in all)" if len(values) > limit else "")


class _Choice:
    """Staged selection shared by :func:`select_subset` and :func:`subset_capacity`."""

    def __init__(self, episodes_df: pd.DataFrame, seed: int) -> None:
        self.table = _table(episodes_df)
        self.seed = seed
        self.env_rank = _rank(list(set(self.table["env_id"])), seed, 0)
        self.object_rank = _rank(list(set(self.table["object_id"])), seed, 1)
        pair_keys = list(set(zip(self.table["env_id"], self.table["object_id"], strict=True)))
        self.pair_rank = _rank(pair_keys, seed, 2)
        self.episode_rank = _rank(list(self.table["episode_index"]), seed, 3)
        self.objects_by_env: dict[str, list[str]] = {
            env: sorted(set(group["object_id"]), key=self.object_rank.__getitem__)
            for env, group in self.table.groupby("env_id")
        }
        self.episodes_by_pair: dict[tuple[str, str], list[int]] = {
            (env, obj): sorted(group["episode_index"].tolist(), key=self.episode_rank.__getitem__)
            for (env, obj), group in self.table.groupby(["env_id", "object_id"])
        }

    def envs(self, n_envs: int) -> list[str]:
        ranked = sorted(self.env_rank, key=self.env_rank.__getitem__)
        if n_envs > len(ranked):
            raise SubsetError(
                f"asked for {n_envs} environments, the store has {len(ranked)}: {_preview(sorted(ranked))}"
            )
        return ranked[:n_envs]

    def max_objects(self, envs: list[str]) -> int:
        return min(len(self.objects_by_env[e]) for e in envs)

    def pairs(self, envs: list[str], n_objects_per_env: int | None) -> list[tuple[str, str]]:
        pairs = []
        for env in envs:
            objects = self.objects_by_env[env]
            if n_objects_per_env is not None:
                if n_objects_per_env > len(objects):
                    raise SubsetError(
                        f"asked for {n_objects_per_env} objects per environment, environment {env!r} has "
                        f"{len(objects)}: {_preview(sorted(objects))}; the largest feasible n_objects_per_env "
                        f"for these {len(envs)} environments is {self.max_objects(envs)}"
                    )
                objects = objects[:n_objects_per_env]
            pairs += [(env, obj) for obj in objects]
        return sorted(pairs, key=self.pair_rank.__getitem__)

    def demos(self, pairs: list[tuple[str, str]], demos_per_pair: int | None) -> list[int]:
        chosen: list[int] = []
        for pair in pairs:
            episodes = self.episodes_by_pair[pair]
            if demos_per_pair is not None:
                if demos_per_pair > len(episodes):
                    largest = min(len(self.episodes_by_pair[p]) for p in pairs)
                    raise SubsetError(
                        f"asked for {demos_per_pair} demos per pair, pair (env {pair[0]!r}, object {pair[1]!r}) "
                        f"has {len(episodes)}; the largest feasible demos_per_pair for this choice of "
                        f"{len(pairs)} pairs is {largest}"
                    )
                episodes = episodes[:demos_per_pair]
            chosen += episodes
        return sorted(chosen)


def select_subset(
    episodes_df: pd.DataFrame,
    n_envs: int,
    n_objects_per_env: int | None = None,
    n_pairs: int | None = None,
    demos_per_pair: int | None = None,
    seed: int = 0,
) -> Subset:
    """Choose ``n_envs`` environments, then objects, pairs and demos per pair; nested for a fixed seed.

    ``None`` means "all available" on that axis. A request larger than the store holds raises
    :class:`SubsetError` (a :class:`StoreError`) naming what is available and the largest feasible value.
    """
    for name, value in (
        ("n_envs", n_envs),
        ("n_objects_per_env", n_objects_per_env),
        ("n_pairs", n_pairs),
        ("demos_per_pair", demos_per_pair),
    ):
        _positive(name, value)
    choice = _Choice(episodes_df, seed)
    envs = choice.envs(int(n_envs))
    pairs = choice.pairs(envs, None if n_objects_per_env is None else int(n_objects_per_env))
    if n_pairs is not None:
        if n_pairs > len(pairs):
            raise SubsetError(
                f"asked for {n_pairs} pairs, the chosen {len(envs)} environments"
                + ("" if n_objects_per_env is None else f" with {n_objects_per_env} objects each")
                + f" have {len(pairs)}; the largest feasible n_pairs is {len(pairs)}"
            )
        pairs = pairs[: int(n_pairs)]
    episodes = choice.demos(pairs, None if demos_per_pair is None else int(demos_per_pair))
    used_envs = {env for env, _ in pairs}
    return Subset(
        episode_indices=[int(i) for i in episodes],
        env_ids=[env for env in envs if env in used_envs],
        object_ids=sorted({obj for _, obj in pairs}),
        pairs=sorted(pairs),
    )


def subset_capacity(
    episodes_df: pd.DataFrame,
    n_envs: int | None = None,
    n_objects_per_env: int | None = None,
    n_pairs: int | None = None,
    seed: int = 0,
) -> dict[str, int]:
    """The largest feasible value of each axis, given the axes before it.

    Returns ``{"n_envs", "n_objects_per_env", "n_pairs", "demos_per_pair"}``: the number of
    environments in the table; the most objects every chosen environment has (for ``n_envs``, default
    all); the number of pairs those allow; the most demos every chosen pair has. A sweep can check a
    grid point with ``value <= capacity[axis]`` before starting anything.
    """
    choice = _Choice(episodes_df, seed)
    total_envs = len(choice.env_rank)
    if total_envs == 0:
        raise SubsetError("the episode table is empty: no environment to choose from")
    envs = choice.envs(total_envs if n_envs is None else int(n_envs))
    max_objects = choice.max_objects(envs)
    pairs = choice.pairs(envs, None if n_objects_per_env is None else int(n_objects_per_env))
    max_pairs = len(pairs)
    if n_pairs is not None:
        if n_pairs > max_pairs:
            raise SubsetError(f"asked for {n_pairs} pairs, the largest feasible n_pairs is {max_pairs}")
        pairs = pairs[: int(n_pairs)]
    max_demos = min(len(choice.episodes_by_pair[p]) for p in pairs)
    return {
        "n_envs": total_envs,
        "n_objects_per_env": max_objects,
        "n_pairs": max_pairs,
        "demos_per_pair": max_demos,
    }
