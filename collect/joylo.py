"""JoyLo (BRS, Galaxea R1) recordings: writers, reader/validator and ingestion into an episode store.

A raw recording is one HDF5 file per episode, recorded at 10 Hz::

    obs/joint_state/{left_arm,right_arm,torso}/{joint_position,joint_velocity,joint_effort,seq,stamp}
    obs/gripper_state/{left_gripper,right_gripper}/{gripper_position,gripper_velocity,gripper_effort,seq,stamp}
    obs/point_cloud/fused/{xyz (T,N,3) float32, rgb (T,N,3) uint8, padding_mask (T,N) bool, seq, stamp}
    obs/odom/{position (T,3), orientation (T,4) xyzw, linear_velocity (T,3), angular_velocity (T,3), seq, stamp}
    obs/rgb/{head,left_wrist,right_wrist}/{img (T,H,W,3) uint8, seq, stamp}
    action/{left_arm (T,6), right_arm (T,6), torso (T,4), left_gripper (T,), right_gripper (T,), mobile_base (T,3)}
    file attributes: record_freq, <sensor>_freq, horizon

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
from pathlib import Path
from typing import Any

import numpy as np
from demoscale.collect.ingest import IngestError

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
) -> dict:
    """Store features of ingested JoyLo episodes (keys of docs/interfaces.md); ``capture`` (camera
    key -> what produced it, the files' ``capture`` attribute) becomes their ``source``."""
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
    }
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
                ),
                "pointcloud_rgb": FeatureSpec(
                    kind="point_cloud", shape=(n_points, 3), dtype="uint8", rate_hz=rate_hz, units="rgb"
                ),
                "pointcloud_mask": FeatureSpec(
                    kind="point_cloud",
                    shape=(n_points,),
                    dtype="bool",
                    rate_hz=rate_hz,
                    units="True = real point",
                ),
            }
        )
    for camera, (height, width) in sorted(cameras.items()):
        source = (capture or {}).get(f"{camera}_rgb")
        features[f"{camera}_rgb"] = FeatureSpec(
            kind="image",
            shape=(height, width, 3),
            dtype="uint8",
            rate_hz=rate_hz,
            units="rgb",
            source=dict(source) if source else None,
        )
    return features


def read_capture(path: str | os.PathLike) -> dict | None:
    """The ``capture`` attribute of a JoyLo file (JSON: camera key -> what produced it), if any."""
    import json

    with _open_h5(Path(path)) as file:
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
        arrays["pointcloud_rgb"] = _as_uint8(rgb, reader, "obs/point_cloud/fused/rgb")
        arrays["pointcloud_mask"] = mask.astype(bool)

    if "obs/rgb" in group:
        for camera in sorted(group["obs/rgb"]):
            key = f"obs/rgb/{camera}/img"
            frames = reader.read(key)
            if frames.ndim != 4 or frames.shape[-1] != 3:
                raise reader.error(key, f"has shape {frames.shape}, expected (T, H, W, 3)")
            arrays[f"{camera}_rgb"] = _as_uint8(frames, reader, key)
    return arrays


def _as_uint8(values: np.ndarray, reader: _EpisodeReader, key: str) -> np.ndarray:
    if values.dtype == np.uint8:
        return values
    if np.issubdtype(values.dtype, np.floating) and not np.array_equal(values, np.round(values)):
        raise reader.error(key, f"{values.dtype} values are not integral colours")
    if values.min(initial=0) < 0 or values.max(initial=0) > 255:
        raise reader.error(key, "colour values outside 0..255")
    return values.astype(np.uint8)


def _open_h5(path: Path):
    import h5py

    try:
        return h5py.File(path, "r")
    except Exception as error:  # h5py raises OSError for truncated or non-HDF5 files
        raise IngestError(f"{path}: not a readable HDF5 file (truncated or corrupt?): {error}") from error


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


def _signature(arrays: Mapping[str, np.ndarray]) -> dict[str, tuple]:
    return {key: (value.shape[1:], value.dtype.str) for key, value in arrays.items()}


def plan_joylo_file(path: Path, ids, progress: bool = False):
    """Validate every episode of one JoyLo file; return (signature, rate_hz, plans)."""
    from demoscale.collect.ingest import ContentHash, EpisodePlan
    from tqdm import tqdm

    path = Path(path).resolve()
    plans, signature = [], None
    with _open_h5(path) as file:
        rate_hz = float(file.attrs.get("record_freq", RECORD_RATE_HZ))
        groups = _episode_groups(file, path)
        for group_name in tqdm(
            groups, desc=f"validate {path.name}", unit="episode", disable=not progress or len(groups) < 2
        ):
            episode = "0" if group_name == "/" else group_name
            arrays = read_joylo_episode(file[group_name], str(path), episode)
            if signature is None:
                signature = _signature(arrays)
            elif _signature(arrays) != signature:
                raise IngestError(
                    f"{path}: episode {episode} has different keys/shapes from the file's first episode"
                )
            digest = ContentHash()
            for key in sorted(arrays):
                digest.array(key, arrays[key])
            plans.append(
                EpisodePlan(
                    source=str(path) if group_name == "/" else f"{path}#{group_name}",
                    sha256=digest.hexdigest(),
                    length=len(arrays["action"]),
                    load_args={"path": str(path), "group": group_name},
                    env_id=ids.env_id,
                    object_id=ids.object_id,
                    task=ids.task,
                    operator=ids.operator,
                )
            )
    return signature, rate_hz, plans


def load_joylo_episode(args: Mapping, want_encoded: bool):
    """Loader for one planned JoyLo episode."""
    path = Path(args["path"])
    with _open_h5(path) as file:
        return read_joylo_episode(file[args["group"]], str(path), args["group"]), None


def ingest_joylo(
    src: str | os.PathLike,
    store: str | os.PathLike,
    *,
    env_id: str | None = None,
    object_id: str | None = None,
    task: str | None = None,
    operator: str | None = None,
    manifest: str | os.PathLike | None = None,
    image_codec: str | None = None,
    workers: int = 1,
    dry_run: bool = False,
    progress: bool = True,
    lock_timeout: float | None = None,
):
    """Ingest JoyLo recordings into ``store``: a directory of raw per-episode HDF5 files (searched
    for ``*.h5`` / ``*.hdf5``), one such file, or a merged BRS file (``demo_<i>`` groups).

    Arms keep their first 6 joints; ``proprio`` and ``action`` follow the 21-dim whole-body layout
    (mobile base 3, torso 4, left arm 6, left gripper 1, right arm 6, right gripper 1); the base
    velocity is ``obs/odom/base_velocity`` where the file has it, else the odometry velocity rotated
    into the base frame. Depth images are not ingested. Everything is validated before writing.
    """
    import time

    from demoscale.collect.ingest import write_plans
    from demoscale.collect.sources import resolve_sources

    started = time.perf_counter()
    overrides = {"env_id": env_id, "object_id": object_id, "task": task, "operator": operator}
    sources = resolve_sources(
        src, ["*.h5", "*.hdf5"], manifest=manifest, overrides=overrides, what="JoyLo HDF5 file"
    )
    signature, rates, plans, captures = None, set(), [], []
    for path, ids in sources:
        file_signature, rate_hz, file_plans = plan_joylo_file(path, ids, progress=progress)
        if signature is not None and file_signature != signature:
            raise IngestError(
                f"{path}: keys/shapes {file_signature} differ from the first file's {signature}"
            )
        captures.append(read_capture(path))
        if captures[-1] != captures[0]:
            raise IngestError(
                f"{path}: cameras recorded as {captures[-1]}, the first file's as {captures[0]}"
            )
        signature = signature or file_signature
        rates.add(rate_hz)
        plans.extend(file_plans)
    if len(rates) > 1:
        raise IngestError(f"{src}: files record different rates {sorted(rates)}")
    cameras = {
        key[: -len("_rgb")]: shape[:2]
        for key, (shape, _) in signature.items()
        if key.endswith("_rgb") and not key.startswith("pointcloud_")
    }
    n_points = signature["pointcloud_xyz"][0][0] if "pointcloud_xyz" in signature else None
    features = joylo_features(n_points, cameras, rates.pop(), captures[0] if captures else None)
    return write_plans(
        store,
        features,
        plans,
        load_joylo_episode,
        sources=[str(p) for p, _ in sources],
        image_codec=image_codec,
        workers=workers,
        dry_run=dry_run,
        progress=progress,
        started=started,
        lock_timeout=lock_timeout,
    )
