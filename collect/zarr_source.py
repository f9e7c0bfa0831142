"""Reading Zarr format-2 ``data/`` + ``meta/episode_ends`` groups (UMI zips, replay buffers).

Both a ``.zarr.zip`` and a ``.zarr`` directory are accepted. Metadata is read from the raw
``.zarray`` files so that every problem (a truncated zip, a missing index, an unknown codec, arrays
whose lengths disagree with ``episode_ends``) is reported with the file and key before any array is
decoded. Chunk bytes can be read as they are (to copy already-encoded images); reads from a zip
verify each member's CRC, so corrupt bytes are caught too.
"""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from demoscale.collect.source_format import IngestError, check_finite


def register_image_codecs() -> None:
    """Register imagecodecs' numcodecs codecs (JPEG-XL among them) in this process."""
    from numcodecs.registry import codec_registry

    if "imagecodecs_jpegxl" in codec_registry:  # registering all of them again costs ~0.3 s
        return
    from imagecodecs.numcodecs import register_codecs

    register_codecs(verbose=False)


class RawGroup:
    """Raw member access to a Zarr format-2 group stored in a zip file or a directory."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._zip: zipfile.ZipFile | None = None
        self._zarr_store = None
        if self.path.is_dir():
            return
        if not self.path.exists():
            raise IngestError(f"{self.path}: no such file or directory")
        try:
            self._zip = zipfile.ZipFile(self.path)
        except (zipfile.BadZipFile, OSError) as error:
            raise IngestError(
                f"{self.path}: not a readable zip file (truncated or corrupt?): {error}"
            ) from error
        self._names = set(self._zip.namelist())

    def exists(self, name: str) -> bool:
        if self._zip is not None:
            return name in self._names
        return (self.path / name).is_file()

    def read(self, name: str) -> bytes:
        try:
            if self._zip is not None:
                return self._zip.read(name)
            return (self.path / name).read_bytes()
        except KeyError as error:
            raise IngestError(f"{self.path}: member {name!r} is missing") from error
        except (zipfile.BadZipFile, OSError, EOFError) as error:
            raise IngestError(f"{self.path}: member {name!r} cannot be read (corrupt?): {error}") from error

    def member_names(self, prefix: str) -> set[str]:
        """Every file name under ``prefix`` (e.g. ``data/action/``), relative to the group root."""
        if self._zip is not None:
            return {n for n in self._names if n.startswith(prefix)}
        folder = self.path / prefix
        if not folder.is_dir():
            return set()
        return {str(p.relative_to(self.path).as_posix()) for p in folder.rglob("*") if p.is_file()}

    def list_arrays(self, group: str) -> list[str]:
        """Names of the arrays directly inside ``group`` (those with a ``.zarray``)."""
        prefix = f"{group}/"
        if self._zip is not None:
            names = {n[len(prefix) :].split("/")[0] for n in self._names if n.startswith(prefix)}
            return sorted(n for n in names if f"{prefix}{n}/.zarray" in self._names)
        folder = self.path / group
        if not folder.is_dir():
            return []
        return sorted(p.name for p in folder.iterdir() if (p / ".zarray").is_file())

    def array_meta(self, name: str) -> dict[str, Any]:
        raw = self.read(f"{name}/.zarray")
        try:
            return json.loads(raw)
        except json.JSONDecodeError as error:
            raise IngestError(f"{self.path}: {name}/.zarray is not valid JSON: {error}") from error

    def zarr_store(self):
        """A read-only zarr store over the same source (closed with this object)."""
        import zarr

        if self._zarr_store is None:
            if self._zip is not None:
                self._zarr_store = zarr.storage.ZipStore(self.path, mode="r")
            else:
                self._zarr_store = zarr.storage.LocalStore(self.path, read_only=True)
        return self._zarr_store

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()
        if self._zarr_store is not None:
            self._zarr_store.close()


@dataclass
class ArrayInfo:
    name: str  # key inside data/
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dtype: np.dtype
    compressor_id: str | None
    has_filters: bool
    separator: str

    def chunk_name(self, frame: int) -> str:
        """Member name of the chunk holding ``frame`` when chunks are one frame each."""
        rest = [0] * (len(self.shape) - 1)
        return f"data/{self.name}/" + self.separator.join(str(i) for i in [frame, *rest])


def check_chunks_present(raw: RawGroup, info: ArrayInfo, episode_ends: np.ndarray, key: str) -> None:
    """Raise IngestError if any chunk of the array is absent from the source.

    zarr reads an absent chunk as the array's fill value (zeros, typically), so a source missing a
    chunk would be ingested as plausible-looking zeros. UMI and diffusion-policy writers store every
    chunk, so an absent one is damage; the error names the key, the episode and the frames.
    """
    import itertools

    present = raw.member_names(f"{key}/")
    grid = [range(max(1, -(-n // c))) for n, c in zip(info.shape, info.chunks, strict=True)]
    for index in itertools.product(*grid):
        name = f"{key}/" + info.separator.join(str(i) for i in index)
        if name not in present:
            first = index[0] * info.chunks[0]
            last = min(info.shape[0], first + info.chunks[0])
            if key.startswith("meta/"):
                where = f"entries {first}:{last}"
            else:
                episode = int(np.searchsorted(episode_ends, first, side="right"))
                where = f"episode {episode}, frames {first}:{last}"
            raise IngestError(
                f"{raw.path}: key {key.removeprefix('data/')!r}: chunk {name} ({where}) is missing; "
                "it would read as the fill value, not as data"
            )


@dataclass
class GroupInfo:
    path: Path
    episode_ends: np.ndarray
    arrays: dict[str, ArrayInfo]

    @property
    def n_episodes(self) -> int:
        return len(self.episode_ends)

    def bounds(self, episode: int) -> tuple[int, int]:
        start = int(self.episode_ends[episode - 1]) if episode else 0
        return start, int(self.episode_ends[episode])


def _check_codec(path: Path, key: str, config: dict | None) -> None:
    import numcodecs

    if config is None:
        return
    try:
        numcodecs.get_codec(dict(config))
    except Exception as error:  # numcodecs raises UnknownCodecError or the codec's own errors
        raise IngestError(
            f"{path}: key {key!r}: codec {config.get('id')!r} is not available ({error}); "
            "is the package that provides it installed?"
        ) from error


def inspect_group(raw: RawGroup) -> GroupInfo:
    """Validate the metadata of a ``data/`` + ``meta/episode_ends`` group and read the index."""
    import zarr

    register_image_codecs()
    path = raw.path
    if not raw.exists("meta/episode_ends/.zarray"):
        raise IngestError(f"{path}: no meta/episode_ends array: not an episode group (UMI / replay buffer)")
    meta = raw.array_meta("meta/episode_ends")
    if meta.get("zarr_format") != 2:
        raise IngestError(f"{path}: meta/episode_ends is not a Zarr format-2 array")
    _check_codec(path, "meta/episode_ends", meta.get("compressor"))
    try:
        root = zarr.open_group(raw.zarr_store(), mode="r", zarr_format=2)
        episode_ends = np.asarray(root["meta/episode_ends"][:])
    except IngestError:
        raise
    except Exception as error:
        raise IngestError(f"{path}: meta/episode_ends cannot be read: {error}") from error
    if episode_ends.ndim != 1 or not np.issubdtype(episode_ends.dtype, np.integer) or len(episode_ends) == 0:
        raise IngestError(
            f"{path}: meta/episode_ends must be a non-empty 1-D integer array, got {episode_ends.dtype} {episode_ends.shape}"
        )
    episode_ends = episode_ends.astype(np.int64)
    ends_meta = raw.array_meta("meta/episode_ends")
    check_chunks_present(
        raw,
        ArrayInfo(
            name="episode_ends",
            shape=tuple(int(n) for n in ends_meta["shape"]),
            chunks=tuple(int(n) for n in ends_meta["chunks"]),
            dtype=np.dtype(ends_meta["dtype"]),
            compressor_id=None,
            has_filters=False,
            separator=ends_meta.get("dimension_separator") or ".",
        ),
        episode_ends,
        "meta/episode_ends",
    )
    steps = np.diff(np.concatenate([[0], episode_ends]))
    if (steps <= 0).any():
        bad = int(np.flatnonzero(steps <= 0)[0])
        raise IngestError(f"{path}: meta/episode_ends is not strictly increasing at episode {bad}")
    total = int(episode_ends[-1])
    arrays: dict[str, ArrayInfo] = {}
    names = raw.list_arrays("data")
    if not names:
        raise IngestError(f"{path}: no arrays under data/")
    for name in names:
        meta = raw.array_meta(f"data/{name}")
        if meta.get("zarr_format") != 2:
            raise IngestError(f"{path}: key {name!r} is not a Zarr format-2 array")
        _check_codec(path, name, meta.get("compressor"))
        for config in meta.get("filters") or []:
            _check_codec(path, name, config)
        shape = tuple(int(n) for n in meta["shape"])
        if not shape or shape[0] != total:
            raise IngestError(
                f"{path}: key {name!r} has {shape[0] if shape else 0} frames but meta/episode_ends says {total} "
                f"(episode {len(episode_ends) - 1} ends at {total})"
            )
        arrays[name] = ArrayInfo(
            name=name,
            shape=shape,
            chunks=tuple(int(n) for n in meta["chunks"]),
            dtype=np.dtype(meta["dtype"]),
            compressor_id=(meta.get("compressor") or {}).get("id"),
            has_filters=bool(meta.get("filters")),
            separator=meta.get("dimension_separator") or ".",
        )
        check_chunks_present(raw, arrays[name], episode_ends, f"data/{name}")
    return GroupInfo(path=path, episode_ends=episode_ends, arrays=arrays)


@contextmanager
def episode_group(path: str | os.PathLike) -> Iterator[tuple[RawGroup, GroupInfo, Any]]:
    """(raw access, checked metadata, zarr group) of the source at ``path``, closed after the block."""
    import zarr

    raw = RawGroup(path)
    try:
        info = inspect_group(raw)
        yield raw, info, zarr.open_group(raw.zarr_store(), mode="r", zarr_format=2)
    finally:
        raw.close()


def read_checked(root: Any, info: GroupInfo, key: str, stop: int | None = None) -> np.ndarray:
    """The frames before ``stop`` (default all) of ``data/<key>``, checked to be finite."""
    try:
        values = np.asarray(root[f"data/{key}"][:stop])
    except Exception as error:
        raise IngestError(f"{info.path}: key {key!r} cannot be read: {error}") from error
    check_finite(values, str(info.path), key, info.episode_ends)
    return values


# One open source per worker process: a zip's central directory is read once, not per episode.
_OPEN: dict[str, tuple[RawGroup, Any]] = {}


def open_cached(path: str | os.PathLike) -> tuple[RawGroup, Any]:
    """(RawGroup, zarr group) for ``path``, opened once per process."""
    import zarr

    # Keyed by process id too: a forked child must never share its parent's open file offsets.
    key = f"{os.getpid()}:{path}"
    if key not in _OPEN:
        register_image_codecs()
        raw = RawGroup(path)
        _OPEN[key] = (raw, zarr.open_group(raw.zarr_store(), mode="r", zarr_format=2))
    return _OPEN[key]


class ChunkedFrames:
    """Frames of one source array, read whole chunks at a time with the last block kept.

    Reading an episode's frames through zarr decompresses every chunk it touches; episodes shorter
    than a chunk (PushT: ~125 frames in chunks of 100) would decompress each chunk two or three
    times, and zarr's per-call overhead is paid once per episode and key. Read in episode order,
    this decompresses every chunk about once.

    Where the layout allows (chunks split only the frame axis, C order, no filters), chunks are read
    as raw members and decompressed by their numcodecs codec directly: zarr-python's read path
    costs two to three times the decompression itself on camera frames (``benchmarks/ingest.py``,
    "source read"), which made reading a replay buffer dearer than encoding its frames.
    """

    def __init__(self, array: Any, raw: RawGroup | None = None, name: str | None = None) -> None:
        self.array = array
        self.length = int(array.shape[0])
        self.chunk = max(1, int(array.chunks[0]))
        self._block: tuple[int, int, np.ndarray] | None = None
        self._direct = _DirectChunks.of(raw, name) if raw is not None and name is not None else None

    def read(self, start: int, stop: int) -> np.ndarray:
        """Frames ``start:stop`` (a view into the cached block: copy before changing it)."""
        block = self._block
        if block is None or not (block[0] <= start and stop <= block[1]):
            first = start // self.chunk * self.chunk
            last = min(self.length, -(-stop // self.chunk) * self.chunk)
            if self._direct is not None:
                values = self._direct.frames(first // self.chunk, -(-last // self.chunk), last)
            else:
                values = np.asarray(self.array[first:last])
            block = (first, last, values)
            self._block = block
        return block[2][start - block[0] : stop - block[0]]


@dataclass
class _DirectChunks:
    """Decompress a Zarr format-2 array's chunks straight from their members (see ChunkedFrames)."""

    raw: RawGroup
    name: str
    chunks: tuple[int, ...]
    dtype: np.dtype
    codec: Any  # a numcodecs codec, or None for uncompressed chunks
    separator: str

    @classmethod
    def of(cls, raw: RawGroup, name: str) -> _DirectChunks | None:
        """The direct reader of ``name`` (e.g. ``data/img``), or None where zarr must read it."""
        import numcodecs

        meta = raw.array_meta(name)
        shape, chunks = tuple(meta["shape"]), tuple(meta["chunks"])
        dtype = np.dtype(meta["dtype"])
        if meta.get("filters") or meta.get("order", "C") != "C" or chunks[1:] != shape[1:] or dtype.hasobject:
            return None
        compressor = meta.get("compressor")
        codec = numcodecs.get_codec(dict(compressor)) if compressor else None
        return cls(raw, name, chunks, dtype, codec, meta.get("dimension_separator") or ".")

    def frames(self, first_chunk: int, stop_chunk: int, stop_frame: int) -> np.ndarray:
        """Frames of chunks ``first_chunk:stop_chunk``, up to global frame ``stop_frame``."""
        from numcodecs.compat import ensure_ndarray_like

        rest = self.separator.join("0" for _ in self.chunks[1:])
        parts = []
        for index in range(first_chunk, stop_chunk):
            member = f"{self.name}/{index}" + (f"{self.separator}{rest}" if rest else "")
            payload = self.raw.read(member)
            try:
                decoded = payload if self.codec is None else self.codec.decode(payload)
                flat = np.ascontiguousarray(ensure_ndarray_like(decoded)).reshape(-1).view(np.uint8)
                values = flat.view(self.dtype).reshape(self.chunks)
            except Exception as error:
                raise IngestError(f"{self.raw.path}: chunk {member} does not decode: {error}") from error
            parts.append(values)
        values = parts[0] if len(parts) == 1 else np.concatenate(parts)
        values = values[: stop_frame - first_chunk * self.chunks[0]]
        if not values.dtype.isnative:
            values = values.astype(values.dtype.newbyteorder("="))
        return values


_FRAMES: dict[str, ChunkedFrames] = {}


def cached_frames(path: str | os.PathLike, key: str) -> ChunkedFrames:
    """The :class:`ChunkedFrames` of ``data/<key>`` of the source at ``path``, one per process."""
    cache_key = f"{os.getpid()}:{path}:{key}"
    if cache_key not in _FRAMES:
        raw, root = open_cached(path)
        _FRAMES[cache_key] = ChunkedFrames(root[f"data/{key}"], raw, f"data/{key}")
    return _FRAMES[cache_key]
