"""The one ingest driver: any registered source format into an episode store.

An ingest runs in two phases. First every source file is found (a file, or a directory searched for
the format's patterns), given its env/object/task ids, read and validated as a whole by the format's
``plan`` and turned into a list of :class:`EpisodePlan` (one per episode, with its content hash);
any problem raises :class:`IngestError` before the store is touched (or even created). Then the
planned episodes are loaded by the format's ``load`` (in worker processes when ``workers > 1``, or
as Ray tasks on a cluster with ``address``) and appended to the store in order by this process, as
one locked store transaction; episodes whose content hash the store already holds are skipped
without being loaded.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import shutil
import time
from collections import deque
from collections.abc import Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from demoscale.collect.formats import source_format
from demoscale.collect.source_format import (
    DEFAULT_CONTENT_HASH,
    ContentHash,
    EpisodePlan,
    IngestError,
    IngestLockTimeout,
    LoadedEpisode,
    SourceFormat,
    check_finite,
    content_hash,
    content_hash_algorithm,
    digest_algorithm,
    using_content_hash,
)
from demoscale.collect.sources import SourceIds, resolve_sources

__all__ = [
    "ContentHash",
    "EpisodePlan",
    "IngestError",
    "IngestLockTimeout",
    "IngestSummary",
    "check_finite",
    "ingest",
    "write_plans",
]

# Episodes whose environment or object nobody named form one environment / one object, id "0".
UNKNOWN_ID = "0"


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
    plan_seconds: float = 0.0  # of ``seconds``: finding, reading and validating the sources
    episodes_committed: int = 0  # of those written, visible in the store (all, once the run ends)
    dry_run: bool = False
    episode_indices: list[int] = field(default_factory=list)
    skipped_sources: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # from the formats: how the sources were read

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
            + "".join(f"\nnote: {note}" for note in self.notes)
        )

    def skip(self, plan: EpisodePlan) -> None:
        self.episodes_skipped += 1
        self.frames_skipped += plan.length
        self.skipped_sources.append(plan.source)


def ingest(
    format: str | SourceFormat,
    src: str | os.PathLike,
    store: str | os.PathLike,
    options: Any = None,
    *,
    env_id: str | None = None,
    object_id: str | None = None,
    task: str | None = None,
    operator: str | None = None,
    manifest: str | os.PathLike | None = None,
    max_episodes: int | None = None,
    image_codec: str | None = None,
    image_codec_options: dict[str, Any] | None = None,
    workers: int = 1,
    address: str | None = None,
    dry_run: bool = False,
    progress: bool = True,
    lock_timeout: float | None = None,
    commit_every: int | None = None,
) -> IngestSummary:
    """Ingest the sources at ``src`` (a file, or a directory searched for the format's patterns)
    into the episode store at ``store``; returns what was written (or, with ``dry_run``, would be).

    ``format`` is a registered name (``"umi"``, ``"joylo"``, ...: see ``collect/formats.py``) or a
    :class:`SourceFormat`; ``options`` an instance of its ``options_type`` (default: its defaults).
    ``env_id``, ``object_id``, ``task`` and ``operator`` label every episode; otherwise they come from
    the ``manifest`` CSV, else the ``<task>/env_<i>/object_<j>/`` directory layout. ``max_episodes``
    takes only the first episodes, in source order. ``image_codec`` (and its encoder options,
    ``image_codec_options``, e.g. ``{"gop": 16}`` for ``h264``) is that of a store the ingest
    creates (default: the format's). ``workers`` processes load and encode episodes (1: this
    process does, between its appends); with ``address`` (``"local"`` for a private local Ray of
    ``workers`` CPUs, ``"auto"`` or ``HOST:PORT`` for a cluster) Ray tasks do, at most
    ``2 x workers`` in flight (``workers`` 1: the cluster's CPU count), while this process
    writes the store in order. The store's writer lock is waited for up to ``lock_timeout``
    seconds. Raises :class:`IngestError` naming file, key and episode, leaving the store as it was;
    with ``commit_every=N`` the episodes are committed N at a time instead, so a failed or killed
    run keeps its committed batches and a rerun skips them (by content hash, see
    :func:`store_content_hash`).
    """
    started = time.perf_counter()
    adapter = source_format(format) if isinstance(format, str) else format
    options = adapter.options_type() if options is None else options
    if not isinstance(options, adapter.options_type):
        raise TypeError(
            f"{adapter.name} options must be {adapter.options_type.__name__}, got {type(options).__name__}"
        )
    if max_episodes is not None and max_episodes < 1:
        raise IngestError(f"max_episodes must be at least 1, got {max_episodes}")
    if workers < 1:
        raise IngestError(f"workers must be at least 1, got {workers}")
    if address is not None and address != "local" and not dry_run:
        from demoscale.collect.ray_cluster import check_reachable

        check_reachable(address)  # before planning, which reads every source and may take long
    overrides = {"env_id": env_id, "object_id": object_id, "task": task, "operator": operator}
    sources = resolve_sources(
        src, adapter.patterns, manifest=manifest, overrides=overrides, what=adapter.what
    )
    notes: list[str] = []
    from demoscale.datasets import store_exists

    # A new store holds nothing to skip: a format that can hash what it loads is not asked to read
    # every frame twice (once here to hash it, once to load it).
    hashes = not (getattr(adapter, "hash_on_load", False) and not dry_run and not store_exists(str(store)))
    with using_content_hash(store_content_hash(str(store))):
        features, plans = plan_sources(adapter, sources, options, max_episodes, progress, notes, hashes)
        planned = time.perf_counter()
        summary = write_plans(
            store,
            features,
            plans,
            adapter,
            sources=[str(path) for path, _ in sources],
            image_codec=image_codec or adapter.default_image_codec,
            image_codec_options=image_codec_options,
            workers=workers,
            address=address,
            dry_run=dry_run,
            progress=progress,
            started=started,
            lock_timeout=lock_timeout,
            commit_every=commit_every,
        )
    summary.plan_seconds = planned - started
    summary.notes = notes
    return summary


def plan_sources(
    adapter: SourceFormat,
    sources: list[tuple[Any, SourceIds]],
    options: Any,
    max_episodes: int | None = None,
    progress: bool = False,
    notes: list[str] | None = None,
    hashes: bool = True,
) -> tuple[dict[str, Any], list[EpisodePlan]]:
    """Validate every source (up to ``max_episodes`` episodes in all); return the store features they
    share and their episode plans. Sources whose keys, shapes, dtypes or rates differ are refused.
    The sources' notes are appended to ``notes`` (each once). ``hashes`` False lets a format with
    ``hash_on_load`` leave its plans unhashed (the write phase hashes the loaded arrays)."""
    from demoscale.datasets.schema import layout_differences

    features: dict[str, Any] | None = None
    plans: list[EpisodePlan] = []
    for path, ids in sources:
        remaining = None if max_episodes is None else max_episodes - len(plans)
        if remaining is not None and remaining <= 0:
            break
        if hashes or not getattr(adapter, "hash_on_load", False):
            planned = adapter.plan(path, ids, options, remaining, progress)
        else:
            planned = adapter.plan(path, ids, options, remaining, progress, hashes=False)
        if features is None:
            features, first = planned.features, path
        elif differences := layout_differences(features, planned.features):
            raise IngestError(
                f"{path}: keys/shapes differ from the first source's ({first}): {'; '.join(differences)}"
            )
        elif _rates(planned.features) != _rates(features):
            raise IngestError(
                f"{path}: sources record different rates ({_rates(planned.features)} Hz; the first source, {first}: "
                f"{_rates(features)} Hz); pass rate_hz (--rate-hz) where the format takes it"
            )
        plans.extend(planned.episodes[:remaining])
        if notes is not None:
            notes.extend(note for note in planned.notes if note not in notes)
    if features is None:
        raise IngestError(f"{sources[0][0] if sources else '?'}: no episodes to ingest")
    return features, plans


def _rates(features: Mapping[str, Any]) -> list[float | None]:
    return sorted({spec.rate_hz for spec in features.values()}, key=str)


def store_content_hash(location: str) -> str:
    """The content hash an ingest into the store at ``location`` records: the default for a new
    store or one holding only prefixed digests, sha256 for a store written before digests named
    their algorithm (so that a rerun recognises the episodes already in it)."""
    from demoscale.datasets import EpisodeStore, StoreError, store_exists

    if not store_exists(location):
        return DEFAULT_CONTENT_HASH
    try:
        digests = {str(h) for h in EpisodeStore.open(location).episodes["source_sha256"].dropna()} - {""}
    except (StoreError, ValueError) as error:
        raise IngestError(f"store {location}: {error}") from error
    return (
        "sha256" if any(digest_algorithm(digest) == "sha256" for digest in digests) else DEFAULT_CONTENT_HASH
    )


def _existing_store(
    location: str, features: Mapping[str, Any], image_codec: str, image_codec_options: dict | None = None
) -> tuple[str, dict, set[str]]:
    """(image codec, encoder options, content hashes) of the store at ``location``, checking that its
    features fit the source's; of the store an ingest would create when there is none."""
    from demoscale.datasets import EpisodeStore, StoreError, store_exists
    from demoscale.datasets.codecs import codec_options
    from demoscale.datasets.schema import layout_differences

    try:
        if not store_exists(location):
            return image_codec, codec_options(image_codec, image_codec_options), set()
        store = EpisodeStore.open(location)
        differences = layout_differences(store.features, features)
        if differences:
            raise IngestError(
                f"store {location} has different features from the source: {'; '.join(differences)}"
            )
        hashes = {str(h) for h in store.episodes["source_sha256"].dropna()} - {""}
        return store.image_codec, dict(store.image_codec_options), hashes
    except (StoreError, ValueError) as error:
        raise IngestError(f"store {location}: {error}") from error


def _load_and_encode(
    adapter: SourceFormat,
    load_args: Any,
    want_encoded: bool,
    encode_images: Mapping[str, tuple],
    hash_with: str | None = None,
) -> tuple[dict, dict | None, str | None]:
    """Run in a worker: load one episode, hash it with ``hash_with`` if given (``hash_on_load``
    formats whose plan left the hash out), and encode its image frames in the store's codec (a
    video codec encodes the episode as one stream). Returns (arrays, encoded frames, content hash
    or None).

    Encoding and hashing here rather than in the writing process is what spreads that work over the
    workers; the store copies already-encoded frames as they are.
    """
    from demoscale.datasets.codecs import encode_frames

    _one_codec_thread()
    arrays, encoded = adapter.load(load_args, want_encoded)
    digest = content_hash(arrays, hash_with) if hash_with else None
    encoded = dict(encoded or {})
    for key, (codec, options) in encode_images.items():
        if key in arrays and key not in encoded:
            encoded[key] = encode_frames(arrays.pop(key), codec, options)
    return arrays, encoded, digest


def _one_codec_thread() -> None:
    """Keep a worker (process or Ray task of one CPU) to one core: Blosc, which decompresses replay
    buffers and Zarr sources, would otherwise start several threads in every worker."""
    try:
        from numcodecs import blosc
    except ImportError:
        return
    blosc.set_nthreads(1)


def _hash_with(plan: EpisodePlan) -> str | None:
    """The content hash a worker hashes ``plan``'s loaded arrays with (None: the plan has its hash)."""
    return content_hash_algorithm() if plan.sha256 is None else None


def _with_hash(plan: EpisodePlan, digest: str | None) -> EpisodePlan:
    return plan if digest is None else dataclasses.replace(plan, sha256=digest)


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


def _unloadable(plan: EpisodePlan, error: Exception) -> IngestError:
    return IngestError(f"{plan.source}: cannot be loaded: {type(error).__name__}: {error}")


def _loaded_in_order(
    adapter: SourceFormat,
    plans: list[EpisodePlan],
    want_encoded: bool,
    workers: int,
    encode_images: Mapping[str, tuple],
    address: str | None = None,
) -> Iterator[tuple[EpisodePlan, LoadedEpisode]]:
    """Yield (plan, loaded episode) in plan order; at most ~2 episodes per worker in flight."""
    if address is not None:
        yield from _loaded_on_ray(adapter, plans, want_encoded, workers, encode_images, address)
        return
    if workers <= 1:
        for plan in plans:
            try:
                arrays, encoded = adapter.load(plan.load_args, want_encoded)
                digest = content_hash(arrays) if plan.sha256 is None else None
            except IngestError:
                raise
            except Exception as error:
                raise _unloadable(plan, error) from error
            yield _with_hash(plan, digest), (arrays, encoded)
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
            future = pool.submit(
                _load_and_encode, adapter, plan.load_args, want_encoded, encode_images, _hash_with(plan)
            )
            pending.append((plan, future))

        for plan in queue:
            submit(plan)
            if len(pending) >= 2 * workers:
                break
        while pending:
            plan, future = pending.popleft()
            try:
                arrays, encoded, digest = future.result()
            except IngestError:
                raise
            except Exception as error:
                raise _unloadable(plan, error) from error
            next_plan = next(queue, None)
            if next_plan is not None:
                submit(next_plan)
            yield _with_hash(plan, digest), (arrays, encoded)


def _loaded_on_ray(
    adapter: SourceFormat,
    plans: list[EpisodePlan],
    want_encoded: bool,
    workers: int,
    encode_images: Mapping[str, tuple],
    address: str,
) -> Iterator[tuple[EpisodePlan, LoadedEpisode]]:
    """:func:`_loaded_in_order` on Ray: each episode loaded and encoded by a task of one CPU, at most
    two per CPU in flight, results taken in plan order (the committer's order).

    ``address`` ``"local"`` starts a private Ray of ``workers`` CPUs (all of this machine's with
    ``workers`` 1) and stops it at the end; any other address joins that cluster and only
    disconnects. Tasks run wherever Ray puts them: every node must see the sources at the paths
    planned here (shared storage), as the driver planned them.
    """
    import ray
    from demoscale.collect.ray_cluster import ray_session

    local = address == "local"
    with ray_session(address, num_cpus=workers if local and workers > 1 else None):
        cpus = workers if workers > 1 else max(1, int(ray.cluster_resources().get("CPU", 1)))
        # One CPU per task: the codecs run one thread each, so a task keeps one core busy.
        load = ray.remote(num_cpus=1)(_load_and_encode)
        adapter_ref = ray.put(adapter)  # shipped to the object store once, not with every task
        pending: deque = deque()
        queue = iter(plans)

        def submit(plan: EpisodePlan) -> None:
            pending.append(
                (
                    plan,
                    load.remote(adapter_ref, plan.load_args, want_encoded, encode_images, _hash_with(plan)),
                )
            )

        try:
            for plan in itertools.islice(queue, 2 * cpus):
                submit(plan)
            while pending:
                plan, ref = pending.popleft()
                try:
                    arrays, encoded, digest = ray.get(ref)
                except ray.exceptions.RayTaskError as error:
                    # The task's own exception, as a local load would raise it (not Ray's wrapper).
                    cause = error.cause
                    if isinstance(cause, IngestError):
                        raise IngestError(str(cause)) from None
                    raise _unloadable(plan, cause) from None
                except ray.exceptions.RayError as error:  # a worker or node lost, a task cancelled
                    raise _unloadable(plan, error) from error
                del ref  # its copy in the object store can go once the committer holds the arrays
                next_plan = next(queue, None)
                if next_plan is not None:
                    submit(next_plan)
                yield _with_hash(plan, digest), (arrays, encoded)
        finally:
            # A failure, or a committer that stopped early: the tasks still running are not needed.
            for _, ref in pending:
                ray.cancel(ref, force=True)


def write_plans(
    store_location: str | os.PathLike,
    features: Mapping[str, Any],
    plans: list[EpisodePlan],
    adapter: SourceFormat,
    *,
    sources: list[str],
    image_codec: str = "jpeg",
    image_codec_options: dict[str, Any] | None = None,
    workers: int = 1,
    address: str | None = None,
    dry_run: bool = False,
    progress: bool = True,
    started: float | None = None,
    lock_timeout: float | None = None,
    commit_every: int | None = None,
) -> IngestSummary:
    """Append the planned episodes to the store, skipping those whose hash it already holds.

    ``image_codec`` and ``image_codec_options`` are used only when the store is created. The adapter
    is asked for encoded frames only when the store uses its ``copy_codec``. With ``workers > 1``
    episodes are loaded and their images encoded in worker processes, with ``address`` in Ray tasks
    (see :func:`ingest`), and this process appends them in order; with one, this process loads and
    encodes between its appends (faster on two cores than one worker process beside it: see
    ``collect/README.md``, "Ingest at scale").

    All or nothing: the whole run holds the store's writer lock (waiting up to ``lock_timeout``
    seconds for another writer) and is one store transaction, so an episode that fails only while
    it is loaded (a video shorter than its plan, a frame that does not decode) leaves an existing
    store byte for byte as it was, and a store this run created is removed again. With
    ``commit_every=N`` each N episodes are one transaction: a failure rolls back only the batch it
    happens in (earlier batches stay committed; a rerun skips them by hash).
    """
    if commit_every is not None and commit_every < 1:
        raise IngestError(f"commit_every must be at least 1, got {commit_every}")
    from demoscale.datasets import StoreLockTimeout, store_exists, writer_lock
    from tqdm import tqdm

    started = time.perf_counter() if started is None else started
    location = str(store_location)
    summary = IngestSummary(store=location, sources=list(sources), dry_run=dry_run)
    codec, options, known = _existing_store(location, features, image_codec, image_codec_options)
    to_write: list[EpisodePlan] = []
    for plan in plans:
        if plan.sha256 is None:  # hashed as it is loaded; the store skips it then if it holds it
            to_write.append(plan)
        elif plan.sha256 in known:
            summary.skip(plan)
        else:
            known.add(plan.sha256)  # the same content twice in one run is written once
            to_write.append(plan)
    if dry_run or not to_write:
        if dry_run:
            summary.episodes_written = len(to_write)
            summary.frames_written = sum(plan.length for plan in to_write)
        summary.seconds = time.perf_counter() - started
        return summary

    # The store's codec decides whether frames are copied or encoded. The store itself is created
    # only when the first episode is ready, so that nothing appears if loading fails.
    want_encoded = adapter.copy_codec is not None and codec == adapter.copy_codec
    encode_images = {key: (codec, options) for key, spec in features.items() if spec.kind == "image"}
    loaded = _loaded_in_order(adapter, to_write, want_encoded, workers, encode_images, address)
    with tqdm(
        total=sum(p.length for p in to_write), unit="frame", desc="ingest", disable=not progress
    ) as bar:
        with ExitStack() as locked:
            try:
                locked.enter_context(writer_lock(location, lock_timeout, what="ingest into"))
            except StoreLockTimeout as error:
                raise IngestLockTimeout(str(error)) from None
            existed = store_exists(location)
            if existed:  # another writer may have created or changed the store since the checks above
                _existing_store(location, features, image_codec)
            try:
                _append_in_transactions(
                    location, features, image_codec, options, loaded, summary, bar, commit_every
                )
            except BaseException:
                # The open transaction is rolled back by now; a store this run created and committed
                # nothing to goes too (still under the lock, so no other writer has used it).
                if not existed and not summary.episodes_committed and store_exists(location):
                    _remove_store(location)
                raise
    summary.seconds = time.perf_counter() - started
    return summary


def _append_in_transactions(
    location: str,
    features: Mapping[str, Any],
    image_codec: str,
    image_codec_options: dict[str, Any],
    loaded: Iterator[tuple[EpisodePlan, LoadedEpisode]],
    summary: IngestSummary,
    bar: Any,
    commit_every: int | None = None,
) -> None:
    """Append every loaded episode in one store transaction (all become visible at its end, or
    none), or in transactions of ``commit_every`` episodes."""
    from demoscale.datasets import EpisodeStore, StoreError

    store = None
    transaction = ExitStack()
    in_batch = 0
    with transaction:
        for plan, (arrays, encoded) in loaded:
            try:
                if store is None:
                    store = EpisodeStore.open_or_create(
                        location, features, image_codec=image_codec, image_codec_options=image_codec_options
                    )
                if in_batch == 0:
                    transaction.enter_context(store.transaction())
                index = store.append_episode(
                    arrays,
                    env_id=plan.ids.env_id or UNKNOWN_ID,
                    object_id=plan.ids.object_id or UNKNOWN_ID,
                    task=plan.ids.task,
                    operator=plan.ids.operator,
                    source=plan.source,
                    source_sha256=plan.sha256,
                    success=plan.success,
                    tags=list(plan.tags),
                    encoded=encoded or None,
                )
            except StoreError as error:
                raise IngestError(f"{plan.source}: the store refused the episode: {error}") from error
            if index is None:
                summary.skip(plan)
            else:
                summary.episodes_written += 1
                summary.frames_written += plan.length
                summary.episode_indices.append(int(index))
            bar.update(plan.length)
            in_batch += 1
            if commit_every is not None and in_batch >= commit_every:
                transaction.close()  # commits this batch
                summary.episodes_committed = summary.episodes_written
                in_batch = 0
        # Leaving this block commits the (last) transaction: its episodes become visible at once.
    summary.episodes_committed = summary.episodes_written


def _remove_store(location: str) -> None:
    """Delete a store this ingest created and could not fill (the caller holds the writer lock)."""
    if "://" in location and not location.startswith("file://"):
        import fsspec

        fs, path = fsspec.core.url_to_fs(location)
        fs.rm(path, recursive=True)
    else:
        shutil.rmtree(location.removeprefix("file://"), ignore_errors=True)
