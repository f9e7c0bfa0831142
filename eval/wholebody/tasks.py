"""The whole-body tasks ``fetch_shelf`` and ``touch_shelf`` as registry entries, and their JoyLo
recording writer.

``fetch_shelf``: drive the mobile base to a shelf, raise and bend the torso to the board's height
(it varies with the environment), grasp the object with the right hand, carry it to a table and
place it there. Stages: base at the shelf; object lifted off the board in the hand; object carried
over the table; object resting on the table, released (= success).

``touch_shelf``: the first half of that, short enough to learn on a laptop (at most 150 control
steps; the expert takes about 60): drive to a nearer shelf, raise the torso to a higher board
(0.8-1.15 m, with the environment), touch the object on it with a hand. Stages: base at the shelf;
shoulder at the board's height; hand touching the standing object (= success). Its point cloud
leaves the floor out of the crop box and keeps 512 points, most of them on the shelf, the object
and the arms.

Recordings are raw JoyLo files (one HDF5 per episode, docs/formats.md section 4) written with
:func:`demoscale.collect.joylo.write_joylo_episode`, so ``demoscale ingest joylo`` takes them in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from demoscale.eval.geometry import quaternion_yaw
from demoscale.eval.tasks import TaskDefinition
from demoscale.eval.wholebody.env import (
    STAGES,
    TOUCH_STAGES,
    TouchShelfEnv,
    WholeBodyConfig,
    WholeBodyEnv,
)

_CONFIG_FIELDS = set(WholeBodyConfig.__dataclass_fields__)

# touch_shelf's observations and episode length where its options do not say otherwise.
TOUCH_SHELF_DEFAULTS: dict[str, Any] = {
    "max_steps": 150,
    "n_points": 512,
    # Base frame (m): the shelf is at most 1.9 m ahead and 0.8 m aside; z from 3 cm leaves the floor
    # (a fifth of fetch_shelf's points) out, so the points fall on the shelf, the object, the arms.
    "crop_min": (-0.3, -1.2, 0.03),
    "crop_max": (2.0, 1.2, 2.0),
}


def _make_env(
    task: str,
    env_class: type[WholeBodyEnv],
    defaults: Mapping[str, Any],
    env_id: int,
    object_id: int,
    image_size: int,
    render: bool,
    options: Mapping[str, Any],
) -> WholeBodyEnv:
    options = {**defaults, **options}
    if not render:
        options = {**options, "cameras": (), "point_cloud_cameras": ()}
    unknown = set(options) - _CONFIG_FIELDS
    if unknown:
        raise TypeError(
            f"unknown {task} options {sorted(unknown)}; expected some of {sorted(_CONFIG_FIELDS)}"
        )
    for key in ("cameras", "point_cloud_cameras", "crop_min", "crop_max"):
        if key in options:
            options[key] = tuple(options[key])
    return env_class(env_id, object_id, WholeBodyConfig(image_size=image_size, **options))


def make_fetch_shelf_env(
    env_id: int, object_id: int, image_size: int = 96, render: bool = True, **options: Any
) -> WholeBodyEnv:
    """A ``fetch_shelf`` environment; ``options`` are :class:`WholeBodyConfig` fields.

    ``render=False`` turns every camera off (no images, no point cloud): physics and expert only.
    """
    return _make_env("fetch_shelf", WholeBodyEnv, {}, env_id, object_id, image_size, render, options)


def make_touch_shelf_env(
    env_id: int, object_id: int, image_size: int = 96, render: bool = True, **options: Any
) -> WholeBodyEnv:
    """A ``touch_shelf`` environment; ``options`` are :class:`WholeBodyConfig` fields, defaulting to
    :data:`TOUCH_SHELF_DEFAULTS`. ``render=False``: physics and expert only, as for ``fetch_shelf``."""
    return _make_env(
        "touch_shelf", TouchShelfEnv, TOUCH_SHELF_DEFAULTS, env_id, object_id, image_size, render, options
    )


def _rotate_yaw(orientation_xyzw: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """Rotate base-frame (x, y) vectors into the odometry frame by the quaternions' yaw."""
    x, y, z, w = np.moveaxis(np.asarray(orientation_xyzw, np.float64), -1, 0)
    yaw = quaternion_yaw(w, x, y, z)
    c, s = np.cos(yaw), np.sin(yaw)
    return np.stack([c * vectors[:, 0] - s * vectors[:, 1], s * vectors[:, 0] + c * vectors[:, 1]], axis=1)


def episode_to_joylo(episode: Mapping[str, np.ndarray], rate_hz: float = 10.0) -> dict[str, np.ndarray]:
    """One recorded episode (store keys + ``action`` -> time-major arrays) in the raw JoyLo layout.

    Joint velocities/efforts come from the ``joylo_*`` observation keys where present; otherwise
    velocities are finite differences and efforts zero.
    """
    f32 = np.float32
    proprio = np.asarray(episode["proprio"], f32)
    action = np.asarray(episode["action"], f32)
    length = len(proprio)
    if action.shape != (length, 21):
        raise ValueError(f"episode action has shape {action.shape}, expected ({length}, 21)")
    joints = np.concatenate([proprio[:, 3:7], proprio[:, 7:13], proprio[:, 14:20]], axis=1)
    velocity = episode.get("joylo_joint_velocity")
    if velocity is None:
        velocity = np.gradient(joints, axis=0) * rate_hz if length > 1 else np.zeros_like(joints)
    effort = episode.get("joylo_joint_effort", np.zeros_like(joints))
    grippers = proprio[:, [13, 20]]
    gripper_velocity = episode.get("joylo_gripper_velocity")
    if gripper_velocity is None:
        gripper_velocity = np.gradient(grippers, axis=0) * rate_hz if length > 1 else np.zeros_like(grippers)
    gripper_effort = episode.get("joylo_gripper_effort", np.zeros_like(grippers))
    out: dict[str, np.ndarray] = {}
    for part, columns in (("torso", slice(0, 4)), ("left_arm", slice(4, 10)), ("right_arm", slice(10, 16))):
        out[f"obs/joint_state/{part}/joint_position"] = joints[:, columns]
        out[f"obs/joint_state/{part}/joint_velocity"] = np.asarray(velocity, f32)[:, columns]
        out[f"obs/joint_state/{part}/joint_effort"] = np.asarray(effort, f32)[:, columns]
    for index, side in enumerate(("left_gripper", "right_gripper")):
        group = f"obs/gripper_state/{side}"
        out[f"{group}/gripper_position"] = grippers[:, index]
        out[f"{group}/gripper_velocity"] = np.asarray(gripper_velocity, f32)[:, index]
        out[f"{group}/gripper_effort"] = np.asarray(gripper_effort, f32)[:, index]
    orientation = np.asarray(episode["odom_orientation"], f32)
    base_velocity = np.asarray(episode["odom_base_velocity"], f32)
    out["obs/odom/position"] = np.asarray(episode["odom_position"], f32)
    out["obs/odom/orientation"] = orientation
    linear = np.zeros((length, 3), f32)
    linear[:, :2] = _rotate_yaw(orientation, base_velocity[:, :2])
    angular = np.zeros((length, 3), f32)
    angular[:, 2] = base_velocity[:, 2]
    out["obs/odom/linear_velocity"] = linear
    out["obs/odom/angular_velocity"] = angular
    if "pointcloud_xyz" in episode:
        out["obs/point_cloud/fused/xyz"] = np.asarray(episode["pointcloud_xyz"], f32)
        out["obs/point_cloud/fused/rgb"] = np.asarray(episode["pointcloud_rgb"], np.uint8)
        out["obs/point_cloud/fused/padding_mask"] = np.asarray(episode["pointcloud_mask"], bool)
    for camera in ("head", "left_wrist", "right_wrist"):
        if f"{camera}_rgb" in episode:
            out[f"obs/rgb/{camera}/img"] = np.asarray(episode[f"{camera}_rgb"], np.uint8)
    for key in episode:
        if key.startswith("object"):  # the object_state option's simulator state
            out[f"obs/object_state/{key}"] = np.asarray(episode[key], f32)
    parts = (("mobile_base", 0, 3), ("torso", 3, 7), ("left_arm", 7, 13), ("left_gripper", 13, 14))
    parts += (("right_arm", 14, 20), ("right_gripper", 20, 21))
    for name, start, stop in parts:
        values = action[:, start:stop]
        out[f"action/{name}"] = values[:, 0] if stop - start == 1 else values
    return out


def write_joylo_demos(
    directory: Path,
    episodes: Sequence[Mapping[str, np.ndarray]],
    rate_hz: float = 10.0,
    capture: Mapping[str, Any] | None = None,
    task: str = "fetch_shelf",
) -> list[Path]:
    """Write each episode as ``episode_<k>.h5`` (raw JoyLo) in ``directory``; numbering continues
    after files already there, so repeated calls add episodes. ``capture`` (image key -> what
    rendered it) goes into the file attribute ``capture`` as JSON; ``task`` into ``task``."""
    import json

    from demoscale.collect.joylo import write_joylo_episode

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    taken = {
        int(p.stem.split("_")[1]) for p in directory.glob("episode_*.h5") if p.stem.split("_")[1].isdigit()
    }
    index = max(taken, default=-1) + 1
    paths = []
    for episode in episodes:
        attrs = {"record_freq": float(rate_hz), "robot": "galaxea_r1_sim", "task": task}
        for sensor in ("joint_state", "gripper_state", "odom", "point_cloud", "rgb"):
            attrs[f"{sensor}_freq"] = float(rate_hz)
        if capture:
            attrs["capture"] = json.dumps(dict(capture))
        path = directory / f"episode_{index}.h5"
        paths.append(write_joylo_episode(path, episode_to_joylo(episode, rate_hz), attrs))
        index += 1
    return paths


FETCH_SHELF = TaskDefinition(
    name="fetch_shelf",
    family="wholebody",
    source_format="joylo",
    make_env=make_fetch_shelf_env,
    write_demos=write_joylo_demos,
    low_dim_features={
        "proprio": (21,),
        "odom_base_velocity": (3,),
        "odom_position": (3,),
        "odom_orientation": (4,),
        "pointcloud_xyz": (WholeBodyConfig.n_points, 3),
        "pointcloud_rgb": (WholeBodyConfig.n_points, 3),
        "pointcloud_mask": (WholeBodyConfig.n_points,),
    },
    image_keys=("head_rgb",),
    action_dim=21,
    max_steps=WholeBodyConfig.max_steps,
    n_stages=len(STAGES),
    description="drive to a shelf, raise the torso, grasp the object, place it on a table (whole body, JoyLo)",
    extras={"stages": STAGES},
)


TOUCH_SHELF = TaskDefinition(
    name="touch_shelf",
    family="wholebody",
    source_format="joylo",
    make_env=make_touch_shelf_env,
    write_demos=partial(write_joylo_demos, task="touch_shelf"),
    low_dim_features={
        "proprio": (21,),
        "odom_base_velocity": (3,),
        "odom_position": (3,),
        "odom_orientation": (4,),
        "pointcloud_xyz": (TOUCH_SHELF_DEFAULTS["n_points"], 3),
        "pointcloud_rgb": (TOUCH_SHELF_DEFAULTS["n_points"], 3),
        "pointcloud_mask": (TOUCH_SHELF_DEFAULTS["n_points"],),
    },
    image_keys=("head_rgb",),
    action_dim=21,
    max_steps=TOUCH_SHELF_DEFAULTS["max_steps"],
    n_stages=len(TOUCH_STAGES),
    description="drive to a shelf, raise the torso to the board, touch the object (whole body, JoyLo)",
    extras={"stages": TOUCH_STAGES},
)
