"""What every ingester shares: the error type, the summary, content hashing and the write loop.

An ingest runs in two phases. First every source file is read and validated as a whole and turned
into a list of :class:`EpisodePlan` (one per episode, with its content hash); any problem raises
:class:`IngestError` before the store is touched (or even created). Then the planned episodes are
loaded (in worker processes when ``workers > 1``) and appended to the store in order by this
process; episodes whose content hash the store already holds are skipped without being loaded.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# A loader turns an episode's ``load_args`` into (arrays, encoded frames or None). It must be a
# module-level function so that worker processes can run it.
Loader = Callable[[Any, bool], tuple[dict[str, np.ndarray], dict[str, list[bytes]] | None]]


# Episodes whose environment or object nobody named form one environment / one object, id "0".
UNKNOWN_ID = "0"


class IngestError(Exception):
    """A source cannot be ingested; the message names the file, key and episode."""


class IngestLockTimeout(IngestError):
    """Another process held the store's writer lock for longer than the ingest would wait: nothing
    is wrong with the input, the run failed (exit 1, not 2)."""


@dataclass
class EpisodePlan:
    """One validated source episode, ready to be loaded and appended."""

    source: str
    sha256: str
    length: int
    load_args: Any
    env_id: str | None = None
    object_id: str | None = None
    task: str | None = None
    operator: str | None = None
    success: bool | None = None
    tags: list[str] = field(default_factory=list)


@dataclass
class IngestSummary:
    """What an ingest did (or, with ``dry_run``, would do)."""

    store: str
    sources: list[str]
    episodes_written: int = 0
    episodes_skipped: int = 0
    frames_written: int = 0
    frames_skipped: int = 0
    seconds: float = 0.0
    dry_run: bool = False
    episode_indices: list[int] = field(default_factory=list)
    skipped_sources: list[str] = field(default_factory=list)

    @property
    def frames_per_second(self) -> float:
        """Frames written per second (0 for a dry run, which writes nothing)."""
        return self.frames_written / self.seconds if self.seconds > 0 and not self.dry_run else 0.0

    def describe(self) -> str:
        verb = "would write" if self.dry_run else "wrote"
        return (
            f"{verb} {self.episodes_written} episodes ({self.frames_written} frames), skipped "
            f"{self.episodes_skipped} already in the store ({self.frames_skipped} frames), "
            f"{len(self.sources)} source file(s) -> {self.store} in {self.seconds:.1f} s"
            + (
                f" ({self.frames_per_second:.0f} frames/s)"
                if not self.dry_run and self.frames_written
                else ""
            )
        )


class ContentHash:
    """sha256 over named arrays (name, dtype, shape and bytes) and raw byte strings, in call order."""

    def __init__(self) -> None:
        self._digest = hashlib.sha256()

    def array(self, name: str, value: np.ndarray) -> None:
        value = np.ascontiguousarray(value)
        self._digest.update(f"{name}|{value.dtype.str}|{value.shape}|".encode())
        self._digest.update(memoryview(value).cast("B") if value.size else b"")

    def raw(self, name: str, payload: bytes) -> None:
        self._digest.update(f"{name}|raw|{len(payload)}|".encode())
        self._digest.update(payload)

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


def check_finite(values: np.ndarray, where: str, key: str, episode_ends: np.ndarray | None = None) -> None:
    """Raise IngestError naming the episode (and frame) of the first NaN or infinity in ``values``."""
    if not np.issubdtype(values.dtype, np.floating):
        return
    bad = ~np.isfinite(values.reshape(len(values), -1)).all(axis=1) if values.ndim else ~np.isfinite(values)
    if bad.any():
        frame = int(np.flatnonzero(bad)[0])
        if episode_ends is not None:
            episode = int(np.searchsorted(episode_ends, frame, side="right"))
            start = int(episode_ends[episode - 1]) if episode else 0
            raise IngestError(
                f"{where}: key {key!r}, episode {episode}: NaN or infinite value at frame {frame - start}"
            )
        raise IngestError(f"{where}: key {key!r}: NaN or infinite value at frame {frame}")


def as_uint8_image(values: np.ndarray, where: str, key: str, episode: int) -> np.ndarray:
    """Images stored as float 0..255 become uint8 exactly; anything else is an error."""
    if values.dtype == np.uint8:
        return values
    if not np.issubdtype(values.dtype, np.floating) and not np.issubdtype(values.dtype, np.integer):
        raise IngestError(
            f"{where}: key {key!r}, episode {episode}: image dtype {values.dtype} is not numeric"
        )
    if np.issubdtype(values.dtype, np.floating):
        check_finite(values, where, key)
        if not np.array_equal(values, np.round(values)):
            raise IngestError(f"{where}: key {key!r}, episode {episode}: image values are not integral")
    low, high = values.min(initial=0), values.max(initial=0)
    if low < 0 or high > 255:
        raise IngestError(
            f"{where}: key {key!r}, episode {episode}: image values span [{low}, {high}], not 0..255"
        )
    return values.astype(np.uint8)


def _store_exists(location: str) -> bool:
    """Whether a (non-empty) store is at ``location``."""
    if "://" in location:
        import fsspec

        fs, path = fsspec.core.url_to_fs(location)
        return fs.exists(path)
    path = Path(location)
    return path.is_file() or (path.is_dir() and any(path.iterdir()))


def check_compatible(store, features: Mapping[str, Any]) -> None:
    """Raise IngestError unless the store holds exactly these keys with the same kind, shape and dtype."""
    mismatched = []
    for key, spec in features.items():
        have = store.features.get(key)
        wanted = (spec.kind, tuple(spec.shape), spec.dtype)
        if have is None or (have.kind, tuple(have.shape), have.dtype) != wanted:
            mismatched.append(f"{key}: store has {have}, source needs {spec}")
        elif getattr(have, "source", None) and getattr(spec, "source", None) and have.source != spec.source:
            # Both recorded what produced the key, differently (another camera, size or options).
            mismatched.append(f"{key}: store recorded {have.source}, source recorded {spec.source}")
    missing = sorted(set(store.features) - set(features))
    if mismatched or missing:
        details = "; ".join(mismatched + ([f"source lacks {missing}"] if missing else []))
        raise IngestError(f"store {store.location} has different features from the source: {details}")


def open_or_create_store(location: str, features: Mapping[str, Any], image_codec: str | None):
    """Open the store for appending (checking that its features match) or create it."""
    from demoscale.datasets import EpisodeStore, StoreError

    try:
        if _store_exists(location):
            store = EpisodeStore.open(location, mode="a")
            check_compatible(store, features)
            return store
        return EpisodeStore.create(location, dict(features), image_codec=image_codec or "jpeg")
    except StoreError as error:
        raise IngestError(f"store {location}: {error}") from error


def existing_hashes(location: str) -> set[str]:
    """Content hashes already in the store at ``location`` (empty if there is no store)."""
    if not _store_exists(location):
        return set()
    from demoscale.datasets import EpisodeStore, StoreError

    try:
        episodes = EpisodeStore.open(location).episodes
    except StoreError as error:
        raise IngestError(f"store {location}: {error}") from error
    return {str(h) for h in episodes["source_sha256"].dropna()} - {""}


def _codec_of(location: str, features: Mapping[str, Any], image_codec: str | None) -> tuple[str, dict]:
    """(codec, encoder options) of the store at ``location`` (checking that its features match the
    source's), or of the store that would be created."""
    from demoscale.datasets import EpisodeStore, StoreError
    from demoscale.datasets.codecs import codec_options

    try:
        if _store_exists(location):
            store = EpisodeStore.open(location)
            check_compatible(store, features)
            return store.image_codec, dict(store.image_codec_options)
        return image_codec or "jpeg", codec_options(image_codec or "jpeg")
    except (StoreError, ValueError) as error:
        raise IngestError(f"store {location}: {error}") from error


def _load_and_encode(loader: Loader, load_args: Any, want_encoded: bool, encode_images: Mapping[str, tuple]):
    """Run in a worker: load one episode and encode its image frames in the store's codec.

    Encoding here rather than in the writing process is what spreads the codec work over the
    workers; the store copies already-encoded frames as they are.
    """
    from demoscale.datasets.codecs import encode_frame

    arrays, encoded = loader(load_args, want_encoded)
    encoded = dict(encoded or {})
    for key, (codec, options) in encode_images.items():
        if key in arrays and key not in encoded:
            encoded[key] = [encode_frame(frame, codec, options) for frame in arrays.pop(key)]
    return arrays, encoded


def _end_with_parent(parent: int) -> None:
    """Worker initializer: exit when the ingesting process dies, whatever kills it.

    A pool worker blocks on its task queue, whose pipe it holds open itself, so it never notices a
    parent killed with SIGKILL: without this it lives on as an orphan. Linux delivers SIGKILL to the
    worker the moment its parent dies (PR_SET_PDEATHSIG); elsewhere a watchdog thread polls.
    """
    import signal
    import sys
    import threading

    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        try:
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="end-with-parent").start()


def _load_guarded(plan: EpisodePlan, loader: Loader, want_encoded: bool):
    try:
        return loader(plan.load_args, want_encoded)
    except IngestError:
        raise
    except Exception as error:
        raise IngestError(f"{plan.source}: cannot be loaded: {type(error).__name__}: {error}") from error


def _loaded_in_order(
    loader: Loader,
    plans: list[EpisodePlan],
    want_encoded: bool,
    workers: int,
    encode_images: Mapping[str, tuple],
) -> Iterator[tuple[EpisodePlan, tuple]]:
    """Yield (plan, loaded episode) in plan order; at most ~2 episodes per worker in flight."""
    if workers <= 1:
        for plan in plans:
            yield plan, _load_guarded(plan, loader, want_encoded)
        return
    # The platform's default start method (fork on Linux: workers start in milliseconds). zarr
    # resets its event loop after a fork, and open sources are cached per process id, so a worker
    # never shares its parent's file offsets. Workers end with this process, even when it is killed.
    with ProcessPoolExecutor(
        max_workers=workers, initializer=_end_with_parent, initargs=(os.getpid(),)
    ) as pool:
        pending: deque = deque()
        queue = iter(plans)

        def submit(plan: EpisodePlan) -> None:
            pending.append(
                (plan, pool.submit(_load_and_encode, loader, plan.load_args, want_encoded, encode_images))
            )

        for plan in queue:
            submit(plan)
            if len(pending) >= 2 * workers:
                break
        while pending:
            plan, future = pending.popleft()
            try:
                result = future.result()
            except IngestError:
                raise
            except Exception as error:
                raise IngestError(
                    f"{plan.source}: cannot be loaded: {type(error).__name__}: {error}"
                ) from error
            next_plan = next(queue, None)
            if next_plan is not None:
                submit(next_plan)
            yield plan, result


def write_plans(
    store_location: str | os.PathLike,
    features: Mapping[str, Any],
    plans: list[EpisodePlan],
    loader: Loader,
    *,
    sources: list[str],
    image_codec: str | None = None,
    copy_codec: str | None = None,
    workers: int = 1,
    dry_run: bool = False,
    progress: bool = True,
    started: float | None = None,
    lock_timeout: float | None = None,
) -> IngestSummary:
    """Append the planned episodes to the store, skipping those whose hash it already holds.

    ``image_codec`` is used only when the store is created. ``copy_codec`` names the store image
    codec whose encoded frames the loader can hand over as they are (``"jpegxl"`` for UMI zips);
    the loader is asked for encoded frames only when the store uses that codec. With
    ``workers > 1`` episodes are loaded and their images encoded in worker processes, and this
    process appends them in order.

    All or nothing: the whole run holds the store's writer lock (waiting up to ``lock_timeout``
    seconds for another writer) and is one store transaction, so an episode that fails only while
    it is loaded (a video shorter than its plan, a frame that does not decode) leaves an existing
    store byte for byte as it was, and a store this run created is removed again.
    """
    from demoscale.datasets import StoreError, StoreLockTimeout, writer_lock
    from tqdm import tqdm

    started = time.perf_counter() if started is None else started
    location = str(store_location)
    summary = IngestSummary(store=location, sources=list(sources), dry_run=dry_run)
    known = existing_hashes(location)
    to_write: list[EpisodePlan] = []
    for plan in plans:
        if plan.sha256 in known:
            summary.episodes_skipped += 1
            summary.frames_skipped += plan.length
            summary.skipped_sources.append(plan.source)
        else:
            known.add(plan.sha256)  # the same content twice in one run is written once
            to_write.append(plan)
    codec, options = _codec_of(location, features, image_codec)  # checks an existing store's features
    if dry_run or not to_write:
        if dry_run:
            summary.episodes_written = len(to_write)
            summary.frames_written = sum(plan.length for plan in to_write)
        summary.seconds = time.perf_counter() - started
        return summary

    # The store's codec decides whether frames are copied or encoded. The store itself is created
    # only when the first episode is ready, so that nothing appears if loading fails.
    want_encoded = copy_codec is not None and codec == copy_codec
    encode_images = {key: (codec, options) for key, spec in features.items() if spec.kind == "image"}
    bar = tqdm(total=sum(plan.length for plan in to_write), unit="frame", desc="ingest", disable=not progress)
    try:
        with ExitStack() as locked:
            try:
                locked.enter_context(writer_lock(location, lock_timeout, what="ingest into"))
            except StoreLockTimeout as error:
                raise IngestLockTimeout(str(error)) from None
            existed = _store_exists(location)
            if existed:  # another writer may have created or changed the store since the checks above
                _codec_of(location, features, image_codec)
            try:
                with ExitStack() as transaction:
                    store = None
                    for plan, (arrays, encoded) in _loaded_in_order(
                        loader, to_write, want_encoded, workers, encode_images
                    ):
                        try:
                            if store is None:
                                store = open_or_create_store(location, features, image_codec)
                                transaction.enter_context(store.transaction())
                            index = store.append_episode(
                                arrays,
                                env_id=plan.env_id or UNKNOWN_ID,
                                object_id=plan.object_id or UNKNOWN_ID,
                                task=plan.task,
                                operator=plan.operator,
                                source=plan.source,
                                source_sha256=plan.sha256,
                                success=plan.success,
                                tags=plan.tags,
                                encoded=encoded or None,
                            )
                        except StoreError as error:
                            raise IngestError(
                                f"{plan.source}: the store refused the episode: {error}"
                            ) from error
                        if index is None:
                            summary.episodes_skipped += 1
                            summary.frames_skipped += plan.length
                            summary.skipped_sources.append(plan.source)
                        else:
                            summary.episodes_written += 1
                            summary.frames_written += plan.length
                            summary.episode_indices.append(int(index))
                        bar.update(plan.length)
                    # Leaving this block commits the transaction: every episode becomes visible at once.
            except BaseException:
                # The transaction is rolled back by now; a store this run created goes too (still
                # under the lock, so no other writer has used it).
                if not existed and _store_exists(location):
                    _remove_store(location)
                raise
    finally:
        bar.close()
    summary.seconds = time.perf_counter() - started
    return summary


def _remove_store(location: str) -> None:
    """Delete a store this ingest created and could not fill (the caller holds the writer lock)."""
    if "://" in location and not location.startswith("file://"):
        import fsspec

        fs, path = fsspec.core.url_to_fs(location)
        fs.rm(path, recursive=True)
    else:
        shutil.rmtree(location.removeprefix("file://"), ignore_errors=True)
