"""LeRobot datasets (codebase v2.1 and v3.0): their parquet frames and mp4 videos into a store.

A LeRobot dataset is a directory described by ``meta/info.json`` (``codebase_version``, ``fps``,
``features`` with dtype, shape and names, and the path templates of its files):

- **v3.0**: frames of many episodes per file in ``data/chunk-XXX/file-XXX.parquet``; one row per
  episode in ``meta/episodes/chunk-XXX/file-XXX.parquet`` (``episode_index``, ``length``, ``tasks``,
  ``data/chunk_index``, ``data/file_index`` and, per video key, ``videos/<key>/chunk_index``,
  ``file_index``, ``from_timestamp``, ``to_timestamp``); the task table ``meta/tasks.parquet``; one
  mp4 per video key and file, ``videos/<key>/chunk-XXX/file-XXX.mp4``, holding several episodes
  back to back: an episode's frame ``t`` is shown at ``from_timestamp + timestamp[t]``.
- **v2.1**: one parquet per episode, ``data/chunk-XXX/episode_XXXXXX.parquet``; one mp4 per episode
  and video key, ``videos/chunk-XXX/<key>/episode_XXXXXX.mp4`` (frame ``t`` at ``timestamp[t]``);
  ``meta/episodes.jsonl`` and ``meta/tasks.jsonl`` (``meta/episodes_stats.jsonl`` is not needed).

What is stored: every numeric feature as a low-dim key, bit for bit as the parquet holds it; every
``video`` and ``image`` feature as a uint8 (H, W, C) image key. LeRobot's bookkeeping columns
(``timestamp``, ``frame_index``, ``episode_index``, ``index``, ``task_index``) are used to check
and locate frames, and are stored only when ``features`` names them. A feature name is its store
key where it is a valid one (LeRobot's dotted names are: ``observation.images.top`` stays
``observation.images.top``); a ``/`` becomes ``.`` and leading dots go. Each key's
``FeatureSpec.source`` records ``{"format": "lerobot", "key": <the LeRobot name>}`` (and the
dimension ``names`` of low-dim features), which the LeRobot export writes back.

Validate, then write: ``plan`` reads every parquet file and, for video keys, every mp4's packet
timestamps (demuxed, not decoded), and checks that each episode's rows, frame indices, values and
video frames agree (a frame within ``tolerance_s`` of every timestamp, as LeRobot itself requires,
and as many frames in the episode's part of the file as rows). Frames are decoded in ``load``, with
torchcodec where it imports and loads its FFmpeg libraries beside the installed torch, else with
PyAV; the ingest summary names the decoder used.
"""

from __future__ import annotations

import csv
import functools
import importlib.util
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from demoscale.collect.driver import IngestSummary, ingest
from demoscale.collect.source_format import (
    ContentHash,
    EpisodePlan,
    IngestError,
    LoadedEpisode,
    SourceFormat,
    SourcePlan,
    check_finite,
    option,
    validating,
)
from demoscale.collect.sources import SourceIds

SUPPORTED_VERSIONS = ("v2.1", "v3.0")
# Columns LeRobot adds to every dataset: how frames are indexed, not what was recorded.
BOOKKEEPING_COLUMNS = ("timestamp", "frame_index", "episode_index", "index", "task_index")
# LeRobot's own default: how far a video frame may lie from the timestamp that asks for it.
DEFAULT_TOLERANCE_S = 1e-4
VIDEO_DECODERS = ("auto", "torchcodec", "pyav")
TASK_SEPARATOR = "; "  # an episode with several tasks gets them all in its store `task`
# Per-episode columns that label episodes when present (the LeRobot export writes them).
LABEL_COLUMNS = ("env_id", "object_id", "operator")


def store_key(name: str) -> str:
    """The store key of a LeRobot feature name (see the module docstring)."""
    return name.replace("/", ".").lstrip(".")


@dataclass(frozen=True)
class LeRobotOptions:
    features: tuple[str, ...] | None = option(
        None,
        "ingest only these LeRobot features (names as in meta/info.json), e.g. the low-dim ones of a "
        "copy without its videos; default: every numeric, image and video feature",
    )
    env_from: str | None = option(
        None,
        "per-episode source of env_id: a column of the episode metadata, 'task' (the episode's task "
        "text) or 'task_index'; default: the column env_id where there is one",
    )
    object_from: str | None = option(
        None,
        "per-episode source of object_id, as --env-from; default: the column object_id where there is one",
    )
    id_map: str | None = option(
        None,
        "CSV labelling episodes: a key column episode_index or task, and env_id, object_id and/or "
        "operator columns",
    )
    video_decoder: str = option(
        "auto", "auto (torchcodec where it works here, else PyAV), torchcodec or pyav"
    )
    tolerance_s: float = option(
        DEFAULT_TOLERANCE_S, "largest gap between a frame's timestamp and its video frame, seconds"
    )


@dataclass(frozen=True)
class Column:
    """One parquet column to read, and what its values must be."""

    name: str
    kind: str  # "low_dim" (numbers) or "image" (encoded image bytes)
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class VideoPart:
    """The frames of one episode in one video file: their presentation timestamps (stream units)."""

    key: str  # store key
    name: str  # LeRobot feature name
    path: str
    pts: tuple[int, ...]
    frame_indices: tuple[int, ...]  # the same frames as indices in presentation order of the file
    shape: tuple[int, ...]


@dataclass(frozen=True)
class LeRobotEpisode:
    """Where one planned LeRobot episode lies."""

    episode_index: int
    data_file: str
    columns: tuple[Column, ...]
    keys: tuple[str, ...]  # store key of each column
    videos: tuple[VideoPart, ...]
    decoder: str  # "torchcodec" or "pyav"


# --- reading the dataset's files --------------------------------------------------------------
def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise IngestError(f"{path}: missing (a LeRobot dataset needs it)") from None
    except (OSError, ValueError) as error:
        raise IngestError(f"{path}: not readable JSON: {error}") from error


def _read_jsonl(path: Path) -> list[dict]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise IngestError(f"{path}: missing (a LeRobot v2.1 dataset needs it)") from None
    except OSError as error:
        raise IngestError(f"{path}: cannot be read: {error}") from error
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError as error:
            raise IngestError(f"{path}, line {number}: not JSON: {error}") from error
    return rows


def _read_parquet(
    path: Path, columns: Sequence[str] | None = None, optional: Sequence[str] = (), what: str = "file"
) -> Any:
    """A pyarrow Table of ``path`` (``columns``, and those of ``optional`` it has; None: all);
    IngestError naming the file when it is missing or damaged, or lacks a column."""
    import pyarrow.parquet as pq

    if not path.is_file():
        raise IngestError(f"{path}: missing {what}")
    try:
        names = pq.read_schema(path).names
        absent = [name for name in columns or () if name not in names]
        if absent:
            raise IngestError(f"{path}: no column(s) {absent}; the file has {names}")
        if columns is not None:
            columns = list(dict.fromkeys([*columns, *(name for name in optional if name in names)]))
        return pq.read_table(path, columns=columns)
    except IngestError:
        raise
    except Exception as error:  # pyarrow raises ArrowInvalid / OSError for truncated or foreign files
        raise IngestError(f"{path}: not a readable parquet file (truncated or corrupt?): {error}") from error


def _is_list(arrow_type: Any) -> bool:
    import pyarrow as pa

    return (
        pa.types.is_list(arrow_type)
        or pa.types.is_large_list(arrow_type)
        or pa.types.is_fixed_size_list(arrow_type)
    )


def _numbers(column: Any, spec: Column, where: str) -> np.ndarray:
    """A numeric parquet column as (rows, *shape) values, exactly as stored (lists flattened)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    rows = len(values)
    level = 0
    while True:
        if isinstance(values, pa.ExtensionArray):  # e.g. a datasets Array2D: its storage is lists
            values = values.storage
        if not _is_list(values.type):
            break
        expected = spec.shape[level] if level < len(spec.shape) else None
        lengths = pc.list_value_length(values).to_numpy(zero_copy_only=False)
        if values.null_count or expected is None or (lengths != expected).any():
            raise IngestError(
                f"{where}: key {spec.name!r}: values are not lists of shape {list(spec.shape)} in every row"
            )
        values = values.flatten()
        level += 1
    if level != len(spec.shape) and not (level == 0 and spec.shape in ((1,), ())):
        raise IngestError(
            f"{where}: key {spec.name!r}: values do not have info.json's shape {list(spec.shape)}"
        )
    if values.null_count:
        raise IngestError(f"{where}: key {spec.name!r}: missing (null) values")
    flat = values.to_numpy(zero_copy_only=False)
    if flat.dtype.kind not in "biuf":
        raise IngestError(f"{where}: key {spec.name!r}: values of type {values.type} are not numbers")
    wanted = np.dtype(spec.dtype)
    if flat.dtype != wanted:
        # LeRobot reads values in info.json's dtype; take them so only where that changes nothing.
        cast = flat.astype(wanted)
        if not np.array_equal(cast.astype(flat.dtype), flat, equal_nan=flat.dtype.kind == "f"):
            raise IngestError(
                f"{where}: key {spec.name!r}: values of type {flat.dtype} do not fit info.json's {wanted}"
            )
        flat = cast
    return flat.reshape((rows, *spec.shape))


def _image_bytes(column: Any, spec: Column, where: str) -> list[bytes]:
    """An ``image`` column (a struct of the encoded file's ``bytes`` and its ``path``) as bytes."""
    import pyarrow as pa

    values = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if not pa.types.is_struct(values.type) or values.type.get_field_index("bytes") < 0:
        raise IngestError(
            f"{where}: key {spec.name!r}: an image column needs a 'bytes' field, got {values.type}"
        )
    payloads = values.field("bytes").to_pylist()
    if any(payload is None for payload in payloads):
        raise IngestError(f"{where}: key {spec.name!r}: images given only by path are not supported")
    return payloads


@dataclass
class FrameColumns:
    """The columns of one data parquet file, converted once."""

    episode_index: np.ndarray
    frame_index: np.ndarray
    timestamp: np.ndarray | None  # None where the file has no such column
    task_index: np.ndarray | None
    values: dict[str, Any]  # column name -> (rows, *shape) numbers, or a list of encoded images

    def rows(self, episode: int) -> np.ndarray:
        return np.flatnonzero(self.episode_index == episode)


BOOKKEEPING_DTYPES = {
    "episode_index": "int64",
    "frame_index": "int64",
    "timestamp": "float64",
    "task_index": "int64",
}


@functools.lru_cache(maxsize=2)
def _frame_columns(path: str, columns: tuple[Column, ...], stamp: tuple[int, int]) -> FrameColumns:
    """The columns of a data file (cached per process and file identity: a v3.0 file holds many
    episodes, each loaded separately)."""
    del stamp  # part of the cache key only: a rewritten file is read again
    table = _read_parquet(
        Path(path), ["episode_index", "frame_index", *(c.name for c in columns)],
        optional=("timestamp", "task_index"), what="data file",
    )  # fmt: skip
    values: dict[str, Any] = {}
    for spec in columns:
        column = table.column(spec.name)
        values[spec.name] = (
            _image_bytes(column, spec, path) if spec.kind == "image" else _numbers(column, spec, path)
        )
    bookkeeping = {
        name: _numbers(table.column(name), Column(name, "low_dim", (1,), dtype), path)[:, 0]
        if name in table.column_names
        else None
        for name, dtype in BOOKKEEPING_DTYPES.items()
    }
    return FrameColumns(values=values, **bookkeeping)


def frame_columns(path: Path, columns: tuple[Column, ...]) -> FrameColumns:
    """The given columns (and the bookkeeping ones) of a data file, read once per process."""
    try:
        status = path.stat()
    except FileNotFoundError:
        raise IngestError(f"{path}: missing data file") from None
    return _frame_columns(str(path), columns, (status.st_mtime_ns, status.st_size))


# --- videos ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class VideoIndex:
    """A video file's frames as its packets say (demuxed, not decoded)."""

    path: Path
    width: int
    height: int
    pts: np.ndarray  # int64, sorted: presentation order
    time_base: float
    sha256: str

    @property
    def times(self) -> np.ndarray:
        return self.pts * self.time_base


def probe_video(path: Path, key: str, episode: int) -> VideoIndex:
    """Read a video's packet timestamps; IngestError naming the file for a missing or damaged one."""
    import av
    from demoscale.datasets import sha256_of

    if not path.is_file():
        raise IngestError(
            f"{path}: missing video file of key {key!r}, episode {episode} (copies of public datasets "
            "often leave videos out: ingest the other features with --features)"
        )
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise IngestError(f"{path}: no video stream (key {key!r}, episode {episode})")
            stream = container.streams.video[0]
            pts = [packet.pts for packet in container.demux(stream) if packet.pts is not None and packet.size]
            width, height = stream.codec_context.width, stream.codec_context.height
            time_base = float(stream.time_base)
    except IngestError:
        raise
    except Exception as error:  # PyAV raises its FFmpegError subclasses for damaged files
        raise IngestError(
            f"{path}: not a readable video (truncated or corrupt?), key {key!r}, episode {episode}: {error}"
        ) from error
    return VideoIndex(path, width, height, np.sort(np.asarray(pts, np.int64)), time_base, sha256_of(path))


def match_frames(
    video: VideoIndex,
    queries: np.ndarray,
    window: tuple[float, float],
    fps: float,
    tolerance_s: float,
    where: str,
) -> np.ndarray:
    """Indices (in presentation order) of the video frames shown at ``queries`` (seconds): one frame
    within ``tolerance_s`` of each, and exactly as many frames in ``window`` as queries."""
    times = video.times
    half_period = 0.5 / fps
    start, stop = window
    in_window = int(((times >= start - half_period) & (times < stop - half_period)).sum())
    if in_window != len(queries):
        raise IngestError(
            f"{where}: the video holds {in_window} frames for the episode, its data parquet {len(queries)} rows"
        )
    after = np.clip(np.searchsorted(times, queries), 0, max(len(times) - 1, 0))
    before = np.clip(after - 1, 0, None)
    nearest = np.where(np.abs(times[before] - queries) <= np.abs(times[after] - queries), before, after)
    gaps = np.abs(times[nearest] - queries) if len(times) else np.full(len(queries), np.inf)
    if (gaps > tolerance_s).any():
        frame = int(np.flatnonzero(gaps > tolerance_s)[0])
        raise IngestError(
            f"{where}: no video frame within {tolerance_s:g} s of frame {frame} (t = {queries[frame]:.6f} s); "
            "the video and the data parquet disagree"
        )
    if len(set(nearest.tolist())) != len(nearest):
        raise IngestError(f"{where}: two frames of the data parquet ask for the same video frame")
    return nearest


@functools.cache
def torchcodec_problem() -> str | None:
    """Why torchcodec cannot decode videos here (None: it can). torchcodec needs a torch it was built
    for and FFmpeg's shared libraries; it is tried only where it is installed."""
    if importlib.util.find_spec("torchcodec") is None:
        return "torchcodec is not installed"
    try:
        from torchcodec.decoders import VideoDecoder  # noqa: F401  (loads torch and FFmpeg's libraries)
    except Exception as error:
        reason = str(error).strip().splitlines()
        return f"torchcodec cannot load here ({type(error).__name__}: {reason[0] if reason else ''})"
    return None


def choose_decoder(requested: str, first_video: Path | None) -> tuple[str, str]:
    """(decoder, note for the summary) for a run asking for ``requested`` (auto, torchcodec, pyav)."""
    import av

    if requested not in VIDEO_DECODERS:
        raise IngestError(f"unknown video decoder {requested!r}; choose one of {', '.join(VIDEO_DECODERS)}")
    problem = torchcodec_problem() if requested != "pyav" else "PyAV was asked for"
    if problem is None and first_video is not None:
        try:
            from torchcodec.decoders import VideoDecoder

            VideoDecoder(str(first_video), seek_mode="exact")
        except Exception as error:
            problem = f"torchcodec cannot open {first_video.name} ({type(error).__name__}: {error})"
    if problem is None:
        import torchcodec

        return "torchcodec", f"video decoded with torchcodec {torchcodec.__version__}"
    if requested == "torchcodec":
        raise IngestError(f"video decoder torchcodec was asked for, but {problem}")
    return "pyav", f"video decoded with PyAV {av.__version__} ({problem})"


def decode_frames(part: VideoPart, decoder: str, where: str) -> np.ndarray:
    """The frames of one episode's part of a video as (n, *shape) uint8."""
    channels = part.shape[2] if len(part.shape) == 3 else 1
    if decoder == "torchcodec" and channels == 3:
        status = os.stat(part.path)
        decoder_of_file = _torchcodec_decoder(part.path, (status.st_mtime_ns, status.st_size))
        frames = decoder_of_file.get_frames_at(indices=list(part.frame_indices)).data.numpy()
    else:
        frames = _decode_pyav(part, channels, where)
    if frames.shape[1:3] != tuple(part.shape[:2]):
        raise IngestError(f"{where}: frames decode to {frames.shape[1:3]}, info.json says {part.shape[:2]}")
    return np.ascontiguousarray(frames.reshape((len(frames), *part.shape)), dtype=np.uint8)


@functools.lru_cache(maxsize=4)
def _torchcodec_decoder(path: str, stamp: tuple[int, int]) -> Any:
    """One decoder per file (identity) and process: opening one in exact mode scans the whole file,
    and a v3.0 file holds many episodes, loaded one after another."""
    from torchcodec.decoders import VideoDecoder

    del stamp  # part of the cache key only

    return VideoDecoder(path, seek_mode="exact", dimension_order="NHWC")


def _decode_pyav(part: VideoPart, channels: int, where: str) -> np.ndarray:
    import av

    pixel_format = {1: "gray", 3: "rgb24", 4: "rgba"}[channels]
    wanted = {pts: position for position, pts in enumerate(part.pts)}
    frames: list[np.ndarray | None] = [None] * len(part.pts)
    found = 0
    with av.open(part.path) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        if part.pts[0] > 0:  # a v3.0 file: start at the key frame before the episode's first frame
            container.seek(int(min(part.pts)), stream=stream, backward=True, any_frame=False)
        for frame in container.decode(stream):
            position = wanted.get(frame.pts)
            if position is not None and frames[position] is None:
                frames[position] = frame.to_ndarray(format=pixel_format, threads=1)  # repeatable
                found += 1
                if found == len(frames):
                    break
    if found < len(frames):
        raise IngestError(f"{where}: {len(frames) - found} of {len(frames)} video frames did not decode")
    return np.stack(frames)


# --- the dataset as a whole --------------------------------------------------------------------
@dataclass
class Dataset:
    """A LeRobot dataset's metadata: info.json, its episodes and tasks."""

    root: Path
    info: dict[str, Any]
    version: str
    fps: float

    @classmethod
    def open(cls, path: Path) -> Dataset:
        info_path = path / "meta" / "info.json" if path.is_dir() else path
        if info_path.name != "info.json" or info_path.parent.name != "meta":
            raise IngestError(f"{path}: not a LeRobot dataset (give its directory or its meta/info.json)")
        info = _read_json(info_path)
        if not isinstance(info, dict):
            raise IngestError(f"{info_path}: not a LeRobot info.json (a JSON object)")
        version = info.get("codebase_version")
        if version not in SUPPORTED_VERSIONS:
            raise IngestError(
                f"{info_path}: codebase_version {version!r} is not supported (supported: "
                f"{', '.join(SUPPORTED_VERSIONS)}; LeRobot converts older datasets to v2.1 and v3.0)"
            )
        fps = info.get("fps")
        if not isinstance(fps, int | float) or isinstance(fps, bool) or not fps > 0:
            raise IngestError(f"{info_path}: fps must be a positive number, got {fps!r}")
        if not isinstance(info.get("features"), dict) or not info["features"]:
            raise IngestError(f"{info_path}: no features")
        return cls(info_path.parent.parent, info, version, float(fps))

    @property
    def info_path(self) -> Path:
        return self.root / "meta" / "info.json"

    @property
    def features(self) -> dict[str, dict]:
        return self.info["features"]

    def episodes(self) -> list[dict[str, Any]]:
        """One dict per episode (its metadata row), by episode index."""
        if self.version == "v3.0":
            files = sorted((self.root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
            if not files:
                raise IngestError(
                    f"{self.root / 'meta' / 'episodes'}: no episode metadata files (chunk-*/file-*.parquet)"
                )
            rows = []
            for file in files:
                table = _read_parquet(file, what="episode metadata file")
                names = [name for name in table.column_names if not name.startswith("stats/")]
                rows += table.select(names).to_pylist()
            where = self.root / "meta" / "episodes"
        else:
            where = self.root / "meta" / "episodes.jsonl"
            rows = _read_jsonl(where)
        for row in rows:
            for name in ("episode_index", "length"):
                if not isinstance(row.get(name), int) or row[name] < 0:
                    raise IngestError(f"{where}: an episode row without a valid {name!r}: {row.get(name)!r}")
        rows.sort(key=lambda row: row["episode_index"])
        indices = [row["episode_index"] for row in rows]
        if len(set(indices)) != len(indices):
            raise IngestError(f"{where}: an episode index appears twice")
        return rows

    def tasks(self) -> dict[int, str]:
        """task_index -> task text."""
        if self.version == "v3.0":
            path = self.root / "meta" / "tasks.parquet"
            table = _read_parquet(path, what="task table")
            frame = table.to_pandas()
            if "task_index" not in frame.columns:
                raise IngestError(f"{path}: no task_index column")
            # LeRobot keeps the task text as the table's index; some writers as a column "task".
            texts = frame["task"] if "task" in frame.columns else frame.index
            return {int(index): str(text) for index, text in zip(frame["task_index"], texts, strict=True)}
        path = self.root / "meta" / "tasks.jsonl"
        return {int(row["task_index"]): str(row["task"]) for row in _read_jsonl(path)}

    def data_file(self, row: dict[str, Any]) -> Path:
        template = self.info.get("data_path")
        return self.root / self._format(template, "data_path", row)

    def video_file(self, row: dict[str, Any], name: str) -> Path:
        template = self.info.get("video_path")
        return self.root / self._format(template, "video_path", row, video_key=name)

    def video_window(self, row: dict[str, Any], name: str) -> tuple[float, float]:
        """Where the episode's frames lie in its video file, seconds (v2.1: the whole file)."""
        if self.version != "v3.0":
            return 0.0, math.inf
        start, stop = row.get(f"videos/{name}/from_timestamp"), row.get(f"videos/{name}/to_timestamp")
        if not isinstance(start, int | float) or not isinstance(stop, int | float):
            raise IngestError(
                f"{self.root / 'meta' / 'episodes'}: episode {row['episode_index']}: no "
                f"videos/{name}/from_timestamp and to_timestamp"
            )
        return float(start), float(stop)

    def _format(self, template: Any, field: str, row: dict[str, Any], **extra: Any) -> str:
        if not isinstance(template, str):
            raise IngestError(f"{self.info_path}: no {field} template")
        episode = row["episode_index"]
        if self.version == "v3.0":
            prefix = f"videos/{extra['video_key']}" if "video_key" in extra else "data"
            values = {
                "chunk_index": row.get(f"{prefix}/chunk_index"),
                "file_index": row.get(f"{prefix}/file_index"),
            }
            if not all(isinstance(v, int) for v in values.values()):
                raise IngestError(
                    f"{self.root / 'meta' / 'episodes'}: episode {episode}: no {prefix}/chunk_index and file_index"
                )
        else:
            values = {
                "episode_chunk": episode // int(self.info.get("chunks_size") or 1000),
                "episode_index": episode,
            }
        try:
            return template.format(**values, **extra)
        except (KeyError, IndexError, ValueError) as error:
            raise IngestError(
                f"{self.info_path}: {field} {template!r} cannot be filled in: {error}"
            ) from error


def image_shape(name: str, feature: Mapping[str, Any], where: Path) -> tuple[int, ...]:
    """(H, W, C) of a video/image feature; LeRobot writes (H, W, C), some ported datasets (C, H, W)."""
    shape = [int(s) for s in feature.get("shape", ())]
    names = feature.get("names") or []
    if len(shape) == 3 and len(names) == 3 and names[0] in ("channel", "channels"):
        shape = [shape[1], shape[2], shape[0]]
    if len(shape) == 2:
        return tuple(shape)
    if len(shape) != 3 or shape[2] not in (1, 3, 4):
        raise IngestError(
            f"{where}: feature {name!r}: image shape {feature.get('shape')} is not (H, W, 1|3|4)"
        )
    return tuple(shape)


def chosen_features(dataset: Dataset, requested: tuple[str, ...] | None) -> tuple[dict[str, dict], list[str]]:
    """(LeRobot name -> feature, for the features to store; notes on those left out)."""
    features = dataset.features
    if requested is not None:
        unknown = [name for name in requested if name not in features]
        if unknown:
            raise IngestError(
                f"{dataset.info_path}: no feature(s) {unknown}; features: {', '.join(features)}"
            )
        chosen = {name: features[name] for name in dict.fromkeys(requested)}
        for name, feature in chosen.items():
            if _kind(feature) is None:
                raise IngestError(
                    f"{dataset.info_path}: feature {name!r} of dtype {feature.get('dtype')!r} cannot be stored"
                )
        return chosen, []
    chosen, notes = {}, []
    for name, feature in features.items():
        if name in BOOKKEEPING_COLUMNS:
            continue
        if _kind(feature) is None:
            notes.append(
                f"feature {name!r} (dtype {feature.get('dtype')!r}) is not stored: not numbers or images"
            )
        else:
            chosen[name] = feature
    if not chosen:
        raise IngestError(f"{dataset.info_path}: no numeric, image or video features to ingest")
    return chosen, notes


def _kind(feature: Mapping[str, Any]) -> str | None:
    dtype = feature.get("dtype")
    if dtype in ("video", "image"):
        return dtype
    try:
        return "low_dim" if np.dtype(dtype).kind in "biuf" else None
    except TypeError:
        return None


def store_features(dataset: Dataset, chosen: Mapping[str, dict]) -> dict[str, Any]:
    """The store's FeatureSpec of each chosen feature, by store key."""
    from demoscale.datasets import FeatureSpec

    specs: dict[str, Any] = {}
    for name, feature in chosen.items():
        key = store_key(name)
        if not key or key in specs:
            raise IngestError(f"{dataset.info_path}: feature {name!r} has no store key of its own ({key!r})")
        source: dict[str, Any] = {"format": "lerobot", "key": name}
        if _kind(feature) == "low_dim":
            shape = tuple(int(s) for s in feature.get("shape", (1,)))
            if feature.get("names"):
                source["names"] = feature["names"]
            specs[key] = FeatureSpec(
                kind="low_dim",
                shape=shape,
                dtype=np.dtype(feature["dtype"]).name,
                rate_hz=dataset.fps,
                source=source,
            )
        else:
            shape = image_shape(name, feature, dataset.info_path)
            specs[key] = FeatureSpec(
                kind="image", shape=shape, dtype="uint8", rate_hz=dataset.fps, units="rgb", source=source
            )
    return specs


# --- episode labels ----------------------------------------------------------------------------
@dataclass(frozen=True)
class IdMap:
    """The ``id_map`` CSV: labels by episode index and by task text."""

    by_episode: dict[int, dict[str, str]]
    by_task: dict[str, dict[str, str]]

    @classmethod
    def read(cls, path: str | os.PathLike | None) -> IdMap:
        if path is None:
            return cls({}, {})
        try:
            with open(path, newline="") as handle:
                rows = list(csv.DictReader(handle))
        except OSError as error:
            raise IngestError(f"id map {path}: cannot be read: {error}") from error
        header = set(rows[0]) if rows else set()
        if not header & {"episode_index", "task"} or not header & set(LABEL_COLUMNS):
            raise IngestError(
                f"id map {path}: needs a key column (episode_index or task) and env_id, object_id or operator"
            )
        by_episode, by_task = {}, {}
        for line, row in enumerate(rows, start=2):
            labels = {k: (row.get(k) or "").strip() for k in LABEL_COLUMNS if (row.get(k) or "").strip()}
            index = (row.get("episode_index") or "").strip()
            if index:
                if not index.isdigit():
                    raise IngestError(f"id map {path}, line {line}: episode_index {index!r} is not a number")
                by_episode[int(index)] = labels
            elif (row.get("task") or "").strip():
                by_task[row["task"].strip()] = labels
            else:
                raise IngestError(f"id map {path}, line {line}: neither episode_index nor task")
        return cls(by_episode, by_task)

    def labels(self, episode: int, tasks: Sequence[str]) -> dict[str, str]:
        if episode in self.by_episode:
            return self.by_episode[episode]
        return next((self.by_task[task] for task in tasks if task in self.by_task), {})


def episode_tasks(
    row: Mapping[str, Any], frame_tasks: np.ndarray, tasks: Mapping[int, str], where: str
) -> list[str]:
    """The episode's tasks: its metadata row's ``tasks``, else those of its frames' task_index."""
    listed = row.get("tasks")
    if isinstance(listed, str):
        listed = [listed]
    if listed:
        return [str(task) for task in listed]
    texts = []
    for index in dict.fromkeys(int(i) for i in frame_tasks):
        if index not in tasks:
            raise IngestError(f"{where}: task_index {index} is not in the task table")
        texts.append(tasks[index])
    return texts


def episode_ids(
    ids: SourceIds,
    row: Mapping[str, Any],
    tasks: list[str],
    task_indices: Mapping[str, int],
    options: LeRobotOptions,
    id_map: IdMap,
    where: str,
) -> SourceIds:
    """The episode's labels: the flags, manifest and directory layout (``ids``) first, then the id map,
    then the columns ``env_from`` / ``object_from`` name (by default env_id / object_id where present)."""
    mapped = id_map.labels(int(row["episode_index"]), tasks)
    labels: dict[str, str | None] = {"task": TASK_SEPARATOR.join(tasks), "operator": mapped.get("operator")}
    if not labels["operator"] and row.get("operator") not in (None, ""):
        labels["operator"] = str(row["operator"])
    for field, source in (("env_id", options.env_from), ("object_id", options.object_from)):
        labels[field] = mapped.get(field) or _label_from(row, tasks, task_indices, source, field, where)
    return SourceIds(**{k: v for k, v in labels.items() if v}).override(ids)


def _label_from(
    row: Mapping[str, Any],
    tasks: list[str],
    task_indices: Mapping[str, int],
    source: str | None,
    field: str,
    where: str,
) -> str | None:
    if source == "task":
        return TASK_SEPARATOR.join(tasks) or None
    if source == "task_index":
        return str(task_indices[tasks[0]]) if tasks and tasks[0] in task_indices else None
    column = source or field
    if column not in row:
        if source is None:
            return None
        raise IngestError(
            f"{where}: no per-episode column {column!r} for {field} (columns: {', '.join(sorted(row))}; "
            "or 'task', 'task_index')"
        )
    value = row[column]
    return None if value is None or value == "" else str(value)


# --- the adapter -------------------------------------------------------------------------------
class LeRobotFormat(SourceFormat):
    """LeRobot datasets v2.1 and v3.0 (the :class:`~demoscale.collect.source_format.SourceFormat` contract)."""

    name = "lerobot"
    summary = "a LeRobot dataset (codebase v2.1 or v3.0: meta/info.json, parquet, mp4)"
    src_help = "the dataset directory (or its meta/info.json; a directory of datasets is searched)"
    patterns = ("meta/info.json",)
    what = "LeRobot dataset (meta/info.json)"
    options_type = LeRobotOptions

    def plan(
        self, path: Path, ids: SourceIds, options: LeRobotOptions, limit: int | None, progress: bool
    ) -> SourcePlan:
        """Validate a dataset's first ``limit`` episodes (default all): metadata, every data row, and
        the frames of every video; nothing is decoded or written."""
        dataset = Dataset.open(Path(path).resolve())
        if not options.tolerance_s > 0:
            raise IngestError(f"tolerance_s must be positive, got {options.tolerance_s}")
        chosen, notes = chosen_features(dataset, options.features)
        features = store_features(dataset, chosen)
        video_names = [name for name, feature in chosen.items() if feature["dtype"] == "video"]
        if video_names and not isinstance(dataset.info.get("video_path"), str):
            raise IngestError(f"{dataset.info_path}: video features {video_names} but no video_path")
        columns = tuple(
            _column(name, feature, features[store_key(name)])
            for name, feature in chosen.items()
            if feature["dtype"] != "video"
        )
        rows = dataset.episodes()[:limit]
        if not rows:
            raise IngestError(f"{dataset.root}: no episodes")
        tasks = dataset.tasks()
        task_indices = {text: index for index, text in tasks.items()}
        id_map = IdMap.read(options.id_map)
        planner = _EpisodePlanner(dataset, features, columns, video_names, options)
        plans = [
            planner.plan(row, ids, tasks, task_indices, id_map)
            for row in validating(rows, dataset.root, progress)
        ]
        if video_names:
            first = dataset.video_file(rows[0], video_names[0])
            decoder, note = choose_decoder(options.video_decoder, first)
            plans = [_with_decoder(plan, decoder) for plan in plans]
            notes = [note, *notes]
        return SourcePlan(features, plans, notes)

    def load(self, episode: LeRobotEpisode, want_encoded: bool) -> LoadedEpisode:
        """The episode's arrays: low-dim values as the parquet holds them, images and video frames decoded."""
        import imagecodecs

        table = frame_columns(Path(episode.data_file), episode.columns)
        rows = table.rows(episode.episode_index)
        arrays: dict[str, np.ndarray] = {}
        for key, spec in zip(episode.keys, episode.columns, strict=True):
            if spec.kind == "image":
                frames = [imagecodecs.imread(table.values[spec.name][row]) for row in rows]
                arrays[key] = np.stack(frames).reshape((len(rows), *spec.shape))
            else:
                arrays[key] = table.values[spec.name][rows]
        for part in episode.videos:
            arrays[part.key] = decode_frames(
                part, episode.decoder, f"{part.path}: key {part.name!r}, episode {episode.episode_index}"
            )
        return arrays, None


def _column(name: str, feature: Mapping[str, Any], spec: Any) -> Column:
    """The parquet column of a non-video feature: numbers, or (``image``) encoded image files."""
    if feature["dtype"] == "image":
        return Column(name, "image", spec.shape, "uint8")
    return Column(name, "low_dim", spec.shape, spec.dtype)


def _with_decoder(plan: EpisodePlan, decoder: str) -> EpisodePlan:
    from dataclasses import replace

    return replace(plan, load_args=replace(plan.load_args, decoder=decoder))


class _EpisodePlanner:
    """Checks one episode after another against its data file and videos, caching what files share."""

    def __init__(
        self,
        dataset: Dataset,
        features: Mapping[str, Any],
        columns: tuple[Column, ...],
        video_names: list[str],
        options: LeRobotOptions,
    ) -> None:
        self.dataset, self.features, self.columns = dataset, features, columns
        self.video_names, self.options = video_names, options
        self.videos: dict[Path, VideoIndex] = {}

    def plan(
        self,
        row: dict[str, Any],
        ids: SourceIds,
        tasks: Mapping[int, str],
        task_indices: Mapping[str, int],
        id_map: IdMap,
    ) -> EpisodePlan:
        dataset, episode = self.dataset, int(row["episode_index"])
        data_file = dataset.data_file(row)
        where = f"{data_file}, episode {episode}"
        table = frame_columns(data_file, self.columns)
        rows = table.rows(episode)
        if len(rows) != row["length"]:
            raise IngestError(f"{where}: {len(rows)} rows, the episode metadata says length {row['length']}")
        if not rows.size:
            raise IngestError(f"{where}: an empty episode")
        if not np.array_equal(table.frame_index[rows], np.arange(len(rows))):
            raise IngestError(f"{where}: frame_index is not 0, 1, 2, ... in row order")
        digest = ContentHash()
        keys = []
        for spec in self.columns:
            key = store_key(spec.name)
            keys.append(key)
            if spec.kind == "image":
                for frame in (table.values[spec.name][r] for r in rows):
                    digest.raw(key, frame)
            else:
                values = table.values[spec.name][rows]
                check_finite(values, where, spec.name)
                digest.array(key, values)
        if self.video_names and table.timestamp is None:
            raise IngestError(f"{data_file}: no timestamp column, which locates the video frames")
        videos = tuple(
            self._video_part(row, name, table.timestamp[rows], digest) for name in self.video_names
        )
        frame_tasks = table.task_index[rows] if table.task_index is not None else np.zeros(0, np.int64)
        texts = episode_tasks(row, frame_tasks, tasks, where)
        episode_labels = episode_ids(ids, row, texts, task_indices, self.options, id_map, where)
        load_args = LeRobotEpisode(episode, str(data_file), self.columns, tuple(keys), videos, decoder="pyav")
        success = row.get("success") if isinstance(row.get("success"), bool) else None
        return EpisodePlan(
            f"{dataset.root}#episode={episode}",
            digest.hexdigest(),
            len(rows),
            load_args,
            episode_labels,
            success,
        )

    def _video_part(
        self, row: dict[str, Any], name: str, timestamps: np.ndarray, digest: ContentHash
    ) -> VideoPart:
        dataset, episode = self.dataset, int(row["episode_index"])
        path = dataset.video_file(row, name)
        if path not in self.videos:
            self.videos[path] = probe_video(path, name, episode)
        video = self.videos[path]
        spec = self.features[store_key(name)]
        where = f"{path}: key {name!r}, episode {episode}"
        if (video.height, video.width) != tuple(spec.shape[:2]):
            raise IngestError(
                f"{where}: frames are {video.height}x{video.width}, info.json says {spec.shape[:2]}"
            )
        window = dataset.video_window(row, name)
        queries = timestamps + (window[0] if dataset.version == "v3.0" else 0.0)
        indices = match_frames(video, queries, window, dataset.fps, self.options.tolerance_s, where)
        pts = video.pts[indices]
        digest.raw(store_key(name), f"{video.sha256}:{','.join(map(str, pts.tolist()))}".encode())
        return VideoPart(
            store_key(name), name, str(path), tuple(pts.tolist()), tuple(indices.tolist()), tuple(spec.shape)
        )


LEROBOT = LeRobotFormat()


def ingest_lerobot(
    src: str | os.PathLike,
    store: str | os.PathLike,
    *,
    features: Sequence[str] | None = None,
    env_from: str | None = None,
    object_from: str | None = None,
    id_map: str | os.PathLike | None = None,
    video_decoder: str = "auto",
    tolerance_s: float = DEFAULT_TOLERANCE_S,
    **common: Any,
) -> IngestSummary:
    """Ingest a LeRobot dataset (v2.1 or v3.0 directory, or a directory of them) into ``store``.

    ``features`` ingests only the named LeRobot features (e.g. the low-dim ones of a copy without its
    videos). Episodes are labelled by the driver's ``env_id``/``object_id``/``task``/``operator`` and
    ``manifest`` (whose ``source`` is a dataset's ``meta/info.json``), then by the ``id_map`` CSV, then
    by the per-episode columns ``env_from``/``object_from`` (``"task"``, ``"task_index"`` or a column
    of the episode metadata; by default ``env_id``/``object_id`` where present); the store's ``task``
    is the episode's LeRobot task(s). ``video_decoder``: ``"auto"`` (torchcodec where it works here,
    else PyAV), ``"torchcodec"`` or ``"pyav"``. ``common`` are the driver's keywords
    (:func:`demoscale.collect.ingest`).
    """
    options = LeRobotOptions(
        features=tuple(features) if features is not None else None,
        env_from=env_from,
        object_from=object_from,
        id_map=None if id_map is None else str(id_map),
        video_decoder=video_decoder,
        tolerance_s=tolerance_s,
    )
    return ingest(LEROBOT, src, store, options, **common)
