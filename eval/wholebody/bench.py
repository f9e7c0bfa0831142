"""Throughput of the whole-body family, for ``benchmarks/sim.py``: physics, rendering, point clouds.

:func:`measure_wholebody` returns one row per measurement, each a dict with ``name``, ``value``
(a median over repeats), ``unit`` and ``repeats``; numbers measured side by side in one process.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import mujoco
import numpy as np
from demoscale.eval.wholebody.pointcloud import sample_fixed
from demoscale.eval.wholebody.tasks import make_fetch_shelf_env


def _median_rate(work: Callable[[], None], count: int, repeats: int) -> float:
    rates = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        rates.append(count / (time.perf_counter() - started))
    return float(np.median(rates))


def measure_wholebody(
    steps: int = 20,
    image_size: int = 96,
    n_points: int = 1024,
    repeats: int = 3,
    env_id: int = 0,
    object_id: int = 0,
) -> list[dict]:
    """Physics steps/s, control steps/s (with and without observations), renders/s and point-cloud
    sampling rates of ``fetch_shelf`` (``steps`` control steps per repeat, medians of ``repeats``)."""
    blind = make_fetch_shelf_env(env_id, object_id, cameras=(), point_cloud_cameras=())
    seeing = make_fetch_shelf_env(env_id, object_id, image_size=image_size, n_points=n_points)
    blind.reset(0)
    seeing.reset(0)
    hold = blind.last_action.copy()
    substeps = blind.config.substeps
    physics = _median_rate(
        lambda: mujoco.mj_step(blind.model, blind.data, nstep=steps * substeps), steps * substeps, repeats
    )
    control_blind = _median_rate(lambda: [blind.step(hold) for _ in range(steps)], steps, repeats)
    control_seeing = _median_rate(lambda: [seeing.step(hold) for _ in range(steps)], steps, repeats)
    render_rgb = _median_rate(
        lambda: [seeing._render_camera("head", depth=False) for _ in range(steps)], steps, repeats
    )
    render_rgbd = _median_rate(
        lambda: [seeing._render_camera("head", depth=True) for _ in range(steps)], steps, repeats
    )
    images = seeing._cameras()
    cloud = np.concatenate(
        [seeing._points_base_frame(c, images[c][1]) for c in seeing.config.point_cloud_cameras]
    )
    colours = np.concatenate([images[c][0].reshape(-1, 3) for c in seeing.config.point_cloud_cameras])
    rng = np.random.default_rng(0)
    sampling = {
        method: _median_rate(
            lambda method=method: [sample_fixed(cloud, colours, n_points, rng, method) for _ in range(5)],
            5,
            repeats,
        )
        for method in ("voxel", "fps", "random")
    }
    blind.close()
    seeing.close()
    rows = [
        ("physics steps (0.002 s)", physics, "steps/s"),
        ("control steps, no observation", control_blind, "steps/s"),
        (f"control steps + head RGB-D {image_size}px + {n_points}-point cloud", control_seeing, "steps/s"),
        (f"head RGB render {image_size}px", render_rgb, "renders/s"),
        (f"head RGB + depth render {image_size}px", render_rgbd, "renders/s"),
    ]
    rows += [(f"point sampling '{m}' {len(cloud)} -> {n_points}", r, "clouds/s") for m, r in sampling.items()]
    return [{"name": name, "value": value, "unit": unit, "repeats": repeats} for name, value, unit in rows]


def format_rows(rows: list[dict]) -> str:
    """A readable table of :func:`measure_wholebody` rows."""
    width = max(len(row["name"]) for row in rows)
    return "\n".join(f"{row['name']:<{width}}  {row['value']:>10.1f} {row['unit']}" for row in rows)


if __name__ == "__main__":  # python -m demoscale.eval.wholebody.bench
    print(format_rows(measure_wholebody()))
