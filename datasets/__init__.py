"""The episode store, subsets by environment/object/demo count, and the windowed sampler.

The store and subsets import without torch; ``EpisodeDataset`` and ``EpisodeDataModule`` load torch
and Lightning only when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from demoscale.datasets.locking import writer_lock
from demoscale.datasets.repair import repair_store
from demoscale.datasets.schema import FeatureSpec, StoreError, StoreLockTimeout
from demoscale.datasets.store import DerivedArray, EpisodeStore, sha256_of, store_exists

__all__ = [
    "DerivedArray",
    "EpisodeStore",
    "FeatureSpec",
    "StoreError",
    "StoreLockTimeout",
    "repair_store",
    "sha256_of",
    "store_exists",
    "writer_lock",
    "Subset",
    "select_subset",
    "subset_capacity",
    "WindowSampler",
    "EpisodeDataset",
    "EpisodeDataModule",
]

_LAZY = {
    "Subset": "demoscale.datasets.subsets",
    "select_subset": "demoscale.datasets.subsets",
    "subset_capacity": "demoscale.datasets.subsets",
    "WindowSampler": "demoscale.datasets.sampler",
    "EpisodeDataset": "demoscale.datasets.torch_data",
    "EpisodeDataModule": "demoscale.datasets.torch_data",
}

if TYPE_CHECKING:
    from demoscale.datasets.sampler import WindowSampler
    from demoscale.datasets.subsets import Subset, select_subset, subset_capacity
    from demoscale.datasets.torch_data import EpisodeDataModule, EpisodeDataset


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'demoscale.datasets' has no attribute {name!r}")
