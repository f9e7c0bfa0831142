"""Fused point clouds from rendered depth: back-projection, cropping, farthest-point sampling."""

from __future__ import annotations

import numpy as np


def backproject(depth: np.ndarray, fovy_deg: float) -> np.ndarray:
    """Camera-frame points (H*W, 3) of a MuJoCo depth image (metres along the view axis).

    MuJoCo cameras look along their -z axis with +y up and +x to the right; image rows grow
    downwards. The focal length in pixels follows from the vertical field of view.
    """
    height, width = depth.shape
    focal = 0.5 * height / np.tan(np.deg2rad(fovy_deg) / 2)
    cols = (np.arange(width) + 0.5 - width / 2) / focal
    rows = (np.arange(height) + 0.5 - height / 2) / focal
    x = cols[None, :] * depth
    y = -rows[:, None] * depth
    return np.stack([x, y, -depth], axis=-1).reshape(-1, 3)


def farthest_point_sample(points: np.ndarray, n: int, start: int = 0) -> np.ndarray:
    """Indices of ``n`` points chosen by farthest-point sampling (all indices if there are fewer)."""
    count = len(points)
    if count <= n:
        return np.arange(count)
    chosen = np.empty(n, np.int64)
    chosen[0] = start
    nearest = np.full(count, np.inf)
    for i in range(1, n):
        offset = points - points[chosen[i - 1]]
        np.minimum(nearest, np.einsum("ij,ij->i", offset, offset), out=nearest)
        chosen[i] = int(nearest.argmax())
    return chosen


VOXEL_SIZES = (0.16, 0.12, 0.08, 0.06, 0.045, 0.035, 0.025, 0.018, 0.012, 0.008)


def _voxel_representatives(points: np.ndarray, size: float) -> np.ndarray:
    """Index of the first point in every occupied voxel of edge ``size``."""
    cells = np.floor(points / size).astype(np.int64)
    cells -= cells.min(axis=0)
    extent = cells.max(axis=0) + 1
    keys = cells[:, 0] + extent[0] * (cells[:, 1] + extent[1] * cells[:, 2])
    return np.unique(keys, return_index=True)[1]


def voxel_sample(points: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of ``n`` points spread over space: one random point per voxel at the coarsest voxel
    size (of :data:`VOXEL_SIZES`) that still has at least ``n`` occupied voxels, then ``n`` of those
    at random. A fast stand-in for farthest-point sampling (uniform coverage, no per-point loop).
    """
    count = len(points)
    if count <= n:
        return rng.permutation(count)
    order = rng.permutation(count)
    shuffled = points[order]
    # Occupied voxels grow as the voxels shrink: bisect for the coarsest size that is enough.
    low, high, best = 0, len(VOXEL_SIZES) - 1, None
    while low <= high:
        middle = (low + high) // 2
        first = _voxel_representatives(shuffled, VOXEL_SIZES[middle])
        if len(first) >= n:
            best, high = first, middle - 1
        else:
            low = middle + 1
    if best is not None:
        return order[rng.choice(best, n, replace=False)]
    # Fewer voxels than points wanted even at the finest size: all voxel representatives, then others.
    first = _voxel_representatives(shuffled, VOXEL_SIZES[-1])
    rest = np.setdiff1d(np.arange(count), first)
    return order[np.concatenate([first, rng.choice(rest, n - len(first), replace=False)])]


def sample_fixed(
    xyz: np.ndarray,
    rgb: np.ndarray,
    n_points: int,
    rng: np.random.Generator,
    method: str = "voxel",
    candidates_per_point: int = 2,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n_points`` of a cloud as (xyz float32 (n,3), rgb uint8 (n,3), mask bool (n,)).

    ``method``: ``"voxel"`` (:func:`voxel_sample`, fast), ``"fps"`` (farthest-point sampling of at
    most ``candidates_per_point * n_points`` uniformly drawn candidates, as BRS recordings are
    sampled; slow in numpy) or ``"random"``. Missing points are zero padding with ``mask`` False.
    """
    if method not in {"voxel", "fps", "random"}:
        raise ValueError(f"unknown point sampling method {method!r}; expected 'voxel', 'fps' or 'random'")
    count = len(xyz)
    if method == "random" or count <= n_points:
        keep = rng.permutation(count)[:n_points]
    elif method == "voxel":
        keep = voxel_sample(xyz, n_points, rng)
    else:
        pool = rng.permutation(count)[: candidates_per_point * n_points]
        keep = pool[farthest_point_sample(xyz[pool], n_points, start=0)]
    out_xyz = np.zeros((n_points, 3), np.float32)
    out_rgb = np.zeros((n_points, 3), np.uint8)
    mask = np.zeros(n_points, bool)
    out_xyz[: len(keep)] = xyz[keep]
    out_rgb[: len(keep)] = rgb[keep]
    mask[: len(keep)] = True
    return out_xyz, out_rgb, mask
