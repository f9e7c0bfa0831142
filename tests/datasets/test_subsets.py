"""Nested subsets by environment, object, pair and demo counts, and clear errors for big requests."""

from __future__ import annotations

import pandas as pd
import pytest
from demoscale.datasets import EpisodeStore, select_subset, subset_capacity
from demoscale.datasets.subsets import SubsetError


def _table() -> pd.DataFrame:
    # 6 environments; environment e has 2 + e % 3 objects of its own; pair (e, o) has 3 + (e + o) % 4 demos.
    rows = []
    for env in range(6):
        for obj in range(2 + env % 3):
            for _ in range(3 + (env + obj) % 4):
                rows.append({"env_id": str(env), "object_id": f"{env}-{obj}"})
    frame = pd.DataFrame(rows)
    frame.insert(0, "episode_index", range(len(frame)))
    return frame


def test_subset_counts_and_consistency() -> None:
    table = _table()
    subset = select_subset(table, n_envs=3, n_objects_per_env=2, demos_per_pair=3, seed=4)
    assert len(subset.env_ids) == 3 and len(subset.pairs) == 6 and len(subset.episode_indices) == 18
    chosen = table.set_index("episode_index").loc[subset.episode_indices]
    assert set(chosen["env_id"]) == set(subset.env_ids)
    assert set(zip(chosen["env_id"], chosen["object_id"], strict=True)) == set(subset.pairs)
    assert chosen.groupby(["env_id", "object_id"]).size().tolist() == [3] * 6
    assert subset.object_ids == sorted({o for _, o in subset.pairs})


@pytest.mark.parametrize("seed", [0, 7])
def test_subsets_are_nested_in_every_axis(seed: int) -> None:
    table = _table()

    def episodes(**kwargs) -> set[int]:
        return set(select_subset(table, seed=seed, **kwargs).episode_indices)

    for small, large in ((1, 2), (2, 4), (4, 6)):
        assert episodes(n_envs=small) <= episodes(n_envs=large)
        assert episodes(n_envs=small, n_objects_per_env=2, demos_per_pair=3) <= episodes(
            n_envs=large, n_objects_per_env=2, demos_per_pair=3
        )
    assert set(select_subset(table, 2, seed=seed).env_ids) <= set(select_subset(table, 4, seed=seed).env_ids)
    assert episodes(n_envs=5, n_objects_per_env=1) <= episodes(n_envs=5, n_objects_per_env=2)
    assert episodes(n_envs=6, n_pairs=3) <= episodes(n_envs=6, n_pairs=7)
    assert episodes(n_envs=6, n_objects_per_env=2, demos_per_pair=1) <= episodes(
        n_envs=6, n_objects_per_env=2, demos_per_pair=3
    )
    # Same seed, same answer; another seed, (almost surely) another choice of environments.
    assert episodes(n_envs=3) == episodes(n_envs=3)


def test_different_seeds_choose_differently() -> None:
    table = _table()
    choices = {tuple(select_subset(table, 2, seed=s).env_ids) for s in range(8)}
    assert len(choices) > 1


def test_too_large_requests_say_what_is_available() -> None:
    table = _table()
    with pytest.raises(SubsetError, match=r"asked for 8 environments, the store has 6: '0', '1'"):
        select_subset(table, 8)
    with pytest.raises(
        SubsetError, match=r"largest feasible n_objects_per_env for these 6 environments is 2"
    ):
        select_subset(table, 6, n_objects_per_env=3)
    with pytest.raises(
        SubsetError, match=r"largest feasible demos_per_pair for this choice of \d+ pairs is 3"
    ):
        select_subset(table, 6, n_objects_per_env=2, demos_per_pair=4)
    with pytest.raises(SubsetError, match="largest feasible n_pairs is 12"):
        select_subset(table, 6, n_objects_per_env=2, n_pairs=13)
    with pytest.raises(SubsetError, match="at least 1"):
        select_subset(table, 0)


def test_capacity_matches_feasibility() -> None:
    table = _table()
    capacity = subset_capacity(table)
    assert capacity == {"n_envs": 6, "n_objects_per_env": 2, "n_pairs": 18, "demos_per_pair": 3}
    for n_envs in (1, 3):
        cap = subset_capacity(table, n_envs=n_envs, seed=2)
        select_subset(table, n_envs, n_objects_per_env=cap["n_objects_per_env"], seed=2)
        with pytest.raises(SubsetError):
            select_subset(table, n_envs, n_objects_per_env=cap["n_objects_per_env"] + 1, seed=2)
        cap = subset_capacity(table, n_envs=n_envs, n_objects_per_env=1, seed=2)
        select_subset(table, n_envs, n_objects_per_env=1, demos_per_pair=cap["demos_per_pair"], seed=2)
        with pytest.raises(SubsetError):
            select_subset(
                table, n_envs, n_objects_per_env=1, demos_per_pair=cap["demos_per_pair"] + 1, seed=2
            )


def test_subset_of_a_real_store(small_store: EpisodeStore) -> None:
    subset = select_subset(small_store.episodes, n_envs=2, n_objects_per_env=1, demos_per_pair=1, seed=3)
    assert len(subset.episode_indices) == 2
    table = small_store.episodes.set_index("episode_index")
    assert set(table.loc[subset.episode_indices, "env_id"]) == set(subset.env_ids)
