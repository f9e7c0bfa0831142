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
``frames.py``; statistics in ``statistics.py``; validation in
``integrity.py``; repair after a killed writer in ``repair.py``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
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
    check_episode,
    checked_compressors,
    id_order,
    layout_differences,
)
from demoscale.datasets.shards import (
    LocalShardWriter,
    TailJournal,
    create_by_rename,
    is_url,
    local_path,
    open_zarr_store,
    resize_and_write_all,
    sync,
)
from demoscale.datasets.statistics import compute_stats, stats_from_json, stats_to_json

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


# A transaction buffers its episodes in memory and writes them together once this many bytes are
# waiting (and at its end): each chunk and shard file near the end of the store is then written
# once per batch instead of once per episode, so an append's cost does not grow with the episodes
# already in the chunk (measured in benchmarks/ingest.py).
DEFAULT_FLUSH_BYTES = 64 << 20


@dataclass
class _Staged:
    """Episodes of an open transaction: written (but not committed) or still buffered in memory."""

    ends: list[int] = field(default_factory=list)
    hashes: set[str] = field(default_factory=set)
    flush_bytes: int = DEFAULT_FLUSH_BYTES
    written_frames: int = 0  # frames of staged episodes already in the arrays (past the committed end)
    written_episodes: int = 0
    data: dict[str, list[np.ndarray]] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    buffered_bytes: int = 0

    def buffer(self, values: Mapping[str, np.ndarray], row: dict[str, Any]) -> None:
        for key, value in values.items():
            self.data.setdefault(key, []).append(value)
            if value.dtype == object:
                self.buffered_bytes += sum(len(blob) for blob in value)
            else:
                self.buffered_bytes += value.nbytes
        self.rows.append(row)


def _as_str(value: Any) -> str:
    return "" if value is None else str(value)


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


class EpisodeStore:
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

    # ------------------------------------------------------------------ writing
    def _clean_partial_files(self) -> None:
        """Remove temporary files left by a writer that was killed mid-write (local stores only)."""
        local = local_path(self.location)
        if self._cleaned or local is None:
            return
        self._cleaned = True
        for path in local.rglob("*.partial"):
            path.unlink(missing_ok=True)

    def append_episode(
        self,
        data: Mapping[str, Any],
        *,
        env_id: str,
        object_id: str,
        task: str = "",
        operator: str = "",
        source: str = "",
        source_sha256: str = "",
        success: bool | None = None,
        tags: str | Sequence[str] = "",
        encoded: Mapping[str, Sequence[bytes]] | None = None,
    ) -> int | None:
        """Append one episode; return its index, or None if ``source_sha256`` is already in the store.

        ``data`` maps every feature key to a time-major array (images uint8); ``encoded`` may give image
        keys as already-encoded frames in the store's codec, copied as they are. The input is checked
        completely before anything is written; a failed check raises StoreError and changes nothing.
        The episode becomes visible only when ``meta/episode_ends`` is written, last; inside a
        :meth:`transaction`, only when the transaction commits. Runs under the writer lock.
        """
        where = f"{self.location}: episode from {source or '<unnamed source>'}"
        if not self.writable:
            raise StoreError(f"{self.location}: opened read-only; open with mode='a' to append")
        encoded = dict(encoded or {})
        length, arrays = check_episode(self.features, data, encoded, self._image_codec_options, where)
        row: dict[str, Any] = {
            "env_id": _as_str(env_id),
            "object_id": _as_str(object_id),
            "task": _as_str(task),
            "operator": _as_str(operator),
            "source": _as_str(source),
            "source_sha256": _as_str(source_sha256),
            "tags": tags if isinstance(tags, str) else ",".join(str(t) for t in tags),
            "length": length,
            "success": SUCCESS_UNKNOWN if success is None else int(bool(success)),
        }
        if self._staged is not None:
            return self._write_episode(length, arrays, encoded, row, where)
        with writer_lock(self.location, what="append to"):
            self._refresh_if_changed()  # another writer may have appended since we opened
            return self._write_episode(length, arrays, encoded, row, where)

    def _write_episode(
        self,
        length: int,
        arrays: dict[str, np.ndarray],
        encoded: dict[str, Sequence[bytes]],
        row: dict[str, Any],
        where: str,
    ) -> int | None:
        """Write one checked episode (the caller holds the writer lock); stage it inside a transaction."""
        staged = self._staged
        digest = row["source_sha256"]
        if digest and (self.has_source(digest) or (staged is not None and digest in staged.hashes)):
            logger.warning(
                "%s: source %s (sha256 %s) is already in the store; skipped",
                self.location,
                row["source"],
                digest,
            )
            return None
        # Encode before touching the store, so an encoder failure leaves it as it was.
        blobs = self._encoded_images(arrays, encoded, where)
        n_episodes = self.n_episodes + (len(staged.ends) if staged is not None else 0)
        start = staged.ends[-1] if staged is not None and staged.ends else self.n_frames
        stop = start + length
        if staged is not None:
            staged.buffer({key: blobs[key] if key in blobs else arrays[key] for key in self.features}, row)
            staged.ends.append(stop)
            if digest:
                staged.hashes.add(digest)
            if staged.buffered_bytes >= staged.flush_bytes:
                self._flush_staged()
            return n_episodes
        self._clean_partial_files()
        writes = self._data_writes(
            start, {key: blobs[key] if key in blobs else arrays[key] for key in self.features}
        )
        writes += [
            (self._array(f"meta/{c}"), n_episodes + 1, slice(n_episodes, n_episodes + 1), [v])
            for c, v in row.items()
        ]
        resize_and_write_all(writes)
        # Commit point, strictly after the writes above: one atomic chunk write of meta/episode_ends.
        self._commit_ends([stop], {digest} - {""})
        return n_episodes

    def _data_writes(self, start: int, values: Mapping[str, Any]) -> list[tuple[zarr.Array, int, Any, Any]]:
        """Write image frames (encoded) of a local store straight into its shard files, and return
        the writes :func:`resize_and_write_all` still has to make (the others, and every resize)."""
        writes: list[tuple[zarr.Array, int, Any, Any]] = []
        for key, value in values.items():
            array = self._array(f"data/{key}")
            stop = start + len(value)
            if self.features[key].kind == "image":
                if key not in self._shard_writers:
                    self._shard_writers[key] = LocalShardWriter.for_array(self.location, key, array)
                writer = self._shard_writers[key]
                if writer is not None:
                    writer.write(start, [bytes(b) for b in value])
                    writes.append((array, stop, None, None))
                    continue
                if isinstance(value, list):
                    blob = np.empty(len(value), dtype=object)
                    blob[:] = value
                    value = blob
            writes.append((array, stop, slice(start, stop), value))
        return writes

    def _flush_staged(self) -> None:
        """Write the buffered episodes of the open transaction, all arrays at once (not committed)."""
        staged = self._staged
        if staged is None or not staged.rows:
            return
        self._clean_partial_files()
        start = self.n_frames + staged.written_frames
        first_episode = self.n_episodes + staged.written_episodes
        stop = staged.ends[-1]
        n_rows = len(staged.rows)
        values: dict[str, Any] = {}
        for key in self.features:
            parts = staged.data[key]
            if parts[0].dtype == object:
                values[key] = [blob for part in parts for blob in part]
            else:
                values[key] = np.concatenate(parts)
        writes = self._data_writes(start, values)
        for column in staged.rows[0]:
            writes.append(
                (
                    self._array(f"meta/{column}"),
                    first_episode + n_rows,
                    slice(first_episode, first_episode + n_rows),
                    [row[column] for row in staged.rows],
                )
            )
        resize_and_write_all(writes)
        staged.written_frames = stop - self.n_frames
        staged.written_episodes += n_rows
        staged.data.clear()
        staged.rows.clear()
        staged.buffered_bytes = 0

    def _encoded_images(
        self, arrays: Mapping[str, np.ndarray], encoded: Mapping[str, Sequence[bytes]], where: str
    ) -> dict[str, np.ndarray]:
        """Every image key's frames as an object array of encoded bytes (given ones copied as they are)."""
        blobs: dict[str, np.ndarray] = {}
        for key, spec in self.features.items():
            if spec.kind != "image":
                continue
            if key in encoded:
                frames = [bytes(b) for b in encoded[key]]
            else:
                codec, options = self._image_codec_options(key)
                try:
                    frames = codecs.encode_frames(arrays[key], codec, options)
                except Exception as error:
                    raise StoreError(f"{where}: cannot encode {key!r} as {codec} ({error})") from None
            blob = np.empty(len(frames), dtype=object)
            blob[:] = frames
            blobs[key] = blob
        return blobs

    def _commit_ends(self, new_ends: list[int], hashes: set[str]) -> None:
        """Make episodes visible: write their ``meta/episode_ends`` entries, the commit point.

        Several entries may span chunks of ``episode_ends``; the chunks are written from the last to
        the first, so until the first (which extends the valid prefix) is written, readers see none
        of the new episodes: a batch becomes visible all at once.
        """
        ends = self._array("meta/episode_ends")
        n = self.n_episodes
        total = n + len(new_ends)
        values = np.asarray(new_ends, dtype=np.int64)
        chunk = int(ends.chunks[0])
        sync(ends.async_array.resize((total,)))
        pieces = []
        position = n
        while position < total:
            piece_end = min(total, (position // chunk + 1) * chunk)
            pieces.append((position, piece_end))
            position = piece_end
        for piece_start, piece_end in reversed(pieces):
            ends[piece_start:piece_end] = values[piece_start - n : piece_end - n]
        self._episode_ends = np.concatenate([self._episode_ends, values])
        self._uncommitted_frames = 0
        self._episodes_df = None
        if self._sources is not None:
            self._sources.update(hashes)

    @contextmanager
    def transaction(
        self, lock_timeout: float | None = None, flush_bytes: int = DEFAULT_FLUSH_BYTES
    ) -> Iterator[EpisodeStore]:
        """Append a batch all-or-nothing: ``with store.transaction(): store.append_episode(...)``.

        Holds the writer lock for the whole block. Appended episodes are buffered in memory and
        written together whenever ``flush_bytes`` of them wait (and at the end), so that the files at
        the end of the store are rewritten once per batch, not once per episode; they stay
        invisible until the block ends, then one commit makes all of them visible. If the block raises (or the commit fails),
        the store is rolled back: a local store byte for byte as it was (every file the batch could
        touch is kept in memory beforehand and put back), a remote one to its committed lengths. A
        process killed inside the block leaves the old episodes and an invisible uncommitted tail
        that the next writer overwrites, as with single appends.
        """
        if not self.writable:
            raise StoreError(f"{self.location}: opened read-only; open with mode='a' to append")
        if self._staged is not None:
            raise StoreError(f"{self.location}: a transaction is already open on this handle")
        with writer_lock(self.location, lock_timeout, what="append to"):
            self._refresh()
            self._clean_partial_files()
            journal = self._journal()
            self._staged = _Staged(flush_bytes=max(0, int(flush_bytes)))
            try:
                yield self
                self._flush_staged()
                staged = self._staged
                if staged.ends:
                    self._commit_ends(staged.ends, staged.hashes)
            except BaseException:
                self._staged = None
                self._rollback(journal)
                raise
            finally:
                self._staged = None

    def _array_paths(self) -> list[str]:
        return [f"data/{key}" for key in self.features] + [
            f"meta/{c}" for c in (*META_COLUMNS, "episode_ends")
        ]

    def _journal(self) -> list[TailJournal] | None:
        """The chunk files a batch could write, as they are now (local stores; None for remote ones)."""
        local = local_path(self.location)
        if local is None:
            return None
        journal = []
        for path in self._array_paths():
            committed = self.n_frames if path.startswith("data/") else self.n_episodes
            per_file = int(self._array(path).metadata.chunk_grid.chunk_shape[0])
            journal.append(TailJournal.save(local / path, committed // per_file))
        return journal

    def _rollback(self, journal: list[TailJournal] | None) -> None:
        """Undo an unfinished batch (the writer lock is held)."""
        if journal is not None:
            for saved in journal:
                saved.restore()
        else:
            committed = self.n_frames
            for path in self._array_paths():
                array = self._array(path)
                length = committed if path.startswith("data/") else self.n_episodes
                if array.shape[0] > length:
                    array.resize((length, *array.shape[1:]))
        self._arrays.clear()
        self._image_frames.clear()
        self._shard_writers.clear()
        self._refresh()

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
