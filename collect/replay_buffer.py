"""diffusion_policy replay buffers (``data/<key>`` + ``meta/episode_ends``, Zarr format 2).

A replay buffer is a directory (``.zarr``) or a zip (``.zarr.zip``); arrays are usually Blosc
compressed. Every ``data/`` key is stored under its own name. Arrays shaped (T, H, W, 3) (or
(T, H, W, 1)) are images: float images (PushT's ``img`` is float32 0..255) become uint8 exactly,
which is checked (integral values in 0..255) rather than assumed. Everything else is low-dim and
stored bit-identically with its source dtype.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from demoscale.collect.ingest import (
    ContentHash,
    EpisodePlan,
    IngestError,
    IngestSummary,
    as_uint8_image,
    check_finite,
    write_plans,
)
from demoscale.collect.sources import SourceIds, resolve_sources
from demoscale.collect.zarr_source import RawGroup, inspect_group, open_cached
from tqdm import tqdm

DEFAULT_RATE_HZ = 10.0  # PushT and most diffusion_policy buffers are recorded at 10 Hz


def _is_image(shape: tuple[int, ...]) -> bool:
    return len(shape) == 4 and shape[-1] in (1, 3)


def replay_buffer_features(arrays: Mapping, rate_hz: float) -> dict:
    from demoscale.datasets import FeatureSpec

    features = {}
    for name, array in sorted(arrays.items()):
        if _is_image(array.shape):
            features[name] = FeatureSpec(
                kind="image", shape=tuple(array.shape[1:]), dtype="uint8", rate_hz=rate_hz, units="rgb"
            )
        else:
            features[name] = FeatureSpec(
                kind="low_dim", shape=tuple(array.shape[1:]), dtype=array.dtype.name, rate_hz=rate_hz
            )
    return features


def plan_replay_buffer(
    path: str | os.PathLike,
    ids: SourceIds | None = None,
    max_episodes: int | None = None,
    progress: bool = False,
):
    """Validate a replay buffer (its first ``max_episodes`` episodes, default all).

    Returns (array infos by key, episode plans); raises IngestError naming file, key and episode.
    """
    import zarr

    ids = ids or SourceIds()
    path = Path(path).resolve()
    raw = RawGroup(path)
    try:
        info = inspect_group(raw)
        root = zarr.open_group(raw.zarr_store(), mode="r", zarr_format=2)
        low_dim, images = {}, []
        for name, array in info.arrays.items():
            if _is_image(array.shape):
                images.append(name)
                continue
            try:
                low_dim[name] = np.asarray(root[f"data/{name}"][:])
            except Exception as error:
                raise IngestError(f"{path}: key {name!r} cannot be read: {error}") from error
            if max_episodes is not None:
                low_dim[name] = low_dim[name][: info.bounds(min(max_episodes, info.n_episodes) - 1)[1]]
            check_finite(low_dim[name], str(path), name, info.episode_ends)
        plans = []
        n_episodes = info.n_episodes if max_episodes is None else min(max_episodes, info.n_episodes)
        for episode in tqdm(
            range(n_episodes), desc=f"validate {path.name}", unit="episode", disable=not progress
        ):
            start, end = info.bounds(episode)
            digest = ContentHash()
            for name in sorted(info.arrays):
                if name in low_dim:
                    digest.array(name, low_dim[name][start:end])
                    continue
                try:
                    frames = np.asarray(root[f"data/{name}"][start:end])
                except Exception as error:
                    raise IngestError(
                        f"{path}: key {name!r}, episode {episode}: cannot be read: {error}"
                    ) from error
                digest.array(name, as_uint8_image(frames, str(path), name, episode))
            plans.append(
                EpisodePlan(
                    source=f"{path}#episode={episode}",
                    sha256=digest.hexdigest(),
                    length=end - start,
                    load_args={"path": str(path), "start": start, "end": end, "images": images},
                    env_id=ids.env_id,
                    object_id=ids.object_id,
                    task=ids.task,
                    operator=ids.operator,
                )
            )
    finally:
        raw.close()
    return info.arrays, plans


def load_replay_episode(args: Mapping, want_encoded: bool):
    """Loader for one planned replay-buffer episode (images as uint8, low-dim as stored)."""
    _, root = open_cached(args["path"])
    start, end = args["start"], args["end"]
    arrays = {}
    for name in root["data"].array_keys():
        values = np.asarray(root[f"data/{name}"][start:end])
        if name in args["images"]:
            values = as_uint8_image(values, args["path"], name, -1)
        arrays[name] = values
    return arrays, None


def ingest_replay_buffer(
    src: str | os.PathLike,
    store: str | os.PathLike,
    *,
    env_id: str | None = None,
    object_id: str | None = None,
    task: str | None = None,
    operator: str | None = None,
    rate_hz: float = DEFAULT_RATE_HZ,
    image_codec: str | None = "png",
    max_episodes: int | None = None,
    workers: int = 1,
    dry_run: bool = False,
    progress: bool = True,
    lock_timeout: float | None = None,
) -> IngestSummary:
    """Ingest a diffusion_policy replay buffer (directory or ``.zarr.zip``) into ``store``.

    Keys are kept as they are; image arrays become uint8 (exactly, or an IngestError). A new store
    gets the lossless ``png`` image codec unless ``image_codec`` says otherwise, so that the stored
    frames equal the source's. ``env_id``,
    ``object_id``, ``task`` and ``operator`` label every episode. ``max_episodes`` ingests only the
    first episodes (and validates only those: nothing else is written).
    """
    started = time.perf_counter()
    overrides = {"env_id": env_id, "object_id": object_id, "task": task, "operator": operator}
    sources = resolve_sources(src, ["*.zarr", "*.zarr.zip"], overrides=overrides, what="replay buffer")
    features, plans = None, []
    for path, ids in sources:
        remaining = None if max_episodes is None else max_episodes - len(plans)
        if remaining is not None and remaining <= 0:
            break
        arrays, source_plans = plan_replay_buffer(path, ids, remaining, progress=progress)
        source_features = replay_buffer_features(arrays, rate_hz)
        if features is not None and source_features.keys() != features.keys():
            raise IngestError(
                f"{path}: keys {sorted(source_features)} differ from the first source's {sorted(features)}"
            )
        features = features or source_features
        plans.extend(source_plans)
    return write_plans(
        store,
        features,
        plans,
        load_replay_episode,
        sources=[str(p) for p, _ in sources],
        image_codec=image_codec,
        workers=workers,
        dry_run=dry_run,
        progress=progress,
        started=started,
        lock_timeout=lock_timeout,
    )
