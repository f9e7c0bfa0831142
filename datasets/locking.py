"""One writer at a time per store: an exclusive lock on a file next to the store.

Every mutation of an episode store (creating it, appending episodes, caching statistics, writing
derived arrays, repairing it) runs under :func:`writer_lock`. The lock is ``flock`` on
``<store>.lock``, a sibling of the store directory (so it exists before the store does and survives
its atomic creation). The kernel releases it when the holding process dies, even by SIGKILL, so a
killed writer never leaves a stale lock behind.

Within one process the lock is re-entrant (an ingest holds it while the store it creates takes it
again); across processes a second writer waits, says so once on the log (who holds it: pid, host,
since when), and fails with :class:`StoreLockTimeout` after ``timeout`` seconds. A forked child
never inherits its parent's hold.

Stores at fsspec URLs other than ``file://`` have no lock: object stores offer no way to take one.
There one writer at a time is the user's responsibility (documented in ``datasets/README.md``).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from demoscale.datasets.schema import StoreError, StoreLockTimeout

logger = logging.getLogger(__name__)

# Long enough for another ingest's batch to finish in ordinary use; short enough that a forgotten
# writer is reported instead of hanging a pipeline forever. Ingest takes --lock-timeout.
DEFAULT_LOCK_TIMEOUT_S = 600.0
LOCK_SUFFIX = ".lock"


def _is_url(location: str) -> bool:
    return "://" in location or "::" in location


def lock_path(location: str | os.PathLike[str]) -> Path | None:
    """The lock file of the store at ``location``, or None where no lock can be taken (remote URLs)."""
    location = os.fspath(location)
    if location.startswith("file://"):
        location = location[len("file://") :]
    elif _is_url(location):
        return None
    path = Path(os.path.abspath(location.rstrip("/") or "/"))
    return path.with_name(path.name + LOCK_SUFFIX)


def _write_holder(fd: int) -> None:
    """Record who holds the lock (read by a waiting writer for its message)."""
    info = f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
    os.ftruncate(fd, 0)
    os.pwrite(fd, info.encode(), 0)


def _holder(path: Path) -> str:
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        return "another process"
    return text or "another process"


def _acquired_at_once(lock) -> bool:
    """Take the lock if it is free now; False (without waiting) if another process holds it."""
    from filelock import Timeout

    try:
        lock.acquire(timeout=0)
    except Timeout:
        return False
    return True


def _file_lock(path: Path):
    from filelock import FileLock

    # One instance per path in a process (is_singleton), so nested holders re-enter instead of
    # deadlocking on a second flock of the same file.
    return FileLock(path, is_singleton=True, on_acquired=_write_holder)


@contextmanager
def writer_lock(
    location: str | os.PathLike[str], timeout: float | None = None, what: str = "write to"
) -> Iterator[None]:
    """Hold the writer lock of the store at ``location`` for the duration of the block.

    Waits up to ``timeout`` seconds (default :data:`DEFAULT_LOCK_TIMEOUT_S`; ``0`` fails at once),
    logging once who holds the lock; raises :class:`StoreLockTimeout` when the wait runs out.
    Does nothing for remote fsspec URLs (no lock is possible there).
    """
    from filelock import Timeout

    path = lock_path(location)
    if path is None:
        yield
        return
    timeout = DEFAULT_LOCK_TIMEOUT_S if timeout is None else float(timeout)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = _file_lock(path)
        free = _acquired_at_once(lock)
    except OSError as error:  # a folder we may not write to, a file system without locks, ...
        raise StoreError(
            f"{os.fspath(location)}: cannot take the writer lock ({path}): {error.strerror or error}"
        ) from None
    if not free:
        holder = _holder(path)
        if timeout <= 0:
            raise StoreLockTimeout(
                f"{os.fspath(location)}: another writer holds the store ({holder}; lock file {path})"
            ) from None
        logger.warning(
            "%s: another writer holds the store (%s); waiting up to %.0f s for it to finish",
            os.fspath(location),
            holder,
            timeout,
        )
        started = time.monotonic()
        try:
            lock.acquire(timeout=timeout)
        except Timeout:
            raise StoreLockTimeout(
                f"{os.fspath(location)}: could not {what} the store: another writer ({_holder(path)}) still "
                f"held it after {time.monotonic() - started:.0f} s (lock file {path}). Wait for it to finish, "
                "or raise the timeout (demoscale ingest --lock-timeout)"
            ) from None
    try:
        yield
    finally:
        lock.release()


@contextmanager
def try_writer_lock(location: str | os.PathLike[str]) -> Iterator[bool]:
    """The writer lock if it is free right now (yields True), else yields False without waiting.

    For optional writes a reader makes (statistics caches): skipped while a writer is busy.
    """

    path = lock_path(location)
    if path is None:
        yield True
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = _file_lock(path)
        free = _acquired_at_once(lock)
    except OSError:
        free = False
    if not free:
        yield False
        return
    try:
        yield True
    finally:
        lock.release()
