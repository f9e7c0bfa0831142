"""The files of a store: where they are, atomic creation, fast frame reads, batched writes, journals.

- :func:`open_zarr_store` and :func:`local_path` say where a store lives (a directory, a read-only
  zip, an fsspec URL);
- :func:`create_by_rename` builds a local store beside its destination and renames it into place;
- :class:`LocalShardReader` and :class:`LocalShardWriter` read and write encoded image frames
  straight from and to local shard files (zarr's general path costs more than the codec);
- :func:`resize_and_write_all` writes one episode's slice of every array in one event-loop trip;
- :class:`TailJournal` keeps the chunk files an unfinished batch could change, to put them back.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from demoscale.datasets.schema import StoreError

# A shard index entry of a chunk that was never written: offset and length both 2**64 - 1.
EMPTY_CHUNK = 2**64 - 1


def is_url(location: str) -> bool:
    return "://" in location or "::" in location


def local_path(location: str) -> Path | None:
    """The directory of a local store (plain path or ``file://`` URL); None for remote URLs and zips."""
    if location.startswith("file://"):
        return Path(location[len("file://") :])
    if is_url(location) or location.endswith(".zip"):
        return None
    return Path(location)


def open_zarr_store(location: str | os.PathLike[str], read_only: bool) -> Any:
    """The zarr store object for a local directory, a ``.zip`` (read-only) or an fsspec URL."""
    location = os.fspath(location)
    if is_url(location):
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


def remove_unfinished_creations(local: Path) -> list[Path]:
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


def create_by_rename(local: Path, build: Callable[[zarr.Group], None]) -> None:
    """Build a store with ``build(root)`` under a scratch name beside ``local``, then rename it there.

    The caller holds the writer lock. A creator killed at any moment leaves either nothing or a
    complete store (scratch folders are removed by the next creation or by repair); an existing
    store at ``local`` is replaced.
    """
    remove_unfinished_creations(local)
    scratch = local.with_name(f".{local.name}.creating-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    replaced = None
    try:
        build(zarr.open_group(zarr.storage.LocalStore(scratch), mode="w-", zarr_format=3))
        if local.is_dir() and any(local.iterdir()):
            replaced = local.with_name(f".{local.name}.replaced-{uuid.uuid4().hex[:8]}")
            os.rename(local, replaced)
        elif local.is_dir():
            local.rmdir()
        elif local.exists():
            raise StoreError(f"{local}: exists and is not a directory")
        os.rename(scratch, local)  # the creation's one visible step
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if replaced is not None:
            shutil.rmtree(replaced, ignore_errors=True)


def sync(coroutine: Any) -> Any:
    """Run one of zarr's coroutines on zarr's event loop."""
    from zarr.core.sync import sync as zarr_sync

    return zarr_sync(coroutine)


def resize_and_write_all(writes: Iterable[tuple[zarr.Array, int, slice, Any]]) -> None:
    """Resize each array along time and write its slice, all arrays concurrently (one event-loop trip).

    Each write is ``(array, new length, selection, values)``; a list of values is one metadata row,
    a ``None`` selection a resize alone.
    """
    import asyncio

    async def one(array: zarr.Array, length: int, selection: slice | None, value: Any) -> None:
        target = array.async_array
        await target.resize((length, *array.shape[1:]))
        if selection is None:  # resize only: the values were written another way
            return
        if isinstance(value, list):
            value = np.asarray(value, dtype=object if array.dtype.kind in "OTSU" else array.dtype)
        await target.setitem(selection, value)

    async def all_of_them() -> None:
        await asyncio.gather(*(one(*w) for w in writes))

    sync(all_of_them())


def write_atomically(path: Path, content: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f"{path.name}.{uuid.uuid4().hex[:8]}.partial")
    temporary.write_bytes(content)
    os.replace(temporary, path)


def _time_chunk_entries(chunks: Path, first: int) -> list[Path]:
    """Entries ``c/<i>`` (files or folders) of an array's chunk folder with time index ``i >= first``."""
    if not chunks.is_dir():
        return []
    return sorted(
        (entry for entry in chunks.iterdir() if entry.name.isdigit() and int(entry.name) >= first),
        key=lambda entry: int(entry.name),
    )


@dataclass
class TailJournal:
    """An array's metadata file and every chunk file from time chunk ``first`` on, as they were.

    Appends write from the committed length on, so only the file holding that position and any
    files after it (an uncommitted tail) can change; :meth:`restore` puts exactly those back.
    """

    folder: Path
    metadata: bytes
    files: dict[str, bytes]
    first: int

    @classmethod
    def save(cls, folder: Path, first: int) -> TailJournal:
        files: dict[str, bytes] = {}
        for entry in _time_chunk_entries(folder / "c", first):
            members = [entry] if entry.is_file() else sorted(f for f in entry.rglob("*") if f.is_file())
            for file in members:
                files[str(file.relative_to(folder))] = file.read_bytes()
        return cls(folder, (folder / "zarr.json").read_bytes(), files, first)

    def restore(self) -> None:
        for entry in _time_chunk_entries(self.folder / "c", self.first):
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        for relative, content in self.files.items():
            write_atomically(self.folder / relative, content)
        write_atomically(self.folder / "zarr.json", self.metadata)


def _image_shard_layout(location: str, key: str, array: zarr.Array) -> tuple[Path, int, bool] | None:
    """(chunk folder, frames per shard, crc32c per frame) of an image array in the one layout this
    package writes (shards of 1-frame inner chunks of variable-length bytes, optionally a crc32c per
    frame, the index at the end of the shard, ``/`` chunk keys) in a local store; None otherwise."""
    from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec, VLenBytesCodec
    from zarr.codecs.sharding import ShardingCodecIndexLocation

    local = local_path(location)
    if local is None:
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
    return local / "data" / key / "c", int(metadata.chunk_grid.chunk_shape[0]), len(inner) == 2


def _read_shard_index(fd: int, shard_frames: int) -> np.ndarray | None:
    """A shard file's (offset, nbytes) per frame; None when the file is too short or its crc32c fails."""
    import google_crc32c

    size = shard_frames * 16 + 4  # (offset, nbytes) uint64 pairs + crc32c
    file_size = os.fstat(fd).st_size
    if file_size < size:
        return None
    raw = os.pread(fd, size, file_size - size)
    if google_crc32c.value(raw[:-4]) != int.from_bytes(raw[-4:], "little"):
        return None
    return np.frombuffer(raw[:-4], dtype="<u8").reshape(-1, 2)


class LocalShardWriter:
    """Writes encoded image frames straight into the shard files of a local store.

    zarr's sharded write path costs a few hundred microseconds of Python per inner chunk (about
    3,000 frames/s, far below the JPEG encoder); this writer builds each shard file in the layout
    :class:`LocalShardReader` reads (byte for byte what zarr writes: inner chunks of
    ``uint32 count, uint32 length, bytes`` plus a crc32c, then the index and its crc32c) and
    replaces it atomically. A shard that already holds frames before the write position keeps
    exactly those (read through its index); anything at or after the position is replaced, like
    the uncommitted tail it is. The caller resizes the array (its metadata) itself.
    """

    def __init__(self, directory: Path, shard_frames: int, checksummed: bool) -> None:
        self.directory = directory
        self.shard_frames = shard_frames
        self.checksummed = checksummed

    @classmethod
    def for_array(cls, location: str, key: str, array: zarr.Array) -> LocalShardWriter | None:
        layout = _image_shard_layout(location, key, array)
        return None if layout is None else cls(*layout)

    def _kept_frames(self, shard: int, keep: int) -> list[bytes | None]:
        """The first ``keep`` inner chunks (encoded, as stored) of an existing shard file."""
        if keep == 0:
            return []
        path = self.directory / str(shard)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return [None] * keep
        try:
            index = _read_shard_index(fd, self.shard_frames)
            if index is None:
                raise StoreError(f"{path}: damaged shard index (run `demoscale store validate`)")
            return [
                None if offset == EMPTY_CHUNK else os.pread(fd, int(nbytes), int(offset))
                for offset, nbytes in index[:keep]
            ]
        finally:
            os.close(fd)

    def _inner_chunk(self, frame: bytes) -> bytes:
        chunk = len(frame).to_bytes(4, "little").join((b"\x01\x00\x00\x00", bytes(frame)))
        if self.checksummed:
            import google_crc32c

            chunk += google_crc32c.value(chunk).to_bytes(4, "little")
        return chunk

    def write(self, start: int, frames: list[bytes]) -> None:
        """Write ``frames`` as global frames ``start, start + 1, ...``."""
        import google_crc32c

        stop = start + len(frames)
        position = start
        while position < stop:
            shard = position // self.shard_frames
            shard_start = shard * self.shard_frames
            shard_stop = min(stop, shard_start + self.shard_frames)
            chunks = self._kept_frames(shard, position - shard_start)
            chunks += [self._inner_chunk(f) for f in frames[position - start : shard_stop - start]]
            index = np.full((self.shard_frames, 2), EMPTY_CHUNK, dtype="<u8")
            offset = 0
            for i, chunk in enumerate(chunks):
                if chunk is not None:
                    index[i] = (offset, len(chunk))
                    offset += len(chunk)
            index_bytes = index.tobytes()
            content = b"".join(
                (
                    *(c for c in chunks if c is not None),
                    index_bytes,
                    google_crc32c.value(index_bytes).to_bytes(4, "little"),
                )
            )
            write_atomically(self.directory / str(shard), content)
            position = shard_stop


class LocalShardReader:
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
    def for_array(cls, location: str, key: str, array: zarr.Array) -> LocalShardReader | None:
        """A reader for image key ``key`` of the store at ``location``; None where the layout differs."""
        layout = _image_shard_layout(location, key, array)
        return None if layout is None else cls(*layout)

    def read(self, frames: np.ndarray) -> list[bytes] | None:
        """The encoded bytes of ``frames`` (global indices), or None to let zarr read them instead."""
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
                    if nbytes < 8 + trailer or offset == EMPTY_CHUNK:
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
        status = os.fstat(fd)
        identity = (status.st_ino, status.st_size, status.st_mtime_ns)
        cached = self._index.get(shard)
        if cached is not None and cached[0] == identity:
            return cached[1]
        index = _read_shard_index(fd, self.shard_frames)
        self._index[shard] = (identity, index)
        return index
