"""Normalisation statistics of a numeric key: streamed over blocks of frames, JSON-cacheable.

:func:`compute_stats` reads a key's committed frames block by block (mean and variance merged
across blocks, Chan et al.); p01/p99 are exact while the key holds at most
``EXACT_PERCENTILE_MAX_VALUES`` values, otherwise read from a fine histogram between min and max.
The store caches the results in its root attributes (:meth:`EpisodeStore.stats`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import zarr
from demoscale.datasets.schema import FeatureSpec

STATS_BLOCK_FRAMES = 1 << 16
EXACT_PERCENTILE_MAX_VALUES = 4_000_000
HISTOGRAM_BINS = 8192
STAT_NAMES = ("min", "max", "mean", "std", "p01", "p99")


def stats_shape(spec: FeatureSpec) -> tuple[int, ...]:
    """Shape of each statistic: per dimension, or per channel (last axis) for point clouds."""
    return spec.shape[-1:] if spec.kind == "point_cloud" else spec.shape


def stats_to_json(stats: Mapping[str, np.ndarray], n_frames: int) -> dict[str, Any]:
    """A cache entry: the statistics as lists, tagged with the frame count they were computed on."""
    return {"n_frames": n_frames, **{k: np.asarray(v).tolist() for k, v in stats.items()}}


def stats_from_json(spec: FeatureSpec, entry: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Inverse of :func:`stats_to_json` (without the frame count)."""
    shape = stats_shape(spec)
    out = {k: np.asarray(entry[k], dtype=np.float64).reshape(shape) for k in STAT_NAMES}
    out["count"] = np.asarray(entry["count"], dtype=np.int64)
    return out


def _blocks(array: zarr.Array, n_frames: int, width: int) -> Iterator[np.ndarray]:
    block = max(array.chunks[0], (STATS_BLOCK_FRAMES // array.chunks[0]) * array.chunks[0])
    for start in range(0, n_frames, block):
        values = np.asarray(array[start : min(n_frames, start + block)], dtype=np.float64)
        yield values.reshape(-1, width)


def compute_stats(array: zarr.Array, spec: FeatureSpec, n_frames: int) -> dict[str, np.ndarray]:
    """min, max, mean, std, p01, p99 (per dimension) and count over the first ``n_frames`` of ``array``."""
    shape = stats_shape(spec)
    width = int(np.prod(shape, dtype=np.int64)) if shape else 1
    count = 0
    mean = np.zeros(width)
    m2 = np.zeros(width)
    low = np.full(width, np.inf)
    high = np.full(width, -np.inf)
    for values in _blocks(array, n_frames, width):
        # Chan et al. pairwise update: stable mean/variance over blocks.
        n_b = len(values)
        mean_b = values.mean(axis=0)
        m2_b = ((values - mean_b) ** 2).sum(axis=0)
        delta = mean_b - mean
        total = count + n_b
        mean = mean + delta * n_b / total
        m2 = m2 + m2_b + delta**2 * count * n_b / total
        count = total
        low = np.minimum(low, values.min(axis=0))
        high = np.maximum(high, values.max(axis=0))
    if count * width <= EXACT_PERCENTILE_MAX_VALUES:
        everything = np.concatenate(list(_blocks(array, n_frames, width)))
        p01, p99 = np.percentile(everything, [1, 99], axis=0)
    else:
        p01, p99 = _histogram_percentiles(array, n_frames, width, low, high, count)
    result = {"min": low, "max": high, "mean": mean, "std": np.sqrt(m2 / count), "p01": p01, "p99": p99}
    out = {k: v.reshape(shape) for k, v in result.items()}
    out["count"] = np.asarray(count, dtype=np.int64)
    return out


def _histogram_percentiles(
    array: zarr.Array, n_frames: int, width: int, low: np.ndarray, high: np.ndarray, count: int
) -> list[np.ndarray]:
    """p01 and p99 from an ``HISTOGRAM_BINS``-bin histogram between min and max (one more pass)."""
    span = np.where(high > low, high - low, 1.0)
    counts = np.zeros((width, HISTOGRAM_BINS), dtype=np.int64)
    for values in _blocks(array, n_frames, width):
        bins = np.clip(((values - low) / span * HISTOGRAM_BINS).astype(np.int64), 0, HISTOGRAM_BINS - 1)
        for d in range(width):
            counts[d] += np.bincount(bins[:, d], minlength=HISTOGRAM_BINS)
    result = []
    for q in (0.01, 0.99):
        rank = q * (count - 1)
        cumulative = np.cumsum(counts, axis=1)
        values = np.empty(width)
        for d in range(width):
            b = int(np.searchsorted(cumulative[d], rank, side="right"))
            b = min(b, HISTOGRAM_BINS - 1)
            before = cumulative[d, b - 1] if b else 0
            inside = counts[d, b]
            fraction = (rank - before) / inside if inside else 0.5
            values[d] = low[d] + (b + fraction) / HISTOGRAM_BINS * span[d]
        result.append(np.clip(values, low, high))
    return result
