"""Procedural tabletop scenes and objects, generated deterministically from integer ids.

An environment id fixes the table (texture, colours, friction), the floor and backdrop colours, the light, the
camera mounting jitter and 0-3 static distractors. An object id fixes the manipulated object's
shape family (box, cylinder, capsule, composite of boxes), size, colour, mass and friction. The
task adds its own fixed-colour elements (a target disc, a container) whose placement changes per
episode. Everything is plain MJCF text; nothing is read from disk.
"""

from __future__ import annotations

import colorsys
from dataclasses import dataclass

import numpy as np
from demoscale.eval.ids import check_id

_ENV_SALT = 0x7AB1E
_OBJECT_SALT = 0x0B1EC7

TABLE_HALF = 0.36  # the table top is a 0.72 m square whose surface is at z = 0
WORKSPACE_HALF = 0.2  # objects, targets and containers are placed within |x|, |y| < this
MAX_GRIPPER_WIDTH = 0.08


def _muted_rgb(rng: np.random.Generator, saturation: tuple[float, float], value: tuple[float, float]):
    hue = rng.uniform(0, 1)
    return colorsys.hsv_to_rgb(hue, rng.uniform(*saturation), rng.uniform(*value))


def _fmt(values) -> str:
    return " ".join(f"{float(v):.4g}" for v in values)


@dataclass(frozen=True)
class Distractor:
    shape: str  # "box" | "cylinder" | "sphere"
    size: tuple[float, ...]
    rgb: tuple[float, float, float]
    xy: tuple[float, float]


@dataclass(frozen=True)
class EnvParams:
    """Everything an environment id decides."""

    env_id: int
    table_texture: str  # "checker" | "gradient" | "flat" | "noise"
    table_rgb1: tuple[float, float, float]
    table_rgb2: tuple[float, float, float]
    table_texrepeat: float
    table_friction: float
    floor_rgb1: tuple[float, float, float]
    floor_rgb2: tuple[float, float, float]
    sky_rgb1: tuple[float, float, float]
    sky_rgb2: tuple[float, float, float]
    light_dir: tuple[float, float, float]
    light_diffuse: float
    ambient: float
    wrist_camera_offset: tuple[float, float, float]  # metres, added to the nominal mount
    wrist_camera_tilt: tuple[float, float]  # radians about x and y
    scene_camera_offset: tuple[float, float, float]
    scene_camera_tilt: tuple[float, float]
    distractors: tuple[Distractor, ...]


def env_params(env_id: int) -> EnvParams:
    """Scene parameters of environment ``env_id`` (deterministic; ids outside the ranges raise)."""
    env_id = check_id(env_id, "environment id")
    rng = np.random.default_rng([_ENV_SALT, env_id])
    texture = str(rng.choice(["checker", "gradient", "flat", "noise"]))
    table_rgb1 = _muted_rgb(rng, (0.0, 0.55), (0.25, 0.9))
    # The second colour is a variation of the first, so that the table reads as one surface.
    table_rgb2 = tuple(float(np.clip(c + rng.uniform(-0.25, 0.25), 0, 1)) for c in table_rgb1)
    azimuth = rng.uniform(0, 2 * np.pi)
    elevation = rng.uniform(np.deg2rad(35), np.deg2rad(85))
    light_dir = (
        -np.cos(elevation) * np.cos(azimuth),
        -np.cos(elevation) * np.sin(azimuth),
        -np.sin(elevation),
    )
    distractors = []
    for _ in range(int(rng.integers(0, 4))):
        # Distractors stand on the rim of the table, outside the workspace, so they never block
        # the task but do show up in the cameras.
        side = rng.integers(0, 4)
        along = rng.uniform(-TABLE_HALF + 0.04, TABLE_HALF - 0.04)
        across = rng.uniform(WORKSPACE_HALF + 0.06, TABLE_HALF - 0.03)
        xy = [(across, along), (-across, along), (along, across), (along, -across)][side]
        shape = str(rng.choice(["box", "cylinder", "sphere"]))
        size = {
            "box": (rng.uniform(0.015, 0.03), rng.uniform(0.015, 0.03), rng.uniform(0.015, 0.05)),
            "cylinder": (rng.uniform(0.012, 0.03), rng.uniform(0.015, 0.05)),
            "sphere": (rng.uniform(0.015, 0.03),),
        }[shape]
        distractors.append(
            Distractor(shape, tuple(map(float, size)), _muted_rgb(rng, (0.2, 0.9), (0.2, 0.95)), xy)
        )
    return EnvParams(
        env_id=env_id,
        table_texture=texture,
        table_rgb1=tuple(map(float, table_rgb1)),
        table_rgb2=table_rgb2,
        table_texrepeat=float(rng.uniform(2, 8)),
        table_friction=float(rng.uniform(0.5, 1.2)),
        floor_rgb1=tuple(map(float, _muted_rgb(rng, (0, 0.6), (0.1, 0.8)))),
        floor_rgb2=tuple(map(float, _muted_rgb(rng, (0, 0.6), (0.1, 0.8)))),
        sky_rgb1=tuple(map(float, _muted_rgb(rng, (0, 0.5), (0.3, 1.0)))),
        sky_rgb2=tuple(map(float, _muted_rgb(rng, (0, 0.5), (0.0, 0.6)))),
        light_dir=tuple(map(float, light_dir)),
        light_diffuse=float(rng.uniform(0.45, 1.0)),
        ambient=float(rng.uniform(0.15, 0.45)),
        wrist_camera_offset=tuple(map(float, rng.uniform(-0.008, 0.008, 3))),
        wrist_camera_tilt=tuple(map(float, rng.uniform(-0.06, 0.06, 2))),
        scene_camera_offset=tuple(map(float, rng.uniform(-0.03, 0.03, 3))),
        scene_camera_tilt=tuple(map(float, rng.uniform(-0.05, 0.05, 2))),
        distractors=tuple(distractors),
    )


@dataclass(frozen=True)
class Part:
    """One primitive geom of an object, in the object's frame (MJCF ``size`` semantics)."""

    shape: str  # "box" | "cylinder" | "capsule"
    size: tuple[float, ...]
    pos: tuple[float, float, float]
    euler: tuple[float, float, float] = (0.0, 0.0, 0.0)


@dataclass(frozen=True)
class ObjectParams:
    """Everything an object id decides. ``half_extent`` is the object's footprint (x, y) and
    ``height`` its full height when resting on the table; the object frame sits at its centre."""

    object_id: int
    family: str  # "box" | "cylinder" | "capsule" | "composite"
    parts: tuple[Part, ...]
    rgb: tuple[float, float, float]
    rgb2: tuple[float, float, float]
    mass: float
    friction: float
    half_extent: tuple[float, float]
    height: float

    @property
    def radius(self) -> float:
        """Radius of the footprint's circumscribed circle."""
        return float(np.hypot(*self.half_extent))

    @property
    def grasp_half_width(self) -> float:
        """Half of the object's width across the gripper when grasped along its local y axis."""
        return float(self.half_extent[1])


def object_params(object_id: int) -> ObjectParams:
    """Parameters of object ``object_id`` (deterministic; ids outside the ranges raise).

    Sizes keep every object graspable by the gripper (width across local y below 6.5 cm)."""
    object_id = check_id(object_id, "object id")
    rng = np.random.default_rng([_OBJECT_SALT, object_id])
    family = str(rng.choice(["box", "cylinder", "capsule", "composite"], p=[0.35, 0.3, 0.15, 0.2]))
    if family == "box":
        hx, hy, hz = rng.uniform(0.018, 0.032), rng.uniform(0.016, 0.03), rng.uniform(0.016, 0.035)
        parts = (Part("box", (hx, hy, hz), (0, 0, 0)),)
        half_extent, height = (hx, hy), 2 * hz
    elif family == "cylinder":
        r, hz = rng.uniform(0.017, 0.03), rng.uniform(0.016, 0.035)
        parts = (Part("cylinder", (r, hz), (0, 0, 0)),)
        half_extent, height = (r, r), 2 * hz
    elif family == "capsule":
        # Lying along x: footprint 2*(r+h) by 2r, height 2r.
        r, h = rng.uniform(0.017, 0.026), rng.uniform(0.01, 0.022)
        parts = (Part("capsule", (r, h), (0, 0, 0), (0.0, np.pi / 2, 0.0)),)
        half_extent, height = (r + h, r), 2 * r
    else:
        # A base box with a smaller box on top (offset along x): an asymmetric silhouette.
        hx, hy, hz = rng.uniform(0.022, 0.032), rng.uniform(0.016, 0.028), rng.uniform(0.012, 0.02)
        tx, ty, tz = hx * rng.uniform(0.3, 0.6), hy * rng.uniform(0.5, 1.0), rng.uniform(0.008, 0.015)
        shift = rng.uniform(-(hx - tx), hx - tx)
        height = 2 * hz + 2 * tz
        base_z = -height / 2 + hz
        parts = (
            Part("box", (hx, hy, hz), (0, 0, base_z)),
            Part("box", (tx, ty, tz), (shift, 0, base_z + hz + tz)),
        )
        half_extent = (hx, hy)
    return ObjectParams(
        object_id=object_id,
        family=family,
        parts=parts,
        rgb=tuple(map(float, _muted_rgb(rng, (0.3, 1.0), (0.25, 1.0)))),
        rgb2=tuple(map(float, _muted_rgb(rng, (0.3, 1.0), (0.25, 1.0)))),
        mass=float(rng.uniform(0.05, 0.3)),
        friction=float(rng.uniform(0.6, 1.2)),
        half_extent=tuple(map(float, half_extent)),
        height=float(height),
    )


def _look_at_xyaxes(
    position: np.ndarray, target: np.ndarray, up_hint: np.ndarray, jitter: tuple[float, float]
) -> str:
    """MJCF ``xyaxes`` of a camera at ``position`` looking at ``target`` with ``up_hint`` pointing
    up in the image, turned by small jitter angles (radians) about its own x and y axes."""
    forward = target - position
    forward = forward / np.linalg.norm(forward)
    right = np.cross(forward, up_hint)
    if np.linalg.norm(right) < 1e-6:
        right = np.array([0.0, -1.0, 0.0])
    right = right / np.linalg.norm(right)
    up = np.cross(right, forward)
    ax, ay = jitter
    # Rotate the image axes about the camera's x (pitch) and y (yaw) axes.
    up, forward = up * np.cos(ax) + forward * np.sin(ax), forward * np.cos(ax) - up * np.sin(ax)
    right, forward = right * np.cos(ay) - forward * np.sin(ay), forward * np.cos(ay) + right * np.sin(ay)
    return f"{_fmt(right)} {_fmt(up)}"


def _object_body(obj: ObjectParams, name: str = "object") -> str:
    total = sum(float(np.prod(p.size)) for p in obj.parts)
    # Lying capsules would roll away forever when pushed: give them rolling friction (condim 6).
    if obj.family == "capsule":
        contact = f'friction="{obj.friction:.3g} 0.005 0.004" condim="6" solref="0.02 1"'
    else:
        contact = f'friction="{obj.friction:.3g} 0.005 0.0001" condim="4" solref="0.02 1"'
    geoms = []
    for i, part in enumerate(obj.parts):
        material = "object_mat" if i == 0 else "object_mat2"
        geoms.append(
            f'<geom name="{name}_geom{i}" type="{part.shape}" size="{_fmt(part.size)}" pos="{_fmt(part.pos)}" '
            f'euler="{_fmt(part.euler)}" material="{material}" mass="{obj.mass * float(np.prod(part.size)) / total:.5g}" '
            f"{contact}/>"
        )
    return (
        f'<body name="{name}" pos="0 0 {obj.height / 2 + 0.001:.4g}">'
        f'<freejoint name="{name}_joint"/>{"".join(geoms)}</body>'
    )


def _distractor_geom(i: int, d: Distractor) -> str:
    z = {"box": d.size[-1], "cylinder": d.size[-1], "sphere": d.size[0]}[d.shape]
    return (
        f'<geom name="distractor{i}" type="{d.shape}" size="{_fmt(d.size)}" pos="{d.xy[0]:.4g} {d.xy[1]:.4g} {z:.4g}" '
        f'rgba="{_fmt(d.rgb)} 1"/>'
    )


def build_mjcf(
    env: EnvParams, obj: ObjectParams, task_worldbody: str = "", task_assets: str = "", image_size: int = 96
) -> str:
    """The full MJCF of one (environment, object) pair plus the task's own elements."""
    table_texture = {
        "checker": f'builtin="checker" rgb1="{_fmt(env.table_rgb1)}" rgb2="{_fmt(env.table_rgb2)}"',
        "gradient": f'builtin="gradient" rgb1="{_fmt(env.table_rgb1)}" rgb2="{_fmt(env.table_rgb2)}"',
        "flat": f'builtin="flat" rgb1="{_fmt(env.table_rgb1)}" rgb2="{_fmt(env.table_rgb2)}"',
        "noise": f'builtin="flat" mark="random" random="0.25" rgb1="{_fmt(env.table_rgb1)}" '
        f'rgb2="{_fmt(env.table_rgb2)}" markrgb="{_fmt(env.table_rgb2)}"',
    }[env.table_texture]
    # The wrist camera rides behind and above the fingers and looks past them at the table ahead,
    # like a gripper-mounted camera; the scene camera looks at the workspace from the front.
    wrist_pos = np.array([-0.1, 0.0, 0.17]) + np.array(env.wrist_camera_offset)
    wrist_axes = _look_at_xyaxes(
        wrist_pos, np.array([0.07, 0.0, -0.03]), np.array([1.0, 0, 0]), env.wrist_camera_tilt
    )
    scene_pos = np.array([0.0, -0.36, 0.42]) + np.array(env.scene_camera_offset)
    scene_axes = _look_at_xyaxes(scene_pos, np.zeros(3), np.array([0, 0, 1.0]), env.scene_camera_tilt)
    fingers = []
    for side, sign in (("left", 1), ("right", -1)):
        fingers.append(
            f'<body name="finger_{side}" pos="0 0 0" gravcomp="1">'
            f'<joint name="finger_{side}_joint" type="slide" axis="0 {sign} 0" range="0 {MAX_GRIPPER_WIDTH / 2}" '
            f'damping="150" armature="0.05"/>'
            f'<geom name="finger_{side}_geom" type="box" size="0.008 0.005 0.025" pos="0 {sign * 0.005} 0.015" '
            f'material="finger_mat" mass="0.05" friction="1.5 0.01 0.0001" condim="4"/></body>'
        )
    distractors = "".join(_distractor_geom(i, d) for i, d in enumerate(env.distractors))
    return f"""<mujoco model="tabletop">
  <compiler angle="radian" autolimits="true"/>
  <option timestep="0.01" integrator="implicitfast" cone="elliptic" impratio="5"/>
  <visual>
    <quality shadowsize="0" offsamples="0"/>
    <global offwidth="{image_size}" offheight="{image_size}"/>
    <headlight ambient="{env.ambient:.3g} {env.ambient:.3g} {env.ambient:.3g}" diffuse="0.2 0.2 0.2" specular="0 0 0"/>
  </visual>
  <asset>
    <texture name="table_tex" type="2d" {table_texture} width="32" height="32"/>
    <material name="table_mat" texture="table_tex" texrepeat="{env.table_texrepeat:.3g} {env.table_texrepeat:.3g}"/>
    <material name="object_mat" rgba="{_fmt(obj.rgb)} 1" specular="0.2"/>
    <material name="object_mat2" rgba="{_fmt(obj.rgb2)} 1" specular="0.2"/>
    <material name="finger_mat" rgba="0.15 0.15 0.17 1"/>
    <material name="palm_mat" rgba="0.35 0.35 0.38 1"/>
    {task_assets}
  </asset>
  <worldbody>
    <light name="sun" directional="true" castshadow="false" dir="{_fmt(env.light_dir)}" diffuse="{env.light_diffuse:.3g} {env.light_diffuse:.3g} {env.light_diffuse:.3g}" specular="0.1 0.1 0.1"/>
    <geom name="floor" type="plane" size="3 3 0.1" pos="0 0 -0.75" rgba="{_fmt(env.floor_rgb1)} 1" contype="0" conaffinity="0"/>
    <geom name="backdrop" type="box" size="1.6 1.6 1.2" pos="0 0 0.3" rgba="{_fmt(env.sky_rgb1)} 1" contype="0" conaffinity="0"/>
    <geom name="table" type="box" size="{TABLE_HALF} {TABLE_HALF} 0.02" pos="0 0 -0.02" material="table_mat" friction="{env.table_friction:.3g} 0.005 0.0001"/>
    <camera name="scene" pos="{_fmt(scene_pos)}" xyaxes="{scene_axes}" fovy="50"/>
    {distractors}
    {task_worldbody}
    {_object_body(obj)}
    <body name="gripper_target" mocap="true" pos="0 0 0.15"/>
    <body name="gripper" pos="0 0 0.15" gravcomp="1">
      <freejoint name="gripper_joint"/>
      <geom name="palm" type="box" size="0.012 0.05 0.01" pos="0 0 0.05" material="palm_mat" mass="0.3" contype="0" conaffinity="0"/>
      <camera name="wrist" pos="{_fmt(wrist_pos)}" xyaxes="{wrist_axes}" fovy="80"/>
      {"".join(fingers)}
    </body>
  </worldbody>
  <equality><weld body1="gripper_target" body2="gripper" solref="0.02 1" solimp="0.99 0.999 0.001"/></equality>
  <contact><exclude body1="finger_left" body2="finger_right"/></contact>
  <actuator>
    <position name="finger_left_act" joint="finger_left_joint" kp="1000" ctrlrange="0 {MAX_GRIPPER_WIDTH / 2}" forcerange="-30 30"/>
    <position name="finger_right_act" joint="finger_right_joint" kp="1000" ctrlrange="0 {MAX_GRIPPER_WIDTH / 2}" forcerange="-30 30"/>
  </actuator>
</mujoco>"""
