"""Scripted whole-body experts: ``fetch_shelf`` (drive, raise the torso, grasp, carry, place) and
``touch_shelf`` (drive, raise the torso, touch the object with the fingertips).

The right hand follows Cartesian waypoints (minimum-jerk interpolation) through damped-least-squares
inverse kinematics on MuJoCo body Jacobians (``mujoco.mj_jacBody``); the result is commanded as
joint position targets, as a teleoperator's JoyLo arm would command them. The base is driven by a
velocity controller towards base-frame goals, the torso by rate-limited position targets.

Human-like variation is drawn once per episode (so it is consistent over time, which keeps action
chunks predictable): driving speed and acceleration, stand-off and lateral offsets, grasp point and
height, lean of the torso, place point, motion durations and short hesitations between phases.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import mujoco
import numpy as np
from demoscale.eval.wholebody.env import ARM_JOINTS, TORSO_JOINTS, TUCKED_ARM, WholeBodyEnv
from demoscale.eval.wholebody.scene import LIFT_RANGE, SHOULDER_Y

ARM = "right"
ARM_SLICE = slice(14, 20)
GRIPPER_INDEX = 20
SHOULDER_HEIGHT_AT_ZERO_LIFT = 0.78  # base top + column + pitch links + shoulder offset (m)


def _yaw_matrix(yaw: float) -> np.ndarray:
    c, s = np.cos(yaw), np.sin(yaw)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def _min_jerk(fraction: float) -> float:
    f = float(np.clip(fraction, 0.0, 1.0))
    return f**3 * (10 - 15 * f + 6 * f**2)


class ArmIK:
    """Damped-least-squares IK for one arm's six joints on a scratch copy of the model state."""

    def __init__(self, env: WholeBodyEnv, side: str = ARM, damping: float = 0.05) -> None:
        self.env, self.side, self.damping = env, side, damping
        self.scratch = mujoco.MjData(env.model)
        model = env.model
        self.body = model.body(f"{side}_grip_center").id
        joints = [model.joint(name) for name in ARM_JOINTS[side]]
        self.qpos = np.array([j.qposadr[0] for j in joints])
        self.dofs = np.array([j.dofadr[0] for j in joints])
        self.limits = np.array([model.jnt_range[j.id] for j in joints])
        self.jacp = np.zeros((3, model.nv))
        self.jacr = np.zeros((3, model.nv))

    def _prepare(self, torso_targets: np.ndarray, arm: np.ndarray) -> None:
        env, scratch = self.env, self.scratch
        scratch.qpos[:] = env.data.qpos
        for name, value in zip(TORSO_JOINTS, torso_targets, strict=True):
            scratch.qpos[env._qpos[name]] = value
        scratch.qpos[self.qpos] = arm

    def forward(self, torso_targets: np.ndarray, arm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Grasp-point position and rotation matrix for the given torso and arm joint targets."""
        self._prepare(torso_targets, arm)
        mujoco.mj_kinematics(self.env.model, self.scratch)
        return self.scratch.xpos[self.body].copy(), self.scratch.xmat[self.body].reshape(3, 3).copy()

    def solve(
        self,
        position: np.ndarray,
        rotation: np.ndarray,
        torso_targets: np.ndarray,
        arm: np.ndarray,
        iterations: int = 12,
    ) -> np.ndarray:
        """Arm joint targets that bring the grasp point to ``position`` with ``rotation`` (world)."""
        model, scratch = self.env.model, self.scratch
        self._prepare(torso_targets, arm)
        q = np.array(arm, np.float64)
        target_quat = np.zeros(4)
        mujoco.mju_mat2Quat(target_quat, np.ascontiguousarray(rotation).reshape(-1))
        current_quat, inverse, difference, rot_error = np.zeros(4), np.zeros(4), np.zeros(4), np.zeros(3)
        for _ in range(iterations):
            scratch.qpos[self.qpos] = q
            mujoco.mj_kinematics(model, scratch)
            mujoco.mj_comPos(model, scratch)
            error_p = position - scratch.xpos[self.body]
            mujoco.mju_mat2Quat(current_quat, scratch.xmat[self.body])
            mujoco.mju_negQuat(inverse, current_quat)
            mujoco.mju_mulQuat(difference, target_quat, inverse)
            mujoco.mju_quat2Vel(rot_error, difference, 1.0)
            error = np.concatenate([error_p, 0.5 * rot_error])
            if np.linalg.norm(error_p) < 1e-4 and np.linalg.norm(rot_error) < 1e-3:
                break
            mujoco.mj_jacBody(model, scratch, self.jacp, self.jacr, self.body)
            jac = np.vstack([self.jacp[:, self.dofs], 0.5 * self.jacr[:, self.dofs]])
            step = jac.T @ np.linalg.solve(jac @ jac.T + self.damping**2 * np.eye(6), error)
            q = np.clip(q + np.clip(step, -0.3, 0.3), self.limits[:, 0], self.limits[:, 1])
        return q


class FetchShelfExpert:
    """Scripted demonstrator of ``fetch_shelf``; ``act(obs)`` returns the next 21-dim action."""

    def __init__(
        self,
        env: WholeBodyEnv,
        seed: int,
        standoff_range: float = 0.03,
        lateral_range: float = 0.01,
        yaw_range: float = 0.04,
    ) -> None:
        """``standoff_range``, ``lateral_range`` and ``yaw_range`` are the half-widths (m, m, rad) of
        the uniform draws of where the base stops at the shelf: the grasp point's distance ahead of
        the shoulder (around 0.45 m), its offset to the side and the base's heading. Wider ranges
        show a policy reaches from more of the places its own base may stop at."""
        limits = {"standoff_range": (standoff_range, 0.3), "lateral_range": (lateral_range, 0.3), "yaw_range": (yaw_range, 0.6)}  # fmt: skip
        for name, (value, limit) in limits.items():
            if not 0 <= float(value) < limit:
                raise ValueError(f"{name} must be in [0, {limit}), got {value!r}")
        self.env = env
        self.rng = np.random.default_rng([env.env_id, env.object_id, int(seed), 29])
        rng = self.rng
        self.speed = rng.uniform(0.8, 1.25)  # > 1: a quicker operator
        self.max_base_speed = rng.uniform(0.35, 0.5)
        self.max_base_accel = rng.uniform(0.04, 0.07)  # m/s per control step
        # The grasp point ahead of the shoulder (m) and to the side when the base stops.
        self.standoff = 0.45 + rng.uniform(-standoff_range, standoff_range)
        self.lateral = rng.uniform(-lateral_range, lateral_range)
        self.grasp_depth = rng.uniform(-0.008, 0.008)
        self.grasp_height = rng.uniform(-0.008, 0.008)
        self.lean = rng.uniform(0.0, 0.25)  # torso bend (rad), compensated so the chest stays level
        self.shoulder_above = rng.uniform(0.12, 0.2)
        self.place_offset = np.array([rng.uniform(0.12, 0.2), rng.uniform(-0.08, 0.08)])
        self.yaw_offset = rng.uniform(-yaw_range, yaw_range)
        self.ik = ArmIK(env, ARM)
        self.action = env.last_action.copy()
        self.done = False  # True once the object is placed and the arm tucked again
        # What the script is doing at the action act() returned last: "drive" (the base moves
        # towards a goal by its measured pose), "reach", "gripper", "hold" or "tuck". Collection
        # can inject noise in some phases only (collect_sim's noise_phases).
        self.phase = "start"
        self._script = self._run()

    # ----------------------------------------------------------------- interface
    def act(self, obs: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
        """The next action (the expert reads the simulator state; ``obs`` is not needed)."""
        return next(self._script).copy()

    # ----------------------------------------------------------------- building blocks
    def _steps(self, seconds: float) -> int:
        return max(1, int(round(seconds * 10.0 / self.speed)))

    def _torso_for(self, hand_z: float) -> np.ndarray:
        lift = hand_z + self.shoulder_above - SHOULDER_HEIGHT_AT_ZERO_LIFT
        lift = float(np.clip(lift, LIFT_RANGE[0] + 0.01, LIFT_RANGE[1] - 0.01))
        return np.array([lift, self.lean, -self.lean, 0.0])

    def _hold(self, steps: int) -> Iterator[np.ndarray]:
        self.phase = "hold"
        self.action[:3] = 0.0
        for _ in range(steps):
            yield self.action

    def _pause(self) -> Iterator[np.ndarray]:
        # Operators hesitate now and then between phases.
        if self.rng.uniform() < 0.4:
            yield from self._hold(int(self.rng.integers(1, 5)))

    def _torso_step(self, goal: np.ndarray) -> bool:
        torso = self.action[3:7]
        rate = np.array([0.035, 0.05, 0.05, 0.05]) * self.speed
        torso += np.clip(goal - torso, -rate, rate)
        return bool(np.allclose(torso, goal, atol=1e-4))

    def _drive(
        self, goal: np.ndarray, torso_goal: np.ndarray | None = None, timeout_s: float = 20.0
    ) -> Iterator[np.ndarray]:
        """Drive the base to ``goal`` = (x, y, yaw) in the world, moving the torso on the way."""
        self.phase = "drive"
        command = np.zeros(3)
        for _ in range(int(timeout_s * 10)):
            x, y, yaw = self.env.base_pose()
            world_error = goal[:2] - np.array([x, y])
            yaw_error = float(np.arctan2(np.sin(goal[2] - yaw), np.cos(goal[2] - yaw)))
            error = _yaw_matrix(-yaw)[:2, :2] @ world_error
            distance = float(np.linalg.norm(error))
            # Slow down in time to stop: v <= sqrt(2 a d) at the per-step deceleration.
            speed = min(self.max_base_speed, 1.6 * distance, np.sqrt(2 * self.max_base_accel * 10 * distance))
            wanted = np.zeros(3)
            if distance > 1e-6:
                wanted[:2] = error / distance * speed
            wanted[2] = np.clip(1.5 * yaw_error, -0.6, 0.6)
            command += np.clip(wanted - command, -self.max_base_accel, self.max_base_accel)
            self.action[:3] = command
            torso_done = self._torso_step(torso_goal) if torso_goal is not None else True
            yield self.action
            if distance < 0.015 and abs(yaw_error) < 0.02 and torso_done and np.abs(command).max() < 0.05:
                break
        self.action[:3] = 0.0

    def _move_hand(
        self, position: np.ndarray, yaw: float, seconds: float, torso_goal: np.ndarray | None = None
    ) -> Iterator[np.ndarray]:
        """Move the grasp point along a minimum-jerk line to ``position``, gripper pointing along ``yaw``."""
        self.phase = "reach"
        self.action[:3] = 0.0
        torso = self.action[3:7]
        start, _ = self.ik.forward(torso, self.action[ARM_SLICE])
        rotation = _yaw_matrix(yaw)
        steps = self._steps(seconds)
        for i in range(1, steps + 1):
            if torso_goal is not None:
                self._torso_step(torso_goal)
            waypoint = start + _min_jerk(i / steps) * (position - start)
            self.action[ARM_SLICE] = self.ik.solve(waypoint, rotation, torso, self.action[ARM_SLICE])
            yield self.action

    def _gripper(self, opening_mm: float, seconds: float) -> Iterator[np.ndarray]:
        self.phase = "gripper"
        self.action[:3] = 0.0
        start = self.action[GRIPPER_INDEX]
        steps = self._steps(seconds)
        for i in range(1, steps + 1):
            self.action[GRIPPER_INDEX] = start + (opening_mm - start) * i / steps
            yield self.action

    def _tuck(self, seconds: float) -> Iterator[np.ndarray]:
        self.phase = "tuck"
        start = self.action[ARM_SLICE].copy()
        steps = self._steps(seconds)
        for i in range(1, steps + 1):
            self.action[ARM_SLICE] = start + _min_jerk(i / steps) * (TUCKED_ARM[ARM] - start)
            yield self.action

    # ----------------------------------------------------------------- the task
    def _run(self) -> Iterator[np.ndarray]:
        env, scene, obj = self.env, self.env.scene, self.env.object
        obj_pos = env.object_position()
        board = scene.shelf_height
        grasp = np.array(
            [
                obj_pos[0] + self.grasp_depth,
                obj_pos[1],
                board + min(obj.half_height + 0.012, 2 * obj.half_height - 0.022) + self.grasp_height,
            ]
        )
        yaw = self.yaw_offset
        heading = _yaw_matrix(yaw)
        opening = min(100.0, 2000.0 * max(obj.half_width, obj.half_depth) + 35.0)

        # 1. Drive to the shelf while raising and bending the torso to the board's height.
        torso_shelf = self._torso_for(grasp[2])
        shoulder_forward = 0.12 * np.sin(self.lean)
        base_goal = np.zeros(3)
        base_goal[:2] = grasp[:2] - heading[:2, :2] @ np.array(
            [self.standoff + shoulder_forward, -SHOULDER_Y - self.lateral]
        )
        base_goal[2] = yaw
        yield from self._drive(base_goal, torso_shelf)
        yield from self._pause()

        # 2. Reach in front of the object, open, move in, close, lift, pull back.
        back = heading[:, 0]
        yield from self._gripper(opening, 0.5)
        yield from self._move_hand(grasp - 0.12 * back + [0, 0, 0.01], yaw, 2.0)
        yield from self._move_hand(grasp, yaw, 1.2)
        yield from self._pause()
        yield from self._gripper(0.0, 0.6)
        yield from self._hold(4)
        lifted = grasp + [0, 0, 0.035]
        yield from self._move_hand(lifted, yaw, 0.8)
        yield from self._move_hand(lifted - 0.2 * back + [0, 0, 0.02], yaw, 1.2)
        yield from self._pause()

        # 3. Back away from the shelf, raise the object above the table's height, drive to the table.
        place = np.array(
            [
                scene.table_x + self.place_offset[0],
                scene.table_y + self.place_offset[1],
                scene.table_height + (grasp[2] - board) + 0.006,
            ]
        )
        x, y, _ = env.base_pose()
        table_goal = np.array(
            [place[0] - self.standoff - shoulder_forward, place[1] + SHOULDER_Y + self.lateral, yaw]
        )
        carry_height = max(grasp[2] + 0.055, place[2] + 0.08)
        torso_carry = self._torso_for(carry_height)
        torso_carry[0] = max(torso_carry[0], self.action[3])
        # Back off until the tucked left hand clears the shelf's posts, strafe, then approach the table.
        clear_x = min(x - 0.25, scene.shelf_x - 0.55, table_goal[0])
        yield from self._drive(np.array([clear_x, y, yaw]), torso_carry)
        yield from self._drive(np.array([clear_x, table_goal[1], yaw]), torso_carry)
        yield from self._drive(table_goal, torso_carry)
        yield from self._pause()

        # 4. Lower the torso to the table, place, release, pull back and tuck.
        torso_place = self._torso_for(place[2])
        torso_place[0] = max(torso_place[0], self.action[3] - 0.25)
        hand_now, _ = self.ik.forward(self.action[3:7], self.action[ARM_SLICE])
        above = np.array([place[0], place[1], max(place[2] + 0.06, hand_now[2] - 0.1)])
        yield from self._move_hand(above, yaw, 1.6, torso_goal=torso_place)
        yield from self._move_hand(place, yaw, 1.0)
        yield from self._gripper(opening, 0.5)
        yield from self._hold(2)
        yield from self._move_hand(place - 0.15 * back + [0, 0, 0.03], yaw, 1.0)
        yield from self._tuck(1.5)
        self.done = True
        while True:
            yield from self._hold(1)


FINGERTIP_AHEAD_OF_GRIP = 0.025  # closed fingertips ahead of the grasp point (m; fingers end 0.13 m out)


class TouchShelfExpert(FetchShelfExpert):
    """Scripted demonstrator of ``touch_shelf``: drive to the shelf while raising the torso to the
    board, bring the closed right hand in front of the object, move in until the fingertips meet
    it (touching with the fingertips keeps the wrist and forearm outside the shelf, clear of the
    board's edge). The episode's variation is :class:`FetchShelfExpert`'s (speeds, stand-off,
    lateral offset, lean, shoulder height above the hand, heading, hesitations) plus where on the
    object's height the hand meets it and how far past its front face the motion aims.

    ``done`` turns true at the step the hand touches the object (the task's success), so a
    recorded episode ends there, as a rollout does.
    """

    def __init__(self, env: WholeBodyEnv, seed: int, **placement: float) -> None:
        super().__init__(env, seed, **placement)
        # Low on the object (a fraction of its height), so that a tall, narrow one is not tipped over.
        self.touch_height = self.rng.uniform(0.3, 0.5)
        self.reach_past = self.rng.uniform(0.01, 0.025)  # fingertip aim behind the object's face (m)
        self.approach = self.rng.uniform(0.08, 0.11)  # fingertips ahead of the face before moving in (m)
        self._script = self._run()

    @property
    def done(self) -> bool:
        return bool(self.env.success())

    @done.setter
    def done(self, value: bool) -> None:
        # FetchShelfExpert's end-of-script flag; this task ends when the hand touches the object.
        pass

    def _run(self) -> Iterator[np.ndarray]:
        env, scene, obj = self.env, self.env.scene, self.env.object
        obj_pos = env.object_position()
        # The object's extent along x (a box may stand turned about z), so the hand aims at its face.
        rotation = env.data.xmat[env._object_body].reshape(3, 3)
        half_x = abs(rotation[0, 0]) * obj.half_depth + abs(rotation[0, 1]) * obj.half_width
        face = obj_pos[0] - half_x
        board = scene.shelf_height
        # The palm is 5 cm tall: keep its lower edge above the board.
        height = board + max(0.03, self.touch_height * 2 * obj.half_height)
        touch = np.array([face - FINGERTIP_AHEAD_OF_GRIP + self.reach_past, obj_pos[1], height])
        yaw = self.yaw_offset
        heading = _yaw_matrix(yaw)

        # 1. Drive to the shelf while raising and bending the torso to the board's height.
        torso_shelf = self._torso_for(touch[2])
        shoulder_forward = 0.12 * np.sin(self.lean)
        base_goal = np.zeros(3)
        base_goal[:2] = touch[:2] - heading[:2, :2] @ np.array(
            [self.standoff + shoulder_forward, -SHOULDER_Y - self.lateral]
        )
        base_goal[2] = yaw
        yield from self._drive(base_goal, torso_shelf)
        yield from self._pause()

        # 2. Bring the closed hand in front of the object, then move in until it touches.
        back = heading[:, 0]
        ahead = touch - (self.approach + self.reach_past) * back
        yield from self._move_hand(ahead, yaw, 1.5)
        yield from self._pause()
        # Slowly (about 7 cm/s at the end): a quick tap tips a narrow object over within one step.
        yield from self._move_hand(touch, yaw, 1.6)
        while True:
            yield from self._hold(1)
