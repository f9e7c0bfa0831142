"""Torch Dataset and Lightning DataModule over :class:`WindowSampler`.

Shuffling is the only randomness: the training sampler draws a permutation from (seed, epoch), so a
run is reproducible and DataLoader workers (which split the index list) never repeat a sample.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from demoscale.datasets.sampler import DEFAULT_PRELOAD_BYTES, WindowSampler, unbatch
from demoscale.datasets.store import EpisodeStore, FeatureSpec, StoreError
from torch.utils.data import DataLoader, Dataset, Sampler


def _to_torch(sample: Mapping[str, Any]) -> dict[str, Any]:
    extra = {}
    if "waypoint_obs" in sample:
        extra["waypoint_obs"] = {
            k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sample["waypoint_obs"].items()
        }
        extra["waypoint_index"] = int(sample["waypoint_index"])
    if "targets" in sample:
        extra["targets"] = {
            k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sample["targets"].items()
        }
    return extra | {
        "obs": {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sample["obs"].items()},
        "obs_is_pad": {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sample["obs_is_pad"].items()},
        "action": torch.from_numpy(np.ascontiguousarray(sample["action"])),
        "action_is_pad": torch.from_numpy(np.ascontiguousarray(sample["action_is_pad"])),
        "episode_index": int(sample["episode_index"]),
        "frame_index": int(sample["frame_index"]),
    }


class EpisodeDataset(Dataset):
    """Map-style dataset of windows (the sample format of docs/interfaces.md), as torch tensors.

    Implements ``__getitems__`` so a DataLoader fetches a whole batch with one store read per key.
    """

    def __init__(
        self,
        store: EpisodeStore | str | os.PathLike[str],
        obs_offsets: Mapping[str, Sequence[int]],
        action_keys: Sequence[str],
        horizon: int,
        episodes: Sequence[int] | None = None,
        preload_bytes: int = DEFAULT_PRELOAD_BYTES,
        waypoint_keys: Sequence[str] | None = None,
        target_keys: Sequence[str] | None = None,
    ) -> None:
        self.sampler = WindowSampler(
            store, obs_offsets, action_keys, horizon, episodes, preload_bytes, waypoint_keys, target_keys
        )

    def __len__(self) -> int:
        return len(self.sampler)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return _to_torch(self.sampler.sample(int(index)))

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        batch = self.sampler.sample_many(np.asarray(indices, dtype=np.int64))
        return [_to_torch(unbatch(batch, i)) for i in range(len(indices))]


class EpochShuffleSampler(Sampler[int]):
    """A permutation of ``range(n)`` drawn from (seed, epoch); Lightning calls ``set_epoch`` each epoch."""

    def __init__(self, n: int, seed: int = 0) -> None:
        self.n = int(n)
        self.seed = int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[int]:
        order = np.random.default_rng([self.seed, self.epoch]).permutation(self.n)
        return iter(order.tolist())

    def __len__(self) -> int:
        return self.n


def split_episodes(
    episodes: Sequence[int], val_fraction: float, seed: int = 0
) -> tuple[list[int], list[int]]:
    """Split episode indices into (train, validation) by a seeded permutation; disjoint, both sorted.

    With ``val_fraction > 0`` and at least two episodes, validation gets at least one and training
    keeps at least one.
    """
    episodes = sorted(int(e) for e in episodes)
    if not 0.0 <= val_fraction < 1.0:
        raise StoreError(f"val_fraction must be in [0, 1), got {val_fraction}")
    n_val = int(round(val_fraction * len(episodes)))
    if val_fraction > 0 and len(episodes) >= 2:
        n_val = min(max(n_val, 1), len(episodes) - 1)
    else:
        n_val = min(n_val, max(0, len(episodes) - 1))
    order = np.random.default_rng([seed, 7919]).permutation(len(episodes))
    val = sorted(episodes[i] for i in order[:n_val])
    train = sorted(episodes[i] for i in order[n_val:])
    return train, val


class EpisodeDataModule(pl.LightningDataModule):
    """Training and validation windows from one store, split by episode.

    Args:
        store: store location (directory, .zip or fsspec URL).
        obs_offsets: frame offsets per observation key, e.g. ``{"camera0_rgb": [-1, 0]}``.
        action_keys: low-dim keys concatenated (in order) into the action.
        horizon: action steps per sample, starting at the current frame.
        batch_size: samples per batch.
        num_workers: DataLoader worker processes (each opens the store itself).
        val_fraction: fraction of the episodes held out for validation (by episode, seeded).
        seed: seed of the split and of the per-epoch shuffling.
        episodes: the episodes to use (a subset); None uses every episode.
        drop_last: drop the last incomplete training batch.
        preload_bytes: low-dim keys up to this total size are held in memory per process.
        waypoint_keys: keys of the next-waypoint frame added to each sample as ``waypoint_obs``
            (needs ``demoscale store label-waypoints``).
        target_keys: low-dim keys whose current frame is added to each sample as ``targets`` (what a
            policy learns to predict without observing it, e.g. a simulator's object pose).
    """

    def __init__(
        self,
        store: str,
        obs_offsets: dict[str, list[int]],
        action_keys: list[str],
        horizon: int = 16,
        batch_size: int = 64,
        num_workers: int = 0,
        val_fraction: float = 0.1,
        seed: int = 0,
        episodes: list[int] | None = None,
        drop_last: bool = False,
        preload_bytes: int = DEFAULT_PRELOAD_BYTES,
        waypoint_keys: list[str] | None = None,
        target_keys: list[str] | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.store_location = os.fspath(store)
        self.obs_offsets = {k: [int(o) for o in v] for k, v in obs_offsets.items()}
        self.action_keys = list(action_keys)
        self.horizon = int(horizon)
        self.batch_size = int(batch_size)
        self.num_workers = int(num_workers)
        self.val_fraction = float(val_fraction)
        self.seed = int(seed)
        self.episodes = None if episodes is None else [int(e) for e in episodes]
        self.drop_last = bool(drop_last)
        self.preload_bytes = int(preload_bytes)
        self.waypoint_keys = list(waypoint_keys or [])
        self.target_keys = list(target_keys or [])
        self._store: EpisodeStore | None = None
        self.train_dataset: EpisodeDataset | None = None
        self.val_dataset: EpisodeDataset | None = None
        self.train_episodes, self.val_episodes = self._split()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_store"] = None
        return state

    @property
    def store(self) -> EpisodeStore:
        """The store, opened read-only on first use."""
        if self._store is None:
            self._store = EpisodeStore.open(self.store_location, mode="r")
        return self._store

    def _split(self) -> tuple[list[int], list[int]]:
        episodes = self.episodes if self.episodes is not None else range(self.store.n_episodes)
        if not len(episodes):
            raise StoreError(f"{self.store_location}: no episodes to train on")
        return split_episodes(episodes, self.val_fraction, self.seed)

    @property
    def features(self) -> dict[str, FeatureSpec]:
        """The store's feature specs."""
        return dict(self.store.features)

    @property
    def action_dim(self) -> int:
        """Length of the concatenated action vector."""
        return int(sum(int(np.prod(self.store.features[k].shape)) for k in self.action_keys))

    def stats(self, key: str) -> dict[str, np.ndarray]:
        """Normalisation statistics of a numeric key over the whole store (cached there)."""
        return self.store.stats(key)

    def action_stats(self) -> dict[str, np.ndarray]:
        """Statistics of the concatenated action (per action dimension)."""
        parts = [self.store.stats(k) for k in self.action_keys]
        return {
            name: np.concatenate([np.ravel(p[name]) for p in parts])
            for name in ("min", "max", "mean", "std", "p01", "p99")
        }

    def _dataset(self, episodes: list[int]) -> EpisodeDataset:
        return EpisodeDataset(
            self.store_location,
            self.obs_offsets,
            self.action_keys,
            self.horizon,
            episodes,
            self.preload_bytes,
            self.waypoint_keys,
            self.target_keys,
        )

    def setup(self, stage: str | None = None) -> None:
        if self.train_dataset is None:
            self.train_dataset = self._dataset(self.train_episodes)
        if self.val_dataset is None and self.val_episodes:
            self.val_dataset = self._dataset(self.val_episodes)

    def _loader(self, dataset: EpisodeDataset, sampler: Sampler | None, drop_last: bool) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=sampler,
            shuffle=False,
            num_workers=self.num_workers,
            drop_last=drop_last,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        self.setup("fit")
        assert self.train_dataset is not None
        sampler = EpochShuffleSampler(len(self.train_dataset), self.seed)
        return self._loader(self.train_dataset, sampler, self.drop_last)

    def val_dataloader(self) -> DataLoader | list:
        self.setup("validate")
        if self.val_dataset is None:
            return []
        return self._loader(self.val_dataset, None, False)
