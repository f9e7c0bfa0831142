"""The episode store: time-major Zarr arrays of many demonstrations plus per-episode metadata.

Layout (format ``demoscale.episode_store``, version 1; described in full in ``datasets/README.md``)::

    store.zarr/                      root group; attributes: format, version, features, image_codec
      data/<key>                     time-major arrays, one row per frame of every episode
      meta/episode_ends              int64, exclusive cumulative end of each episode (the commit point)
      meta/<column>                  one entry per episode: env_id, object_id, task, operator, source,
                                     source_sha256, length, success (int8: 1, 0, -1 unknown), tags

Appends are made safe against being killed at any moment by writing ``meta/episode_ends`` last:
readers trust only frames before its last valid entry and only metadata rows of committed episodes.
"""

from __future__ import annotations

import json
import logging
import math
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import zarr
from demoscale.datasets import codecs
from zarr.core.dtype import VariableLengthBytes, VariableLengthUTF8

logger = logging.getLogger(__name__)

FORMAT_NAME = "demoscale.episode_store"
FORMAT_VERSION = 1
FEATURE_KINDS = ("image", "low_dim", "point_cloud")
STRING_COLUMNS = ("env_id", "object_id", "task", "operator", "source", "source_sha256", "tags")
META_COLUMNS = (*STRING_COLUMNS, "length", "success")
SUCCESS_UNKNOWN = -1

# Variable-length bytes has no ratified Zarr v3 spec yet; zarr warns on every array that uses it.
# The layout is versioned by this package, so the warning says nothing a user can act on.
warnings.filterwarnings("ignore", message=r"The data type \(VariableLength")

# Chunking targets: low-dim chunks of ~1 MiB, meta columns of 4096 episodes, image shards of 1000 frames.
_CHUNK_BYTES = 1 << 20
_META_CHUNK = 4096
DEFAULT_IMAGE_SHARD_FRAMES = 1000
_STATS_BLOCK_FRAMES = 1 << 16
_EXACT_PERCENTILE_MAX_VALUES = 4_000_000
_HISTOGRAM_BINS = 8192
_EMPTY_CHUNK = 2**64 - 1


class StoreError(Exception):
    """Any problem with an episode store or with data offered to it."""


@dataclass(frozen=True)
class FeatureSpec:
    """What one time-major key holds per frame.

    ``kind`` is ``"image"`` (uint8 HxW, HxWx1, HxWx3 or HxWx4, stored compressed per frame),
    ``"low_dim"`` (a small numeric vector) or ``"point_cloud"`` (N points x channels).
    ``source`` (optional, JSON-ready) says what produced the key, e.g. for a simulated camera
    ``{"task": "reach", "camera": "scene", "image_size": 64, "env_options": {"cameras": ["scene"]}}``;
    None where unknown (stores written before it existed, data that did not record it).
    """

    kind: Literal["image", "low_dim", "point_cloud"]
    shape: tuple[int, ...]
    dtype: str = "float32"
    rate_hz: float | None = None
    units: str = ""
    frame: str = ""
    source: Mapping[str, Any] | None = field(default=None, compare=True, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype).name)
        if self.kind not in FEATURE_KINDS:
            raise StoreError(f"unknown feature kind {self.kind!r}; choose one of {', '.join(FEATURE_KINDS)}")
        if self.kind == "image":
            if self.dtype != "uint8":
                raise StoreError(f"image features must be uint8, got {self.dtype}")
            if not (len(self.shape) == 2 or (len(self.shape) == 3 and self.shape[2] in (1, 3, 4))):
                raise StoreError(f"image shape must be (H, W) or (H, W, 1|3|4), got {self.shape}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (stored in the root group attributes)."""
        out = asdict(self)
        out["shape"] = list(self.shape)
        if out["source"] is None:  # unknown: left out, so such stores read as before
            del out["source"]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FeatureSpec:
        """Inverse of :meth:`to_dict`."""
        return cls(**{**data, "shape": tuple(data["shape"])})


@dataclass
class _Committed:
    n_episodes: int
    episode_ends: np.ndarray
    uncommitted_frames: int = 0
    notes: list[str] = field(default_factory=list)


def id_order(value: Any) -> tuple[int, int, str]:
    """Sort key of env/object ids as people count them: numeric ids as numbers ("2" before "10"),
    then the other ids as text."""
    text = str(value)
    return (0, int(text), "") if text.lstrip("-").isdigit() else (1, 0, text)


def _is_url(location: str) -> bool:
    return "://" in location or "::" in location


def _open_zarr_store(location: str | os.PathLike[str], read_only: bool) -> Any:
    location = os.fspath(location)
    if _is_url(location):
        from zarr.storage import FsspecStore

        if location.startswith("file://"):
            return zarr.storage.LocalStore(location[len("file://") :], read_only=read_only)
        return FsspecStore.from_url(location, read_only=read_only)
    if location.endswith(".zip"):
        if not read_only:
            raise StoreError(f"{location}: zip stores are read-only; write to a directory and zip it")
        if not Path(location).is_file():
            raise StoreError(f"{location}: no such zip file")
        return zarr.storage.ZipStore(location, mode="r")
    return zarr.storage.LocalStore(location, read_only=read_only)


def _frame_nbytes(spec: FeatureSpec) -> int:
    return int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize


def _as_str(value: Any) -> str:
    return "" if value is None else str(value)


class _LocalShardReader:
    """Reads encoded image frames straight from the shard files of a local store.

    zarr's general read path costs about a millisecond of Python per inner chunk, more than decoding
    a JPEG. For the one layout this package writes (shards of 1-frame inner chunks, variable-length
    bytes, index at the end of the shard) a frame is one ``pread`` at an offset from the shard index.
    Shard indexes are cached per file identity (inode, size, mtime), so a shard rewritten by an append
    is re-indexed. Anything unexpected returns None and the caller falls back to zarr.
    """

    def __init__(self, directory: Path, shard_frames: int) -> None:
        self.directory = directory
        self.shard_frames = shard_frames
        self._index: dict[int, tuple[tuple[int, int, int], np.ndarray]] = {}

    @classmethod
    def for_array(cls, location: str, key: str, array: zarr.Array) -> _LocalShardReader | None:
        from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec, VLenBytesCodec
        from zarr.codecs.sharding import ShardingCodecIndexLocation

        if _is_url(location) or location.endswith(".zip"):
            return None
        metadata = array.metadata
        codecs_ = getattr(metadata, "codecs", ())
        if len(codecs_) != 1 or not isinstance(codecs_[0], ShardingCodec):
            return None
        sharding = codecs_[0]
        if (
            tuple(sharding.chunk_shape) != (1,)
            or [type(c) for c in sharding.codecs] != [VLenBytesCodec]
            or [type(c) for c in sharding.index_codecs] != [BytesCodec, Crc32cCodec]
            or sharding.index_location != ShardingCodecIndexLocation.end
            or getattr(metadata.chunk_key_encoding, "separator", None) != "/"
        ):
            return None
        return cls(Path(location) / "data" / key / "c", int(metadata.chunk_grid.chunk_shape[0]))

    def read(self, frames: np.ndarray) -> list[bytes] | None:
        out: list[bytes] = [b""] * len(frames)
        shards = frames // self.shard_frames
        for shard in np.unique(shards):
            positions = np.flatnonzero(shards == shard)
            try:
                fd = os.open(self.directory / str(int(shard)), os.O_RDONLY)
            except OSError:
                return None
            try:
                index = self._shard_index(int(shard), fd)
                for position in positions:
                    offset, nbytes = index[int(frames[position]) % self.shard_frames]
                    if nbytes < 8 or offset == _EMPTY_CHUNK:
                        return None
                    chunk = os.pread(fd, int(nbytes), int(offset))
                    # variable-length bytes: uint32 item count (1), uint32 length, the bytes.
                    count, length = np.frombuffer(chunk, dtype="<u4", count=2)
                    if count != 1 or length != len(chunk) - 8:
                        return None
                    out[position] = chunk[8:]
            finally:
                os.close(fd)
        return out

    def _shard_index(self, shard: int, fd: int) -> np.ndarray:
        status = os.fstat(fd)
        identity = (status.st_ino, status.st_size, status.st_mtime_ns)
        cached = self._index.get(shard)
        if cached is not None and cached[0] == identity:
            return cached[1]
        size = self.shard_frames * 16 + 4  # (offset, nbytes) uint64 pairs + crc32c
        raw = os.pread(fd, size, status.st_size - size)
        index = np.frombuffer(raw[:-4], dtype="<u8").reshape(-1, 2)
        self._index[shard] = (identity, index)
        return index


class EpisodeStore:
    """A Zarr store of episodes; use :meth:`create`, :meth:`open` or :meth:`open_or_create`."""

    def __init__(self, root: zarr.Group, location: str, writable: bool) -> None:
        self._root = root
        self.location = location
        self.writable = writable
        attrs = dict(root.attrs)
        if attrs.get("format") != FORMAT_NAME:
            raise StoreError(
                f"{location}: not a demoscale episode store (root attribute format={attrs.get('format')!r})"
            )
        if int(attrs.get("version", -1)) > FORMAT_VERSION:
            raise StoreError(
                f"{location}: store format version {attrs.get('version')} is newer than this reader ({FORMAT_VERSION})"
            )
        self.features: dict[str, FeatureSpec] = {
            k: FeatureSpec.from_dict(v) for k, v in attrs["features"].items()
        }
        self.image_codec: str = attrs.get("image_codec", "jpeg")
        self.image_codec_options: dict[str, Any] = dict(attrs.get("image_codec_options", {}))
        self._arrays: dict[str, zarr.Array] = {}
        self._stats_memory: dict[str, dict[str, Any]] = {}
        self._cleaned = False
        self._shard_readers: dict[str, _LocalShardReader | None] = {}
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
    ) -> EpisodeStore:
        """Create an empty store at a local directory (or a writable fsspec URL).

        ``image_codec`` is ``"jpeg"`` (default), ``"png"`` (lossless) or ``"jpegxl"``;
        ``image_codec_options`` go to the imagecodecs encoder (e.g. ``{"level": 95}``).
        """
        location = os.fspath(location)
        try:
            codec = codecs.check_codec(image_codec)
        except ValueError as error:
            raise StoreError(f"{location}: {error}") from None
        options = codecs.codec_options(codec, image_codec_options)
        if not features:
            raise StoreError(f"{location}: a store needs at least one feature")
        features = {
            k: (v if isinstance(v, FeatureSpec) else FeatureSpec.from_dict(v)) for k, v in features.items()
        }
        for key in features:
            if not key or "/" in key or key.startswith("."):
                raise StoreError(f"{location}: invalid feature key {key!r}")
        zstore = _open_zarr_store(location, read_only=False)
        if (
            not overwrite
            and not _is_url(location)
            and Path(location).exists()
            and any(Path(location).iterdir())
        ):
            raise StoreError(f"{location}: already exists (open it, or pass overwrite=True)")
        try:
            root = zarr.open_group(zstore, mode="w" if overwrite else "w-", zarr_format=3)
        except FileExistsError:
            raise StoreError(f"{location}: already exists (open it, or pass overwrite=True)") from None
        data = root.create_group("data")
        meta = root.create_group("meta")
        for key, spec in features.items():
            if spec.kind == "image":
                data.create_array(
                    key,
                    shape=(0,),
                    chunks=(1,),
                    shards=(int(image_shard_frames),),
                    dtype=VariableLengthBytes(),
                    compressors=None,
                    attributes={"codec": codec, "codec_options": options, "frame_shape": list(spec.shape)},
                )
            else:
                frame_bytes = max(1, _frame_nbytes(spec))
                frames_per_chunk = max(1, _CHUNK_BYTES // frame_bytes)
                shards = None
                if frames_per_chunk < 64:
                    # Large frames (point clouds): 1 frame per inner chunk, many frames per file.
                    shards = (max(1, (16 * _CHUNK_BYTES) // frame_bytes), *spec.shape)
                    frames_per_chunk = 1
                data.create_array(
                    key,
                    shape=(0, *spec.shape),
                    chunks=(frames_per_chunk, *spec.shape),
                    shards=shards,
                    dtype=spec.dtype,
                    fill_value=0,
                )
        # Fill 0 marks an entry whose chunk was never written: never a valid (positive) episode end.
        meta.create_array("episode_ends", shape=(0,), chunks=(_META_CHUNK,), dtype="int64", fill_value=0)
        for column in STRING_COLUMNS:
            meta.create_array(column, shape=(0,), chunks=(_META_CHUNK,), dtype=VariableLengthUTF8())
        meta.create_array("length", shape=(0,), chunks=(_META_CHUNK,), dtype="int64", fill_value=0)
        meta.create_array(
            "success", shape=(0,), chunks=(_META_CHUNK,), dtype="int8", fill_value=SUCCESS_UNKNOWN
        )
        root.attrs.update(
            {
                "format": FORMAT_NAME,
                "version": FORMAT_VERSION,
                "features": {k: v.to_dict() for k, v in features.items()},
                "image_codec": codec,
                "image_codec_options": options,
                "success_encoding": "int8: 1 success, 0 failure, -1 unknown",
                "tags_encoding": "comma-separated",
            }
        )
        return cls(root, location, writable=True)

    @classmethod
    def open(cls, location: str | os.PathLike[str], mode: Literal["r", "a"] = "r") -> EpisodeStore:
        """Open an existing store: a local directory, a ``.zip`` (read-only) or an fsspec URL.

        ``mode="r"`` reads; ``mode="a"`` also allows appending episodes and caching statistics.
        """
        location = os.fspath(location)
        if mode not in ("r", "a"):
            raise StoreError(f"{location}: mode must be 'r' or 'a', got {mode!r}")
        if not _is_url(location) and not Path(location).exists():
            raise StoreError(f"{location}: no such store")
        zstore = _open_zarr_store(location, read_only=mode == "r")
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
        """Open a store for appending, creating it if absent; an existing one must have the same features."""
        location = os.fspath(location)
        if _is_url(location):
            try:
                store = cls.open(location, mode="a")
            except StoreError:
                return cls.create(location, features, image_codec, image_codec_options, image_shard_frames)
        elif not Path(location).exists() or not any(Path(location).iterdir()):
            return cls.create(location, features, image_codec, image_codec_options, image_shard_frames)
        else:
            store = cls.open(location, mode="a")
        wanted = {
            k: (v if isinstance(v, FeatureSpec) else FeatureSpec.from_dict(v)) for k, v in features.items()
        }
        if store.features != wanted:
            keys = sorted(
                k for k in set(store.features) | set(wanted) if store.features.get(k) != wanted.get(k)
            )
            details = "; ".join(f"{k}: store {store.features.get(k)}, given {wanted.get(k)}" for k in keys)
            raise StoreError(f"{location}: existing store has different features ({details})")
        return store

    # ------------------------------------------------------------------ state
    def _array(self, path: str) -> zarr.Array:
        if path not in self._arrays:
            try:
                self._arrays[path] = self._root[path]
            except KeyError:
                raise StoreError(f"{self.location}: missing array {path}") from None
        return self._arrays[path]

    def _reload_array(self, path: str) -> zarr.Array:
        self._arrays.pop(path, None)
        try:
            self._arrays[path] = zarr.open_array(
                self._root.store, path=path, mode="r+" if self.writable else "r"
            )
        except Exception:
            raise StoreError(f"{self.location}: missing array {path}") from None
        return self._arrays[path]

    def _committed(self) -> _Committed:
        """Find the committed episodes: the longest valid prefix of ``meta/episode_ends``."""
        ends_array = self._reload_array("meta/episode_ends")
        ends = np.asarray(ends_array[:], dtype=np.int64)
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
        ends = np.asarray(self._reload_array("meta/episode_ends")[:], dtype=np.int64)
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
        """First frame of each committed episode."""
        return np.concatenate([[0], self._episode_ends[:-1]]).astype(np.int64)

    @property
    def episodes(self) -> pd.DataFrame:
        """One row per committed episode: index, frame range, metadata (``success`` is nullable boolean)."""
        if self._episodes_df is None:
            n = self.n_episodes
            columns: dict[str, Any] = {
                "episode_index": np.arange(n, dtype=np.int64),
                "start": self.episode_starts,
                "end": self.episode_ends,
                "length": np.asarray(self._array("meta/length")[:n], dtype=np.int64),
            }
            for column in ("env_id", "object_id", "task", "operator", "source", "source_sha256", "tags"):
                values = self._array(f"meta/{column}")[:n] if n else []
                columns[column] = pd.array([str(v) for v in values], dtype=object)
            success = (
                np.asarray(self._array("meta/success")[:n], dtype=np.int8) if n else np.zeros(0, np.int8)
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
            self._sources = {str(v) for v in self._array("meta/source_sha256")[:n]} - {""} if n else set()
        return self._sources

    def has_source(self, source_sha256: str) -> bool:
        """Whether a committed episode came from a source with this content hash."""
        return source_sha256 in self._source_hashes()

    # ------------------------------------------------------------------ reading
    def _check_key(self, key: str) -> FeatureSpec:
        if key not in self.features:
            raise StoreError(f"{self.location}: unknown key {key!r}; keys are {', '.join(self.features)}")
        return self.features[key]

    def _decode_images(self, key: str, encoded: np.ndarray) -> np.ndarray:
        spec = self.features[key]
        codec = self._array(f"data/{key}").attrs.get("codec", self.image_codec)
        out = np.empty((len(encoded), *spec.shape), dtype=np.uint8)
        for i, data in enumerate(encoded):
            try:
                codecs.decode_frame(data, codec, out=out[i])
            except Exception as error:
                raise StoreError(f"{self.location}: cannot decode frame of {key!r} ({error})") from None
        return out

    def read(self, key: str, start: int, stop: int) -> np.ndarray:
        """Frames ``start:stop`` (global frame indices, committed frames only) of ``key``, decoded."""
        spec = self._check_key(key)
        n = self.n_frames
        if not (0 <= start <= stop <= n):
            raise StoreError(f"{self.location}: frames {start}:{stop} of {key!r} outside committed 0:{n}")
        if spec.kind == "image":
            if stop == start:
                return np.empty((0, *spec.shape), dtype=np.uint8)
            return self._decode_images(key, self._read_encoded_frames(key, np.arange(start, stop)))
        return np.asarray(self._array(f"data/{key}")[start:stop])

    def read_encoded(self, key: str, start: int, stop: int) -> list[bytes]:
        """The stored (encoded) bytes of image frames ``start:stop`` of ``key``."""
        spec = self._check_key(key)
        if spec.kind != "image":
            raise StoreError(f"{self.location}: {key!r} is not an image key")
        if not (0 <= start <= stop <= self.n_frames):
            raise StoreError(f"{self.location}: frames {start}:{stop} of {key!r} outside 0:{self.n_frames}")
        if stop == start:
            return []
        return [bytes(b) for b in self._read_encoded_frames(key, np.arange(start, stop))]

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
            encoded = self._read_encoded_frames(key, unique)
            return self._decode_images(key, encoded[inverse])
        array = self._array(f"data/{key}")
        if len(unique) == unique[-1] - unique[0] + 1:
            raw = array[int(unique[0]) : int(unique[-1]) + 1]  # contiguous: a plain slice is cheapest
        else:
            raw = array.get_orthogonal_selection(unique)
        return np.asarray(raw)[inverse]

    def _read_encoded_frames(self, key: str, frames: np.ndarray) -> np.ndarray:
        """Encoded bytes of image frames (sorted unique global indices) as an object array."""
        if key not in self._shard_readers:
            self._shard_readers[key] = _LocalShardReader.for_array(
                self.location, key, self._array(f"data/{key}")
            )
        reader = self._shard_readers[key]
        if reader is not None:
            found = reader.read(frames)
            if found is not None:
                out = np.empty(len(found), dtype=object)
                out[:] = found
                return out
        array = self._array(f"data/{key}")
        if len(frames) == frames[-1] - frames[0] + 1:
            return array[int(frames[0]) : int(frames[-1]) + 1]
        return array.get_orthogonal_selection(frames)

    def episode(self, index: int) -> dict[str, np.ndarray]:
        """All keys of one committed episode, decoded."""
        if not (0 <= index < self.n_episodes):
            raise StoreError(f"{self.location}: episode {index} outside 0:{self.n_episodes}")
        start = int(self.episode_starts[index])
        stop = int(self._episode_ends[index])
        return {key: self.read(key, start, stop) for key in self.features}

    # ------------------------------------------------------------------ writing
    def _validate_episode(
        self,
        data: Mapping[str, Any],
        encoded: Mapping[str, Sequence[bytes]],
        where: str,
    ) -> tuple[int, dict[str, np.ndarray]]:
        unknown = sorted((set(data) | set(encoded)) - set(self.features))
        if unknown:
            raise StoreError(
                f"{where}: keys not in the store's features: {unknown} (features: {list(self.features)})"
            )
        missing = [k for k in self.features if k not in data and k not in encoded]
        if missing:
            raise StoreError(f"{where}: missing keys {missing}")
        for key in encoded:
            if self.features[key].kind != "image":
                raise StoreError(f"{where}: encoded frames given for {key!r}, which is not an image key")
        lengths = {k: len(encoded[k]) if k in encoded else len(np.asarray(data[k])) for k in self.features}
        distinct = set(lengths.values())
        if len(distinct) != 1:
            raise StoreError(f"{where}: keys have different lengths: {lengths}")
        length = distinct.pop()
        if length == 0:
            raise StoreError(f"{where}: empty episode (0 frames)")
        arrays: dict[str, np.ndarray] = {}
        for key, spec in self.features.items():
            if key in encoded:
                codec = self._array(f"data/{key}").attrs.get("codec", self.image_codec)
                for t, frame in enumerate(encoded[key]):
                    if not isinstance(frame, bytes | bytearray | memoryview | np.bytes_):
                        raise StoreError(
                            f"{where}: encoded frame {t} of {key!r} is {type(frame).__name__}, not bytes"
                        )
                    if not codecs.has_magic(bytes(frame), codec):
                        raise StoreError(
                            f"{where}: encoded frame {t} of {key!r} is not {codec} (the store's codec for this key)"
                        )
                try:
                    first = codecs.decode_frame(bytes(encoded[key][0]), codec)
                except Exception as error:
                    raise StoreError(
                        f"{where}: encoded frame 0 of {key!r} does not decode ({error})"
                    ) from None
                if int(np.prod(first.shape)) != int(np.prod(spec.shape)) or first.shape[:2] != spec.shape[:2]:
                    raise StoreError(
                        f"{where}: encoded frames of {key!r} decode to {first.shape}, spec is {spec.shape}"
                    )
                continue
            value = np.asarray(data[key])
            if value.shape[1:] != spec.shape:
                raise StoreError(f"{where}: {key!r} has frame shape {value.shape[1:]}, spec is {spec.shape}")
            target = np.dtype(spec.dtype)
            if spec.kind == "image":
                if value.dtype != np.uint8:
                    raise StoreError(f"{where}: image {key!r} must be uint8, got {value.dtype}")
            elif value.dtype != target and not np.can_cast(value.dtype, target, casting="same_kind"):
                raise StoreError(f"{where}: {key!r} has dtype {value.dtype}, cannot store as {spec.dtype}")
            if spec.kind == "low_dim" and value.dtype.kind in "fc":
                bad = ~np.isfinite(value)
                if bad.any():
                    frame_index = int(np.argwhere(bad)[0][0])
                    raise StoreError(f"{where}: {key!r} has NaN or inf values (first at frame {frame_index})")
            arrays[key] = value if spec.kind == "image" else value.astype(target, copy=False)
        return length, arrays

    def _clean_partial_files(self) -> None:
        """Remove temporary files left by a writer that was killed mid-write (local stores only)."""
        if self._cleaned or _is_url(self.location) or self.location.endswith(".zip"):
            return
        self._cleaned = True
        for path in Path(self.location).rglob("*.partial"):
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
        The episode becomes visible only when ``meta/episode_ends`` is written, last.
        """
        where = f"{self.location}: episode from {source or '<unnamed source>'}"
        if not self.writable:
            raise StoreError(f"{self.location}: opened read-only; open with mode='a' to append")
        encoded = dict(encoded or {})
        length, arrays = self._validate_episode(data, encoded, where)
        self._refresh_if_changed()  # another writer may have appended since we opened
        if source_sha256 and self.has_source(source_sha256):
            logger.warning(
                "%s: source %s (sha256 %s) is already in the store; skipped",
                self.location,
                source,
                source_sha256,
            )
            return None
        tag_text = tags if isinstance(tags, str) else ",".join(str(t) for t in tags)
        # Encode before touching the store, so an encoder failure leaves it as it was.
        blobs: dict[str, np.ndarray] = {}
        for key, spec in self.features.items():
            if spec.kind != "image":
                continue
            if key in encoded:
                frames = [bytes(b) for b in encoded[key]]
            else:
                array = self._array(f"data/{key}")
                codec = array.attrs.get("codec", self.image_codec)
                options = dict(array.attrs.get("codec_options", self.image_codec_options))
                try:
                    frames = [codecs.encode_frame(frame, codec, options) for frame in arrays[key]]
                except Exception as error:
                    raise StoreError(f"{where}: cannot encode {key!r} as {codec} ({error})") from None
            blob = np.empty(len(frames), dtype=object)
            blob[:] = frames
            blobs[key] = blob

        self._clean_partial_files()
        n_episodes, start = self.n_episodes, self.n_frames
        stop = start + length
        row: dict[str, Any] = {
            "env_id": _as_str(env_id),
            "object_id": _as_str(object_id),
            "task": _as_str(task),
            "operator": _as_str(operator),
            "source": _as_str(source),
            "source_sha256": _as_str(source_sha256),
            "tags": tag_text,
            "length": length,
            "success": SUCCESS_UNKNOWN if success is None else int(bool(success)),
        }
        writes = [
            (
                self._array(f"data/{key}"),
                stop,
                slice(start, stop),
                blobs[key] if key in blobs else arrays[key],
            )
            for key in self.features
        ]
        writes += [
            (self._array(f"meta/{c}"), n_episodes + 1, slice(n_episodes, n_episodes + 1), [v])
            for c, v in row.items()
        ]
        _sync(_resize_and_write_all(writes))
        # Commit point, strictly after the writes above: one atomic chunk write of meta/episode_ends.
        ends = self._array("meta/episode_ends")
        _sync(_resize_and_write_all([(ends, n_episodes + 1, slice(n_episodes, n_episodes + 1), [stop])]))
        self._episode_ends = np.append(self._episode_ends, np.int64(stop))
        self._uncommitted_frames = 0
        self._episodes_df = None
        if self._sources is not None and source_sha256:
            self._sources.add(source_sha256)
        return n_episodes

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
            return self._stats_from_json(key, cached)
        result = self._compute_stats(key, spec, n_frames)
        entry = {"n_frames": n_frames, **{k: np.asarray(v).tolist() for k, v in result.items()}}
        self._stats_memory[key] = entry
        self._persist_stats(key, entry)
        return self._stats_from_json(key, entry)

    def _persist_stats(self, key: str, entry: dict[str, Any]) -> None:
        """Cache statistics in the root attributes: always when writable; for a read-only handle on a
        local directory we may write to, too (the one write a reader makes; losing it only costs a
        recomputation, so failures are ignored)."""
        root = self._root
        if not self.writable:
            local = not _is_url(self.location) and not self.location.endswith(".zip")
            if not (
                local
                and os.access(self.location, os.W_OK)
                and os.access(Path(self.location) / "zarr.json", os.W_OK)
            ):
                return
            try:
                root = zarr.open_group(zarr.storage.LocalStore(self.location), mode="r+")
            except Exception:
                return
        try:
            all_stats = dict(root.attrs.get("stats", {}))
            all_stats[key] = entry
            root.attrs["stats"] = all_stats
        except OSError:
            pass

    def _stats_shape(self, spec: FeatureSpec) -> tuple[int, ...]:
        return spec.shape[-1:] if spec.kind == "point_cloud" else spec.shape

    def _stats_from_json(self, key: str, entry: Mapping[str, Any]) -> dict[str, np.ndarray]:
        shape = self._stats_shape(self.features[key])
        out = {
            k: np.asarray(entry[k], dtype=np.float64).reshape(shape)
            for k in ("min", "max", "mean", "std", "p01", "p99")
        }
        out["count"] = np.asarray(entry["count"], dtype=np.int64)
        return out

    def _blocks(self, key: str, n_frames: int, width: int):
        array = self._array(f"data/{key}")
        block = max(array.chunks[0], (_STATS_BLOCK_FRAMES // array.chunks[0]) * array.chunks[0])
        for start in range(0, n_frames, block):
            values = np.asarray(array[start : min(n_frames, start + block)], dtype=np.float64)
            yield values.reshape(-1, width)

    def _compute_stats(self, key: str, spec: FeatureSpec, n_frames: int) -> dict[str, np.ndarray]:
        shape = self._stats_shape(spec)
        width = int(np.prod(shape, dtype=np.int64)) if shape else 1
        count = 0
        mean = np.zeros(width)
        m2 = np.zeros(width)
        low = np.full(width, np.inf)
        high = np.full(width, -np.inf)
        for values in self._blocks(key, n_frames, width):
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
        if count * width <= _EXACT_PERCENTILE_MAX_VALUES:
            everything = np.concatenate(list(self._blocks(key, n_frames, width)))
            p01, p99 = np.percentile(everything, [1, 99], axis=0)
        else:
            p01, p99 = self._histogram_percentiles(key, n_frames, width, low, high, count)
        result = {
            "min": low,
            "max": high,
            "mean": mean,
            "std": np.sqrt(m2 / count),
            "p01": p01,
            "p99": p99,
        }
        out = {k: v.reshape(shape) for k, v in result.items()}
        out["count"] = np.asarray(count, dtype=np.int64)
        return out

    def _histogram_percentiles(self, key, n_frames, width, low, high, count):
        span = np.where(high > low, high - low, 1.0)
        counts = np.zeros((width, _HISTOGRAM_BINS), dtype=np.int64)
        for values in self._blocks(key, n_frames, width):
            bins = np.clip(((values - low) / span * _HISTOGRAM_BINS).astype(np.int64), 0, _HISTOGRAM_BINS - 1)
            for d in range(width):
                counts[d] += np.bincount(bins[:, d], minlength=_HISTOGRAM_BINS)
        result = []
        for q in (0.01, 0.99):
            rank = q * (count - 1)
            cumulative = np.cumsum(counts, axis=1)
            values = np.empty(width)
            for d in range(width):
                b = int(np.searchsorted(cumulative[d], rank, side="right"))
                b = min(b, _HISTOGRAM_BINS - 1)
                before = cumulative[d, b - 1] if b else 0
                inside = counts[d, b]
                fraction = (rank - before) / inside if inside else 0.5
                values[d] = low[d] + (b + fraction) / _HISTOGRAM_BINS * span[d]
            result.append(np.clip(values, low, high))
        return result

    # ------------------------------------------------------------------ checks and summaries
    def validate(self) -> None:
        """Check every invariant of the store; raise StoreError naming the key and episode at fault."""
        loc = self.location
        attrs = dict(self._root.attrs)
        for name in ("format", "version", "features", "image_codec"):
            if name not in attrs:
                raise StoreError(f"{loc}: root attribute {name!r} missing")
        try:
            ends_array = self._reload_array("meta/episode_ends")
        except StoreError:
            raise StoreError(f"{loc}: meta/episode_ends missing") from None
        if ends_array.dtype != np.int64 or ends_array.ndim != 1:
            raise StoreError(
                f"{loc}: meta/episode_ends must be 1-d int64, is {ends_array.ndim}-d {ends_array.dtype}"
            )
        for column in META_COLUMNS:
            self._reload_array(f"meta/{column}")
        self._refresh()
        if self._notes:
            raise StoreError(f"{loc}: " + "; ".join(self._notes))
        n, ends, n_frames = self.n_episodes, self._episode_ends, self.n_frames
        for key, spec in self.features.items():
            array = self._reload_array(f"data/{key}")
            if array.shape[0] < n_frames:
                raise StoreError(
                    f"{loc}: data/{key} has {array.shape[0]} frames, episode_ends says {n_frames}"
                )
            expected = (array.shape[0],) if spec.kind == "image" else (array.shape[0], *spec.shape)
            if array.shape != expected:
                raise StoreError(f"{loc}: data/{key} has shape {array.shape}, spec says {expected}")
            if spec.kind != "image" and array.dtype != np.dtype(spec.dtype):
                raise StoreError(f"{loc}: data/{key} has dtype {array.dtype}, spec says {spec.dtype}")
        for column in META_COLUMNS:
            if self._array(f"meta/{column}").shape[0] < n:
                raise StoreError(
                    f"{loc}: meta/{column} has {self._array(f'meta/{column}').shape[0]} rows for {n} episodes"
                )
        if n == 0:
            return
        frame = self.episodes
        lengths = np.diff(np.concatenate([[0], ends]))
        bad = np.flatnonzero(frame["length"].to_numpy() != lengths)
        if len(bad):
            i = int(bad[0])
            raise StoreError(
                f"{loc}: episode {i}: meta/length is {frame['length'][i]}, episode_ends give {lengths[i]}"
            )
        for column in ("env_id", "object_id"):
            empty = np.flatnonzero(frame[column].to_numpy() == "")
            if len(empty):
                raise StoreError(f"{loc}: episode {int(empty[0])}: empty {column}")
        success = np.asarray(self._array("meta/success")[:n])
        odd = np.flatnonzero(~np.isin(success, [0, 1, SUCCESS_UNKNOWN]))
        if len(odd):
            raise StoreError(
                f"{loc}: episode {int(odd[0])}: meta/success is {success[odd[0]]}, expected 1, 0 or -1"
            )
        hashes = frame["source_sha256"].to_numpy()
        missing = np.flatnonzero(hashes == "")
        if len(missing):
            raise StoreError(
                f"{loc}: episode {int(missing[0])}: source_sha256 missing (source {frame['source'][int(missing[0])]!r})"
            )
        seen: dict[str, int] = {}
        for i, digest in enumerate(hashes):
            if digest in seen:
                raise StoreError(
                    f"{loc}: episodes {seen[digest]} and {i} have the same source_sha256 {digest}"
                )
            seen[digest] = i
        # Spot-check that the first and last frame of every image key decode to the spec's shape.
        for key, spec in self.features.items():
            if spec.kind == "image":
                for index in (0, n_frames - 1):
                    try:
                        self.read(key, index, index + 1)
                    except StoreError as error:
                        raise StoreError(f"{loc}: data/{key} frame {index}: {error}") from None

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


def _sync(coroutine: Any) -> Any:
    from zarr.core.sync import sync

    return sync(coroutine)


async def _resize_and_write_all(writes: list[tuple[zarr.Array, int, slice, Any]]) -> None:
    """Resize each array along time and write its slice, all arrays concurrently (one event-loop trip)."""
    import asyncio

    async def one(array: zarr.Array, length: int, selection: slice, value: Any) -> None:
        target = array.async_array
        await target.resize((length, *array.shape[1:]))
        if isinstance(value, list):
            value = np.asarray(value, dtype=object if array.dtype.kind in "OTSU" else array.dtype)
        await target.setitem(selection, value)

    await asyncio.gather(*(one(*w) for w in writes))


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
