"""UMI ``dataset.zarr.zip``: writer, reader/validator and ingestion into an episode store.

The source layout (a Zarr format-2 group inside an uncompressed zip) is::

    meta/episode_ends                 (n_episodes,) int64, cumulative exclusive ends, no compressor
    data/robot{i}_eef_pos             (T, 3) float32, metres
    data/robot{i}_eef_rot_axis_angle  (T, 3) float32, axis-angle radians
    data/robot{i}_gripper_width       (T, 1) float32, metres
    data/robot{i}_demo_start_pose     (T, 6) float64, the episode's first pose on every step
    data/robot{i}_demo_end_pose       (T, 6) float64, the episode's last pose on every step
    data/camera{i}_rgb                (T, H, W, 3) uint8, one frame per chunk, JPEG-XL
                                      (numcodecs id ``imagecodecs_jpegxl``)
    data/object{i}_<name>             (T, k) float32, optional: a simulator's state of object i
                                      (e.g. ``object0_pose``); not UMI's own, carried as low-dim

``i`` is 0 for single-arm data and 0, 1 for bimanual data.

In-memory episode layout taken by :func:`write_umi_zip` (one dict per episode, all episodes with
the same keys, every array time-major with the same length ``T``):

- ``robot{i}_eef_pos``: (T, 3) float, metres;
- ``robot{i}_eef_rot_axis_angle``: (T, 3) float, axis-angle radians;
- ``robot{i}_gripper_width``: (T,) or (T, 1) float, metres;
- ``camera{i}_rgb``: (T, H, W, 3) uint8 RGB;
- optional ``robot{i}_demo_start_pose`` / ``robot{i}_demo_end_pose``: (T, 6); when absent they are
  derived from the episode's first / last ``[eef_pos, eef_rot_axis_angle]``;
- optional ``object{i}_<name>``: (T, k) float, object state a simulator knows (the tabletop tasks'
  ``object_state`` option); ingested as a low-dim feature of that name.

Ingestion derives ``action`` = concat over robots of (eef_pos, eef_rot_axis_angle, gripper_width)
of the *next* frame (the last frame repeats itself): the pose the robot is commanded to reach next.
"""

from __future__ import annotations

import os
import re
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from demoscale.collect.driver import IngestSummary, ingest
from demoscale.collect.source_format import (
    OBJECT_STATE_KEY,
    ContentHash,
    EpisodePlan,
    IngestError,
    LoadedEpisode,
    SourceFormat,
    SourcePlan,
    option,
    validating,
)
from demoscale.collect.sources import SourceIds
from demoscale.collect.zarr_source import (
    GroupInfo,
    RawGroup,
    episode_group,
    open_cached,
    read_checked,
    register_image_codecs,
)

JPEGXL_CODEC_ID = "imagecodecs_jpegxl"
_ROBOT_LOW_DIM = ("eef_pos", "eef_rot_axis_angle", "gripper_width")
_ROBOT_KEY = re.compile(
    r"^robot(\d+)_(eef_pos|eef_rot_axis_angle|gripper_width|demo_start_pose|demo_end_pose)$"
)
_CAMERA_KEY = re.compile(r"^camera(\d+)_rgb$")


def _complete_episode(episode: Mapping[str, np.ndarray], index: int) -> dict[str, np.ndarray]:
    """Check one in-memory episode and fill in the demo start/end poses where they are absent."""
    unknown = [
        k for k in episode if not (_ROBOT_KEY.match(k) or _CAMERA_KEY.match(k) or OBJECT_STATE_KEY.match(k))
    ]
    if unknown:
        raise ValueError(
            f"episode {index}: keys {unknown} are not UMI keys (robot<i>_..., camera<i>_rgb, object<i>_...)"
        )
    lengths = {key: len(value) for key, value in episode.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"episode {index}: arrays have different lengths {lengths}")
    robots = sorted({int(m.group(1)) for k in episode if (m := _ROBOT_KEY.match(k))})
    out: dict[str, np.ndarray] = {}
    for key, value in episode.items():
        value = np.asarray(value)
        if _CAMERA_KEY.match(key):
            if value.dtype != np.uint8 or value.ndim != 4 or value.shape[-1] != 3:
                raise ValueError(
                    f"episode {index}: {key} must be (T, H, W, 3) uint8, got {value.dtype} {value.shape}"
                )
        if OBJECT_STATE_KEY.match(key):
            if value.ndim not in (1, 2) or not np.issubdtype(value.dtype, np.floating):
                raise ValueError(
                    f"episode {index}: {key} must be (T, k) float, got {value.dtype} {value.shape}"
                )
            value = value.reshape(len(value), -1).astype(np.float32)
        out[key] = value
    for robot in robots:
        for part in _ROBOT_LOW_DIM:
            key = f"robot{robot}_{part}"
            if key not in out:
                raise ValueError(f"episode {index}: missing {key}")
        out[f"robot{robot}_gripper_width"] = (
            out[f"robot{robot}_gripper_width"].reshape(-1, 1).astype(np.float32)
        )
        out[f"robot{robot}_eef_pos"] = out[f"robot{robot}_eef_pos"].astype(np.float32)
        out[f"robot{robot}_eef_rot_axis_angle"] = out[f"robot{robot}_eef_rot_axis_angle"].astype(np.float32)
        pose = np.concatenate(
            [episode[f"robot{robot}_eef_pos"], episode[f"robot{robot}_eef_rot_axis_angle"]], axis=1
        )
        pose = pose.astype(np.float64)
        for key, row in (
            (f"robot{robot}_demo_start_pose", pose[0]),
            (f"robot{robot}_demo_end_pose", pose[-1]),
        ):
            out[key] = (
                np.asarray(episode[key], np.float64) if key in episode else np.repeat(row[None], len(pose), 0)
            )
    return out


def write_umi_zip(
    path: str | os.PathLike,
    episodes: Sequence[Mapping[str, np.ndarray]],
    jpegxl_level: int = 99,
    jpegxl_lossless: bool = False,
    rate_hz: float | None = None,
    capture: Mapping[str, Mapping] | None = None,
) -> Path:
    """Write ``episodes`` (layout in the module docstring) as a UMI ``dataset.zarr.zip``.

    The zip holds a Zarr format-2 group, entries stored without zip compression; images go one
    frame per chunk through imagecodecs' JPEG-XL numcodecs codec at ``jpegxl_level`` (lossy unless
    ``jpegxl_lossless``); low-dim arrays are uncompressed, chunked by the first episode's length.
    ``rate_hz``, when given, is recorded in the root attributes (UMI itself records no rate), and
    so is ``capture`` (camera key -> what produced its images, e.g. a simulator camera's name,
    image size and task options), which ingestion copies into the store's feature spec.
    """
    import zarr
    from imagecodecs.numcodecs import Jpegxl

    if not episodes:
        raise ValueError("write_umi_zip needs at least one episode")
    register_image_codecs()
    completed = [_complete_episode(episode, i) for i, episode in enumerate(episodes)]
    keys = sorted(completed[0])
    for i, episode in enumerate(completed):
        if sorted(episode) != keys:
            raise ValueError(f"episode {i} has keys {sorted(episode)}, episode 0 has {keys}")
    lengths = np.array([len(episode[keys[0]]) for episode in completed], dtype=np.int64)
    episode_ends = np.cumsum(lengths).astype(np.int64)
    total = int(episode_ends[-1])

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # zarr's zip store rewrites metadata entries (duplicate zip members); build the group in a
    # scratch directory and pack it into the zip afterwards, every member stored uncompressed.
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".umi-zip-") as scratch:
        root = zarr.open_group(zarr.storage.LocalStore(scratch), mode="w", zarr_format=2)
        if rate_hz is not None:
            root.attrs["rate_hz"] = float(rate_hz)
        if capture:
            root.attrs["capture"] = {key: dict(value) for key, value in capture.items()}
        meta = root.create_group("meta")
        data = root.create_group("data")
        meta.create_array(
            "episode_ends",
            shape=episode_ends.shape,
            dtype="int64",
            chunks=episode_ends.shape,
            compressor=None,
        )[:] = episode_ends
        for key in keys:
            first = completed[0][key]
            full = np.concatenate([episode[key] for episode in completed], axis=0)
            if _CAMERA_KEY.match(key):
                chunks = (1, *first.shape[1:])
                compressor = Jpegxl(level=jpegxl_level, lossless=jpegxl_lossless)
            else:
                chunks = (max(1, min(len(first), total)), *first.shape[1:])
                compressor = None
            # Every chunk written, even an all-zero one: readers treat a missing chunk as damage.
            array = data.create_array(
                key,
                shape=full.shape,
                dtype=full.dtype,
                chunks=chunks,
                compressor=compressor,
                config={"write_empty_chunks": True},
            )
            array[:] = full
        partial = path.with_name(path.name + ".partial")
        with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
            for file in sorted(Path(scratch).rglob("*")):
                if file.is_file():
                    archive.write(file, file.relative_to(scratch).as_posix())
        os.replace(partial, path)
    return path


# ----------------------------------------------------------------------------------------------
# Reading and ingestion

UMI_RATE_HZ = 60.0  # the GoPro rate UMI zips are recorded at; the zip itself records no rate


def robot_keys(robot: int) -> list[str]:
    return [f"robot{robot}_{part}" for part in _ROBOT_LOW_DIM]


def umi_features(
    robots: Sequence[int],
    cameras: Mapping[int, tuple[int, int]],
    rate_hz: float,
    capture: Mapping[str, Mapping] | None = None,
    object_state: Mapping[str, int] | None = None,
) -> dict:
    """Store features of UMI-style data (also what the simulated tabletop writes); ``capture``
    (camera key -> what produced it, the zip's ``capture`` attribute) becomes their ``source``;
    ``object_state`` (``object<i>_...`` key -> width) adds the simulator's object-state features."""
    from demoscale.datasets import FeatureSpec

    features = {}
    for camera, (height, width) in sorted(cameras.items()):
        key = f"camera{camera}_rgb"
        source = (capture or {}).get(key)
        features[key] = FeatureSpec(
            kind="image",
            shape=(height, width, 3),
            dtype="uint8",
            rate_hz=rate_hz,
            units="rgb",
            source=dict(source) if source else None,
        )
    for robot in robots:
        low_dim = {
            "eef_pos": ((3,), "float32", "m"),
            "eef_rot_axis_angle": ((3,), "float32", "rad (axis-angle)"),
            "gripper_width": ((1,), "float32", "m"),
            "demo_start_pose": ((6,), "float64", "m,rad (axis-angle)"),
            "demo_end_pose": ((6,), "float64", "m,rad (axis-angle)"),
        }
        for part, (shape, dtype, units) in low_dim.items():
            features[f"robot{robot}_{part}"] = FeatureSpec(
                kind="low_dim", shape=shape, dtype=dtype, rate_hz=rate_hz, units=units, frame="world"
            )
    for key, width in sorted((object_state or {}).items()):
        features[key] = FeatureSpec(
            kind="low_dim", shape=(int(width),), dtype="float32", rate_hz=rate_hz, units="simulator state",
            frame="world",
        )  # fmt: skip
    features["action"] = FeatureSpec(
        kind="low_dim",
        shape=(7 * len(robots),),
        dtype="float32",
        rate_hz=rate_hz,
        units="m,rad,m per robot (next-frame eef_pos, eef_rot_axis_angle, gripper_width)",
        frame="world",
    )
    return features


def next_pose_action(arrays: Mapping[str, np.ndarray], robots: Sequence[int]) -> np.ndarray:
    """``action`` = concat over robots of (eef_pos, eef_rot_axis_angle, gripper_width) of the next frame.

    The last frame repeats itself: the robot is commanded to stay where it ended.
    """
    parts = [
        np.asarray(arrays[key], np.float32).reshape(len(arrays[key]), -1)
        for r in robots
        for key in robot_keys(r)
    ]
    pose = np.concatenate(parts, axis=1)
    return np.concatenate([pose[1:], pose[-1:]], axis=0)


def _split_keys(info, where: str) -> tuple[list[int], dict[int, tuple[int, int]], list[str]]:
    """Robots, cameras (index -> (H, W)) and the keys to read; checks shapes and dtypes."""
    import warnings

    robots, cameras, keys = set(), {}, []
    for name, array in info.arrays.items():
        if match := _CAMERA_KEY.match(name):
            if array.dtype != np.uint8 or len(array.shape) != 4 or array.shape[-1] != 3:
                raise IngestError(
                    f"{where}: key {name!r} must be (T, H, W, 3) uint8, got {array.dtype} {array.shape}"
                )
            cameras[int(match.group(1))] = (array.shape[1], array.shape[2])
            keys.append(name)
        elif match := _ROBOT_KEY.match(name):
            robots.add(int(match.group(1)))
            width = {"eef_pos": 3, "eef_rot_axis_angle": 3, "gripper_width": 1}.get(match.group(2), 6)
            if int(np.prod(array.shape[1:])) != width or not np.issubdtype(array.dtype, np.floating):
                raise IngestError(
                    f"{where}: key {name!r} must be (T, {width}) float, got {array.dtype} {array.shape}"
                )
            keys.append(name)
        elif OBJECT_STATE_KEY.match(name):
            if len(array.shape) != 2 or not np.issubdtype(array.dtype, np.floating):
                raise IngestError(
                    f"{where}: key {name!r} must be (T, k) float, got {array.dtype} {array.shape}"
                )
            keys.append(name)
        else:
            warnings.warn(f"{where}: key {name!r} is not a UMI key and is not ingested", stacklevel=3)
    if not robots:
        raise IngestError(f"{where}: no robot<i>_eef_pos / ... arrays under data/")
    for robot in sorted(robots):
        for key in robot_keys(robot):
            if key not in info.arrays:
                raise IngestError(f"{where}: key {key!r} is missing")
    return sorted(robots), cameras, keys


def _copyable(array) -> bool:
    """Frames whose chunk bytes are a JPEG-XL image each and can be handed over as they are."""
    return (
        array.compressor_id == JPEGXL_CODEC_ID
        and not array.has_filters
        and array.chunks == (1, *array.shape[1:])
    )


@dataclass(frozen=True)
class UmiOptions:
    rate_hz: float | None = option(None, "frame rate (default: the zip's rate_hz attribute, else 60)")


@dataclass(frozen=True)
class UmiEpisode:
    """Where one planned episode of a UMI zip lies, and how to read it."""

    path: str
    episode: int
    start: int
    end: int
    robots: tuple[int, ...]
    keys: tuple[str, ...]
    copyable: tuple[str, ...]  # camera keys whose chunk bytes can be copied as they are


class UmiZipFormat(SourceFormat):
    """UMI ``dataset.zarr.zip`` files (the :class:`~demoscale.collect.source_format.SourceFormat` contract)."""

    name = "umi"
    summary = "UMI dataset.zarr.zip files or a <task>/env_<i>/object_<j>/ tree"
    src_help = "a dataset.zarr.zip or a directory searched for *.zarr.zip"
    patterns = ("*.zarr.zip",)
    what = "UMI dataset.zarr.zip"
    options_type = UmiOptions
    copy_codec = "jpegxl"  # the zip's frames are JPEG-XL images: a JPEG-XL store takes them as they are

    def plan(
        self, path: Path, ids: SourceIds, options: UmiOptions, limit: int | None, progress: bool
    ) -> SourcePlan:
        """Validate a whole UMI zip (its low-dim arrays, and every frame's chunk present or decodable)."""
        path = Path(path).resolve()
        with episode_group(path) as (raw, info, root):
            robots, cameras, keys = _split_keys(info, str(path))
            rate_hz = (
                options.rate_hz
                if options.rate_hz is not None
                else float(root.attrs.get("rate_hz", UMI_RATE_HZ))
            )
            capture = root.attrs.get("capture") or None
            low_dim = {
                key: read_checked(root, info, key) for key in keys if key.startswith(("robot", "object"))
            }
            object_state = {key: int(info.arrays[key].shape[1]) for key in keys if key.startswith("object")}
            for camera in cameras:
                key = f"camera{camera}_rgb"
                try:
                    root[f"data/{key}"][0]
                except Exception as error:
                    raise IngestError(
                        f"{path}: key {key!r}, episode 0: frame 0 cannot be decoded: {error}"
                    ) from error
            copyable = tuple(k for k in keys if k.startswith("camera") and _copyable(info.arrays[k]))
            plans = []
            for episode in validating(range(info.n_episodes)[:limit], path, progress):
                start, end = info.bounds(episode)
                digest = ContentHash().arrays({key: values[start:end] for key, values in low_dim.items()})
                for camera in sorted(cameras):
                    _hash_frames(digest, raw, root, info, f"camera{camera}_rgb", episode)
                load_args = UmiEpisode(str(path), episode, start, end, tuple(robots), tuple(keys), copyable)
                plans.append(
                    EpisodePlan(f"{path}#episode={episode}", digest.hexdigest(), end - start, load_args, ids)
                )
        return SourcePlan(umi_features(robots, cameras, rate_hz, capture, object_state), plans)

    def load(self, episode: UmiEpisode, want_encoded: bool) -> LoadedEpisode:
        """The episode's arrays (frames decoded, or their JPEG-XL bytes when ``want_encoded``) and action."""
        raw, root = open_cached(episode.path)
        start, end = episode.start, episode.end
        arrays: dict[str, np.ndarray] = {}
        encoded: dict[str, list[bytes]] = {}
        for key in episode.keys:
            array = root[f"data/{key}"]
            if want_encoded and key in episode.copyable:
                separator = array.metadata.dimension_separator or "."
                rest = separator.join("0" for _ in array.shape[1:])
                encoded[key] = [
                    raw.read(f"data/{key}/{frame}{separator}{rest}") for frame in range(start, end)
                ]
                _check_copied_frames(encoded[key], tuple(array.shape[1:]), episode, key)
            else:
                try:
                    arrays[key] = np.asarray(array[start:end])
                except Exception as error:  # zarr and the codecs raise many types for damaged chunks
                    raise IngestError(
                        f"{episode.path}: key {key!r}, episode {episode.episode} (frames {start}:{end}): cannot be "
                        f"read or decoded ({type(error).__name__}: {error})"
                    ) from None
        for robot in episode.robots:
            for part in _ROBOT_LOW_DIM:
                key = f"robot{robot}_{part}"
                arrays[key] = arrays[key].reshape(end - start, -1).astype(np.float32, copy=False)
            pose = np.concatenate(
                [arrays[f"robot{robot}_eef_pos"], arrays[f"robot{robot}_eef_rot_axis_angle"]], axis=1
            )
            for part, row in (("demo_start_pose", 0), ("demo_end_pose", -1)):
                key = f"robot{robot}_{part}"
                if key in arrays:
                    arrays[key] = arrays[key].astype(np.float64, copy=False)
                else:
                    arrays[key] = np.repeat(pose[row][None].astype(np.float64), end - start, axis=0)
        for key in episode.keys:
            if OBJECT_STATE_KEY.match(key):
                arrays[key] = arrays[key].astype(np.float32, copy=False)
        arrays["action"] = next_pose_action(arrays, episode.robots)
        return arrays, (encoded or None)


UMI_ZIP = UmiZipFormat()


def _hash_frames(digest: ContentHash, raw: RawGroup, root, info: GroupInfo, key: str, episode: int) -> None:
    """Hash an episode's frames: the raw chunk bytes where each chunk is one JPEG-XL frame (checking
    that each is there), else the decoded frames."""
    start, end = info.bounds(episode)
    array = info.arrays[key]
    if _copyable(array):
        for frame in range(start, end):
            name = array.chunk_name(frame)
            if not raw.exists(name):
                raise IngestError(
                    f"{info.path}: key {key!r}, episode {episode}: chunk of frame {frame - start} is missing"
                )
            digest.raw(key, raw.read(name))
        return
    try:
        digest.array(key, np.asarray(root[f"data/{key}"][start:end]))
    except Exception as error:
        raise IngestError(
            f"{info.path}: key {key!r}, episode {episode}: cannot be decoded: {error}"
        ) from error


def _check_copied_frames(
    frames: Sequence[bytes], shape: tuple[int, ...], episode: UmiEpisode, key: str
) -> None:
    """Decode every frame about to be copied as it is, once: a corrupt frame must fail the ingest,
    not be stored (zip CRCs catch damaged bytes, not a frame that was written broken)."""
    import imagecodecs

    for offset, data in enumerate(frames):
        try:
            decoded = imagecodecs.jpegxl_decode(data)
        except Exception as error:
            raise IngestError(
                f"{episode.path}: key {key!r}, episode {episode.episode}: frame {offset} does not decode as "
                f"JPEG-XL ({error})"
            ) from None
        if decoded.shape != shape:
            raise IngestError(
                f"{episode.path}: key {key!r}, episode {episode.episode}: frame {offset} decodes to "
                f"{decoded.shape}, the array says {shape}"
            )


def ingest_umi(
    src: str | os.PathLike, store: str | os.PathLike, *, rate_hz: float | None = None, **common: Any
) -> IngestSummary:
    """Ingest UMI ``dataset.zarr.zip`` files into the episode store at ``store``.

    ``src`` is one zip or a directory searched for ``*.zarr.zip``. When the store's image codec is
    JPEG-XL the frames' compressed bytes are copied as they are; otherwise they are decoded and
    re-encoded by the store. ``rate_hz`` defaults to the zip's ``rate_hz`` attribute, else 60 Hz.
    ``common`` are the driver's keywords (ids, ``manifest``, ``workers``, ``dry_run``, ...: see
    :func:`demoscale.collect.ingest`). Returns an :class:`~demoscale.collect.IngestSummary`.
    """
    return ingest(UMI_ZIP, src, store, UmiOptions(rate_hz=rate_hz), **common)
