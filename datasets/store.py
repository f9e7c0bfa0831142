"""The episode store: time-major Zarr arrays of many demonstrations plus per-episode metadata.

Layout (format ``demoscale.episode_store``, version 1; described in full in ``datasets/README.md``)::

    store.zarr/                      root group; attributes: format, version, features, image_codec
      data/<key>                     time-major arrays, one row per frame of every episode
      meta/episode_ends              int64, exclusive cumulative end of each episode (the commit point)
      meta/<column>                  one entry per episode: env_id, object_id, task, operator, source,
                                     source_sha256, length, success (int8: 1, 0, -1 unknown), tags

Appends are made safe against being killed at any moment by writing ``meta/episode_ends`` last:
readers trust only frames before its last valid entry and only metadata rows of committed episodes.
Every mutation runs under the store's writer lock (``datasets/locking.py``); a :meth:`transaction`
makes a batch of appends visible together or, on any error, not at all.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import uuid
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import zarr
from demoscale.datasets import codecs
from demoscale.datasets.locking import try_writer_lock, writer_lock
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


class StoreLockTimeout(StoreError):
    """Another process held the store's writer lock for longer than the caller would wait."""


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


@dataclass
class _Staged:
    """Episodes written by an open transaction but not yet committed."""

    ends: list[int] = field(default_factory=list)
    hashes: set[str] = field(default_factory=set)


def _time_chunk_entries(chunks: Path, first: int) -> list[Path]:
    """Entries ``c/<i>`` (files or folders) of an array's chunk folder with time index ``i >= first``."""
    if not chunks.is_dir():
        return []
    return sorted(
        (entry for entry in chunks.iterdir() if entry.name.isdigit() and int(entry.name) >= first),
        key=lambda entry: int(entry.name),
    )


def _write_atomically(path: Path, content: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f"{path.name}.{uuid.uuid4().hex[:8]}.partial")
    temporary.write_bytes(content)
    os.replace(temporary, path)


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


def _local_path(location: str) -> Path | None:
    """The directory of a local store (plain path or ``file://`` URL); None for remote URLs and zips."""
    if location.startswith("file://"):
        return Path(location[len("file://") :])
    if _is_url(location) or location.endswith(".zip"):
        return None
    return Path(location)


def _remove_unfinished_creations(local: Path) -> list[Path]:
    """Delete scratch directories of creations that were killed before their rename (under the lock)."""
    removed = []
    if local.parent.is_dir():
        for leftover in local.parent.glob(f".{local.name}.creating-*"):
            shutil.rmtree(leftover, ignore_errors=True)
            removed.append(leftover)
        for leftover in local.parent.glob(f".{local.name}.replaced-*"):
            shutil.rmtree(leftover, ignore_errors=True)
            removed.append(leftover)
    return removed


def _build_layout(
    root: zarr.Group,
    features: Mapping[str, FeatureSpec],
    codec: str,
    options: dict[str, Any],
    image_shard_frames: int,
) -> None:
    """Create the empty arrays and, last, the root attributes of a new store in ``root``."""
    from zarr.codecs import Crc32cCodec, VLenBytesCodec, ZstdCodec

    # Checksums everywhere, so that damage is found when read instead of decoded into plausible
    # values (a JPEG with garbage in the middle often still decodes): a crc32c per image frame, and
    # zstd's own content checksum in every numeric and string chunk.
    checked = [ZstdCodec(level=0, checksum=True)]
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
                serializer=VLenBytesCodec(),
                compressors=[Crc32cCodec()],
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
                compressors=checked,
            )
    # Fill 0 marks an entry whose chunk was never written: never a valid (positive) episode end.
    meta.create_array(
        "episode_ends", shape=(0,), chunks=(_META_CHUNK,), dtype="int64", fill_value=0, compressors=checked
    )
    for column in STRING_COLUMNS:
        meta.create_array(
            column, shape=(0,), chunks=(_META_CHUNK,), dtype=VariableLengthUTF8(), compressors=checked
        )
    meta.create_array(
        "length", shape=(0,), chunks=(_META_CHUNK,), dtype="int64", fill_value=0, compressors=checked
    )
    meta.create_array(
        "success",
        shape=(0,),
        chunks=(_META_CHUNK,),
        dtype="int8",
        fill_value=SUCCESS_UNKNOWN,
        compressors=checked,
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
            # Every chunk is written, even one equal to the fill value, so a missing chunk file is
            # damage (validate checks); stores without this attribute may omit all-fill chunks.
            "all_chunks_written": True,
        }
    )


class _LocalShardReader:
    """Reads encoded image frames straight from the shard files of a local store.

    zarr's general read path costs about a millisecond of Python per inner chunk, more than decoding
    a JPEG. For the one layout this package writes (shards of 1-frame inner chunks, variable-length
    bytes, optionally a crc32c per frame, index at the end of the shard) a frame is one ``pread`` at
    an offset from the shard index. Shard indexes are checked (crc32c) and cached per file identity
    (inode, size, mtime), so a shard rewritten by an append is re-indexed. Anything unexpected,
    a checksum that does not match included, returns None and the caller falls back to zarr, which
    raises for damaged data.
    """

    def __init__(self, directory: Path, shard_frames: int, checksummed: bool = False) -> None:
        self.directory = directory
        self.shard_frames = shard_frames
        self.checksummed = checksummed
        self._index: dict[int, tuple[tuple[int, int, int], np.ndarray | None]] = {}

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
        inner = [type(c) for c in sharding.codecs]
        if (
            tuple(sharding.chunk_shape) != (1,)
            or inner not in ([VLenBytesCodec], [VLenBytesCodec, Crc32cCodec])
            or [type(c) for c in sharding.index_codecs] != [BytesCodec, Crc32cCodec]
            or sharding.index_location != ShardingCodecIndexLocation.end
            or getattr(metadata.chunk_key_encoding, "separator", None) != "/"
        ):
            return None
        directory = Path(_local_path(location) or location) / "data" / key / "c"
        return cls(directory, int(metadata.chunk_grid.chunk_shape[0]), checksummed=len(inner) == 2)

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
                if index is None:
                    return None
                trailer = 4 if self.checksummed else 0
                for position in positions:
                    offset, nbytes = index[int(frames[position]) % self.shard_frames]
                    if nbytes < 8 + trailer or offset == _EMPTY_CHUNK:
                        return None
                    chunk = os.pread(fd, int(nbytes), int(offset))
                    if self.checksummed:
                        import google_crc32c

                        if google_crc32c.value(chunk[:-4]) != int.from_bytes(chunk[-4:], "little"):
                            return None
                        chunk = chunk[:-4]
                    # variable-length bytes: uint32 item count (1), uint32 length, the bytes.
                    count, length = np.frombuffer(chunk, dtype="<u4", count=2)
                    if count != 1 or length != len(chunk) - 8:
                        return None
                    out[position] = chunk[8:]
            finally:
                os.close(fd)
        return out

    def _shard_index(self, shard: int, fd: int) -> np.ndarray | None:
        """The shard's (offset, nbytes) per frame; None when the index is damaged (zarr then raises)."""
        import google_crc32c

        status = os.fstat(fd)
        identity = (status.st_ino, status.st_size, status.st_mtime_ns)
        cached = self._index.get(shard)
        if cached is not None and cached[0] == identity:
            return cached[1]
        size = self.shard_frames * 16 + 4  # (offset, nbytes) uint64 pairs + crc32c
        if status.st_size < size:
            return None
        raw = os.pread(fd, size, status.st_size - size)
        index = None
        if google_crc32c.value(raw[:-4]) == int.from_bytes(raw[-4:], "little"):
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
        self._shard_readers: dict[str, _LocalShardReader | None] = {}
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

        ``image_codec`` is ``"jpeg"`` (default), ``"png"`` (lossless) or ``"jpegxl"``;
        ``image_codec_options`` go to the imagecodecs encoder (e.g. ``{"level": 95}``).
        A local store is built under a temporary name beside ``location`` and renamed into place,
        so a creator killed at any moment leaves either no store or a complete empty one.
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
        layout = (features, codec, options, int(image_shard_frames))
        local = _local_path(location)
        if local is None:
            # Remote stores cannot be renamed atomically; a creation killed half-way is cleared by
            # `demoscale store repair` (documented in datasets/README.md).
            zstore = _open_zarr_store(location, read_only=False)
            try:
                root = zarr.open_group(zstore, mode="w" if overwrite else "w-", zarr_format=3)
            except FileExistsError:
                raise StoreError(f"{location}: already exists (open it, or pass overwrite=True)") from None
            _build_layout(root, *layout)
            return cls(root, location, writable=True)
        with writer_lock(location, lock_timeout, what="create"):
            if not overwrite and local.exists() and (not local.is_dir() or any(local.iterdir())):
                raise StoreError(f"{location}: already exists (open it, or pass overwrite=True)")
            _remove_unfinished_creations(local)
            scratch = local.with_name(f".{local.name}.creating-{os.getpid()}-{uuid.uuid4().hex[:8]}")
            replaced = None
            try:
                _build_layout(
                    zarr.open_group(zarr.storage.LocalStore(scratch), mode="w-", zarr_format=3), *layout
                )
                if local.is_dir() and any(local.iterdir()):
                    replaced = local.with_name(f".{local.name}.replaced-{uuid.uuid4().hex[:8]}")
                    os.rename(local, replaced)
                elif local.is_dir():
                    local.rmdir()
                elif local.exists():
                    raise StoreError(f"{location}: exists and is not a directory")
                os.rename(scratch, local)  # the creation's one visible step
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
                if replaced is not None:
                    shutil.rmtree(replaced, ignore_errors=True)
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
        else:
            with writer_lock(location, what="create"):  # no other creator between the check and the creation
                if not Path(location).exists() or not any(Path(location).iterdir()):
                    return cls.create(
                        location, features, image_codec, image_codec_options, image_shard_frames
                    )
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
        with self._reading(key, slice(start, stop)):
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
        with self._reading(key, unique):
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
        with self._reading(key, frames):
            if len(frames) == frames[-1] - frames[0] + 1:
                return array[int(frames[0]) : int(frames[-1]) + 1]
            return array.get_orthogonal_selection(frames)

    @contextmanager
    def _reading(self, key: str, frames: np.ndarray | slice) -> Iterator[None]:
        """Turn zarr's errors for damaged chunks (checksums, truncated files) into a StoreError."""
        try:
            yield
        except StoreError:
            raise
        except Exception as error:
            if isinstance(frames, slice):
                span = f"{frames.start}:{frames.stop}"
            else:
                span = f"{int(frames[0])}..{int(frames[-1])}" if len(frames) else "-"
            raise StoreError(
                f"{self.location}: data/{key} frames {span} cannot be read (damaged chunk? "
                f"`demoscale store validate --deep` locates it): {type(error).__name__}: {error}"
            ) from None

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
        The episode becomes visible only when ``meta/episode_ends`` is written, last; inside a
        :meth:`transaction`, only when the transaction commits. Runs under the writer lock.
        """
        where = f"{self.location}: episode from {source or '<unnamed source>'}"
        if not self.writable:
            raise StoreError(f"{self.location}: opened read-only; open with mode='a' to append")
        encoded = dict(encoded or {})
        length, arrays = self._validate_episode(data, encoded, where)
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
        n_episodes = self.n_episodes + (len(staged.ends) if staged is not None else 0)
        start = staged.ends[-1] if staged is not None and staged.ends else self.n_frames
        stop = start + length
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
        if staged is not None:
            staged.ends.append(stop)
            if digest:
                staged.hashes.add(digest)
            return n_episodes
        # Commit point, strictly after the writes above: one atomic chunk write of meta/episode_ends.
        self._commit_ends([stop], {digest} - {""})
        return n_episodes

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
        _sync(ends.async_array.resize((total,)))
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
    def transaction(self, lock_timeout: float | None = None) -> Iterator[EpisodeStore]:
        """Append a batch all-or-nothing: ``with store.transaction(): store.append_episode(...)``.

        Holds the writer lock for the whole block. Appended episodes stay invisible until the block
        ends, then one commit makes all of them visible. If the block raises (or the commit fails),
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
            self._staged = _Staged()
            try:
                yield self
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

    def _journal(self) -> dict[str, tuple[bytes, dict[str, bytes], int]] | None:
        """For each array: its metadata file and every chunk file a batch could write (local stores).

        Appends write from the committed length on, so only the file holding that position and any
        files after it (an uncommitted tail) can change; everything before is left alone.
        """
        local = _local_path(self.location)
        if local is None:
            return None
        journal = {}
        for path in self._array_paths():
            array = self._array(path)
            committed = self.n_frames if path.startswith("data/") else self.n_episodes
            first = committed // int(array.metadata.chunk_grid.chunk_shape[0])
            folder = local / path
            saved: dict[str, bytes] = {}
            for entry in _time_chunk_entries(folder / "c", first):
                files = [entry] if entry.is_file() else sorted(f for f in entry.rglob("*") if f.is_file())
                for file in files:
                    saved[str(file.relative_to(folder))] = file.read_bytes()
            journal[path] = ((folder / "zarr.json").read_bytes(), saved, first)
        return journal

    def _rollback(self, journal: dict[str, tuple[bytes, dict[str, bytes], int]] | None) -> None:
        """Undo an unfinished batch (the writer lock is held)."""
        local = _local_path(self.location)
        if journal is not None and local is not None:
            for path, (metadata, saved, first) in journal.items():
                folder = local / path
                for entry in _time_chunk_entries(folder / "c", first):
                    if entry.is_dir():
                        shutil.rmtree(entry)
                    else:
                        entry.unlink()
                for relative, content in saved.items():
                    _write_atomically(folder / relative, content)
                _write_atomically(folder / "zarr.json", metadata)
        else:
            committed = self.n_frames
            for path in self._array_paths():
                array = self._array(path)
                length = committed if path.startswith("data/") else self.n_episodes
                if array.shape[0] > length:
                    array.resize((length, *array.shape[1:]))
        self._arrays.clear()
        self._shard_readers.clear()
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
            return self._stats_from_json(key, cached)
        result = self._compute_stats(key, spec, n_frames)
        entry = {"n_frames": n_frames, **{k: np.asarray(v).tolist() for k, v in result.items()}}
        self._stats_memory[key] = entry
        self._persist_stats(key, entry)
        return self._stats_from_json(key, entry)

    def _persist_stats(self, key: str, entry: dict[str, Any]) -> None:
        """Cache statistics in the root attributes: always when writable; for a read-only handle on a
        local directory we may write to, too (the one write a reader makes). Losing the cache only
        costs a recomputation, so it is skipped while another process holds the writer lock, and
        failures are ignored."""
        local = _local_path(self.location)
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
    def _file_size(self, key: str) -> int | None:
        """Size of one file of the store (``data/x/c/0``), None if it does not exist."""
        local = _local_path(self.location)
        if local is not None:
            try:
                return (local / key).stat().st_size
            except FileNotFoundError:
                return None
        try:
            return int(_sync(self._root.store.getsize(key)))
        except (FileNotFoundError, KeyError):
            return None

    def _read_file(self, key: str, suffix: int | None = None) -> bytes:
        """The bytes of one file of the store, or only its last ``suffix`` bytes."""
        local = _local_path(self.location)
        if local is not None:
            with open(local / key, "rb") as handle:
                if suffix is not None:
                    handle.seek(-suffix, os.SEEK_END)
                return handle.read()
        from zarr.abc.store import SuffixByteRequest
        from zarr.core.buffer import default_buffer_prototype

        request = SuffixByteRequest(suffix) if suffix is not None else None
        buffer = _sync(self._root.store.get(key, prototype=default_buffer_prototype(), byte_range=request))
        if buffer is None:
            raise StoreError(f"{self.location}: {key} is missing")
        return buffer.to_bytes()

    def validate(self, deep: bool = False, progress: bool = False) -> None:
        """Check every invariant of the store; raise StoreError naming the key and episode at fault.

        Always: the format attributes, ``episode_ends``, every array's length, shape and dtype, the
        metadata columns, and the presence and sizes of every chunk file of committed data (see
        ``datasets/integrity.py``), plus decoding the first and last frame of every image key.
        ``deep=True`` also reads every committed value: every image frame decoded, every numeric
        chunk decompressed (``progress`` shows a bar).
        """
        from demoscale.datasets.integrity import check_chunk_files, check_every_value

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
        check_chunk_files(self)  # before reading the columns, so that damage is named by its file
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
        success = self._read_column("meta/success", n)
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
        if deep:
            check_every_value(self, progress=progress)

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


def repair_store(location: str | os.PathLike[str], lock_timeout: float | None = None) -> list[str]:
    """Bring a store left behind by a killed writer or creator back to a clean state.

    Under the writer lock: removes scratch folders of killed creations beside the store; removes a
    store that never got its root attributes (a creation killed by an older version) when it holds
    no data; cuts every array back to the committed episodes (an uncommitted tail, entries after
    the valid prefix of ``meta/episode_ends``, and committed episodes whose data is incomplete);
    removes leftover ``*.partial`` files and statistics cached for another frame count. Returns one
    line per action (empty when there was nothing to do).
    """
    location = os.fspath(location)
    local = _local_path(location)
    actions: list[str] = []
    with writer_lock(location, lock_timeout, what="repair"):
        if local is not None:
            actions += [
                f"removed {p.name}, left by a store creation that was killed"
                for p in _remove_unfinished_creations(local)
            ]
            if not local.exists():
                if actions:
                    return actions
                raise StoreError(f"{location}: no such store")
        try:
            root = zarr.open_group(_open_zarr_store(location, read_only=False), mode="r+")
        except Exception as error:
            raise StoreError(
                f"{location}: cannot open as a zarr group ({type(error).__name__}: {error})"
            ) from None
        found = root.attrs.get("format")
        if found != FORMAT_NAME:
            if found is not None:
                raise StoreError(f"{location}: format {found!r} is not a demoscale episode store; left alone")
            arrays = [
                (name, node) for name, node in root.members(max_depth=None) if isinstance(node, zarr.Array)
            ]
            holding = [name for name, array in arrays if array.shape and array.shape[0] > 0]
            if holding:
                raise StoreError(
                    f"{location}: has no store attributes but holds data ({', '.join(sorted(holding)[:5])}); "
                    "not removing it"
                )
            if local is not None:
                shutil.rmtree(local)
            else:
                import fsspec

                fs, path = fsspec.core.url_to_fs(location)
                fs.rm(path, recursive=True)
            actions.append(
                "removed an unfinished store (created without its attributes, no data); the next ingest creates it"
            )
            return actions
        store = EpisodeStore(root, location, writable=True)
        if local is not None:
            leftovers = list(local.rglob("*.partial"))
            for leftover in leftovers:
                leftover.unlink(missing_ok=True)
            if leftovers:
                actions.append(f"removed {len(leftovers)} temporary *.partial file(s) of a killed writer")
        raw_ends = store._read_ends()
        n, n_frames = store.n_episodes, store.n_frames
        if len(raw_ends) > n:
            valid = np.flatnonzero(np.diff(np.concatenate([[0], raw_ends])) <= 0)
            prefix = int(valid[0]) if len(valid) else len(raw_ends)
            if prefix > n:
                actions.append(
                    f"dropped episodes {n}..{prefix - 1}: committed, but their data is incomplete "
                    f"({'; '.join(store._notes)})"
                )
            if len(raw_ends) > prefix:
                actions.append(
                    f"removed {len(raw_ends) - prefix} entries of meta/episode_ends after its valid prefix"
                )
        for path in store._array_paths():
            array = store._array(path)
            length = n_frames if path.startswith("data/") else n
            extra = array.shape[0] - length
            if extra > 0:
                array.resize((length, *array.shape[1:]))
                if path.startswith("data/"):
                    actions.append(f"removed {extra} uncommitted frames from {path}")
        stats = dict(root.attrs.get("stats", {}))
        stale = sorted(key for key, entry in stats.items() if entry.get("n_frames") != n_frames)
        if stale:
            root.attrs["stats"] = {key: entry for key, entry in stats.items() if key not in stale}
            actions.append(
                f"dropped cached statistics of {', '.join(stale)} (computed on another frame count)"
            )
    return actions


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
