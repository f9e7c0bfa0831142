"""The store's write path: appends, transactions (buffered, batched, all-or-nothing), the commit
point and rollback. A mixin of :class:`~demoscale.datasets.store.EpisodeStore`, whose API it is part
of; the handle's state (arrays, committed ends, shard writers) is kept by the store class.

Appends are made safe against being killed at any moment by writing ``meta/episode_ends`` last;
every mutation runs under the store's writer lock (``datasets/locking.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr
from demoscale.datasets import codecs
from demoscale.datasets.locking import writer_lock
from demoscale.datasets.schema import META_COLUMNS, SUCCESS_UNKNOWN, StoreError, check_episode
from demoscale.datasets.shards import LocalShardWriter, TailJournal, local_path, resize_and_write_all, sync

if TYPE_CHECKING:
    from demoscale.datasets.store import EpisodeStore

logger = logging.getLogger("demoscale.datasets.store")

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


class StoreWriting:
    """The write half of :class:`~demoscale.datasets.store.EpisodeStore` (see the module note)."""

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
