"""An episode store written as a LeRobot v3.0 dataset (``demoscale store export STORE OUT --format lerobot``).

The layout is LeRobot's codebase v3.0, as its own writer makes it:

```
OUT/
  meta/info.json                               codebase_version "v3.0", fps, features, path templates
  meta/stats.json                              min, max, mean, std, count per feature (images per channel, 0..1)
  meta/tasks.parquet                           task_index, indexed by the task text
  meta/episodes/chunk-000/file-000.parquet     one row per episode: episode_index, tasks, length,
                                               data/chunk_index, data/file_index, dataset_from_index,
                                               dataset_to_index, videos/<key>/{chunk_index, file_index,
                                               from_timestamp, to_timestamp}, stats/<key>/<stat>, and
                                               demoscale's env_id, object_id, operator, success
  data/chunk-XXX/file-XXX.parquet              frames of many episodes: one column per low-dim key
                                               (vectors as fixed-size lists, shape (1,) as scalars) and
                                               timestamp, frame_index, episode_index, index, task_index
  videos/<key>/chunk-XXX/file-XXX.mp4          one per image key and file: episodes back to back at
                                               fps, episode e's frame t at from_timestamp + t / fps
```

Files roll over past ``data_file_size_mb`` / ``video_file_size_mb`` (LeRobot's defaults, 100 and
200 MB), up to 1,000 files per chunk folder. Image keys (uint8 (H, W, 3)) become ``video`` features:
H.264 (PyAV's libx264, ``crf`` 23 by default) or AV1 (PyAV's libsvtav1, ``crf`` 30), yuv420p (yuv444p
for H.264 frames of odd size), a key frame every ``gop`` frames (2, as LeRobot records, so that a
frame is found quickly). Low-dim values are written exactly. A feature keeps the LeRobot name it was
ingested from (``FeatureSpec.source["key"]``), else its store key; ``names`` renames.

The dataset is built beside ``OUT`` under a temporary name and renamed into place at the end: a
failed export leaves no partial dataset at ``OUT``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

CODEBASE_VERSION = "v3.0"
CHUNKS_SIZE = 1000  # files per chunk folder, as LeRobot
DATA_FILE_SIZE_MB = 100.0
VIDEO_FILE_SIZE_MB = 200.0
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
BOOKKEEPING = {"timestamp": "float32", "frame_index": "int64", "episode_index": "int64", "index": "int64",
               "task_index": "int64"}  # fmt: skip
# codec name in info.json -> (PyAV encoder, default crf)
VIDEO_CODECS = {"h264": ("libx264", 23), "av1": ("libsvtav1", 30)}
DEFAULT_GOP = 2
STATS = ("min", "max", "mean", "std", "count")


class ExportError(Exception):
    """A store (or a request) that cannot be exported; the message says which key or setting."""


@dataclass
class ExportSummary:
    """What an export wrote."""

    out: str
    episodes: int = 0
    frames: int = 0
    video_keys: list[str] = field(default_factory=list)
    low_dim_keys: list[str] = field(default_factory=list)
    video_codec: str = ""
    data_files: int = 0
    video_files: int = 0
    seconds: float = 0.0

    def describe(self) -> str:
        videos = f", {len(self.video_keys)} video key(s) as {self.video_codec}" if self.video_keys else ""
        return (
            f"wrote a LeRobot {CODEBASE_VERSION} dataset: {self.episodes} episodes ({self.frames} frames), "
            f"{len(self.low_dim_keys)} low-dim key(s){videos}, {self.data_files} data file(s) and "
            f"{self.video_files} video file(s) -> {self.out} in {self.seconds:.1f} s"
        )


@dataclass(frozen=True)
class ExportedFeature:
    """One store key and how it is written."""

    key: str  # store key
    name: str  # LeRobot feature name
    spec: Any  # FeatureSpec

    @property
    def is_video(self) -> bool:
        return self.spec.kind == "image"


def lerobot_name(key: str, spec: Any, names: Mapping[str, str]) -> str:
    """The LeRobot name of a store key: ``names[key]``, else the name it was ingested from, else the key."""
    if key in names:
        return names[key]
    source = spec.source or {}
    if source.get("format") == "lerobot" and isinstance(source.get("key"), str):
        return source["key"]
    return key


def _chosen(store: Any, features: Sequence[str] | None, names: Mapping[str, str]) -> list[ExportedFeature]:
    keys = list(store.features) if features is None else list(dict.fromkeys(features))
    unknown = [key for key in keys if key not in store.features]
    if unknown:
        raise ExportError(f"the store has no key(s) {unknown}; keys: {', '.join(store.features)}")
    unused = sorted(set(names) - set(keys))
    if unused:
        raise ExportError(f"names given for keys that are not exported: {unused}")
    chosen = []
    for key in keys:
        spec = store.features[key]
        if spec.kind == "image" and (len(spec.shape) != 3 or spec.shape[2] != 3):
            raise ExportError(
                f"key {key!r}: images of shape {spec.shape} cannot be LeRobot video (RGB (H, W, 3) only); "
                "leave it out with features=/--features"
            )
        if spec.kind == "point_cloud" or (spec.kind == "low_dim" and len(spec.shape) > 1):
            raise ExportError(
                f"key {key!r}: {spec.kind} of shape {spec.shape} has no LeRobot column here (vectors and "
                "scalars only); leave it out with features=/--features"
            )
        chosen.append(ExportedFeature(key, lerobot_name(key, spec, names), spec))
    taken: dict[str, str] = {}
    for feature in chosen:
        if "/" in feature.name or not feature.name or feature.name in BOOKKEEPING:
            raise ExportError(f"key {feature.key!r}: {feature.name!r} is not a LeRobot feature name")
        if feature.name in taken:
            raise ExportError(
                f"keys {taken[feature.name]!r} and {feature.key!r} would both be {feature.name!r}"
            )
        taken[feature.name] = feature.key
    if not chosen:
        raise ExportError("nothing to export: no features chosen")
    return chosen


def _fps(chosen: list[ExportedFeature], fps: float | None) -> int:
    """LeRobot datasets have one integer frame rate; every exported key must share it."""
    if fps is None:
        rates = {feature.spec.rate_hz for feature in chosen}
        if len(rates) != 1 or None in rates:
            raise ExportError(
                f"the keys record rates {sorted(rates, key=str)} Hz; a LeRobot dataset has one: give fps="
            )
        (fps,) = rates
    if not fps > 0 or abs(fps - round(fps)) > 1e-6:
        raise ExportError(f"LeRobot datasets need a whole number of frames per second, got {fps:g}")
    return int(round(fps))


# --- running statistics ------------------------------------------------------------------------
@dataclass
class Moments:
    """min, max, mean, std and count of one feature, per dimension (images: per channel, 0..1)."""

    minimum: np.ndarray
    maximum: np.ndarray
    mean: np.ndarray
    variance: np.ndarray
    count: int

    @classmethod
    def of(cls, values: np.ndarray, image: bool) -> Moments:
        frames = len(values)
        if image:  # (n, H, W, C) uint8 -> per channel in 0..1, as LeRobot's stats
            values = values.reshape(-1, values.shape[-1]).astype(np.float64) / 255.0
        else:
            values = values.reshape(frames, -1).astype(np.float64)
        return cls(values.min(axis=0), values.max(axis=0), values.mean(axis=0), values.var(axis=0), frames)

    @classmethod
    def merged(cls, parts: list[Moments]) -> Moments:
        """The moments of all parts together (every frame of an image key has as many pixels)."""
        counts = [part.count for part in parts]
        weights = np.asarray(counts, np.float64) / sum(counts)
        mean = sum(w * p.mean for w, p in zip(weights, parts, strict=True))
        variance = sum(w * (p.variance + (p.mean - mean) ** 2) for w, p in zip(weights, parts, strict=True))
        return cls(
            np.min([p.minimum for p in parts], axis=0),
            np.max([p.maximum for p in parts], axis=0),
            mean,
            variance,
            sum(counts),
        )

    def as_lerobot(self, image: bool) -> dict[str, list]:
        """LeRobot's layout: images as (C, 1, 1) per statistic; count = frames."""
        shape = (-1, 1, 1) if image else (-1,)
        values = {"min": self.minimum, "max": self.maximum, "mean": self.mean, "std": np.sqrt(self.variance)}
        out = {name: np.asarray(value).reshape(shape).tolist() for name, value in values.items()}
        out["count"] = [int(self.count)]
        return out


# --- writers -----------------------------------------------------------------------------------
class RollingFiles:
    """chunk/file indices of a series of files, rolling over past a size, as LeRobot numbers them."""

    def __init__(self, limit_mb: float) -> None:
        self.limit_bytes = limit_mb * 1024 * 1024
        self.chunk_index, self.file_index = 0, 0
        self.files = 0

    def advance(self) -> None:
        self.file_index += 1
        if self.file_index == CHUNKS_SIZE:
            self.chunk_index, self.file_index = self.chunk_index + 1, 0


class DataWriter:
    """The data parquet files: each episode's rows appended to the open file."""

    def __init__(self, root: Path, schema: Any, limit_mb: float) -> None:
        self.root, self.schema = root, schema
        self.files = RollingFiles(limit_mb)
        self.writer: Any = None
        self.bytes_in_file = 0

    def add(self, table: Any) -> tuple[int, int]:
        import pyarrow.parquet as pq

        if self.writer is not None and self.bytes_in_file >= self.files.limit_bytes:
            self.close()
            self.files.advance()
        if self.writer is None:
            path = self.root / DATA_PATH.format(
                chunk_index=self.files.chunk_index, file_index=self.files.file_index
            )
            path.parent.mkdir(parents=True, exist_ok=True)
            self.writer = pq.ParquetWriter(path, self.schema, compression="snappy")
            self.files.files += 1
            self.bytes_in_file = 0
        self.writer.write_table(table)
        self.bytes_in_file += table.nbytes
        return self.files.chunk_index, self.files.file_index

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class VideoWriter:
    """The mp4 files of one key: each episode's frames encoded after the previous episode's."""

    def __init__(
        self, root: Path, name: str, fps: int, codec: str, crf: int | None, gop: int, limit_mb: float
    ):
        self.root, self.name, self.fps = root, name, fps
        self.encoder, default_crf = VIDEO_CODECS[codec]
        self.options = {"crf": str(default_crf if crf is None else crf), "g": str(gop)}
        if self.encoder == "libsvtav1":
            self.options["preset"] = "10"  # fast; LeRobot records with 12 (mapped to 11 by SVT-AV1 4)
        self.files = RollingFiles(limit_mb)
        self.container: Any = None
        self.stream: Any = None
        self.frames_in_file = 0
        self.bytes_in_file = 0
        self.first_path: Path | None = None

    def add(self, frames: np.ndarray) -> dict[str, Any]:
        """Encode one episode; returns its videos/<key>/... columns of the episode metadata."""
        import av

        if self.container is not None and self.bytes_in_file >= self.files.limit_bytes:
            self.close()
            self.files.advance()
        if self.container is None:
            self._open(frames.shape[1], frames.shape[2])
        start = self.frames_in_file
        for image in frames:
            # One swscale thread: sliced over every core its output is not the same run to run.
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24").reformat(
                format=self.stream.pix_fmt, threads=1
            )
            frame.pts, frame.time_base = self.frames_in_file, Fraction(1, self.fps)
            self._mux(self.stream.encode(frame))
            self.frames_in_file += 1
        prefix = f"videos/{self.name}"
        return {
            f"{prefix}/chunk_index": self.files.chunk_index,
            f"{prefix}/file_index": self.files.file_index,
            f"{prefix}/from_timestamp": start / self.fps,
            f"{prefix}/to_timestamp": self.frames_in_file / self.fps,
        }

    def _open(self, height: int, width: int) -> None:
        import av

        if (height % 2 or width % 2) and self.encoder == "libsvtav1":
            raise ExportError(
                f"key {self.name!r}: AV1 (yuv420p) needs an even frame size, not {height}x{width}"
            )
        path = self.root / VIDEO_PATH.format(
            video_key=self.name, chunk_index=self.files.chunk_index, file_index=self.files.file_index
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        self.container = av.open(str(path), mode="w")
        self.stream = self.container.add_stream(self.encoder, rate=self.fps, options=self.options)
        self.stream.width, self.stream.height = width, height
        # yuv420p halves the colour resolution; odd sizes cannot be halved, so they keep it all.
        self.stream.pix_fmt = "yuv444p" if height % 2 or width % 2 else "yuv420p"
        self.stream.time_base = Fraction(1, self.fps)
        self.frames_in_file = self.bytes_in_file = 0
        self.files.files += 1
        self.first_path = self.first_path or path

    def _mux(self, packets: list) -> None:
        for packet in packets:
            self.bytes_in_file += packet.size
            self.container.mux(packet)

    def close(self) -> None:
        if self.container is not None:
            self._mux(self.stream.encode())  # flush the encoder's delayed frames
            self.container.close()
            self.container = self.stream = None


def video_info(path: Path, codec: str) -> dict[str, Any]:
    """The ``info`` of a video feature in info.json, read from its first file."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return {
            "video.height": stream.codec_context.height,
            "video.width": stream.codec_context.width,
            "video.codec": codec,
            "video.pix_fmt": stream.codec_context.pix_fmt,
            "video.is_depth_map": False,
            "video.fps": int(round(float(stream.average_rate or stream.base_rate))),
            "video.channels": 3,
            "has_audio": False,
        }


def _arrow_type(spec: Any) -> Any:
    import pyarrow as pa

    item = pa.from_numpy_dtype(np.dtype(spec.dtype))
    if spec.shape in ((), (1,)):
        return item
    return pa.list_(item, int(spec.shape[0]))


def _column(values: np.ndarray, spec: Any) -> Any:
    import pyarrow as pa

    values = np.ascontiguousarray(values, dtype=np.dtype(spec.dtype))
    if spec.shape in ((), (1,)):
        return pa.array(values.reshape(len(values)))
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), int(spec.shape[0]))


def _feature_entry(feature: ExportedFeature, fps: int) -> dict[str, Any]:
    spec = feature.spec
    if feature.is_video:
        return {"dtype": "video", "shape": list(spec.shape), "names": ["height", "width", "channels"]}
    source = spec.source or {}
    names = source.get("names") if source.get("format") == "lerobot" else None
    shape = [1] if spec.shape in ((), (1,)) else list(spec.shape)
    return {"dtype": spec.dtype, "shape": shape, "names": names, "fps": fps}


# --- the export --------------------------------------------------------------------------------
def export_lerobot(
    store: str | os.PathLike | Any,
    out: str | os.PathLike,
    *,
    features: Sequence[str] | None = None,
    episodes: Sequence[int] | None = None,
    names: Mapping[str, str] | None = None,
    video_codec: str = "h264",
    crf: int | None = None,
    gop: int = DEFAULT_GOP,
    fps: float | None = None,
    robot_type: str | None = None,
    data_file_size_mb: float = DATA_FILE_SIZE_MB,
    video_file_size_mb: float = VIDEO_FILE_SIZE_MB,
    overwrite: bool = False,
    progress: bool = True,
) -> ExportSummary:
    """Write the episode store ``store`` (a location or an open ``EpisodeStore``) as a LeRobot v3.0
    dataset at ``out``; returns what was written (see the module docstring for the layout).

    ``features`` exports only those store keys, ``episodes`` only those episodes (store indices, in
    that order; e.g. a subset's ``episode_indices``), ``names`` gives keys other LeRobot names.
    ``video_codec`` is ``"h264"`` or ``"av1"``; ``crf`` its quality (lower is better), ``gop`` the key
    frame interval. ``fps`` is needed only where the store's keys record no single rate. An existing
    ``out`` is refused unless ``overwrite``. Raises :class:`ExportError` for what cannot be exported.
    """
    from demoscale.datasets import EpisodeStore, StoreError

    started = time.perf_counter()
    if video_codec not in VIDEO_CODECS:
        raise ExportError(f"unknown video codec {video_codec!r}; choose one of {', '.join(VIDEO_CODECS)}")
    if gop < 1 or (crf is not None and crf < 0):
        raise ExportError(f"gop must be at least 1 and crf not negative, got gop={gop}, crf={crf}")
    if not (data_file_size_mb > 0 and video_file_size_mb > 0):
        raise ExportError("file sizes must be positive")
    try:
        opened = store if isinstance(store, EpisodeStore) else EpisodeStore.open(store)
        table = opened.episodes
    except (StoreError, FileNotFoundError, ValueError) as error:
        raise ExportError(f"store {store}: {error}") from error
    chosen = _chosen(opened, features, dict(names or {}))
    rate = _fps(chosen, fps)
    order = list(range(opened.n_episodes)) if episodes is None else [int(i) for i in episodes]
    if not order:
        raise ExportError(f"store {store}: no episodes to export")
    bad = [i for i in order if not 0 <= i < opened.n_episodes]
    if bad or len(set(order)) != len(order):
        raise ExportError(
            f"episodes must be distinct store indices in 0..{opened.n_episodes - 1}, got {bad or order}"
        )
    out = Path(out)
    if out.exists() and not overwrite:
        raise ExportError(f"{out} exists; choose another OUT or overwrite=True (--overwrite)")
    scratch = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        summary = _write(opened, table, chosen, order, rate, scratch, video_codec, crf, gop, robot_type,
                         data_file_size_mb, video_file_size_mb, progress)  # fmt: skip
        if out.exists():
            shutil.rmtree(out)
        os.replace(scratch, out)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    summary.out = str(out)
    summary.seconds = time.perf_counter() - started
    return summary


def _write(
    store: Any,
    table: Any,
    chosen: list[ExportedFeature],
    order: list[int],
    fps: int,
    root: Path,
    video_codec: str,
    crf: int | None,
    gop: int,
    robot_type: str | None,
    data_file_size_mb: float,
    video_file_size_mb: float,
    progress: bool,
) -> ExportSummary:
    import pyarrow as pa
    from tqdm import tqdm

    low_dim = [f for f in chosen if not f.is_video]
    videos = [f for f in chosen if f.is_video]
    tasks = list(dict.fromkeys(str(table["task"].iloc[i] or "") for i in order))
    task_index = {task: index for index, task in enumerate(tasks)}
    schema = pa.schema(
        [(f.name, _arrow_type(f.spec)) for f in low_dim]
        + [(name, pa.from_numpy_dtype(np.dtype(dtype))) for name, dtype in BOOKKEEPING.items()]
    )
    data = DataWriter(root, schema, data_file_size_mb)
    encoders = {
        f.name: VideoWriter(root, f.name, fps, video_codec, crf, gop, video_file_size_mb) for f in videos
    }
    rows: list[dict[str, Any]] = []
    moments: dict[str, list[Moments]] = {f.name: [] for f in chosen}
    frames_done = 0
    try:
        for position, episode in enumerate(tqdm(order, desc="export", unit="episode", disable=not progress)):
            meta = table.iloc[episode]
            start, end = int(meta["start"]), int(meta["end"])
            length = end - start
            task = str(meta["task"] or "")
            row: dict[str, Any] = {"episode_index": position, "tasks": [task], "length": length}
            columns = {}
            for feature in low_dim:
                values = store.read(feature.key, start, end)
                columns[feature.name] = _column(values, feature.spec)
                moments[feature.name].append(Moments.of(values, image=False))
            frame_index = np.arange(length, dtype=np.int64)
            columns.update(
                timestamp=pa.array((frame_index / fps).astype(np.float32)),
                frame_index=pa.array(frame_index),
                episode_index=pa.array(np.full(length, position, np.int64)),
                index=pa.array(frame_index + frames_done),
                task_index=pa.array(np.full(length, task_index[task], np.int64)),
            )
            chunk, file = data.add(pa.table(columns, schema=schema))
            row.update({"data/chunk_index": chunk, "data/file_index": file,
                        "dataset_from_index": frames_done, "dataset_to_index": frames_done + length})  # fmt: skip
            for feature in videos:
                frames = store.read(feature.key, start, end)
                row.update(encoders[feature.name].add(frames))
                moments[feature.name].append(Moments.of(frames, image=True))
            for feature in chosen:
                stats = moments[feature.name][-1].as_lerobot(feature.is_video)
                row.update({f"stats/{feature.name}/{name}": value for name, value in stats.items()})
            row.update(_labels(meta))
            row.update({"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0})
            rows.append(row)
            frames_done += length
    finally:
        data.close()
        for encoder in encoders.values():
            encoder.close()
    _write_meta(root, rows, tasks, chosen, moments, encoders, fps, video_codec, robot_type,
                data_file_size_mb, video_file_size_mb)  # fmt: skip
    return ExportSummary(
        out=str(root),
        episodes=len(rows),
        frames=frames_done,
        video_keys=[f.name for f in videos],
        low_dim_keys=[f.name for f in low_dim],
        video_codec=video_codec,
        data_files=data.files.files,
        video_files=sum(encoder.files.files for encoder in encoders.values()),
    )


def _labels(meta: Any) -> dict[str, Any]:
    """demoscale's per-episode labels, as extra columns LeRobot carries along (ingest reads them back)."""
    import pandas as pd

    success = meta["success"]
    return {
        "env_id": str(meta["env_id"]),
        "object_id": str(meta["object_id"]),
        "operator": str(meta["operator"] or ""),
        "success": None if pd.isna(success) else bool(success),
    }


def _write_meta(
    root: Path,
    rows: list[dict[str, Any]],
    tasks: list[str],
    chosen: list[ExportedFeature],
    moments: Mapping[str, list[Moments]],
    encoders: Mapping[str, VideoWriter],
    fps: int,
    video_codec: str,
    robot_type: str | None,
    data_file_size_mb: float,
    video_file_size_mb: float,
) -> None:
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    meta = root / "meta"
    episodes_path = root / EPISODES_PATH.format(chunk_index=0, file_index=0)
    episodes_path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), episodes_path, compression="snappy")
    # LeRobot keeps the task text as the table's index (pandas writes it into the parquet file).
    pd.DataFrame({"task_index": range(len(tasks))}, index=pd.Index(tasks)).to_parquet(meta / "tasks.parquet")
    lengths = [row["length"] for row in rows]
    stats = {f.name: Moments.merged(moments[f.name]).as_lerobot(f.is_video) for f in chosen}
    features: dict[str, Any] = {}
    for feature in chosen:
        entry = _feature_entry(feature, fps)
        if feature.is_video and encoders[feature.name].first_path is not None:
            entry["info"] = video_info(encoders[feature.name].first_path, video_codec)
        features[feature.name] = entry
    for name, dtype in BOOKKEEPING.items():
        features[name] = {"dtype": dtype, "shape": [1], "names": None, "fps": fps}
    info = {
        "codebase_version": CODEBASE_VERSION,
        "robot_type": robot_type,
        "total_episodes": len(rows),
        "total_frames": int(sum(lengths)),
        "total_tasks": len(tasks),
        "chunks_size": CHUNKS_SIZE,
        "data_files_size_in_mb": _whole(data_file_size_mb),
        "video_files_size_in_mb": _whole(video_file_size_mb),
        "fps": fps,
        "splits": {"train": f"0:{len(rows)}"},
        "data_path": DATA_PATH,
        "video_path": VIDEO_PATH if encoders else None,
        "features": features,
    }
    (meta / "info.json").write_text(json.dumps(info, indent=4))
    (meta / "stats.json").write_text(json.dumps(stats, indent=4))


def _whole(value: float) -> int | float:
    """A size setting as LeRobot writes it: a whole number where it is one."""
    return int(value) if float(value).is_integer() else float(value)


def psnr(reference: np.ndarray, decoded: np.ndarray) -> float:
    """Peak signal-to-noise ratio of uint8 images, dB (inf for identical images)."""
    error = np.mean((reference.astype(np.float64) - decoded.astype(np.float64)) ** 2)
    return math.inf if error == 0 else 10 * math.log10(255.0**2 / error)
