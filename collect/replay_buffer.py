"""diffusion_policy replay buffers (``data/<key>`` + ``meta/episode_ends``, Zarr format 2).

A replay buffer is a directory (``.zarr``) or a zip (``.zarr.zip``); arrays are usually Blosc
compressed. Every ``data/`` key is stored under its own name. Arrays shaped (T, H, W, 3) (or
(T, H, W, 1)) are images: float images (PushT's ``img`` is float32 0..255) become uint8 exactly,
which is checked (integral values in 0..255) rather than assumed. Everything else is low-dim and
stored bit-identically with its source dtype.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from demoscale.collect.driver import IngestSummary, ingest
from demoscale.collect.source_format import (
    EpisodePlan,
    IngestError,
    LoadedEpisode,
    SourceFormat,
    SourcePlan,
    as_uint8_image,
    content_hash,
    option,
    validating,
)
from demoscale.collect.sources import SourceIds
from demoscale.collect.zarr_source import cached_frames, episode_group, read_checked

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


@dataclass(frozen=True)
class ReplayBufferOptions:
    rate_hz: float = option(DEFAULT_RATE_HZ, f"frame rate (default {DEFAULT_RATE_HZ:g})")


@dataclass(frozen=True)
class ReplayEpisode:
    """Where one planned replay-buffer episode lies."""

    path: str
    episode: int
    start: int
    end: int
    images: tuple[str, ...]  # keys of image arrays: made uint8 on loading
    keys: tuple[str, ...] = ()  # every data/ key


class ReplayBufferFormat(SourceFormat):
    """diffusion_policy replay buffers (the :class:`~demoscale.collect.source_format.SourceFormat` contract)."""

    name = "replay-buffer"
    summary = "a diffusion_policy replay buffer (.zarr or .zarr.zip)"
    src_help = "the replay buffer directory or zip"
    patterns = ("*.zarr", "*.zarr.zip")
    what = "replay buffer"
    options_type = ReplayBufferOptions
    default_image_codec = "png"  # lossless: stored frames equal the source's
    hash_on_load = True  # an episode's hash is that of the arrays `load` returns

    def plan(
        self,
        path: Path,
        ids: SourceIds,
        options: ReplayBufferOptions,
        limit: int | None,
        progress: bool,
        hashes: bool = True,
    ) -> SourcePlan:
        """Validate a replay buffer's first ``limit`` episodes (default all): nothing else is written.

        With ``hashes`` False the image frames are not read here (their values are checked as they
        are loaded) and the plans carry no hash: the driver hashes the loaded arrays."""
        path = Path(path).resolve()
        with episode_group(path) as (_, info, root):
            n_episodes = info.n_episodes if limit is None else min(limit, info.n_episodes)
            images = tuple(name for name, array in info.arrays.items() if _is_image(array.shape))
            low_dim = {
                name: read_checked(root, info, name, stop=info.bounds(n_episodes - 1)[1])
                for name in info.arrays
                if name not in images
            }
            plans = []
            for episode in validating(range(n_episodes), path, progress):
                start, end = info.bounds(episode)
                load_args = ReplayEpisode(str(path), episode, start, end, images, tuple(sorted(info.arrays)))
                digest = None
                if hashes:
                    arrays = {name: values[start:end] for name, values in low_dim.items()}
                    for name in images:
                        try:
                            frames = cached_frames(path, name).read(start, end)
                        except Exception as error:
                            raise IngestError(
                                f"{path}: key {name!r}, episode {episode}: cannot be read: {error}"
                            ) from error
                        arrays[name] = as_uint8_image(frames, str(path), name, episode)
                    digest = content_hash(arrays)
                plans.append(EpisodePlan(f"{path}#episode={episode}", digest, end - start, load_args, ids))
        return SourcePlan(replay_buffer_features(info.arrays, options.rate_hz), plans)

    def load(self, episode: ReplayEpisode, want_encoded: bool) -> LoadedEpisode:
        """The episode's arrays: images as uint8, low-dim as stored."""
        arrays = {}
        for name in episode.keys:
            values = cached_frames(episode.path, name).read(episode.start, episode.end)
            if name in episode.images:
                values = as_uint8_image(values, episode.path, name, episode.episode)
            arrays[name] = values
        return arrays, None


REPLAY_BUFFER = ReplayBufferFormat()


def ingest_replay_buffer(
    src: str | os.PathLike, store: str | os.PathLike, *, rate_hz: float = DEFAULT_RATE_HZ, **common: Any
) -> IngestSummary:
    """Ingest a diffusion_policy replay buffer (directory or ``.zarr.zip``) into ``store``.

    Keys are kept as they are; image arrays become uint8 (exactly, or an IngestError). A new store
    gets the lossless ``png`` image codec unless ``image_codec`` says otherwise, so that the stored
    frames equal the source's. ``max_episodes`` ingests only the first episodes (and validates only
    those). ``common`` are the driver's keywords (:func:`demoscale.collect.ingest`).
    """
    return ingest(REPLAY_BUFFER, src, store, ReplayBufferOptions(rate_hz=rate_hz), **common)
