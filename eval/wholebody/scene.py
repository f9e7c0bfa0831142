"""Procedural whole-body scenes: a Galaxea-R1-like mobile manipulator, a shelf, a table, clutter.

Everything is generated from integer ids: the environment id fixes the room (floor, wall colours,
lighting), the shelf (position, board height, colour), the table (position, height, colour) and the
clutter; the object id fixes the manipulated object (shape, size, colour, mass, friction). Both go
through :func:`demoscale.eval.ids.check_id`, so the train/unseen ranges of the tabletop apply.

Robot layout (names used by the environment and the expert):

- base: slide ``base_x``, slide ``base_y``, hinge ``base_yaw`` (holonomic), velocity actuators;
- torso: ``torso_lift`` (slide, m), ``torso_pitch1``, ``torso_pitch2`` (hinges about y, bend),
  ``torso_yaw`` (hinge about z); position actuators;
- arms ``left_arm_j1..j6`` / ``right_arm_j1..j6`` (shoulder pitch, shoulder yaw, upper-arm twist,
  elbow pitch, forearm twist, wrist pitch), links along +x at zero; position actuators;
- parallel grippers: two slide fingers per hand, each 0..50 mm, so the opening is 0..100 mm
  (the JoyLo gripper stroke); one position actuator per finger.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from demoscale.eval.ids import check_id

ARM_LINKS = (0.30, 0.25)  # upper arm, forearm (m)
SHOULDER_Y = 0.24
BASE_HALF = (0.22, 0.22, 0.12)
BASE_TOP = 0.27
LIFT_RANGE = (0.0, 0.55)
TORSO_COLUMN = 0.22  # lift carriage to the first pitch joint (m)
FINGER_STROKE = 0.05  # per finger (m); opening = 2 x stroke = 100 mm
GRIP_CENTER_X = 0.105  # grasp point ahead of the wrist-pitch joint (m)


@dataclass(frozen=True)
class SceneParams:
    """Everything an environment id decides."""

    env_id: int
    floor_rgb: tuple[tuple[float, float, float], tuple[float, float, float]]
    wall_rgb: tuple[float, float, float]
    light_dir: tuple[float, float, float]
    light_diffuse: float
    ambient: float
    shelf_x: float  # front edge of the shelf boards (m)
    shelf_y: float
    shelf_height: float  # top of the board holding the object (m)
    shelf_rgb: tuple[float, float, float]
    table_x: float  # front edge of the table top
    table_y: float
    table_height: float
    table_rgb: tuple[float, float, float]
    clutter: tuple[tuple[str, float, float, float, float, tuple[float, float, float]], ...]
    # (where: "shelf"/"floor"/"table", dx, dy, half size, half height, rgb)
    head_tilt: float  # head camera pitch down (rad)


@dataclass(frozen=True)
class ObjectParams:
    """Everything an object id decides."""

    object_id: int
    shape: str  # "box" or "cylinder"
    half_width: float  # half the size across the fingers (m)
    half_depth: float
    half_height: float
    rgb: tuple[float, float, float]
    mass: float
    friction: float


def _rgb(rng: np.random.Generator, low: float = 0.05, high: float = 0.95) -> tuple[float, float, float]:
    return tuple(float(v) for v in rng.uniform(low, high, 3))


def scene_params(env_id: int) -> SceneParams:
    """The procedural scene of ``env_id`` (deterministic; raises ``IdRangeError`` outside the ranges)."""
    env_id = check_id(env_id, "environment id")
    rng = np.random.default_rng([env_id, 7301])
    floor_a = _rgb(rng, 0.1, 0.9)
    floor_b = tuple(float(np.clip(c + rng.uniform(-0.2, 0.2), 0, 1)) for c in floor_a)
    light = rng.normal(size=3) * np.array([0.5, 0.5, 0.2]) + np.array([0.0, 0.0, -1.0])
    clutter = []
    for _ in range(int(rng.integers(0, 4))):
        where = str(rng.choice(["shelf", "floor", "table"]))
        clutter.append(
            (
                where,
                float(rng.uniform(0, 1)),
                float(rng.uniform(0, 1)),
                float(rng.uniform(0.02, 0.05)),
                float(rng.uniform(0.02, 0.08)),
                _rgb(rng),
            )
        )
    return SceneParams(
        env_id=env_id,
        floor_rgb=(floor_a, floor_b),
        wall_rgb=_rgb(rng, 0.3, 0.95),
        light_dir=tuple(float(v) for v in light / np.linalg.norm(light)),
        light_diffuse=float(rng.uniform(0.45, 0.9)),
        ambient=float(rng.uniform(0.15, 0.35)),
        shelf_x=float(rng.uniform(1.3, 1.7)),
        shelf_y=float(rng.uniform(-0.3, 0.3)),
        shelf_height=float(rng.uniform(0.5, 1.05)),
        shelf_rgb=_rgb(rng, 0.2, 0.8),
        table_x=float(rng.uniform(0.9, 1.3)),
        table_y=float(rng.uniform(-1.5, -1.2)),
        table_height=float(rng.uniform(0.5, 0.8)),
        table_rgb=_rgb(rng, 0.2, 0.8),
        clutter=tuple(clutter),
        head_tilt=float(rng.uniform(0.45, 0.6)),
    )


# touch_shelf: the shelf's front edge (m ahead of the start) and the object's board height (m).
# Nearer than fetch_shelf's shelf, so that an episode stays short; higher, so that the torso must
# rise by 0.25-0.55 m to bring the shoulder above the board (at lift 0 it is at or below it).
TOUCH_SHELF_X = (1.0, 1.3)
TOUCH_SHELF_HEIGHT = (0.8, 1.15)


def touch_scene_params(env_id: int) -> SceneParams:
    """The ``touch_shelf`` scene of ``env_id``: the room, table and clutter of :func:`scene_params`,
    with the shelf's position and board height drawn from the ``touch_shelf`` ranges."""
    scene = scene_params(env_id)
    rng = np.random.default_rng([scene.env_id, 7302])
    return replace(
        scene,
        shelf_x=float(rng.uniform(*TOUCH_SHELF_X)),
        shelf_y=float(rng.uniform(-0.3, 0.3)),
        shelf_height=float(rng.uniform(*TOUCH_SHELF_HEIGHT)),
    )


def object_params(object_id: int) -> ObjectParams:
    """The procedural object of ``object_id`` (deterministic; raises ``IdRangeError`` outside the ranges)."""
    object_id = check_id(object_id, "object id")
    rng = np.random.default_rng([object_id, 9127])
    shape = str(rng.choice(["box", "cylinder"]))
    half_width = float(rng.uniform(0.018, 0.035))
    return ObjectParams(
        object_id=object_id,
        shape=shape,
        half_width=half_width,
        half_depth=half_width if shape == "cylinder" else float(rng.uniform(0.018, 0.035)),
        half_height=float(rng.uniform(0.035, 0.07)),
        rgb=_rgb(rng),
        mass=float(rng.uniform(0.05, 0.5)),
        friction=float(rng.uniform(0.8, 1.2)),
    )


def _fmt(values) -> str:
    return " ".join(f"{float(v):.5g}" for v in np.atleast_1d(values))


def _arm_xml(side: str, sign: float) -> str:
    """One 6-DoF arm with a parallel gripper; ``sign`` is +1 for the left arm, -1 for the right."""
    upper, fore = ARM_LINKS
    robot = 'contype="2" conaffinity="1" group="1"'
    finger = 'contype="2" conaffinity="1" condim="4" friction="1.5 0.05 0.001" solref="0.01 1"'
    return f"""
      <body name="{side}_shoulder" pos="0 {sign * SHOULDER_Y:.4f} 0.12" gravcomp="1">
        <joint name="{side}_arm_j1" axis="0 1 0" range="-2.6 1.6"/>
        <geom type="sphere" size="0.05" rgba="0.25 0.25 0.28 1" mass="0.8" {robot}/>
        <body name="{side}_upper_yaw" gravcomp="1">
          <joint name="{side}_arm_j2" axis="0 0 1" range="-1.6 1.6"/>
          <inertial pos="0 0 0" mass="0.3" diaginertia="0.001 0.001 0.001"/>
          <body name="{side}_upper_arm" gravcomp="1">
            <joint name="{side}_arm_j3" axis="1 0 0" range="-2.6 2.6"/>
            <geom type="capsule" fromto="0 0 0 {upper} 0 0" size="0.04" rgba="0.8 0.8 0.82 1" mass="1.2" {robot}/>
            <body name="{side}_forearm" pos="{upper} 0 0" gravcomp="1">
              <joint name="{side}_arm_j4" axis="0 1 0" range="-2.6 0.3"/>
              <geom type="capsule" fromto="0 0 0 {fore} 0 0" size="0.035" rgba="0.25 0.25 0.28 1" mass="0.8" {robot}/>
              <body name="{side}_wrist" pos="{fore} 0 0" gravcomp="1">
                <joint name="{side}_arm_j5" axis="1 0 0" range="-2.6 2.6"/>
                <inertial pos="0 0 0" mass="0.2" diaginertia="0.0005 0.0005 0.0005"/>
                <body name="{side}_hand" gravcomp="1">
                  <joint name="{side}_arm_j6" axis="0 1 0" range="-1.8 1.8"/>
                  <geom type="box" size="0.03 0.055 0.025" pos="0.03 0 0" rgba="0.15 0.15 0.17 1" mass="0.4" {robot}/>
                  <camera name="{side}_wrist" pos="0.02 0 0.06" xyaxes="0 -1 0 0.5 0 0.866" fovy="75"/>
                  <body name="{side}_finger_a" pos="0.06 0 0" gravcomp="1">
                    <joint name="{side}_finger_a" type="slide" axis="0 1 0" range="0 {FINGER_STROKE}" damping="2"/>
                    <geom type="box" size="0.035 0.006 0.018" pos="0.035 0.006 0" rgba="0.9 0.9 0.9 1" mass="0.05" {finger}/>
                  </body>
                  <body name="{side}_finger_b" pos="0.06 0 0" gravcomp="1">
                    <joint name="{side}_finger_b" type="slide" axis="0 -1 0" range="0 {FINGER_STROKE}" damping="2"/>
                    <geom type="box" size="0.035 0.006 0.018" pos="0.035 -0.006 0" rgba="0.9 0.9 0.9 1" mass="0.05" {finger}/>
                  </body>
                  <body name="{side}_grip_center" pos="{GRIP_CENTER_X} 0 0"/>
                </body>
              </body>
            </body>
          </body>
        </body>
      </body>"""


def _head_xyaxes(tilt: float) -> str:
    forward = np.array([np.cos(tilt), 0.0, -np.sin(tilt)])
    right = np.array([0.0, -1.0, 0.0])
    up = np.cross(right, forward)  # image "up" for a camera whose -z is ``forward``
    return _fmt(np.concatenate([right, up]))


def _box_xml(name: str, pos, half, rgb, extra: str = "") -> str:
    return (
        f'<geom name="{name}" type="box" pos="{_fmt(pos)}" size="{_fmt(half)}" rgba="{_fmt(rgb)} 1" {extra}/>'
    )


def build_mjcf(scene: SceneParams, obj: ObjectParams) -> str:
    """The MJCF of one (environment, object) pair; the object starts on the shelf board."""
    static = 'contype="1" conaffinity="1"'
    board_depth, board_half_width, board_thick = 0.4, 0.45, 0.02
    shelf_cx = scene.shelf_x + board_depth / 2
    boards = []
    for index, top in enumerate(
        sorted({round(scene.shelf_height, 4), round(scene.shelf_height + 0.45, 4), 0.12})
    ):
        boards.append(
            _box_xml(
                f"shelf_board_{index}",
                (shelf_cx, scene.shelf_y, top - board_thick / 2),
                (board_depth / 2, board_half_width, board_thick / 2),
                scene.shelf_rgb,
                static,
            )
        )
    shelf_top = scene.shelf_height + 0.45
    for side in (-1, 1):
        boards.append(
            _box_xml(
                f"shelf_post_{'l' if side > 0 else 'r'}",
                (shelf_cx, scene.shelf_y + side * (board_half_width + 0.015), shelf_top / 2),
                (board_depth / 2, 0.015, shelf_top / 2),
                scene.shelf_rgb,
                static,
            )
        )
    boards.append(
        _box_xml(
            "shelf_back",
            (scene.shelf_x + board_depth + 0.01, scene.shelf_y, shelf_top / 2),
            (0.01, board_half_width, shelf_top / 2),
            scene.shelf_rgb,
            static,
        )
    )
    table_depth, table_half_width = 0.5, 0.4
    table_cx = scene.table_x + table_depth / 2
    table = [
        _box_xml(
            "table_top",
            (table_cx, scene.table_y, scene.table_height - 0.02),
            (table_depth / 2, table_half_width, 0.02),
            scene.table_rgb,
            static,
        )
    ]
    for i, (dx, dy) in enumerate(((-1, -1), (-1, 1), (1, -1), (1, 1))):
        table.append(
            _box_xml(
                f"table_leg_{i}",
                (
                    table_cx + dx * (table_depth / 2 - 0.03),
                    scene.table_y + dy * (table_half_width - 0.03),
                    (scene.table_height - 0.04) / 2,
                ),
                (0.02, 0.02, (scene.table_height - 0.04) / 2),
                scene.table_rgb,
                static,
            )
        )
    clutter = []
    for index, (where, u, v, half, half_h, rgb) in enumerate(scene.clutter):
        if where == "shelf":  # on the object's board, left of the object (away from the right hand)
            pos = (
                scene.shelf_x + 0.1 + 0.2 * u,
                scene.shelf_y + 0.22 + 0.15 * v,
                scene.shelf_height + half_h,
            )
        elif where == "table":  # far half of the table top
            pos = (table_cx + 0.05 + 0.12 * u, scene.table_y - 0.3 * v, scene.table_height + half_h)
        else:  # on the floor, left of the robot's path
            pos = (0.5 + 1.5 * u, 0.8 + 0.8 * v, half_h)
        clutter.append(
            f'<body name="clutter_{index}" pos="{_fmt(pos)}"><freejoint/>'
            f'<geom type="box" size="{_fmt((half, half, half_h))}" rgba="{_fmt(rgb)} 1" mass="0.2" {static}/></body>'
        )
    if obj.shape == "box":
        object_geom = f'type="box" size="{_fmt((obj.half_depth, obj.half_width, obj.half_height))}"'
    else:
        object_geom = f'type="cylinder" size="{_fmt((obj.half_width, obj.half_height))}"'
    object_pos = (scene.shelf_x + 0.09, scene.shelf_y, scene.shelf_height + obj.half_height + 0.001)
    floor_a, floor_b = scene.floor_rgb
    light = scene.light_dir
    head = _head_xyaxes(scene.head_tilt)
    lift_lo, lift_hi = LIFT_RANGE
    robot = 'contype="2" conaffinity="1" group="1"'
    base_x, base_y, base_z = BASE_HALF
    return f"""<mujoco model="wholebody_{scene.env_id}_{obj.object_id}">
  <compiler angle="radian" autolimits="true"/>
  <option timestep="0.002" integrator="implicitfast" cone="elliptic" impratio="5"/>
  <visual>
    <quality shadowsize="0" offsamples="0"/>
    <global offwidth="640" offheight="480"/>
    <headlight ambient="{scene.ambient:.3f} {scene.ambient:.3f} {scene.ambient:.3f}" diffuse="0.3 0.3 0.3"/>
    <map znear="0.001" zfar="1"/>  <!-- fractions of the model extent (~15 m): 1.5 cm .. 15 m -->
  </visual>
  <asset>
    <texture name="floor_tex" type="2d" builtin="checker" rgb1="{_fmt(floor_a)}" rgb2="{_fmt(floor_b)}" width="256" height="256"/>
    <material name="floor_mat" texture="floor_tex" texrepeat="8 8"/>
  </asset>
  <default>
    <joint damping="8" armature="0.05"/>
    <position kp="400" kv="20"/>
  </default>
  <worldbody>
    <light directional="true" dir="{_fmt(light)}" diffuse="{scene.light_diffuse:.3f} {scene.light_diffuse:.3f} {scene.light_diffuse:.3f}" castshadow="false"/>
    <geom name="floor" type="plane" size="5 5 0.1" material="floor_mat" {static}/>
    <geom name="wall_front" type="box" pos="4 0 1.5" size="0.05 4 1.5" rgba="{_fmt(scene.wall_rgb)} 1" {static}/>
    <geom name="wall_back" type="box" pos="-3 0 1.5" size="0.05 4 1.5" rgba="{_fmt(scene.wall_rgb)} 1" {static}/>
    <geom name="wall_left" type="box" pos="0.5 4 1.5" size="3.5 0.05 1.5" rgba="{_fmt(scene.wall_rgb)} 1" {static}/>
    <geom name="wall_right" type="box" pos="0.5 -4 1.5" size="3.5 0.05 1.5" rgba="{_fmt(scene.wall_rgb)} 1" {static}/>
    {chr(10).join(boards)}
    {chr(10).join(table)}
    {chr(10).join(clutter)}
    <body name="object" pos="{_fmt(object_pos)}">
      <freejoint name="object"/>
      <geom name="object" {object_geom} rgba="{_fmt(obj.rgb)} 1" mass="{obj.mass:.4f}" friction="{obj.friction:.3f} 0.02 0.001" condim="4" {static}/>
    </body>
    <body name="base" pos="0 0 0">
      <joint name="base_x" type="slide" axis="1 0 0" damping="0" armature="0"/>
      <joint name="base_y" type="slide" axis="0 1 0" damping="0" armature="0"/>
      <joint name="base_yaw" type="hinge" axis="0 0 1" damping="0" armature="0"/>
      <geom name="base" type="box" pos="0 0 {0.03 + base_z:.3f}" size="{base_x} {base_y} {base_z}" rgba="0.2 0.2 0.22 1" mass="40" {robot}/>
      <body name="torso_lift_link" pos="0 0 {BASE_TOP}" gravcomp="1">
        <joint name="torso_lift" type="slide" axis="0 0 1" range="{lift_lo} {lift_hi}"/>
        <geom type="box" pos="0 0 0.11" size="0.07 0.09 0.11" rgba="0.8 0.8 0.82 1" mass="6" {robot}/>
        <body name="torso_pitch1_link" pos="0 0 {TORSO_COLUMN}" gravcomp="1">
          <joint name="torso_pitch1" axis="0 1 0" range="-0.3 0.8"/>
          <geom type="capsule" fromto="0 0 0 0 0 0.12" size="0.07" rgba="0.25 0.25 0.28 1" mass="3" {robot}/>
          <body name="torso_pitch2_link" pos="0 0 0.12" gravcomp="1">
            <joint name="torso_pitch2" axis="0 1 0" range="-0.8 0.3"/>
            <inertial pos="0 0 0" mass="1" diaginertia="0.01 0.01 0.01"/>
            <body name="chest" pos="0 0 0.05" gravcomp="1">
              <joint name="torso_yaw" axis="0 0 1" range="-1.2 1.2"/>
              <geom type="box" pos="0 0 0.1" size="0.09 0.19 0.1" rgba="0.8 0.8 0.82 1" mass="5" {robot}/>
              <geom type="sphere" pos="0.02 0 0.3" size="0.08" rgba="0.2 0.2 0.22 1" mass="1" {robot}/>
              <camera name="head" pos="0.1 0 0.32" xyaxes="{head}" fovy="75"/>
              {_arm_xml("left", 1.0)}
              {_arm_xml("right", -1.0)}
            </body>
          </body>
        </body>
      </body>
    </body>
  </worldbody>
  <contact>
    <exclude body1="left_finger_a" body2="left_finger_b"/>
    <exclude body1="right_finger_a" body2="right_finger_b"/>
  </contact>
  <actuator>
    <velocity name="base_x" joint="base_x" kv="4000" ctrlrange="-1 1"/>
    <velocity name="base_y" joint="base_y" kv="4000" ctrlrange="-1 1"/>
    <velocity name="base_yaw" joint="base_yaw" kv="800" ctrlrange="-1.5 1.5"/>
    <position name="torso_lift" joint="torso_lift" kp="20000" kv="2000" ctrlrange="{lift_lo} {lift_hi}"/>
    <position name="torso_pitch1" joint="torso_pitch1" kp="3000" kv="300" ctrlrange="-0.3 0.8"/>
    <position name="torso_pitch2" joint="torso_pitch2" kp="3000" kv="300" ctrlrange="-0.8 0.3"/>
    <position name="torso_yaw" joint="torso_yaw" kp="2000" kv="200" ctrlrange="-1.2 1.2"/>
    {_actuators("left")}
    {_actuators("right")}
  </actuator>
</mujoco>
"""


def _actuators(side: str) -> str:
    lines = [f'<position name="{side}_arm_j{i}" joint="{side}_arm_j{i}"/>' for i in range(1, 7)]
    for finger in ("a", "b"):
        lines.append(
            f'<position name="{side}_finger_{finger}" joint="{side}_finger_{finger}" kp="300" kv="10" '
            f'ctrlrange="0 {FINGER_STROKE}" forcerange="-25 25"/>'
        )
    return "\n    ".join(lines)
