"""The episode store: time-major Zarr arrays of many demonstrations plus per-episode metadata.

Layout (format ``demoscale.episode_store``, version 1; described in full in ``datasets/README.md``)::

    store.zarr/                      root group; attributes: format, version, features, image_codec
      data/<key>                     time-major arrays, one row per frame of every episode
      data/<derived key>             per-frame caches computed from the episodes (write_derived)
      meta/episode_ends              int64, exclusive cumulative end of each episode (the commit point)
      meta/<column>                  one entry per episode: env_id, object_id, task, operator, source,
                                     source_sha256, length, success (int8: 1, 0, -1 unknown), tags

Appends are made safe against being killed at any moment by writing ``meta/episode_ends`` last:
readers trust only frames before its last valid entry and only metadata rows of committed episodes.
Every mutation runs under the store's writer lock (``datasets/locking.py``); a :meth:`transaction`
makes a batch of appends visible together or, on any error, not at all.

This module is the store's API. What a store is made of (feature specs, the array layout, checks of
offered episodes) is in ``schema.py``; chunk and shard files (fast frame reads, batched writes,
rollback journals) in ``shards.py``; reading an image key's frames (codecs, video decoding) in
``frames.py``; appends and transactions in ``writing.py``; statistics in ``statistics.py``; validation in
``integrity.py``; repair after a killed writer in ``repair.py``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
import pandas as pd
import zarr
from demoscale.datasets import codecs, video
from demoscale.datasets.frames import ImageKeyFrames, reading_errors
from demoscale.datasets.locking import try_writer_lock, writer_lock
from demoscale.datasets.schema import (
    CHUNK_BYTES,
    DEFAULT_IMAGE_SHARD_FRAMES,
    FORMAT_NAME,
    FORMAT_VERSION,
    META_COLUMNS,
    SUCCESS_UNKNOWN,
    FeatureSpec,
    StoreError,
    StoreLockTimeout,
    as_feature_specs,
    build_layout,
    checked_compressors,
    id_order,
    layout_differences,
)
from demoscale.datasets.shards import (
    LocalShardWriter,
    create_by_rename,
    is_url,
    local_path,
    open_zarr_store,
)
from demoscale.datasets.statistics import compute_stats, stats_from_json, stats_to_json
from demoscale.datasets.writing import StoreWriting, _Staged

__all__ = [
    "DerivedArray",
    "EpisodeStore",
    "FeatureSpec",
    "StoreError",
    "StoreLockTimeout",
    "dumps_info",
    "sha256_of",
    "store_exists",
]

logger = logging.getLogger(__name__)

# Variable-length bytes has no ratified Zarr v3 spec yet; zarr warns on every array that uses it.
# The layout is versioned by this package, so the warning says nothing a user can act on.
warnings.filterwarnings("ignore", message=r"The data type \(VariableLength")

# Attribute of a derived array: the number of frames it was computed on, set once its values are written.
_DERIVED_FRAMES = "derived_from_n_frames"


class DerivedArray(NamedTuple):
    """A derived array's values (one row per committed frame) and its attributes."""

    values: np.ndarray
    attrs: dict[str, Any]


@dataclass
class _Committed:
    n_episodes: int
    episode_ends: np.ndarray
    uncommitted_frames: int = 0
    notes: list[str] = field(default_factory=list)


def store_exists(location: str | os.PathLike[str]) -> bool:
    """Whether something a creation would clash with is at ``location``: a file, a non-empty
    directory, or (for a URL) any object."""
    location = os.fspath(location)
    local = local_path(location)
    if local is None and is_url(location):
        import fsspec

        fs, path = fsspec.core.url_to_fs(location)
        return fs.exists(path)
    path = local if local is not None else Path(location)
    return path.is_file() or (path.is_dir() and any(path.iterdir()))


class EpisodeStore(StoreWriting):
    """A Zarr store of episodes; use :meth:`create`, :meth:`open` or :meth:`open_or_create`."""

    def __init__(self, root: zarr.Group, location: str, writable: bool) -> None:
        self._root = root
        self.location = location
        self.writable = writable
        attrs = dict(root.attrs)
        if attrs.get("format") != FORMAT_NAME:
            hint = (
                " (an unfinished creation? `demoscale store repair` removes a store that never got its attributes)"
                if "format" not in attrs
                else ""
            )
            raise StoreError(
                f"{location}: not a demoscale episode store (root attribute format={attrs.get('format')!r}){hint}"
            )
        if int(attrs.get("version", -1)) > FORMAT_VERSION:
            raise StoreError(
                f"{location}: store format version {attrs.get('version')} is newer than this reader ({FORMAT_VERSION})"
            )
        try:
            self.features: dict[str, FeatureSpec] = {
                k: FeatureSpec.from_dict(v) for k, v in attrs["features"].items()
            }
        except (KeyError, TypeError, AttributeError, ValueError) as error:
            raise StoreError(
                f"{location}: root attribute 'features' is missing or malformed ({error!r})"
            ) from None
        self.image_codec: str = attrs.get("image_codec", "jpeg")
        self.image_codec_options: dict[str, Any] = dict(attrs.get("image_codec_options", {}))
        self._arrays: dict[str, zarr.Array] = {}
        self._stats_memory: dict[str, dict[str, Any]] = {}
        self._cleaned = False
        self._image_frames: dict[str, ImageKeyFrames] = {}
        self._shard_writers: dict[str, LocalShardWriter | None] = {}
        self._staged: _Staged | None = None
        self._refresh()

    # ------------------------------------------------------------------ opening
    @classmethod
    def create(
        cls,
        location: str | os.PathLike[str],
        features: Mapping[str, FeatureSpec],
        image_codec: str = "jpeg",
        image_codec_options: dict[str, Any] | None = None,
        image_shard_frames: int = DEFAULT_IMAGE_SHARD_FRAMES,
        overwrite: bool = False,
        lock_timeout: float | None = None,
    ) -> EpisodeStore:
        """Create an empty store at a local directory (or a writable fsspec URL).

        ``image_codec`` is ``"jpeg"`` (default), ``"png"`` (lossless) or ``"jpegxl"``, each frame
        an image; or ``"h264"`` / ``"av1"``, each episode a video (RGB keys only; see
        ``datasets/video.py``). ``image_codec_options`` go to the encoder: imagecodecs' (e.g.
        ``{"level": 95}``), or for video ``crf``, ``gop`` (the key-frame interval) and ``preset``.
        A local store is built under a temporary name beside ``location`` and renamed into place,
        so a creator killed at any moment leaves either no store or a complete empty one.
        """
        location = os.fspath(location)
        try:
            codec = codecs.check_codec(image_codec)
            options = codecs.codec_options(codec, image_codec_options)
        except ValueError as error:
            raise StoreError(f"{location}: {error}") from None
        if not features:
            raise StoreError(f"{location}: a store needs at least one feature")
        features = as_feature_specs(features)
        for key in features:
            if not key or "/" in key or key.startswith("."):
                raise StoreError(f"{location}: invalid feature key {key!r}")
        if codecs.is_video(codec):
            _check_video_store(location, codec, features)
        layout = (features, codec, options, int(image_shard_frames))
        local = local_path(location)
        if local is None:
            # Remote stores cannot be renamed atomically; a creation killed half-way is cleared by
            # `demoscale store repair` (documented in datasets/README.md).
            zstore = open_zarr_store(location, read_only=False)
            try:
                root = zarr.open_group(zstore, mode="w" if overwrite else "w-", zarr_format=3)
            except FileExistsError:
                raise StoreError(f"{location}: already exists (open it, or pass overwrite=True)") from None
            build_layout(root, *layout)
            return cls(root, location, writable=True)
        with writer_lock(location, lock_timeout, what="create"):
            if not overwrite and local.exists() and (not local.is_dir() or any(local.iterdir())):
                raise StoreError(f"{location}: already exists (open it, or pass overwrite=True)")
            create_by_rename(local, lambda root: build_layout(root, *layout))
            root = zarr.open_group(zarr.storage.LocalStore(local), mode="r+", zarr_format=3)
            return cls(root, location, writable=True)

    @classmethod
    def open(cls, location: str | os.PathLike[str], mode: Literal["r", "a"] = "r") -> EpisodeStore:
        """Open an existing store: a local directory, a ``.zip`` (read-only) or an fsspec URL.

        ``mode="r"`` reads; ``mode="a"`` also allows appending episodes and caching statistics.
        """
        location = os.fspath(location)
        if mode not in ("r", "a"):
            raise StoreError(f"{location}: mode must be 'r' or 'a', got {mode!r}")
        if not is_url(location) and not Path(location).exists():
            raise StoreError(f"{location}: no such store")
        zstore = open_zarr_store(location, read_only=mode == "r")
        try:
            root = zarr.open_group(zstore, mode="r" if mode == "r" else "r+")
        except Exception as error:  # zarr raises several types for a missing/invalid group
            raise StoreError(
                f"{location}: cannot open as a zarr group ({type(error).__name__}: {error})"
            ) from None
        return cls(root, location, writable=mode == "a")

    @classmethod
    def open_or_create(
        cls,
        location: str | os.PathLike[str],
        features: Mapping[str, FeatureSpec],
        image_codec: str = "jpeg",
        image_codec_options: dict[str, Any] | None = None,
        image_shard_frames: int = DEFAULT_IMAGE_SHARD_FRAMES,
    ) -> EpisodeStore:
        """Open a store for appending, creating it if absent.

        An existing store must hold episodes of the same layout: the same keys, each of the same
        kind, shape and dtype (rates, units and frames describe the data and are not compared).
        """
        location = os.fspath(location)
        with writer_lock(location, what="create"):  # no other creator between the check and the creation
            if not store_exists(location):
                return cls.create(location, features, image_codec, image_codec_options, image_shard_frames)
        store = cls.open(location, mode="a")
        differences = layout_differences(store.features, as_feature_specs(features))
        if differences:
            raise StoreError(f"{location}: existing store has different features ({'; '.join(differences)})")
        return store

    # ------------------------------------------------------------------ state
    def _for_writing(self, array: zarr.Array) -> zarr.Array:
        # Write every chunk, even one equal to the fill value: a chunk file that is missing is then
        # always damage, never "all zeros" (validate relies on it).
        return array.with_config({"write_empty_chunks": True}) if self.writable else array

    def _array(self, path: str) -> zarr.Array:
        if path not in self._arrays:
            try:
                self._arrays[path] = self._for_writing(self._root[path])
            except KeyError:
                raise StoreError(f"{self.location}: missing array {path}") from None
        return self._arrays[path]

    def _reload_array(self, path: str) -> zarr.Array:
        self._arrays.pop(path, None)
        try:
            array = zarr.open_array(self._root.store, path=path, mode="r+" if self.writable else "r")
        except (FileNotFoundError, KeyError):
            raise StoreError(f"{self.location}: missing array {path}") from None
        except Exception as error:  # zarr raises several types for damaged metadata
            raise StoreError(
                f"{self.location}: array {path} cannot be opened (damaged zarr.json?): {type(error).__name__}: {error}"
            ) from None
        self._arrays[path] = self._for_writing(array)
        return self._arrays[path]

    def _read_column(self, path: str, stop: int | None = None) -> np.ndarray:
        """A metadata array (or its first ``stop`` rows), with a clear error for a damaged chunk."""
        array = self._array(path)
        try:
            return np.asarray(array[:stop] if stop is not None else array[:])
        except Exception as error:
            hint = (
                "its chunk files under meta/episode_ends/c/ are damaged: the committed episodes are unknown"
                if path == "meta/episode_ends"
                else "a damaged chunk? `demoscale store validate` names the file"
            )
            raise StoreError(
                f"{self.location}: {path} cannot be read ({hint}): {type(error).__name__}: {error}"
            ) from None

    def _read_ends(self) -> np.ndarray:
        self._reload_array("meta/episode_ends")
        return np.asarray(self._read_column("meta/episode_ends"), dtype=np.int64)

    def _committed(self) -> _Committed:
        """Find the committed episodes: the longest valid prefix of ``meta/episode_ends``."""
        ends = self._read_ends()
        not_increasing = np.flatnonzero(np.diff(np.concatenate([[0], ends])) <= 0)
        n = int(not_increasing[0]) if len(not_increasing) else len(ends)
        notes = []
        if n + 1 < len(ends):
            notes.append(
                f"meta/episode_ends is not increasing at episode {n} "
                f"({int(ends[n - 1]) if n else 0} then {int(ends[n])}) and continues for {len(ends) - n} entries"
            )
        # A committed episode must be fully present in every data array and metadata column; if not,
        # the store is damaged (not merely interrupted): read what is whole, and let validate() say why.
        for key in self.features:
            frames = self._reload_array(f"data/{key}").shape[0]
            if n and ends[n - 1] > frames:
                notes.append(f"data/{key} has {frames} frames, meta/episode_ends says {int(ends[n - 1])}")
        for column in META_COLUMNS:
            rows = self._reload_array(f"meta/{column}").shape[0]
            if rows < n:
                notes.append(f"meta/{column} has {rows} rows for {n} committed episodes")
        limit_frames = min((self._array(f"data/{k}").shape[0] for k in self.features), default=0)
        limit_rows = min(self._array(f"meta/{c}").shape[0] for c in META_COLUMNS)
        while n > 0 and (ends[n - 1] > limit_frames or n > limit_rows):
            n -= 1
        n_frames = int(ends[n - 1]) if n else 0
        longest = max((self._array(f"data/{k}").shape[0] for k in self.features), default=0)
        return _Committed(n, ends[:n].copy(), uncommitted_frames=longest - n_frames, notes=notes)

    def _refresh(self) -> None:
        state = self._committed()
        self._episode_ends = state.episode_ends
        self._uncommitted_frames = state.uncommitted_frames
        self._notes = state.notes
        self._episodes_df: pd.DataFrame | None = None
        self._sources: set[str] | None = None

    def _refresh_if_changed(self) -> None:
        ends = self._read_ends()
        if len(ends) != self.n_episodes or not np.array_equal(ends, self._episode_ends):
            self._refresh()

    @property
    def n_episodes(self) -> int:
        """Number of committed episodes."""
        return len(self._episode_ends)

    @property
    def n_frames(self) -> int:
        """Number of committed frames (``episode_ends[-1]``, 0 when empty)."""
        return int(self._episode_ends[-1]) if len(self._episode_ends) else 0

    @property
    def episode_ends(self) -> np.ndarray:
        """Exclusive cumulative end frame of each committed episode (int64, a copy)."""
        return self._episode_ends.copy()

    @property
    def episode_starts(self) -> np.ndarray:
        """First frame of each committed episode (empty for an empty store)."""
        return np.concatenate([[0], self._episode_ends]).astype(np.int64)[:-1]

    @property
    def episodes(self) -> pd.DataFrame:
        """One row per committed episode: index, frame range, metadata (``success`` is nullable boolean)."""
        if self._episodes_df is None:
            n = self.n_episodes
            columns: dict[str, Any] = {
                "episode_index": np.arange(n, dtype=np.int64),
                "start": self.episode_starts,
                "end": self.episode_ends,
                "length": np.asarray(self._read_column("meta/length", n), dtype=np.int64),
            }
            for column in ("env_id", "object_id", "task", "operator", "source", "source_sha256", "tags"):
                values = self._read_column(f"meta/{column}", n) if n else []
                columns[column] = pd.array([str(v) for v in values], dtype=object)
            success = (
                np.asarray(self._read_column("meta/success", n), dtype=np.int8) if n else np.zeros(0, np.int8)
            )
            columns["success"] = pd.array(
                [None if s == SUCCESS_UNKNOWN else bool(s) for s in success], dtype="boolean"
            )
            frame = pd.DataFrame(columns)
            self._episodes_df = frame[
                [
                    "episode_index",
                    "start",
                    "end",
                    "length",
                    "env_id",
                    "object_id",
                    "task",
                    "operator",
                    "source",
                    "source_sha256",
                    "success",
                    "tags",
                ]
            ]
        return self._episodes_df.copy()

    def _source_hashes(self) -> set[str]:
        if self._sources is None:
            n = self.n_episodes
            self._sources = (
                {str(v) for v in self._read_column("meta/source_sha256", n)} - {""} if n else set()
            )
        return self._sources

    def has_source(self, source_sha256: str) -> bool:
        """Whether a committed episode came from a source with this content hash."""
        return source_sha256 in self._source_hashes()

    # ------------------------------------------------------------------ reading
    def _check_key(self, key: str) -> FeatureSpec:
        if key not in self.features:
            raise StoreError(f"{self.location}: unknown key {key!r}; keys are {', '.join(self.features)}")
        return self.features[key]

    def _frames(self, key: str) -> ImageKeyFrames:
        """The reader of image key ``key``'s stored frames (made on first use, dropped on rollback)."""
        frames = self._image_frames.get(key)
        if frames is None:
            frames = ImageKeyFrames(
                self.location,
                key,
                self.features[key],
                lambda: self._array(f"data/{key}"),
                self.image_codec,
                self.image_codec_options,
            )
            self._image_frames[key] = frames
        return frames

    def _image_codec_options(self, key: str) -> tuple[str, dict[str, Any]]:
        """The codec of image key ``key`` and its encoder options."""
        frames = self._frames(key)
        return frames.codec, dict(frames.options)

    def _read_images(self, key: str, frames: np.ndarray) -> np.ndarray:
        """Decoded images of image key ``key`` at sorted unique global indices."""
        return self._frames(key).decoded(frames, self.episode_starts, self._episode_ends)

    def video_packets_decoded(self, key: str) -> int:
        """How many packets of video image key ``key`` this handle has decoded in this process (0 for
        other keys): what random access costs, for benchmarks and tests (a frame decodes from its
        key frame on, so a random frame costs at most ``gop`` packets)."""
        spec = self._check_key(key)
        return self._frames(key).packets_decoded if spec.kind == "image" else 0

    def read(self, key: str, start: int, stop: int) -> np.ndarray:
        """Frames ``start:stop`` (global frame indices, committed frames only) of ``key``, decoded."""
        spec = self._check_key(key)
        n = self.n_frames
        if not (0 <= start <= stop <= n):
            raise StoreError(f"{self.location}: frames {start}:{stop} of {key!r} outside committed 0:{n}")
        if spec.kind == "image":
            if stop == start:
                return np.empty((0, *spec.shape), dtype=np.uint8)
            return self._read_images(key, np.arange(start, stop))
        with reading_errors(self.location, key, slice(start, stop)):
            return np.asarray(self._array(f"data/{key}")[start:stop])

    def read_encoded(self, key: str, start: int, stop: int) -> list[bytes]:
        """The stored (encoded) bytes of image frames ``start:stop`` of ``key`` (for a video key, the
        frames' packets: a frame decodes together with those from its key frame on)."""
        spec = self._check_key(key)
        if spec.kind != "image":
            raise StoreError(f"{self.location}: {key!r} is not an image key")
        if not (0 <= start <= stop <= self.n_frames):
            raise StoreError(f"{self.location}: frames {start}:{stop} of {key!r} outside 0:{self.n_frames}")
        if stop == start:
            return []
        return [bytes(b) for b in self._frames(key).encoded(np.arange(start, stop))]

    def read_frames(self, key: str, frame_indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """Frames at arbitrary global indices (any order, repeats allowed), read in one zarr call."""
        spec = self._check_key(key)
        indices = np.asarray(frame_indices, dtype=np.int64).reshape(-1)
        if len(indices) and (indices.min() < 0 or indices.max() >= self.n_frames):
            raise StoreError(f"{self.location}: frame index outside committed 0:{self.n_frames} for {key!r}")
        unique, inverse = np.unique(indices, return_inverse=True)
        if len(unique) == 0:
            return np.empty((0, *spec.shape), dtype=np.uint8 if spec.kind == "image" else spec.dtype)
        if spec.kind == "image":
            frames = self._frames(key)
            if frames.is_video:
                return frames.decoded(unique, self.episode_starts, self._episode_ends)[inverse]
            return frames.decode(frames.encoded(unique)[inverse])
        array = self._array(f"data/{key}")
        with reading_errors(self.location, key, unique):
            if len(unique) == unique[-1] - unique[0] + 1:
                raw = array[int(unique[0]) : int(unique[-1]) + 1]  # contiguous: a plain slice is cheapest
            else:
                raw = array.get_orthogonal_selection(unique)
        return np.asarray(raw)[inverse]

    def episode(self, index: int) -> dict[str, np.ndarray]:
        """All keys of one committed episode, decoded."""
        if not (0 <= index < self.n_episodes):
            raise StoreError(f"{self.location}: episode {index} outside 0:{self.n_episodes}")
        start = int(self.episode_starts[index])
        stop = int(self._episode_ends[index])
        return {key: self.read(key, start, stop) for key in self.features}

    # ------------------------------------------------------------------ statistics
    def stats(self, key: str) -> dict[str, np.ndarray]:
        """Per-dimension min, max, mean, std, p01, p99 and count of a numeric key over committed frames.

        Computed by streaming over blocks of frames (percentiles exactly when small, else from a fine
        histogram between min and max), cached in the store attributes until episodes are appended.
        Point clouds are summarised per channel (the last axis) over all points.
        """
        spec = self._check_key(key)
        if spec.kind == "image":
            raise StoreError(f"{self.location}: stats are for numeric keys; {key!r} is an image")
        n_frames = self.n_frames
        if n_frames == 0:
            raise StoreError(f"{self.location}: no committed frames to compute stats of {key!r}")
        cached = self._stats_memory.get(key) or dict(self._root.attrs.get("stats", {})).get(key)
        if cached and cached.get("n_frames") == n_frames:
            return stats_from_json(spec, cached)
        entry = stats_to_json(compute_stats(self._array(f"data/{key}"), spec, n_frames), n_frames)
        self._stats_memory[key] = entry
        self._persist_stats(key, entry)
        return stats_from_json(spec, entry)

    def _persist_stats(self, key: str, entry: dict[str, Any]) -> None:
        """Cache statistics in the root attributes: always when writable; for a read-only handle on a
        local directory we may write to, too (the one write a reader makes). Losing the cache only
        costs a recomputation, so it is skipped while another process holds the writer lock, and
        failures are ignored."""
        local = local_path(self.location)
        if not self.writable and not (
            local is not None and os.access(local, os.W_OK) and os.access(local / "zarr.json", os.W_OK)
        ):
            return
        with try_writer_lock(self.location) as locked:
            if not locked:
                return
            try:
                # Re-read the attributes under the lock: another process may have cached other keys.
                root = zarr.open_group(
                    self._root.store if self.writable else zarr.storage.LocalStore(local), mode="r+"
                )
                all_stats = dict(root.attrs.get("stats", {}))
                all_stats[key] = entry
                root.attrs["stats"] = all_stats
            except Exception:  # a cache write must never fail a read
                return

    # ------------------------------------------------------------------ derived arrays
    def write_derived(self, key: str, values: np.ndarray, attrs: Mapping[str, Any] | None = None) -> None:
        """Store ``values``, one row per committed frame, as the derived array ``data/<key>``.

        A derived array is a cache computed from the episodes (waypoint labels, say), not a feature:
        append and validate ignore it, and it is replaced by the next ``write_derived`` of its key.
        ``attrs`` (JSON-ready) are kept with it. Runs under the writer lock; raises StoreError when
        ``key`` names a feature, or when episodes were appended since the values were computed.
        """
        if not self.writable:
            raise StoreError(f"{self.location}: opened read-only; open with mode='a' to write {key!r}")
        if not key or "/" in key or key.startswith(".") or key in self.features:
            raise StoreError(
                f"{self.location}: {key!r} cannot be a derived array (feature keys: {', '.join(self.features)})"
            )
        values = np.asarray(values)
        if values.ndim == 0:
            raise StoreError(f"{self.location}: derived {key!r} needs one row per frame, got a scalar")
        with writer_lock(self.location, what=f"write {key!r} to"):
            self._refresh()
            if len(values) != self.n_frames:
                raise StoreError(
                    f"{self.location}: derived {key!r} has {len(values)} rows but the store has "
                    f"{self.n_frames} committed frames (episodes appended since it was computed?); "
                    "compute it again"
                )
            row_bytes = max(1, int(np.prod(values.shape[1:], dtype=np.int64)) * values.dtype.itemsize)
            array = self._root["data"].create_array(
                key,
                shape=values.shape,
                dtype=values.dtype,
                chunks=(max(1, min(len(values), CHUNK_BYTES // row_bytes)), *values.shape[1:]),
                compressors=checked_compressors(),
                # Marked complete only after the values are written: a writer killed in between
                # leaves an array that reads as absent, not one of zeros.
                attributes={**dict(attrs or {}), _DERIVED_FRAMES: None},
                overwrite=True,
            )
            array[:] = values
            array.attrs[_DERIVED_FRAMES] = int(self.n_frames)

    def read_derived(self, key: str) -> DerivedArray | None:
        """The derived array ``data/<key>`` and its attributes, or None when it is absent, unfinished
        or stale (computed on another number of frames than the store now holds)."""
        if key in self.features:
            raise StoreError(f"{self.location}: {key!r} is a feature, not a derived array; use read()")
        try:
            array = zarr.open_array(self._root.store, path=f"data/{key}", mode="r")
        except (FileNotFoundError, KeyError):
            return None
        except Exception as error:  # zarr raises several types for damaged metadata
            raise StoreError(
                f"{self.location}: data/{key} cannot be opened (damaged zarr.json?): {type(error).__name__}: {error}"
            ) from None
        attrs = dict(array.attrs)
        # Arrays written before the completion mark count as complete when their length fits.
        computed_on = attrs.pop(_DERIVED_FRAMES, array.shape[0])
        if computed_on != self.n_frames or array.shape[0] != self.n_frames:
            return None
        with reading_errors(self.location, key, slice(0, self.n_frames)):
            values = np.asarray(array[:])
        return DerivedArray(values, attrs)

    # ------------------------------------------------------------------ checks and summaries
    def validate(self, deep: bool = False, progress: bool = False) -> None:
        """Check every invariant of the store; raise StoreError naming the key and episode at fault.

        Always: the format attributes, ``episode_ends``, every array's length, shape and dtype, the
        metadata columns, and the presence and sizes of every chunk file of committed data (see
        ``datasets/integrity.py``), plus decoding the first and last frame of every image key.
        ``deep=True`` also reads every committed value: every image frame decoded, every numeric
        chunk decompressed (``progress`` shows a bar).
        """
        from demoscale.datasets.integrity import validate_store

        validate_store(self, deep=deep, progress=progress)

    def info(self) -> dict[str, Any]:
        """A JSON-ready summary: counts, envs, objects, tasks, features, codec, uncommitted frames."""
        frame = self.episodes
        pairs = frame.groupby(["env_id", "object_id"]).size() if len(frame) else pd.Series(dtype=int)
        return {
            "location": self.location,
            "format": FORMAT_NAME,
            "version": int(self._root.attrs.get("version", FORMAT_VERSION)),
            "n_episodes": self.n_episodes,
            "n_frames": self.n_frames,
            "envs": sorted(set(frame["env_id"]), key=id_order),
            "objects": sorted(set(frame["object_id"]), key=id_order),
            "n_pairs": int(len(pairs)),
            "tasks": sorted(set(frame["task"])),
            "episodes_per_pair": {"min": int(pairs.min()), "max": int(pairs.max())} if len(pairs) else None,
            "success_rate": (
                float(frame["success"].dropna().astype(float).mean())
                if frame["success"].notna().any()
                else None
            ),
            "image_codec": self.image_codec,
            "features": {k: v.to_dict() for k, v in self.features.items()},
            "uncommitted_frames": int(self._uncommitted_frames),
            "problems": list(self._notes),
        }

    def __repr__(self) -> str:
        return f"EpisodeStore({self.location!r}, n_episodes={self.n_episodes}, n_frames={self.n_frames})"


def _check_video_store(location: str, codec: str, features: Mapping[str, FeatureSpec]) -> None:
    """A video codec stores RGB frames, and PyAV here must have its encoder and decoder."""
    problem = video.codec_problem(codec)
    if problem is not None:
        raise StoreError(f"{location}: image codec {codec}: {problem}")
    for key, spec in features.items():
        if spec.kind == "image" and (len(spec.shape) != 3 or spec.shape[2] != 3):
            raise StoreError(
                f"{location}: image codec {codec} stores RGB (H, W, 3) frames; {key!r} is {spec.shape} "
                "(store it in a jpeg or png store)"
            )


def sha256_of(path: str | os.PathLike[str], chunk_bytes: int = 1 << 20) -> str:
    """Hex sha256 of a file's contents (what ``source_sha256`` should hold for file sources)."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk_bytes):
            digest.update(block)
    return digest.hexdigest()


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    raise TypeError(type(value))


def dumps_info(info: Mapping[str, Any]) -> str:
    """``info()`` as indented JSON."""
    return json.dumps(info, indent=2, default=_json_default)
