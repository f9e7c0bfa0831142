"""The contract of a source format, and the small toolkit its adapter uses.

A source format (UMI zips, JoyLo HDF5, ...) is one adapter object satisfying :class:`SourceFormat`,
registered by name in ``collect/formats.py``. The one driver (``collect/driver.py``) does the rest
for every format alike: finding the source files, their env/object/task ids, validating every file
before anything is written, skipping what the store already holds, loading in worker processes, one
locked store transaction, progress, dry runs and the summary. An adapter only says how to

- ``plan(path, ids, options, limit, progress)``: read and check one source file as a whole and
  return its store features and one :class:`EpisodePlan` per episode (with a content hash and the
  typed arguments that :meth:`load` needs), raising :class:`IngestError` on any problem;
- ``load(episode, want_encoded)``: load one planned episode's arrays (in a worker process).

``options`` is an instance of the format's ``options_type``, a frozen dataclass whose fields
(declared with :func:`option`) become the format's command-line flags. ``collect/README.md``
("Adding a source format") walks through writing one.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np

if TYPE_CHECKING:
    from demoscale.collect.sources import SourceIds
    from demoscale.datasets import FeatureSpec

# What ``load`` returns: the episode's arrays by store key, and image keys already encoded in the
# store's codec (copied as they are), or None.
LoadedEpisode = tuple[dict[str, np.ndarray], dict[str, list[bytes]] | None]
Item = TypeVar("Item")


class IngestError(Exception):
    """A source cannot be ingested; the message names the file, key and episode."""


class IngestLockTimeout(IngestError):
    """Another process held the store's writer lock for longer than the ingest would wait: nothing
    is wrong with the input, the run failed (exit 1, not 2)."""


@dataclass(frozen=True)
class EpisodePlan:
    """One validated source episode, ready to be loaded and appended.

    ``load_args`` is the format's own typed argument object for ``load`` (a frozen dataclass: it
    travels to worker processes).
    """

    source: str
    sha256: str | None  # None: hashed from the loaded arrays (formats with ``hash_on_load``)
    length: int
    load_args: Any
    ids: SourceIds
    success: bool | None = None
    tags: tuple[str, ...] = ()


@dataclass
class SourcePlan:
    """What ``plan`` found in one source file: the store features its episodes need, and the episodes."""

    features: dict[str, FeatureSpec]
    episodes: list[EpisodePlan]
    # What the run's summary tells the user about how this source is read (e.g. the video decoder).
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class NoOptions:
    """The options of a format that has none."""


class SourceFormat(Protocol):
    """A raw demonstration format the driver can ingest (see the module docstring).

    An adapter may subclass this explicitly to take the defaults of the last attributes.
    """

    name: str  # registry key and the `demoscale ingest NAME` subcommand
    summary: str  # one line for `demoscale ingest --help`
    src_help: str  # what SRC may be
    patterns: tuple[str, ...]  # file names a source directory is searched for
    what: str  # what one source is called in messages ("UMI dataset.zarr.zip")
    options_type: type = NoOptions  # frozen dataclass of the format's settings (fields made with `option`)
    default_image_codec: str = "jpeg"  # image codec of a store the ingest creates, unless one is asked for
    copy_codec: str | None = None  # store codec whose frames `load` can hand over encoded (None: never)
    # True where an episode's content hash is `content_hash` of the arrays `load` returns: `plan`
    # then takes `hashes=False` and leaves `sha256` None, and the driver hashes the arrays as they are
    # loaded (in the worker). It does so when the store is new, where nothing can be skipped, so that
    # a first ingest reads every frame once instead of twice.
    hash_on_load: bool = False

    def plan(self, path: Path, ids: SourceIds, options: Any, limit: int | None, progress: bool) -> SourcePlan:
        """Validate one source file as a whole; at most ``limit`` episodes are needed (None: all)."""
        ...

    def load(self, episode: Any, want_encoded: bool) -> LoadedEpisode:
        """Load one planned episode (its ``load_args``); runs in a worker process when workers > 1."""
        ...


def option(default: Any, help: str) -> Any:
    """A field of a format's options dataclass; ``help`` is its command-line flag's help."""
    return field(default=default, metadata={"help": help})


def validating(items: Iterable[Item], path: Path, progress: bool, unit: str = "episode") -> Iterator[Item]:
    """``items`` with a ``validate <file>`` progress bar when ``progress``."""
    from tqdm import tqdm

    items = list(items)
    yield from tqdm(items, desc=f"validate {path.name}", unit=unit, disable=not progress or len(items) < 2)


def open_hdf5(path: Path) -> Any:
    """An HDF5 file opened for reading; IngestError for a truncated or non-HDF5 file."""
    import h5py

    try:
        return h5py.File(path, "r")
    except Exception as error:  # h5py raises OSError for truncated or non-HDF5 files
        raise IngestError(f"{path}: not a readable HDF5 file (truncated or corrupt?): {error}") from error


# The content hash an ingest records in ``source_sha256`` and skips known episodes by. It identifies
# content (a rerun, the same file under another name): nothing relies on it against a forger, so
# it need not be a cryptographic hash, and it must be cheap: sha256 cost 0.8 of a JPEG encode per
# 96x96 frame, xxh3-128 0.09 (``benchmarks/ingest.py``, "content hash"). Digests carry their
# algorithm as a prefix ("xxh3_128:<hex>"); a bare 64-digit hex digest is sha256, what stores
# written before the prefix hold, and an ingest into such a store goes on hashing with sha256 so
# that a rerun still recognises what is in it.
CONTENT_HASHES = ("xxh3_128", "sha256")
DEFAULT_CONTENT_HASH = "xxh3_128"
_content_hash_algorithm: ContextVar[str] = ContextVar("content_hash_algorithm", default=DEFAULT_CONTENT_HASH)


def _check_content_hash(algorithm: str) -> None:
    if algorithm not in CONTENT_HASHES:
        raise ValueError(f"content hash {algorithm!r}: expected one of {CONTENT_HASHES}")


def digest_algorithm(digest: str) -> str:
    """The algorithm of a recorded content digest ("sha256" for a bare hex digest)."""
    prefix, separator, _ = digest.partition(":")
    return prefix if separator else "sha256"


@contextmanager
def using_content_hash(algorithm: str) -> Iterator[None]:
    """Hash with ``algorithm`` (one of :data:`CONTENT_HASHES`) inside this block (this thread)."""
    _check_content_hash(algorithm)
    token = _content_hash_algorithm.set(algorithm)
    try:
        yield
    finally:
        _content_hash_algorithm.reset(token)


def content_hash_algorithm() -> str:
    """The algorithm :class:`ContentHash` uses here (see :func:`using_content_hash`)."""
    return _content_hash_algorithm.get()


class ContentHash:
    """A content digest over named arrays (name, dtype, shape and bytes) and raw byte strings, in
    call order, with :func:`content_hash_algorithm` unless ``algorithm`` is given."""

    def __init__(self, algorithm: str | None = None) -> None:
        self.algorithm = algorithm or content_hash_algorithm()
        _check_content_hash(self.algorithm)
        if self.algorithm == "sha256":
            self._digest: Any = hashlib.sha256()
        else:
            import xxhash

            self._digest = xxhash.xxh3_128()

    def array(self, name: str, value: np.ndarray) -> None:
        value = np.ascontiguousarray(value)
        self._digest.update(f"{name}|{value.dtype.str}|{value.shape}|".encode())
        self._digest.update(memoryview(value).cast("B") if value.size else b"")

    def arrays(self, values: Mapping[str, np.ndarray]) -> ContentHash:
        """Every array of ``values``, in key order; returns this hash."""
        for name in sorted(values):
            self.array(name, values[name])
        return self

    def raw(self, name: str, payload: bytes) -> None:
        self._digest.update(f"{name}|raw|{len(payload)}|".encode())
        self._digest.update(payload)

    def hexdigest(self) -> str:
        """The digest as recorded: bare hex for sha256, "<algorithm>:<hex>" otherwise."""
        hexdigest = self._digest.hexdigest()
        return hexdigest if self.algorithm == "sha256" else f"{self.algorithm}:{hexdigest}"


def content_hash(arrays: Mapping[str, np.ndarray], algorithm: str | None = None) -> str:
    """The content hash of an episode's arrays (every key, in key order): what ``hash_on_load``
    formats record as ``source_sha256``."""
    return ContentHash(algorithm).arrays(arrays).hexdigest()


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


# A simulator's object state carried beside a format's own keys (``object<i>_<name>``, e.g. the
# tabletop and whole-body ``object_state`` option's ``object0_pose``): every format that carries it
# names it alike, and it becomes the low-dim store feature of the same name.
OBJECT_STATE_KEY = re.compile(r"^object(\d+)_[a-z0-9_]+$")


def as_uint8_image(values: np.ndarray, where: str, key: str, episode: int | str) -> np.ndarray:
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
