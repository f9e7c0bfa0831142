"""Tabletop tasks (``reach``, ``push``, ``pick_place``), their staged scores and their scripted experts.

Scores follow the staged scheme of the data-scaling-laws study: each task has three stages,
latched over an episode; an episode's score is the highest stage reached divided by three, and its
success flag is whether the final condition holds at the end.

Experts read the simulator state (they are privileged) and output absolute pose targets. Their
human-like variation is consistent over time, so that action chunks stay predictable: per-episode
speeds, heights, approach via-points and grasp offsets, plus a small smooth (sinusoidal) drift -
never per-step white noise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from demoscale.eval.tabletop.env import TabletopEnv
from demoscale.eval.tabletop.scene import MAX_GRIPPER_WIDTH, ObjectParams
from demoscale.eval.tasks import TaskDefinition

TARGET_RADIUS = 0.05
TARGET_RGB = "0.95 0.12 0.1"
CONTAINER_INNER_HALF = 0.07
CONTAINER_WALL = 0.006
CONTAINER_HEIGHT = 0.03
CONTAINER_RGB = "0.92 0.92 0.95"
PUSHER_HALF = (0.008, 0.01)  # closed fingers' footprint half extents along the gripper's x, y


def _unit(v: np.ndarray) -> np.ndarray:
    n = float(np.linalg.norm(v))
    return v / n if n > 1e-9 else np.array([1.0, 0.0])


def _object_support(obj: ObjectParams, yaw: float, direction: np.ndarray) -> float:
    """Extent of the object's footprint from its centre along ``direction`` (a unit 2-vector)."""
    ox = np.array([np.cos(yaw), np.sin(yaw)])
    oy = np.array([-np.sin(yaw), np.cos(yaw)])
    if obj.family == "cylinder":
        return obj.half_extent[0]
    if obj.family == "capsule":
        r = obj.half_extent[1]
        return (obj.half_extent[0] - r) * abs(direction @ ox) + r
    return obj.half_extent[0] * abs(direction @ ox) + obj.half_extent[1] * abs(direction @ oy)


def _pusher_support(gripper_yaw: float, direction: np.ndarray) -> float:
    gx = np.array([np.cos(gripper_yaw), np.sin(gripper_yaw)])
    gy = np.array([-np.sin(gripper_yaw), np.cos(gripper_yaw)])
    return PUSHER_HALF[0] * abs(direction @ gx) + PUSHER_HALF[1] * abs(direction @ gy)


class SmoothDrift:
    """A small, smooth offset over time: per axis, two sinusoids with random amplitude/period/phase."""

    def __init__(self, rng: np.random.Generator, amplitude: float, dims: int = 3) -> None:
        self.amplitude = rng.uniform(0.3, 1.0, (dims, 2)) * amplitude / 2
        self.period_steps = rng.uniform(15, 60, (dims, 2))
        self.phase = rng.uniform(0, 2 * np.pi, (dims, 2))

    def __call__(self, t: int) -> np.ndarray:
        return (self.amplitude * np.sin(2 * np.pi * t / self.period_steps + self.phase)).sum(axis=1)


class _Expert:
    """Shared machinery: a commanded pose that moves toward goals at a per-episode speed."""

    def __init__(self, env: TabletopEnv, seed: int) -> None:
        self.env = env
        self.rng = np.random.default_rng([0xE7E, int(seed), env.env_id, env.object_id])
        self.cmd = env.eef_pos
        self.speed = self.rng.uniform(0.025, 0.035)
        self.drift = SmoothDrift(self.rng, self.rng.uniform(0.002, 0.005))
        self.yaw = 0.0
        self.width = MAX_GRIPPER_WIDTH
        self.phase = "start"
        self.t = 0
        self.timer = 0
        self.done = False

    def _move(self, goal: np.ndarray, speed: float | None = None, tolerance: float = 0.004) -> bool:
        """Advance the command toward ``goal``; slow down over the last centimetres; True on arrival."""
        speed = self.speed if speed is None else speed
        speed *= min(1.0, (self.timer + 1) / 3)  # ease in at the start of every phase
        delta = goal - self.cmd
        distance = float(np.linalg.norm(delta))
        step = min(speed, distance, max(0.5 * distance, 0.006))
        if distance > 1e-9:
            self.cmd = self.cmd + delta / distance * step
        return float(np.linalg.norm(goal - self.cmd)) < tolerance

    def _set_phase(self, phase: str) -> None:
        self.phase, self.timer = phase, 0

    def plan(self) -> None:
        raise NotImplementedError

    def act(self, obs: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
        """The next absolute action [x y z rx ry rz width] (``obs`` is unused: the expert is privileged)."""
        self.plan()
        self.t += 1
        self.timer += 1
        position = self.cmd + self.drift(self.t)
        return np.array([*position, 0.0, 0.0, self.yaw, self.width], dtype=np.float64)


class PushExpert(_Expert):
    """Approach behind the object (optionally through a via-point), descend, push it along the
    line to the target while re-aiming at every step, then lift away."""

    def __init__(self, env: PushEnv, seed: int) -> None:
        super().__init__(env, seed)
        rng = self.rng
        self.yaw = rng.uniform(-0.35, 0.35)
        self.width = 0.0
        self.approach_height = rng.uniform(0.07, 0.12)
        self.push_height = rng.uniform(0.014, 0.022)
        self.clearance = rng.uniform(0.025, 0.045)
        self.push_step = rng.uniform(0.008, 0.013)  # metres per control step while pushing
        self.stop_distance = rng.uniform(0.004, 0.015)
        self.lateral_bias = rng.uniform(-0.004, 0.004)
        self.via = None
        if rng.random() < 0.5:
            start, goal = self.cmd[:2], self._pre_push()
            normal = np.array([-(goal - start)[1], (goal - start)[0]])
            self.via = (start + goal) / 2 + _unit(normal) * rng.uniform(-0.05, 0.05)

    def _line(self) -> tuple[np.ndarray, np.ndarray, float]:
        env = self.env
        obj_xy = env.object_pos[:2]
        direction = _unit(env.layout["target"] - obj_xy)
        contact = _object_support(env.object, env.object_yaw, direction) + _pusher_support(
            self.yaw, direction
        )
        return obj_xy, direction, contact

    def _pre_push(self) -> np.ndarray:
        obj_xy, direction, contact = self._line()
        normal = np.array([-direction[1], direction[0]])
        return obj_xy - direction * (contact + self.clearance) + normal * self.lateral_bias

    def plan(self) -> None:
        env = self.env
        if self.phase == "start":
            self._set_phase("via" if self.via is not None else "approach")
        if self.phase == "via":
            if self._move(np.array([*self.via, self.approach_height]), tolerance=0.02):
                self._set_phase("approach")
        elif self.phase == "approach":
            if self._move(np.array([*self._pre_push(), self.approach_height]), tolerance=0.008):
                self._set_phase("descend")
        elif self.phase == "descend":
            if self._move(np.array([*self._pre_push(), self.push_height]), tolerance=0.004):
                self._set_phase("push")
        elif self.phase == "push":
            obj_xy, direction, contact = self._line()
            normal = np.array([-direction[1], direction[0]])
            lateral = float((self.cmd[:2] - obj_xy) @ normal)
            behind = float((obj_xy - self.cmd[:2]) @ direction)
            lost = abs(lateral) > 0.8 * _object_support(env.object, env.object_yaw, normal)
            if lost or behind < 0.5 * _object_support(env.object, env.object_yaw, direction):
                self._set_phase("realign")  # slid off the object's side: lift and approach again
            elif float(np.linalg.norm(env.layout["target"] - obj_xy)) < self.stop_distance:
                self._set_phase("retreat")
            else:
                # Advance along the line at the pushing speed and steer back onto the line
                # through the object's centre; no contact model needed, the object is re-read.
                steer = -normal * 0.5 * (lateral - self.lateral_bias)
                step_xy = direction * self.push_step + steer
                self.cmd = np.array([*(self.cmd[:2] + step_xy), self.push_height])
        elif self.phase == "realign":
            if self._move(self.cmd + np.array([0, 0, 0.05]), tolerance=0.01) or self.timer > 3:
                self._set_phase("approach")
        elif self.phase == "retreat":
            self._move(self.cmd + np.array([0, 0, 0.03]))
            if self.timer >= 3:
                self.done = True


class PickPlaceExpert(_Expert):
    """Hover above the object aligned with its grasp axis, descend, close, lift, carry over the
    container, lower, open and lift away."""

    def __init__(self, env: PickPlaceEnv, seed: int) -> None:
        super().__init__(env, seed)
        rng = self.rng
        self.yaw = self._grasp_yaw()
        self.open_width = rng.uniform(0.07, MAX_GRIPPER_WIDTH)
        self.hover_height = rng.uniform(0.08, 0.12)
        self.carry_height = rng.uniform(0.1, 0.14)
        self.grasp_height = 0.014 + rng.uniform(0.0, 0.006)
        self.grasp_offset = rng.uniform(-0.004, 0.004, 2)
        self.place_offset = rng.uniform(-0.015, 0.015, 2)
        self.close_steps = int(rng.integers(3, 6))
        self.width = self.open_width

    def _grasp_yaw(self) -> float:
        """Gripper yaw closing across the object's narrow side, the one nearest zero."""
        period = np.pi if self.env.object.family == "capsule" else np.pi / 2
        return float((self.env.object_yaw + period / 2) % period - period / 2)

    def _holding(self) -> bool:
        env = self.env
        return env.fingers_touch_object() and env.object_pos[2] > env.object.height / 2 + 0.01

    def plan(self) -> None:
        env = self.env
        obj_xy = env.object_pos[:2]
        if self.phase == "start":
            self._set_phase("hover")
        if self.phase == "hover":
            if self._move(np.array([*(obj_xy + self.grasp_offset), self.hover_height]), tolerance=0.006):
                self._set_phase("descend")
        elif self.phase == "descend":
            goal = np.array([*(obj_xy + self.grasp_offset), self.grasp_height])
            if self._move(goal, tolerance=0.003):
                self._set_phase("close")
        elif self.phase == "close":
            self.width = 0.0
            if self.timer >= self.close_steps:
                self._set_phase("lift")
        elif self.phase == "lift":
            if self._move(np.array([*self.cmd[:2], self.carry_height]), tolerance=0.01):
                self._set_phase("carry")
        elif self.phase in ("carry", "lower") and not self._holding():
            # Dropped it: open, rise and grasp again (people do the same).
            self.width = self.open_width
            self.yaw = self._grasp_yaw()
            self._set_phase("hover")
        elif self.phase == "carry":
            goal_xy = env.layout["container"] + self.place_offset
            if self._move(np.array([*goal_xy, self.carry_height]), tolerance=0.008):
                self._set_phase("lower")
        elif self.phase == "lower":
            # Lower until the object's bottom is just above the container's rim.
            bottom = env.object_pos[2] - env.object.height / 2
            goal_z = self.cmd[2] - (bottom - (CONTAINER_HEIGHT + 0.012))
            if self._move(np.array([*self.cmd[:2], goal_z]), tolerance=0.004):
                self._set_phase("open")
        elif self.phase == "open":
            self.width = self.open_width
            if self.timer >= 3:
                self._set_phase("retreat")
        elif self.phase == "retreat":
            self._move(self.cmd + np.array([0, 0, 0.03]))
            if self.timer >= 3:
                self.done = True


class ReachExpert(_Expert):
    """Move above the object (with a per-episode offset of a few millimetres), pause, descend, and
    touch its top with the closed fingers."""

    def __init__(self, env: ReachEnv, seed: int) -> None:
        super().__init__(env, seed)
        rng = self.rng
        # A third of the other experts' pace: episodes of 20-40 steps, longer than a policy's action chunk.
        self.speed = rng.uniform(0.009, 0.013)
        self.yaw = rng.uniform(-0.35, 0.35)
        self.width = 0.0
        self.hover_height = rng.uniform(0.06, 0.1)
        self.offset = rng.uniform(-0.004, 0.004, 2)
        self.hold_steps = int(rng.integers(1, 3))
        self.dwell_steps = int(rng.integers(2, 5))  # a pause above the object, as people do

    def plan(self) -> None:
        env = self.env
        above = env.object_pos[:2] + self.offset
        if self.phase == "start":
            self._set_phase("hover")
        if self.phase == "hover":
            if self._move(np.array([*above, self.hover_height]), tolerance=0.01):
                self._set_phase("dwell")
        elif self.phase == "dwell":
            if self.timer >= self.dwell_steps:
                self._set_phase("descend")
        elif self.phase == "descend":
            # The fingertips hang 1 cm below the tool-centre point: aim 5 mm into the object's top.
            goal_z = env.object.height + 0.01 - 0.005
            self._move(np.array([*above, goal_z]), tolerance=0.002)
            if env.fingers_touch_object():
                self._set_phase("touch")
        elif self.phase == "touch":
            if self.timer >= self.hold_steps:
                self.done = True


class ReachEnv(TabletopEnv):
    """Touch the object with the closed fingers. Stages: 1 gripper's horizontal distance to the
    object halved; 2 gripper within 2.5 cm horizontally of the object's centre; 3 fingers touch the
    object (= success). The simplest visually guided task: only the object must be found."""

    task = "reach"
    max_steps = 80

    def _place_task(self, rng: np.random.Generator) -> None:
        obj_xy = rng.uniform(-0.15, 0.15, 2)
        self._place_object(obj_xy, rng.uniform(-np.pi / 3, np.pi / 3))
        self.layout = {"object_start": obj_xy}

    def _horizontal_distance(self) -> float:
        return float(np.linalg.norm(self.eef_pos[:2] - self.object_pos[:2]))

    def reset(self, seed: int) -> dict[str, np.ndarray]:
        obs = super().reset(seed)
        self._start_distance = self._horizontal_distance()
        return obs

    def success(self) -> bool:
        return self.fingers_touch_object()

    def _update_stages(self) -> None:
        distance = self._horizontal_distance()
        if distance <= 0.5 * self._start_distance:
            self._stages[0] = True
        if distance < 0.025:
            self._stages[1] = True
        if self.success():
            self._stages[2] = True

    def expert(self, seed: int) -> ReachExpert:
        return ReachExpert(self, seed)


class PushEnv(TabletopEnv):
    """Push the object into the red target disc. Stages: 1 object moved >= 1.5 cm; 2 object's
    distance to the target halved; 3 object's centre inside the target disc (= success)."""

    task = "push"
    max_steps = 100
    goal_layout_key = "target"

    def _task_worldbody(self) -> str:
        return (
            '<body name="target" pos="0 0 0">'
            f'<geom name="target_rim" type="cylinder" size="{TARGET_RADIUS + 0.006} 0.0005" pos="0 0 0.0005" '
            'rgba="1 1 1 1" contype="0" conaffinity="0"/>'
            f'<geom name="target_disc" type="cylinder" size="{TARGET_RADIUS} 0.0006" pos="0 0 0.0008" '
            f'rgba="{TARGET_RGB} 1" contype="0" conaffinity="0"/></body>'
        )

    def _place_task(self, rng: np.random.Generator) -> None:
        for _ in range(1000):
            obj_xy = rng.uniform(-0.1, 0.1, 2)
            angle = rng.uniform(-np.pi, np.pi)
            target = obj_xy + rng.uniform(0.12, 0.18) * np.array([np.cos(angle), np.sin(angle)])
            if np.all(np.abs(target) < 0.17):
                break
        self.model.body_pos[self.model.body("target").id] = [target[0], target[1], 0]
        self._place_object(obj_xy, rng.uniform(-np.pi / 3, np.pi / 3))
        self.layout = {"target": target, "object_start": obj_xy}

    def target_distance(self) -> float:
        return float(np.linalg.norm(self.object_pos[:2] - self.layout["target"]))

    def success(self) -> bool:
        return self.target_distance() < TARGET_RADIUS

    def _update_stages(self) -> None:
        start = self.layout["object_start"]
        if np.linalg.norm(self.object_pos[:2] - start) >= 0.015:
            self._stages[0] = True
        if self.target_distance() <= 0.5 * np.linalg.norm(self.layout["target"] - start):
            self._stages[1] = True
        if self.success():
            self._stages[2] = True

    def expert(self, seed: int) -> PushExpert:
        return PushExpert(self, seed)


class PickPlaceEnv(TabletopEnv):
    """Pick the object and place it in the white container. Stages: 1 object lifted >= 2 cm while
    held; 2 object above (or in) the container; 3 object resting in the container, released (= success)."""

    task = "pick_place"
    max_steps = 120
    goal_layout_key = "container"

    def _task_worldbody(self) -> str:
        h, t, w = CONTAINER_INNER_HALF, CONTAINER_WALL, CONTAINER_HEIGHT
        walls = [
            (f"{h + t} {t / 2} {w / 2}", f"0 {h + t / 2} {w / 2}"),
            (f"{h + t} {t / 2} {w / 2}", f"0 {-(h + t / 2)} {w / 2}"),
            (f"{t / 2} {h} {w / 2}", f"{h + t / 2} 0 {w / 2}"),
            (f"{t / 2} {h} {w / 2}", f"{-(h + t / 2)} 0 {w / 2}"),
        ]
        geoms = "".join(
            f'<geom name="container_wall{i}" type="box" size="{size}" pos="{pos}" rgba="{CONTAINER_RGB} 1"/>'
            for i, (size, pos) in enumerate(walls)
        )
        floor = (
            f'<geom name="container_floor" type="box" size="{h} {h} 0.001" pos="0 0 0.001" '
            'rgba="0.3 0.45 0.85 1" contype="0" conaffinity="0"/>'
        )
        return f'<body name="container" pos="0.3 0 0">{geoms}{floor}</body>'

    def _place_task(self, rng: np.random.Generator) -> None:
        container = rng.uniform(-0.13, 0.13, 2)
        keep_out = CONTAINER_INNER_HALF + CONTAINER_WALL + self.object.radius + 0.04
        for _ in range(1000):
            obj_xy = rng.uniform(-0.15, 0.15, 2)
            if np.max(np.abs(obj_xy - container)) > keep_out:
                break
        self.model.body_pos[self.model.body("container").id] = [container[0], container[1], 0]
        self._place_object(obj_xy, rng.uniform(-np.pi / 3, np.pi / 3))
        self.layout = {"container": container, "object_start": obj_xy}

    def _inside_container_xy(self) -> bool:
        offset = np.abs(self.object_pos[:2] - self.layout["container"])
        return bool(np.all(offset < CONTAINER_INNER_HALF))

    def success(self) -> bool:
        resting_z = CONTAINER_HEIGHT + self.object.height / 2
        return (
            self._inside_container_xy() and self.object_pos[2] < resting_z and not self.fingers_touch_object()
        )

    def _update_stages(self) -> None:
        lifted = self.object_pos[2] > self.object.height / 2 + 0.02
        if lifted and self.fingers_touch_object():
            self._stages[0] = True
        if self._stages[0] and self._inside_container_xy():
            self._stages[1] = True
        if self.success():
            self._stages[2] = True

    def expert(self, seed: int) -> PickPlaceExpert:
        return PickPlaceExpert(self, seed)


def write_umi_demos(
    directory: Path,
    episodes: Sequence[Mapping[str, np.ndarray]],
    rate_hz: float,
    capture: Mapping[str, Any] | None = None,
) -> list[Path]:
    """Write episodes (store keys -> time-major arrays) as one UMI ``dataset.zarr.zip`` in
    ``directory``; ``capture`` (camera key -> what rendered it) goes into the zip's attributes. The
    object state of ``object_state=True`` goes in as the zip's ``object<i>_...`` arrays."""
    from demoscale.collect.umi import write_umi_zip

    umi_episodes = [
        {key: value for key, value in episode.items() if key.startswith(("camera", "robot", "object"))}
        for episode in episodes
    ]
    path = Path(directory) / "dataset.zarr.zip"
    return [write_umi_zip(path, umi_episodes, rate_hz=rate_hz, capture=capture)]


_LOW_DIM = {"robot0_eef_pos": (3,), "robot0_eef_rot_axis_angle": (3,), "robot0_gripper_width": (1,)}

REACH = TaskDefinition(
    name="reach",
    family="tabletop",
    make_env=ReachEnv,
    write_demos=write_umi_demos,
    low_dim_features=_LOW_DIM,
    image_keys=("camera0_rgb",),
    action_dim=7,
    max_steps=ReachEnv.max_steps,
    n_stages=3,
    description="touch the object with the closed fingers (tabletop; the simplest visually guided task)",
)

PUSH = TaskDefinition(
    name="push",
    family="tabletop",
    make_env=PushEnv,
    write_demos=write_umi_demos,
    low_dim_features=_LOW_DIM,
    image_keys=("camera0_rgb",),
    action_dim=7,
    max_steps=PushEnv.max_steps,
    n_stages=3,
    description="push the object into the red target disc (tabletop, wrist camera)",
)

PICK_PLACE = TaskDefinition(
    name="pick_place",
    family="tabletop",
    make_env=PickPlaceEnv,
    write_demos=write_umi_demos,
    low_dim_features=_LOW_DIM,
    image_keys=("camera0_rgb",),
    action_dim=7,
    max_steps=PickPlaceEnv.max_steps,
    n_stages=3,
    description="pick the object and place it in the white container (tabletop, wrist camera)",
)
