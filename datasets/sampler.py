"""Step-level training windows over the episodes of a store (numpy; no torch needed).

Sample ``i`` is frame ``t`` of one episode (every frame of every chosen episode is a sample, in
episode order). For each observation key the frames ``t + offset`` are read; actions are the
``horizon`` frames from ``t`` of ``action_keys``, concatenated. Frames outside the episode repeat the
edge frame and are flagged in ``obs_is_pad`` / ``action_is_pad``. A sample depends only on its index:
no random state is involved, so workers and reruns see exactly the same data.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from demoscale.datasets.store import EpisodeStore, StoreError

# Low-dim keys smaller than this in total are read once into memory: a window read then costs a
# numpy gather instead of a zarr call. Images are always read per batch.
DEFAULT_PRELOAD_BYTES = 256 << 20


class WindowSampler:
    """Windows of observation frames and action chunks, read in one store call per key and batch.

    ``store`` is an :class:`EpisodeStore` or a location; a location is opened lazily in each process
    (the sampler pickles without open handles, for DataLoader and Ray workers).
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
        if isinstance(store, EpisodeStore):
            self._store: EpisodeStore | None = store
            self.location = store.location
        else:
            self._store = None
            self.location = os.fspath(store)
        self.obs_offsets = {k: [int(o) for o in v] for k, v in obs_offsets.items()}
        self.action_keys = list(action_keys)
        self.horizon = int(horizon)
        self.preload_bytes = int(preload_bytes)
        if self.horizon < 1:
            raise StoreError(f"horizon must be at least 1, got {horizon}")
        if not self.action_keys:
            raise StoreError("action_keys must name at least one key")
        for key, offsets in self.obs_offsets.items():
            if not offsets:
                raise StoreError(f"observation key {key!r} has no frame offsets")
        store_ = self.store
        self.target_keys = list(target_keys or [])
        for key in [*self.obs_offsets, *self.action_keys, *self.target_keys]:
            if key not in store_.features:
                raise StoreError(
                    f"{self.location}: unknown key {key!r}; keys are {', '.join(store_.features)}"
                )
        for role, keys in (("action", self.action_keys), ("target", self.target_keys)):
            for key in keys:
                if store_.features[key].kind != "low_dim":
                    raise StoreError(
                        f"{self.location}: {role} key {key!r} is {store_.features[key].kind}, not low_dim"
                    )
        n = store_.n_episodes
        chosen = np.arange(n) if episodes is None else np.asarray(list(episodes), dtype=np.int64)
        if len(chosen) and (chosen.min() < 0 or chosen.max() >= n):
            raise StoreError(
                f"{self.location}: episode indices must be in 0:{n}, got {chosen.min()}..{chosen.max()}"
            )
        self.episodes = chosen
        starts, ends = store_.episode_starts[chosen], store_.episode_ends[chosen]
        self._starts = starts
        self._ends = ends
        lengths = ends - starts
        self._cumulative = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self.action_dim = int(sum(int(np.prod(store_.features[k].shape)) for k in self.action_keys))
        self._cache: dict[str, np.ndarray] = {}
        # Optional: the frame at each sample's next waypoint (datasets/waypoints.py labels the store).
        self.waypoint_keys = list(waypoint_keys or [])
        self._next_waypoint: np.ndarray | None = None
        if self.waypoint_keys:
            from demoscale.datasets.waypoints import read_next_waypoint_index

            unknown = [key for key in self.waypoint_keys if key not in store_.features]
            if unknown:
                raise StoreError(
                    f"{self.location}: unknown waypoint keys {unknown}; keys are {', '.join(store_.features)}"
                )
            self._next_waypoint = read_next_waypoint_index(self.location)
            if self._next_waypoint is None:
                raise StoreError(
                    f"{self.location}: waypoint_keys need the store's next_waypoint_index (missing or stale); "
                    f"run `demoscale store label-waypoints {self.location} --threshold T`"
                )

    # Open handles and caches stay in the process that made them.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_store"] = None
        state["_cache"] = {}
        return state

    @property
    def store(self) -> EpisodeStore:
        """The store, opened read-only on first use in this process."""
        if self._store is None:
            self._store = EpisodeStore.open(self.location, mode="r")
        return self._store

    def __len__(self) -> int:
        return int(self._cumulative[-1])

    def locate(
        self, indices: Sequence[int] | np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """For sample indices: (position in ``episodes``, global frame t, episode start, episode end)."""
        indices = np.asarray(indices, dtype=np.int64)
        if len(indices) and (indices.min() < 0 or indices.max() >= len(self)):
            raise IndexError(f"sample index out of range 0:{len(self)}")
        which = np.searchsorted(self._cumulative, indices, side="right") - 1
        t = self._starts[which] + (indices - self._cumulative[which])
        return which, t, self._starts[which], self._ends[which]

    def _read(self, key: str, frames: np.ndarray) -> np.ndarray:
        store = self.store
        spec = store.features[key]
        if spec.kind != "image":
            cached = self._cache.get(key)
            if cached is None and self._fits_in_memory(key):
                cached = self._cache[key] = store.read(key, 0, store.n_frames)
            if cached is not None:
                return cached[frames.reshape(-1)].reshape(*frames.shape, *spec.shape)
        return store.read_frames(key, frames.reshape(-1)).reshape(*frames.shape, *spec.shape)

    def _fits_in_memory(self, key: str) -> bool:
        store = self.store
        used = sum(v.nbytes for v in self._cache.values())
        spec = store.features[key]
        need = store.n_frames * int(np.prod(spec.shape)) * np.dtype(spec.dtype).itemsize
        return used + need <= self.preload_bytes

    def sample_many(self, indices: Sequence[int] | np.ndarray) -> dict[str, Any]:
        """A batch as numpy arrays with a leading batch axis (see :meth:`sample` for the keys)."""
        which, t, start, end = self.locate(indices)
        batch: dict[str, Any] = {"obs": {}, "obs_is_pad": {}}
        for key, offsets in self.obs_offsets.items():
            wanted = t[:, None] + np.asarray(offsets, dtype=np.int64)[None, :]
            frames = np.clip(wanted, start[:, None], end[:, None] - 1)
            batch["obs"][key] = self._read(key, frames)
            batch["obs_is_pad"][key] = wanted != frames
        wanted = t[:, None] + np.arange(self.horizon, dtype=np.int64)[None, :]
        frames = np.minimum(wanted, end[:, None] - 1)
        parts = [self._read(key, frames).reshape(len(t), self.horizon, -1) for key in self.action_keys]
        batch["action"] = np.concatenate(parts, axis=-1).astype(np.float32, copy=False)
        batch["action_is_pad"] = wanted != frames
        batch["episode_index"] = self.episodes[which]
        batch["frame_index"] = t - start
        for key in self.obs_offsets:
            if self.store.features[key].kind == "low_dim":
                batch["obs"][key] = batch["obs"][key].astype(np.float32, copy=False)
        if self.target_keys:
            batch["targets"] = {
                key: self._read(key, t[:, None]).astype(np.float32, copy=False) for key in self.target_keys
            }
        if self._next_waypoint is not None:
            following = self._next_waypoint[t]
            batch["waypoint_obs"] = {key: self._read(key, following[:, None]) for key in self.waypoint_keys}
            for key in self.waypoint_keys:
                if self.store.features[key].kind == "low_dim":
                    batch["waypoint_obs"][key] = batch["waypoint_obs"][key].astype(np.float32, copy=False)
            batch["waypoint_index"] = following - start
        return batch

    def sample(self, index: int) -> dict[str, Any]:
        """One sample: ``obs`` {key: (len(offsets), *shape)}, ``obs_is_pad`` {key: (len(offsets),)},
        ``action`` (horizon, action_dim) float32, ``action_is_pad`` (horizon,), ``episode_index`` (store
        index) and ``frame_index`` (t within the episode); with ``waypoint_keys`` also ``waypoint_obs``
        {key: (1, *shape)} (the frame at the store's ``next_waypoint_index``) and ``waypoint_index``
        (that frame within the episode); with ``target_keys`` also ``targets`` {key: (1, *shape)}
        float32, the frame ``t`` of keys a policy learns to predict but does not observe."""
        batch = self.sample_many([index])
        return unbatch(batch, 0)


def unbatch(batch: Mapping[str, Any], i: int) -> dict[str, Any]:
    """Item ``i`` of a batch made by :meth:`WindowSampler.sample_many`."""
    return {
        "obs": {k: v[i] for k, v in batch["obs"].items()},
        "obs_is_pad": {k: v[i] for k, v in batch["obs_is_pad"].items()},
        "action": batch["action"][i],
        "action_is_pad": batch["action_is_pad"][i],
        "episode_index": int(batch["episode_index"][i]),
        "frame_index": int(batch["frame_index"][i]),
        **({"targets": {k: v[i] for k, v in batch["targets"].items()}} if "targets" in batch else {}),
        **(
            {
                "waypoint_obs": {k: v[i] for k, v in batch["waypoint_obs"].items()},
                "waypoint_index": int(batch["waypoint_index"][i]),
            }
            if "waypoint_obs" in batch
            else {}
        ),
    }
