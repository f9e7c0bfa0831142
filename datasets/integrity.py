"""Validation of an episode store: its invariants, and damage in its chunk files.

:func:`validate_store` (what :meth:`EpisodeStore.validate` runs) checks the format attributes,
``episode_ends``, every array's length, shape and dtype, the metadata columns and the chunk files.
The chunk files are checked at two depths:

- the default (cheap) check looks at every chunk file of the committed frames and episodes without
  decoding data: the file exists (for stores that write every chunk, see the ``all_chunks_written``
  attribute; image frames are never allowed to be missing), a shard's index is intact (crc32c) and
  every committed frame's byte range lies inside the file, and a zstd chunk is one complete zstd
  frame of the chunk's size (block headers walked, nothing decompressed);
- the deep check reads every committed value: every image frame decoded to the feature's shape
  (a video key group of pictures by group of pictures, each from its key frame with a fresh
  decoder, so that random access is checked too), every low-dim and point-cloud block
  decompressed (and low-dim floats finite), every metadata column read.

Failures raise ``StoreError`` naming the array, the chunk file, the frames and the episode.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

import numpy as np
from demoscale.datasets.schema import META_COLUMNS, SUCCESS_UNKNOWN, StoreError
from demoscale.datasets.shards import EMPTY_CHUNK, local_path, sync

if TYPE_CHECKING:
    from demoscale.datasets.store import EpisodeStore

_ZSTD_MAGIC = 0xFD2FB528
_DEEP_BLOCK_FRAMES = 4096


def validate_store(store: EpisodeStore, deep: bool = False, progress: bool = False) -> None:
    """Check every invariant of ``store``; raise StoreError naming the key and episode at fault.

    Always: the format attributes, ``episode_ends``, every array's length, shape and dtype, the
    metadata columns, and the presence and sizes of every chunk file of committed data, plus
    decoding the first and last frame of every image key. ``deep=True`` also reads every committed
    value (``progress`` shows a bar).
    """
    _check_arrays(store)
    check_chunk_files(store)  # before reading the columns, so that damage is named by its file
    if store.n_episodes == 0:
        return
    _check_metadata(store)
    # Spot-check that the first and last frame of every image key decode to the spec's shape.
    for key, spec in store.features.items():
        if spec.kind == "image":
            for index in (0, store.n_frames - 1):
                try:
                    store.read(key, index, index + 1)
                except StoreError as error:
                    raise StoreError(f"{store.location}: data/{key} frame {index}: {error}") from None
    if deep:
        check_every_value(store, progress=progress)


def _check_arrays(store: EpisodeStore) -> None:
    """Root attributes, ``episode_ends``, and every array's length, shape and dtype."""
    loc = store.location
    attrs = dict(store._root.attrs)
    for name in ("format", "version", "features", "image_codec"):
        if name not in attrs:
            raise StoreError(f"{loc}: root attribute {name!r} missing")
    try:
        ends_array = store._reload_array("meta/episode_ends")
    except StoreError:
        raise StoreError(f"{loc}: meta/episode_ends missing") from None
    if ends_array.dtype != np.int64 or ends_array.ndim != 1:
        raise StoreError(
            f"{loc}: meta/episode_ends must be 1-d int64, is {ends_array.ndim}-d {ends_array.dtype}"
        )
    for column in META_COLUMNS:
        store._reload_array(f"meta/{column}")
    store._refresh()
    if store._notes:
        raise StoreError(f"{loc}: " + "; ".join(store._notes))
    n, n_frames = store.n_episodes, store.n_frames
    for key, spec in store.features.items():
        array = store._reload_array(f"data/{key}")
        if array.shape[0] < n_frames:
            raise StoreError(f"{loc}: data/{key} has {array.shape[0]} frames, episode_ends says {n_frames}")
        expected = (array.shape[0],) if spec.kind == "image" else (array.shape[0], *spec.shape)
        if array.shape != expected:
            raise StoreError(f"{loc}: data/{key} has shape {array.shape}, spec says {expected}")
        if spec.kind != "image" and array.dtype != np.dtype(spec.dtype):
            raise StoreError(f"{loc}: data/{key} has dtype {array.dtype}, spec says {spec.dtype}")
    for column in META_COLUMNS:
        rows = store._array(f"meta/{column}").shape[0]
        if rows < n:
            raise StoreError(f"{loc}: meta/{column} has {rows} rows for {n} episodes")


def _check_metadata(store: EpisodeStore) -> None:
    """Lengths against ``episode_ends``, non-empty ids, success values, present and unique hashes."""
    loc, n = store.location, store.n_episodes
    frame = store.episodes
    lengths = np.diff(np.concatenate([[0], store.episode_ends]))
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
    success = store._read_column("meta/success", n)
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
            raise StoreError(f"{loc}: episodes {seen[digest]} and {i} have the same source_sha256 {digest}")
        seen[digest] = i


def _file_size(store: EpisodeStore, key: str) -> int | None:
    """Size of one file of the store (``data/x/c/0``), None if it does not exist."""
    local = local_path(store.location)
    if local is not None:
        try:
            return (local / key).stat().st_size
        except FileNotFoundError:
            return None
    try:
        return int(sync(store._root.store.getsize(key)))
    except (FileNotFoundError, KeyError):
        return None


def _read_file(store: EpisodeStore, key: str, suffix: int | None = None) -> bytes:
    """The bytes of one file of the store, or only its last ``suffix`` bytes."""
    local = local_path(store.location)
    if local is not None:
        with open(local / key, "rb") as handle:
            if suffix is not None:
                handle.seek(-suffix, os.SEEK_END)
            return handle.read()
    from zarr.abc.store import SuffixByteRequest
    from zarr.core.buffer import default_buffer_prototype

    request = SuffixByteRequest(suffix) if suffix is not None else None
    buffer = sync(store._root.store.get(key, prototype=default_buffer_prototype(), byte_range=request))
    if buffer is None:
        raise StoreError(f"{store.location}: {key} is missing")
    return buffer.to_bytes()


def zstd_frame_check(data: bytes) -> int | None:
    """Walk one zstd frame's headers; return its declared content size (None if not declared).

    Raises ValueError when the bytes are not exactly one complete zstd frame (truncated, padded,
    or not zstd at all). Reads only headers: cheap enough to run over every low-dim chunk.
    """
    if len(data) < 6 or int.from_bytes(data[:4], "little") != _ZSTD_MAGIC:
        raise ValueError("not a zstd frame (bad magic number)")
    descriptor = data[4]
    fcs_flag, single_segment = descriptor >> 6, (descriptor >> 5) & 1
    has_checksum, dictionary_flag = (descriptor >> 2) & 1, descriptor & 3
    position = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[dictionary_flag]
    fcs_bytes = (1 if single_segment else 0, 2, 4, 8)[fcs_flag]
    if position + fcs_bytes > len(data):
        raise ValueError("zstd frame header is truncated")
    content_size = None
    if fcs_bytes:
        content_size = int.from_bytes(data[position : position + fcs_bytes], "little")
        content_size += 256 if fcs_bytes == 2 else 0
    position += fcs_bytes
    while True:
        if position + 3 > len(data):
            raise ValueError(f"zstd data ends inside a block header at byte {position} of {len(data)}")
        header = int.from_bytes(data[position : position + 3], "little")
        last, block_type, block_size = header & 1, (header >> 1) & 3, header >> 3
        if block_type == 3:
            raise ValueError(f"reserved zstd block type at byte {position}")
        position += 3 + (1 if block_type == 1 else block_size)
        if position > len(data):
            raise ValueError(
                f"zstd data is truncated: a block needs {position} bytes, the file has {len(data)}"
            )
        if last:
            break
    position += 4 if has_checksum else 0
    if position != len(data):
        raise ValueError(f"zstd frame ends at byte {position} but the file has {len(data)} bytes")
    return content_size


def _codec_names(array: Any) -> list[str]:
    return [type(codec).__name__ for codec in getattr(array.metadata, "codecs", ())]


def _describe(store: EpisodeStore, path: str, first: int, last: int) -> str:
    """'frames a:b (episodes i..j)' for data arrays, 'episodes a:b' for metadata columns."""
    if not path.startswith("data/"):
        return f"episodes {first}:{last}"
    ends = store.episode_ends
    episode_first = int(np.searchsorted(ends, first, side="right"))
    episode_last = int(np.searchsorted(ends, max(first, last - 1), side="right"))
    episodes = (
        f"episode {episode_first}"
        if episode_first == episode_last
        else f"episodes {episode_first}..{episode_last}"
    )
    return f"frames {first}:{last} ({episodes})"


def check_chunk_files(store: EpisodeStore) -> None:
    """The default depth: presence and sizes of every chunk file that holds committed data."""

    strict = bool(store._root.attrs.get("all_chunks_written"))
    targets = [(f"data/{key}", store.n_frames, spec.kind) for key, spec in store.features.items()]
    targets += [(f"meta/{column}", store.n_episodes, "meta") for column in (*META_COLUMNS, "episode_ends")]
    for path, length, kind in targets:
        if length == 0:
            continue
        array = store._array(path)
        encoding = array.metadata.chunk_key_encoding
        if getattr(encoding, "name", "default") != "default" or getattr(encoding, "separator", "/") != "/":
            continue  # not a layout this package writes: nothing to check file by file
        per_file = int(array.metadata.chunk_grid.chunk_shape[0])
        rest = "/0" * (array.ndim - 1)
        codecs_ = _codec_names(array)
        for index in range(math.ceil(length / per_file)):
            first, last = index * per_file, min(length, (index + 1) * per_file)
            name = f"c/{index}{rest}"
            where = f"{store.location}: {path}/{name} ({_describe(store, path, first, last)})"
            size = _file_size(store, f"{path}/{name}")
            if size is None:
                if kind == "image" or strict:
                    raise StoreError(f"{where}: chunk file is missing")
                continue
            if codecs_ == ["ShardingCodec"]:
                _check_shard(store, path, name, size, first, last, index * per_file, kind, strict, where)
            elif codecs_ in (["BytesCodec", "ZstdCodec"], ["VLenUTF8Codec", "ZstdCodec"]):
                data = _read_file(store, f"{path}/{name}")
                try:
                    content = zstd_frame_check(data)
                except ValueError as error:
                    raise StoreError(f"{where}: damaged chunk file: {error}") from None
                expected = per_file * int(np.prod(array.shape[1:], dtype=np.int64)) * array.dtype.itemsize
                if content is not None and codecs_[0] == "BytesCodec" and content != expected:
                    raise StoreError(f"{where}: chunk holds {content} bytes, expected {expected}")


def _check_shard(
    store: EpisodeStore,
    path: str,
    name: str,
    size: int,
    first: int,
    last: int,
    shard_start: int,
    kind: str,
    strict: bool,
    where: str,
) -> None:
    """A shard's index (crc32c) and the byte range of each committed frame inside the file."""
    import google_crc32c

    array = store._array(path)
    sharding = array.metadata.codecs[0]
    per_shard = int(
        np.prod(np.asarray(array.metadata.chunk_grid.chunk_shape) // np.asarray(sharding.chunk_shape))
    )
    index_bytes = 16 * per_shard + 4
    if size < index_bytes:
        raise StoreError(
            f"{where}: shard file is truncated ({size} bytes, its index alone needs {index_bytes})"
        )
    raw = _read_file(store, f"{path}/{name}", suffix=index_bytes)
    if google_crc32c.value(raw[:-4]) != int.from_bytes(raw[-4:], "little"):
        raise StoreError(f"{where}: shard index is damaged (crc32c mismatch)")
    index = np.frombuffer(raw[:-4], dtype="<u8").reshape(-1, 2)
    for position in range(last - first):
        offset, nbytes = (int(v) for v in index[first - shard_start + position])
        frame = first + position
        if offset == EMPTY_CHUNK and nbytes == EMPTY_CHUNK:
            if kind == "image" or strict:
                raise StoreError(f"{where}: frame {frame} is missing from the shard")
            continue
        if offset + nbytes > size - index_bytes or (kind == "image" and nbytes < 8):
            raise StoreError(
                f"{where}: frame {frame} lies at bytes {offset}:{offset + nbytes}, outside the shard's "
                f"{size - index_bytes} data bytes (truncated file?)"
            )


def _locate_unreadable_frame(store: EpisodeStore, key: str, start: int, stop: int) -> None:
    """Raise StoreError naming the first frame of ``start:stop`` that cannot be read (checksum...)."""

    path = f"data/{key}"
    for frame in range(start, stop):
        try:
            store._frames(key).encoded(np.arange(frame, frame + 1))
        except StoreError as error:
            raise StoreError(
                f"{store.location}: {path} {_describe(store, path, frame, frame + 1)}: damaged frame: "
                + str(error).removeprefix(f"{store.location}: ")
            ) from None


def _check_video_key(store: EpisodeStore, key: str, bar: Any) -> None:
    """Decode every frame of a video image key, each group of pictures from its key frame with a
    fresh decoder (what a random read does), checking the key frames where the gop puts them."""
    from demoscale.datasets import video

    path = f"data/{key}"
    codec, options = store._image_codec_options(key)
    gop = int(options["gop"])
    shape = store.features[key].shape
    decoder = video.PacketDecoder(codec, shape)
    out = np.empty((gop, *shape), dtype=np.uint8)
    starts, ends = store.episode_starts, store.episode_ends
    step = max(gop, _DEEP_BLOCK_FRAMES // gop * gop)  # blocks of whole groups of pictures
    for episode, (episode_start, episode_end) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        for block in range(episode_start, episode_end, step):
            block_end = min(episode_end, block + step)
            try:
                packets = store._frames(key).encoded(np.arange(block, block_end))
            except StoreError:
                _locate_unreadable_frame(store, key, block, block_end)
                raise
            for first in range(block, block_end, gop):
                last = min(block_end, first + gop)
                run = [bytes(p) for p in packets[first - block : last - block]]
                if not video.is_keyframe(run[0], codec):
                    raise StoreError(
                        f"{store.location}: {path} frame {first} (episode {episode}) is not a key frame "
                        f"(gop {gop}): reads of its group of pictures cannot start there"
                    )
                decoder.reset()
                try:
                    decoder.decode_into(run, range(len(run)), out)
                except video.PacketError as error:
                    frame = first + error.position
                    raise StoreError(
                        f"{store.location}: {path} frame {frame} (episode {episode}) does not decode as "
                        f"{codec} from its key frame at {first}: {error.reason} (the damage is in its packet or in one "
                        "since that key frame)"
                    ) from None
            bar.update(block_end - block)


def check_every_value(store: EpisodeStore, progress: bool = False) -> None:
    """The deep depth: decode every image frame, decompress every numeric block, read every column."""
    from demoscale.datasets import codecs
    from tqdm import tqdm

    n_frames = store.n_frames
    total = n_frames * len(store.features)
    with tqdm(total=total, unit="frame", desc="validate --deep", disable=not progress) as bar:
        for key, spec in store.features.items():
            path = f"data/{key}"
            codec = store._frames(key).codec
            if spec.kind == "image" and codecs.is_video(codec):
                _check_video_key(store, key, bar)
                continue
            for start in range(0, n_frames, _DEEP_BLOCK_FRAMES):
                stop = min(n_frames, start + _DEEP_BLOCK_FRAMES)
                where = f"{store.location}: {path} {_describe(store, path, start, stop)}"
                if spec.kind == "image":
                    try:
                        encoded = store._frames(key).encoded(np.arange(start, stop))
                    except StoreError:
                        _locate_unreadable_frame(store, key, start, stop)
                        raise
                    out = np.empty(spec.shape, dtype=np.uint8)
                    for offset, data in enumerate(encoded):
                        frame = start + offset
                        try:
                            if not data:
                                raise ValueError("empty frame")
                            codecs.decode_frame(bytes(data), codec, out=out)
                        except Exception as error:
                            raise StoreError(
                                f"{store.location}: {path} {_describe(store, path, frame, frame + 1)}: "
                                f"frame does not decode as {codec} ({error})"
                            ) from None
                else:
                    try:
                        values = np.asarray(store._array(path)[start:stop])
                    except Exception as error:
                        raise StoreError(
                            f"{where}: cannot be read: {type(error).__name__}: {error}"
                        ) from None
                    if spec.kind == "low_dim" and values.dtype.kind == "f" and not np.isfinite(values).all():
                        bad = start + int(np.argwhere(~np.isfinite(values))[0][0])
                        raise StoreError(
                            f"{store.location}: {path} {_describe(store, path, bad, bad + 1)}: NaN or inf"
                        )
                bar.update(stop - start)
    for column in (*META_COLUMNS, "episode_ends"):
        store._read_column(f"meta/{column}", store.n_episodes)
