"""JoyLo (BRS, Galaxea R1) recordings: writers, reader/validator and ingestion into an episode store.

A raw recording is one HDF5 file per episode, recorded at 10 Hz::

    obs/joint_state/{left_arm,right_arm,torso}/{joint_position,joint_velocity,joint_effort,seq,stamp}
    obs/gripper_state/{left_gripper,right_gripper}/{gripper_position,gripper_velocity,gripper_effort,seq,stamp}
    obs/point_cloud/fused/{xyz (T,N,3) float32, rgb (T,N,3) uint8, padding_mask (T,N) bool, seq, stamp}
    obs/odom/{position (T,3), orientation (T,4) xyzw, linear_velocity (T,3), angular_velocity (T,3), seq, stamp}
    obs/rgb/{head,left_wrist,right_wrist}/{img (T,H,W,3) uint8, seq, stamp}
    action/{left_arm (T,6), right_arm (T,6), torso (T,4), left_gripper (T,), right_gripper (T,), mobile_base (T,3)}
    file attributes: record_freq, <sensor>_freq, horizon

Optionally ``obs/object_state/object<i>_<name>`` (T, k) float32: a simulator's state of object i
(not a JoyLo recorder's), ingested as the low-dim feature ``object<i>_<name>``.

A merged (post-processed) BRS file holds ``demo_{i}/obs/...`` and ``demo_{i}/action/...`` with the
same sub-paths, plus ``obs/odom/base_velocity`` (T,3).

In-memory episode layout taken by the writers: a dict from the HDF5 path below the episode root
(for example ``"obs/joint_state/left_arm/joint_position"`` or ``"action/mobile_base"``) to a
time-major array; nested dicts (``{"obs": {"joint_state": {...}}}``) are accepted too. Each sensor
group (``obs/joint_state/<part>``, ``obs/gripper_state/<part>``, ``obs/odom``,
``obs/point_cloud/fused``, ``obs/rgb/<camera>``, ``obs/depth/<camera>``) gets ``seq`` and ``stamp``
datasets when the dict has none (``seq`` = 0..T-1, ``stamp`` = seconds at the recording rate).

Ingestion writes the keys of docs/interfaces.md: ``action`` (21 = mobile base 3, torso 4, left arm
6, left gripper 1, right arm 6, right gripper 1) with its named parts, ``proprio`` (21, same layout,
the base part being the base-frame velocity), odometry, the fused point cloud and the RGB cameras.
"""

from __future__ import annotations

import os
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
    NoOptions,
    SourceFormat,
    SourcePlan,
    as_uint8_image,
    open_hdf5,
    validating,
)
from demoscale.collect.sources import SourceIds

RECORD_RATE_HZ = 10.0
ARM_DOF = 6
TORSO_DOF = 4
CAMERAS = ("head", "left_wrist", "right_wrist")
ACTION_PARTS: tuple[tuple[str, int], ...] = (
    ("mobile_base", 3),
    ("torso", TORSO_DOF),
    ("left_arm", ARM_DOF),
    ("left_gripper", 1),
    ("right_arm", ARM_DOF),
    ("right_gripper", 1),
)


def flatten_episode(episode: Mapping[str, Any], prefix: str = "") -> dict[str, np.ndarray]:
    """Turn a nested episode dict into ``{"obs/odom/position": array, ...}``."""
    flat: dict[str, np.ndarray] = {}
    for key, value in episode.items():
        path = f"{prefix}{key}".strip("/")
        if isinstance(value, Mapping):
            flat.update(flatten_episode(value, path + "/"))
        else:
            flat[path] = np.asarray(value)
    return flat


def base_frame_velocity(
    orientation_xyzw: np.ndarray, linear_velocity: np.ndarray, angular_velocity: np.ndarray
):
    """Base velocity ``[vx, vy, yaw rate]`` in the base frame from world-frame odometry.

    The world-frame linear velocity is rotated by the inverse of the base orientation; the yaw rate
    is the z component of the angular velocity expressed in the base frame.
    """
    from scipy.spatial.transform import Rotation

    rotation = Rotation.from_quat(np.asarray(orientation_xyzw, np.float64))
    linear = rotation.inv().apply(np.asarray(linear_velocity, np.float64))
    angular = rotation.inv().apply(np.asarray(angular_velocity, np.float64))
    return np.stack([linear[:, 0], linear[:, 1], angular[:, 2]], axis=1).astype(np.float32)


def _sensor_groups(paths: Sequence[str]) -> set[str]:
    groups = set()
    for path in paths:
        parts = path.split("/")
        if parts[0] != "obs" or len(parts) < 3:
            continue
        if parts[1] in {"joint_state", "gripper_state", "rgb", "depth", "point_cloud"} and len(parts) >= 4:
            groups.add("/".join(parts[:3]))
        elif parts[1] == "odom":
            groups.add("obs/odom")
    return groups


def _with_stamps(flat: dict[str, np.ndarray], rate_hz: float) -> dict[str, np.ndarray]:
    lengths = {len(v) for v in flat.values() if v.ndim > 0}
    if len(lengths) != 1:
        raise ValueError(f"episode arrays have different lengths: {sorted(lengths)}")
    horizon = lengths.pop()
    out = dict(flat)
    for group in _sensor_groups(list(flat)):
        out.setdefault(f"{group}/seq", np.arange(horizon, dtype=np.int64))
        out.setdefault(f"{group}/stamp", np.arange(horizon, dtype=np.float64) / rate_hz)
    return out


def _write_datasets(group, flat: Mapping[str, np.ndarray]) -> None:
    for path, value in sorted(flat.items()):
        # Images and point clouds are large: compress them per frame, as a recorder would.
        if value.ndim >= 3:
            group.create_dataset(
                path, data=value, chunks=(1, *value.shape[1:]), compression="gzip", compression_opts=1
            )
        else:
            group.create_dataset(path, data=value)


def write_joylo_episode(
    path: str | os.PathLike, episode: Mapping[str, Any], attrs: Mapping[str, Any] | None = None
) -> Path:
    """Write one raw per-episode JoyLo HDF5 file (layout in the module docstring).

    ``attrs`` become file attributes on top of the defaults ``record_freq`` (10 Hz) and ``horizon``.
    """
    import h5py

    rate_hz = float((attrs or {}).get("record_freq", RECORD_RATE_HZ))
    flat = _with_stamps(flatten_episode(episode), rate_hz)
    horizon = len(next(iter(flat.values())))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as file:
        file.attrs["record_freq"] = rate_hz
        file.attrs["horizon"] = horizon
        for key, value in (attrs or {}).items():
            file.attrs[key] = value
        _write_datasets(file, flat)
    return path


def write_brs_merged(
    path: str | os.PathLike, episodes: Sequence[Mapping[str, Any]], rate_hz: float = RECORD_RATE_HZ
) -> Path:
    """Write a merged BRS file: ``demo_{i}/obs/...`` and ``demo_{i}/action/...`` per episode.

    As BRS post-processing does, ``obs/odom/base_velocity`` is added (from the odometry) where an
    episode lacks it.
    """
    import h5py

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as file:
        file.attrs["record_freq"] = float(rate_hz)
        file.attrs["num_demos"] = len(episodes)
        for index, episode in enumerate(episodes):
            flat = _with_stamps(flatten_episode(episode), rate_hz)
            if "obs/odom/base_velocity" not in flat:
                flat["obs/odom/base_velocity"] = base_frame_velocity(
                    flat["obs/odom/orientation"],
                    flat["obs/odom/linear_velocity"],
                    flat["obs/odom/angular_velocity"],
                )
            _write_datasets(file.create_group(f"demo_{index}"), flat)
    return path


# ----------------------------------------------------------------------------------------------
# Reading and ingestion

_ACTION_UNITS = (
    "base m/s,m/s,rad/s; torso rad x4; left arm rad x6; left gripper mm; right arm rad x6; right gripper mm"
)


def joylo_features(
    n_points: int | None,
    cameras: Mapping[str, tuple[int, int]],
    rate_hz: float,
    capture: Mapping[str, Mapping] | None = None,
    object_state: Mapping[str, int] | None = None,
) -> dict:
    """Store features of ingested JoyLo episodes (keys of docs/interfaces.md); ``capture`` (camera
    key -> what produced it, the files' ``capture`` attribute) becomes their ``source``;
    ``object_state`` (``object<i>_...`` key -> width) adds the simulator's object-state features."""
    from demoscale.datasets import FeatureSpec

    def low_dim(width: int, units: str, frame: str = "", dtype: str = "float32"):
        return FeatureSpec(
            kind="low_dim", shape=(width,), dtype=dtype, rate_hz=rate_hz, units=units, frame=frame
        )

    part_units = {"mobile_base": "m/s,m/s,rad/s", "torso": "rad", "left_arm": "rad", "right_arm": "rad"}
    features = {
        "action": low_dim(21, _ACTION_UNITS),
        **{f"action_{part}": low_dim(width, part_units.get(part, "mm")) for part, width in ACTION_PARTS},
        "proprio": low_dim(21, _ACTION_UNITS.replace("m/s,m/s,rad/s", "base-frame velocity m/s,m/s,rad/s")),
        "odom_base_velocity": low_dim(3, "m/s,m/s,rad/s", frame="base"),
        "odom_position": low_dim(3, "m", frame="odom"),
        "odom_orientation": low_dim(4, "quaternion xyzw", frame="odom"),
        **{
            key: low_dim(width, "simulator state", frame="base")
            for key, width in sorted((object_state or {}).items())
        },
    }

    def recorded(key: str) -> dict | None:
        source = (capture or {}).get(key)
        return dict(source) if source else None

    if n_points is not None:
        features.update(
            {
                "pointcloud_xyz": FeatureSpec(
                    kind="point_cloud",
                    shape=(n_points, 3),
                    dtype="float32",
                    rate_hz=rate_hz,
                    units="m",
                    frame="base",
                    source=recorded("pointcloud_xyz"),
                ),
                "pointcloud_rgb": FeatureSpec(
                    kind="point_cloud",
                    shape=(n_points, 3),
                    dtype="uint8",
                    rate_hz=rate_hz,
                    units="rgb",
                    source=recorded("pointcloud_rgb"),
                ),
                "pointcloud_mask": FeatureSpec(
                    kind="point_cloud",
                    shape=(n_points,),
                    dtype="bool",
                    rate_hz=rate_hz,
                    units="True = real point",
                    source=recorded("pointcloud_mask"),
                ),
            }
        )
    for camera, (height, width) in sorted(cameras.items()):
        features[f"{camera}_rgb"] = FeatureSpec(
            kind="image",
            shape=(height, width, 3),
            dtype="uint8",
            rate_hz=rate_hz,
            units="rgb",
            source=recorded(f"{camera}_rgb"),
        )
    return features


def read_capture(file, path: str | os.PathLike) -> dict | None:
    """The ``capture`` attribute of an open JoyLo file (JSON: camera key -> what produced it), if any."""
    import json

    text = file.attrs.get("capture")
    if text is None:
        return None
    try:
        return json.loads(text.decode() if isinstance(text, bytes) else str(text))
    except ValueError as error:
        raise IngestError(f"{path}: attribute 'capture' is not JSON: {error}") from error


class _EpisodeReader:
    """Reads the required datasets of one episode group, checking presence, length and values."""

    def __init__(self, group, where: str, episode: str) -> None:
        self.group, self.where, self.episode = group, where, episode
        self.length: int | None = None

    def error(self, key: str, problem: str) -> IngestError:
        return IngestError(f"{self.where}: key {key!r}, episode {self.episode}: {problem}")

    def has(self, key: str) -> bool:
        return key in self.group

    def read(self, key: str, width: int | None = None, min_width: int | None = None) -> np.ndarray:
        if key not in self.group:
            raise self.error(key, "required dataset is missing")
        try:
            values = np.asarray(self.group[key][()])
        except Exception as error:  # h5py raises OSError/KeyError/... on corrupt data
            raise self.error(key, f"cannot be read (corrupt?): {error}") from error
        if values.ndim == 0:
            raise self.error(key, "is a scalar, expected a time-major array")
        if self.length is None:
            self.length = len(values)
        elif len(values) != self.length:
            raise self.error(key, f"has {len(values)} steps, other datasets have {self.length}")
        if width is not None or min_width is not None:
            values = values.reshape(len(values), -1) if values.ndim <= 2 else values
            columns = values.shape[1] if values.ndim == 2 else -1
            if (width is not None and columns != width) or (min_width is not None and columns < min_width):
                raise self.error(key, f"has shape {values.shape}, expected (T, {width or f'>={min_width}'})")
        if np.issubdtype(values.dtype, np.floating) and not np.isfinite(values).all():
            frame = int(np.flatnonzero(~np.isfinite(values.reshape(len(values), -1)).all(axis=1))[0])
            raise self.error(key, f"NaN or infinite value at frame {frame}")
        return values


def read_joylo_episode(group, where: str, episode: str) -> dict[str, np.ndarray]:
    """The store arrays of one JoyLo episode (a raw file's root or a merged file's ``demo_i``)."""
    reader = _EpisodeReader(group, where, episode)
    f32 = np.float32
    actions = {
        "mobile_base": reader.read("action/mobile_base", width=3),
        "torso": reader.read("action/torso", width=TORSO_DOF),
        "left_arm": reader.read("action/left_arm", min_width=ARM_DOF)[:, :ARM_DOF],
        "left_gripper": reader.read("action/left_gripper", width=1),
        "right_arm": reader.read("action/right_arm", min_width=ARM_DOF)[:, :ARM_DOF],
        "right_gripper": reader.read("action/right_gripper", width=1),
    }
    arrays = {f"action_{part}": actions[part].astype(f32) for part, _ in ACTION_PARTS}
    arrays["action"] = np.concatenate([arrays[f"action_{part}"] for part, _ in ACTION_PARTS], axis=1)

    orientation = reader.read("obs/odom/orientation", width=4)
    if reader.has("obs/odom/base_velocity"):
        base_velocity = reader.read("obs/odom/base_velocity", width=3).astype(f32)
    else:
        linear = reader.read("obs/odom/linear_velocity", width=3)
        angular = reader.read("obs/odom/angular_velocity", width=3)
        if (np.linalg.norm(orientation, axis=1) < 1e-6).any():
            raise reader.error("obs/odom/orientation", "zero quaternion")
        base_velocity = base_frame_velocity(orientation, linear, angular)
    arrays["odom_base_velocity"] = base_velocity
    arrays["odom_position"] = reader.read("obs/odom/position", width=3).astype(f32)
    arrays["odom_orientation"] = orientation.astype(f32)
    arrays["proprio"] = np.concatenate(
        [
            base_velocity,
            reader.read("obs/joint_state/torso/joint_position", width=TORSO_DOF),
            reader.read("obs/joint_state/left_arm/joint_position", min_width=ARM_DOF)[:, :ARM_DOF],
            reader.read("obs/gripper_state/left_gripper/gripper_position", width=1),
            reader.read("obs/joint_state/right_arm/joint_position", min_width=ARM_DOF)[:, :ARM_DOF],
            reader.read("obs/gripper_state/right_gripper/gripper_position", width=1),
        ],
        axis=1,
    ).astype(f32)

    if reader.has("obs/point_cloud/fused/xyz"):  # recordings without a fused cloud store none
        xyz = reader.read("obs/point_cloud/fused/xyz")
        if xyz.ndim != 3 or xyz.shape[-1] != 3:
            raise reader.error("obs/point_cloud/fused/xyz", f"has shape {xyz.shape}, expected (T, N, 3)")
        rgb = reader.read("obs/point_cloud/fused/rgb")
        if rgb.shape != xyz.shape:
            raise reader.error(
                "obs/point_cloud/fused/rgb", f"has shape {rgb.shape}, expected {xyz.shape} like xyz"
            )
        if reader.has("obs/point_cloud/fused/padding_mask"):
            mask = reader.read("obs/point_cloud/fused/padding_mask")
            if mask.shape != xyz.shape[:2]:
                raise reader.error(
                    "obs/point_cloud/fused/padding_mask", f"has shape {mask.shape}, expected {xyz.shape[:2]}"
                )
        else:
            mask = np.ones(xyz.shape[:2], bool)
        arrays["pointcloud_xyz"] = xyz.astype(f32)
        arrays["pointcloud_rgb"] = as_uint8_image(rgb, reader.where, "obs/point_cloud/fused/rgb", episode)
        arrays["pointcloud_mask"] = mask.astype(bool)

    if "obs/rgb" in group:
        for camera in sorted(group["obs/rgb"]):
            key = f"obs/rgb/{camera}/img"
            frames = reader.read(key)
            if frames.ndim != 4 or frames.shape[-1] != 3:
                raise reader.error(key, f"has shape {frames.shape}, expected (T, H, W, 3)")
            arrays[f"{camera}_rgb"] = as_uint8_image(frames, reader.where, key, episode)
    if "obs/object_state" in group:
        for name in sorted(group["obs/object_state"]):
            key = f"obs/object_state/{name}"
            values = reader.read(key)
            if (
                not OBJECT_STATE_KEY.match(name)
                or values.ndim != 2
                or not np.issubdtype(values.dtype, np.floating)
            ):
                raise reader.error(
                    key, f"must be object<i>_<name>, (T, k) float; got {values.dtype} {values.shape}"
                )
            arrays[name] = values.astype(f32)
    return arrays


def _episode_groups(file, path: Path) -> list[str]:
    """'/' for a raw per-episode file, else the merged file's ``demo_i`` groups in numeric order."""
    if "obs" in file and "action" in file:
        return ["/"]
    demos = [name for name in file if name.startswith("demo_")]
    if not demos:
        raise IngestError(
            f"{path}: neither a raw JoyLo episode (obs/, action/) nor a merged file (demo_<i>/)"
        )
    return sorted(
        demos, key=lambda name: int(name.split("_", 1)[1]) if name.split("_", 1)[1].isdigit() else 1 << 60
    )


@dataclass(frozen=True)
class JoyloEpisode:
    """One planned JoyLo episode: its file and group (``/`` for a raw per-episode file)."""

    path: str
    group: str


class JoyloFormat(SourceFormat):
    """JoyLo recordings (the :class:`~demoscale.collect.source_format.SourceFormat` contract)."""

    name = "joylo"
    summary = "JoyLo per-episode HDF5 files or a merged BRS file"
    src_help = "an .h5/.hdf5 file or a directory searched for them"
    patterns = ("*.h5", "*.hdf5")
    what = "JoyLo HDF5 file"

    def plan(
        self, path: Path, ids: SourceIds, options: NoOptions, limit: int | None, progress: bool
    ) -> SourcePlan:
        """Validate every episode of one JoyLo file (they must share keys and shapes)."""
        path = Path(path).resolve()
        plans, first = [], None
        with open_hdf5(path) as file:
            rate_hz = float(file.attrs.get("record_freq", RECORD_RATE_HZ))
            capture = read_capture(file, path)
            for group in validating(_episode_groups(file, path)[:limit], path, progress):
                episode = "0" if group == "/" else group
                arrays = read_joylo_episode(file[group], str(path), episode)
                if first is None:
                    first = arrays
                elif _signature(arrays) != _signature(first):
                    raise IngestError(
                        f"{path}: episode {episode} has different keys/shapes from the file's first episode"
                    )
                source = str(path) if group == "/" else f"{path}#{group}"
                digest = ContentHash().arrays(arrays).hexdigest()
                plans.append(
                    EpisodePlan(source, digest, len(arrays["action"]), JoyloEpisode(str(path), group), ids)
                )
        cameras = {
            key[: -len("_rgb")]: first[key].shape[1:3]
            for key in first
            if key.endswith("_rgb") and not key.startswith("pointcloud_")
        }
        n_points = first["pointcloud_xyz"].shape[1] if "pointcloud_xyz" in first else None
        object_state = {key: int(first[key].shape[1]) for key in first if OBJECT_STATE_KEY.match(key)}
        return SourcePlan(joylo_features(n_points, cameras, rate_hz, capture, object_state), plans)

    def load(self, episode: JoyloEpisode, want_encoded: bool) -> LoadedEpisode:
        path = Path(episode.path)
        with open_hdf5(path) as file:
            return read_joylo_episode(file[episode.group], str(path), episode.group), None


JOYLO = JoyloFormat()


def _signature(arrays: Mapping[str, np.ndarray]) -> dict[str, tuple]:
    return {key: (value.shape[1:], value.dtype.str) for key, value in arrays.items()}


def ingest_joylo(src: str | os.PathLike, store: str | os.PathLike, **common: Any) -> IngestSummary:
    """Ingest JoyLo recordings into ``store``: a directory of raw per-episode HDF5 files (searched
    for ``*.h5`` / ``*.hdf5``), one such file, or a merged BRS file (``demo_<i>`` groups).

    Arms keep their first 6 joints; ``proprio`` and ``action`` follow the 21-dim whole-body layout
    (mobile base 3, torso 4, left arm 6, left gripper 1, right arm 6, right gripper 1); the base
    velocity is ``obs/odom/base_velocity`` where the file has it, else the odometry velocity rotated
    into the base frame. Depth images are not ingested. Everything is validated before writing.
    ``common`` are the driver's keywords (:func:`demoscale.collect.ingest`).
    """
    return ingest(JOYLO, src, store, NoOptions(), **common)
