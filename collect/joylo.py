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
