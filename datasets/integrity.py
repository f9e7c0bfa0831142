"""Damage checks of a store's chunk files, for :meth:`EpisodeStore.validate`.

Two depths:

- the default (cheap) check looks at every chunk file of the committed frames and episodes without
  decoding data: the file exists (for stores that write every chunk, see the ``all_chunks_written``
  attribute; image frames are never allowed to be missing), a shard's index is intact (crc32c) and
  every committed frame's byte range lies inside the file, and a zstd chunk is one complete zstd
  frame of the chunk's size (block headers walked, nothing decompressed);
- the deep check reads every committed value: every image frame decoded to the feature's shape,
  every low-dim and point-cloud block decompressed (and low-dim floats finite), every metadata
  column read.

Failures raise ``StoreError`` naming the array, the chunk file, the frames and the episode.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from demoscale.datasets.store import EpisodeStore

_ZSTD_MAGIC = 0xFD2FB528
_EMPTY = 2**64 - 1
_DEEP_BLOCK_FRAMES = 4096


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
    from demoscale.datasets.store import META_COLUMNS, StoreError

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
            size = store._file_size(f"{path}/{name}")
            if size is None:
                if kind == "image" or strict:
                    raise StoreError(f"{where}: chunk file is missing")
                continue
            if codecs_ == ["ShardingCodec"]:
                _check_shard(store, path, name, size, first, last, index * per_file, kind, strict, where)
            elif codecs_ in (["BytesCodec", "ZstdCodec"], ["VLenUTF8Codec", "ZstdCodec"]):
                data = store._read_file(f"{path}/{name}")
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
    from demoscale.datasets.store import StoreError

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
    raw = store._read_file(f"{path}/{name}", suffix=index_bytes)
    if google_crc32c.value(raw[:-4]) != int.from_bytes(raw[-4:], "little"):
        raise StoreError(f"{where}: shard index is damaged (crc32c mismatch)")
    index = np.frombuffer(raw[:-4], dtype="<u8").reshape(-1, 2)
    for position in range(last - first):
        offset, nbytes = (int(v) for v in index[first - shard_start + position])
        frame = first + position
        if offset == _EMPTY and nbytes == _EMPTY:
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
    from demoscale.datasets.store import StoreError

    path = f"data/{key}"
    for frame in range(start, stop):
        try:
            store._read_encoded_frames(key, np.arange(frame, frame + 1))
        except StoreError as error:
            raise StoreError(
                f"{store.location}: {path} {_describe(store, path, frame, frame + 1)}: damaged frame: "
                + str(error).removeprefix(f"{store.location}: ")
            ) from None


def check_every_value(store: EpisodeStore, progress: bool = False) -> None:
    """The deep depth: decode every image frame, decompress every numeric block, read every column."""
    from demoscale.datasets import codecs
    from demoscale.datasets.store import META_COLUMNS, StoreError
    from tqdm import tqdm

    n_frames = store.n_frames
    total = n_frames * len(store.features)
    with tqdm(total=total, unit="frame", desc="validate --deep", disable=not progress) as bar:
        for key, spec in store.features.items():
            path = f"data/{key}"
            codec = store._array(path).attrs.get("codec", store.image_codec)
            for start in range(0, n_frames, _DEEP_BLOCK_FRAMES):
                stop = min(n_frames, start + _DEEP_BLOCK_FRAMES)
                where = f"{store.location}: {path} {_describe(store, path, start, stop)}"
                if spec.kind == "image":
                    try:
                        encoded = store._read_encoded_frames(key, np.arange(start, stop))
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
