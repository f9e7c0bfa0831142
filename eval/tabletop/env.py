"""The tabletop environment: a free-floating, mocap-driven parallel gripper over a procedural table.

Action (7, absolute targets, the ``action`` layout of docs/interfaces.md for one UMI robot):
``[x, y, z, rx, ry, rz, width]`` - the tool-centre-point position (metres, world frame), its
orientation as an axis-angle vector (identity = fingers pointing straight down, opening along the
world y axis) and the gripper opening (metres, 0 .. 0.08). Targets are clamped to the workspace
and to a speed limit, then reached by interpolating the mocap pose over the physics substeps of
one 10 Hz control step.

Observations (store keys): ``camera{i}_rgb`` (uint8 HxWx3, one per configured camera; ``wrist``
is the gripper-mounted camera, ``scene`` a fixed camera over the table), ``robot0_eef_pos`` (3),
``robot0_eef_rot_axis_angle`` (3) and ``robot0_gripper_width`` (1); with ``object_state=True``
also the simulator's own object state: ``object0_pose`` (4: x, y, z in metres, yaw in radians) and
``object0_goal`` (2: the x, y the task brings the object to, or for ``reach`` where it started), for
policies that are told where the object is instead of seeing it. The width reported is the
gripper's set-point (the commanded opening): while an object is held the fingers stay open by the
object's width, and reporting the set-point keeps "next observed width" equal to the command, so
ingested ``action`` labels (the next frame's pose and width) replay exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

import mujoco  # the package (demoscale.eval) set MUJOCO_GL before any of its modules loads
import numpy as np
from demoscale.eval.geometry import quaternion_yaw
from demoscale.eval.rendering import thread_gl_context
from demoscale.eval.tabletop.scene import MAX_GRIPPER_WIDTH, build_mjcf, env_params, object_params

CONTROL_HZ = 10.0
SUBSTEPS = 10  # 10 x 10 ms physics steps per control step
POSITION_LOW = np.array([-0.32, -0.32, 0.012])
POSITION_HIGH = np.array([0.32, 0.32, 0.3])
MAX_STEP_M = 0.06  # per control step (0.6 m/s)
MAX_STEP_RAD = 0.5
CAMERAS = ("wrist", "scene")


def axis_angle_to_quat(rotvec: np.ndarray) -> np.ndarray:
    """Unit quaternion (w, x, y, z) of an axis-angle vector."""
    rotvec = np.asarray(rotvec, dtype=np.float64)
    angle = float(np.linalg.norm(rotvec))
    if angle < 1e-12:
        return np.array([1.0, 0.0, 0.0, 0.0])
    axis = rotvec / angle
    return np.concatenate([[np.cos(angle / 2)], np.sin(angle / 2) * axis])


def quat_to_axis_angle(quat: np.ndarray) -> np.ndarray:
    """Axis-angle vector (angle in [0, pi]) of a quaternion (w, x, y, z)."""
    quat = np.asarray(quat, dtype=np.float64)
    quat = quat / np.linalg.norm(quat)
    if quat[0] < 0:
        quat = -quat
    sin_half = float(np.linalg.norm(quat[1:]))
    if sin_half < 1e-12:
        return np.zeros(3)
    angle = 2 * np.arctan2(sin_half, quat[0])
    return quat[1:] / sin_half * angle


def _nlerp(q0: np.ndarray, q1: np.ndarray, fraction: float) -> np.ndarray:
    if np.dot(q0, q1) < 0:
        q1 = -q1
    q = (1 - fraction) * q0 + fraction * q1
    return q / np.linalg.norm(q)


class OffscreenRenderer:
    """Render RGB images of one model's cameras through this thread's GL context.

    The renderer belongs to the thread that created it (its GPU-side objects live in that thread's
    context); render from that thread.
    """

    def __init__(self, model: mujoco.MjModel, size: int) -> None:
        self.gl_context = thread_gl_context()
        self.model = model
        self.size = int(size)
        self.scene = mujoco.MjvScene(model, maxgeom=200)
        self.option = mujoco.MjvOption()
        self.camera = mujoco.MjvCamera()
        self.camera.type = mujoco.mjtCamera.mjCAMERA_FIXED
        self.context = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_50)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self.context)
        self.rect = mujoco.MjrRect(0, 0, self.size, self.size)

    def render(self, data: mujoco.MjData, camera: str) -> np.ndarray:
        self.gl_context.make_current()
        self.camera.fixedcamid = self.model.camera(camera).id
        mujoco.mjv_updateScene(
            self.model, data, self.option, None, self.camera, mujoco.mjtCatBit.mjCAT_ALL, self.scene
        )
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self.context)
        mujoco.mjr_render(self.rect, self.scene, self.context)
        image = np.empty((self.size, self.size, 3), dtype=np.uint8)
        mujoco.mjr_readPixels(image, None, self.rect, self.context)
        return image[::-1].copy()  # OpenGL rows run bottom-up

    def close(self) -> None:
        if self.context is not None:
            self.gl_context.make_current()
            self.context.free()
            self.context = None


class TabletopEnv:
    """Base class of the tabletop tasks. Subclasses add their MJCF elements, layout and scoring."""

    task = "tabletop"
    n_stages = 3
    max_steps = 80
    # The layout entry ``object0_goal`` reports (see the module docstring).
    goal_layout_key = "object_start"
    # Workspace region objects are placed in (subclasses narrow it).
    place_low = np.array([-0.12, -0.12])
    place_high = np.array([0.12, 0.12])

    def __init__(
        self,
        env_id: int,
        object_id: int,
        image_size: int = 96,
        cameras: Sequence[str] = ("wrist",),
        render: bool = True,
        object_state: bool = False,
    ) -> None:
        unknown = [c for c in cameras if c not in CAMERAS]
        if unknown or not cameras:
            raise ValueError(f"cameras must be a non-empty subset of {CAMERAS}, got {list(cameras)}")
        self.env_id = int(env_id)
        self.object_id = int(object_id)
        self.env_params = env_params(env_id)
        self.object = object_params(object_id)
        self.image_size = int(image_size)
        self.cameras = tuple(cameras)
        self.render_images = render
        self.object_state = bool(object_state)
        xml = build_mjcf(
            self.env_params, self.object, self._task_worldbody(), self._task_assets(), self.image_size
        )
        self.model = mujoco.MjModel.from_xml_string(xml)
        self.data = mujoco.MjData(self.model)
        self._renderer: OffscreenRenderer | None = None
        self._mocap = self.model.body("gripper_target").mocapid[0]
        self._gripper_body = self.model.body("gripper").id
        self._gripper_qpos = self.model.joint("gripper_joint").qposadr[0]
        self._object_joint = self.model.joint("object_joint")
        self._object_qpos = self._object_joint.qposadr[0]
        self._object_body = self.model.body("object").id
        self._finger_qpos = [self.model.joint(f"finger_{s}_joint").qposadr[0] for s in ("left", "right")]
        self._finger_geoms = {self.model.geom(f"finger_{s}_geom").id for s in ("left", "right")}
        self._object_geoms = {
            i for i in range(self.model.ngeom) if self.model.geom_bodyid[i] == self._object_body
        }
        self.steps = 0
        self._stages = [False] * self.n_stages
        self._width = MAX_GRIPPER_WIDTH
        self._rotvec = np.zeros(3)
        self.layout: dict[str, np.ndarray] = {}

    # --- task hooks -------------------------------------------------------------------------
    def _task_worldbody(self) -> str:
        return ""

    def _task_assets(self) -> str:
        return ""

    def _place_task(self, rng: np.random.Generator) -> None:
        """Place the object and the task's elements for a new episode (sets ``self.layout``)."""

    def _update_stages(self) -> None:
        """Latch the stages reached in the current state."""

    def success(self) -> bool:
        raise NotImplementedError

    def expert(self, seed: int):
        raise NotImplementedError

    # --- state accessors --------------------------------------------------------------------
    @property
    def object_pos(self) -> np.ndarray:
        return self.data.qpos[self._object_qpos : self._object_qpos + 3].copy()

    @property
    def object_yaw(self) -> float:
        w, x, y, z = self.data.qpos[self._object_qpos + 3 : self._object_qpos + 7]
        return float(quaternion_yaw(w, x, y, z))

    @property
    def eef_pos(self) -> np.ndarray:
        """The gripper's tool-centre point (it follows the mocap target through a stiff weld)."""
        return self.data.xpos[self._gripper_body].copy()

    def fingers_touch_object(self) -> bool:
        for i in range(self.data.ncon):
            pair = {int(self.data.contact[i].geom1), int(self.data.contact[i].geom2)}
            if pair & self._finger_geoms and pair & self._object_geoms:
                return True
        return False

    def stages(self) -> list[bool]:
        return list(self._stages)

    def stage_score(self) -> int:
        """The highest stage reached (0 .. n_stages)."""
        reached = [k + 1 for k, done in enumerate(self._stages) if done]
        return max(reached, default=0)

    # --- episode ----------------------------------------------------------------------------
    def _place_object(self, xy: np.ndarray, yaw: float) -> None:
        qpos = self.data.qpos
        qpos[self._object_qpos : self._object_qpos + 3] = [xy[0], xy[1], self.object.height / 2 + 0.001]
        qpos[self._object_qpos + 3 : self._object_qpos + 7] = [np.cos(yaw / 2), 0, 0, np.sin(yaw / 2)]

    def reset(self, seed: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([0x5EED, int(seed), self.env_id, self.object_id])
        mujoco.mj_resetData(self.model, self.data)
        self._place_task(rng)
        start = np.array([rng.uniform(-0.06, 0.06), rng.uniform(-0.06, 0.06), rng.uniform(0.12, 0.17)])
        self.data.mocap_pos[self._mocap] = start
        self.data.mocap_quat[self._mocap] = [1, 0, 0, 0]
        self.data.qpos[self._gripper_qpos : self._gripper_qpos + 7] = [*start, 1, 0, 0, 0]
        self._rotvec = np.zeros(3)
        self._width = MAX_GRIPPER_WIDTH
        for q in self._finger_qpos:
            self.data.qpos[q] = MAX_GRIPPER_WIDTH / 2
        self.data.ctrl[:] = MAX_GRIPPER_WIDTH / 2
        mujoco.mj_forward(self.model, self.data)
        for _ in range(10):  # let the object settle on the table
            mujoco.mj_step(self.model, self.data)
        self.steps = 0
        self._stages = [False] * self.n_stages
        self.initial_object_pos = self.object_pos
        return self.observe()

    def step(self, action: np.ndarray) -> dict[str, np.ndarray]:
        action = np.asarray(action, dtype=np.float64).reshape(-1)
        if action.shape != (7,) or not np.all(np.isfinite(action)):
            raise ValueError(f"tabletop action must be 7 finite numbers [x y z rx ry rz width], got {action}")
        start_pos = self.data.mocap_pos[self._mocap].copy()
        start_quat = self.data.mocap_quat[self._mocap].copy()
        target = np.clip(action[:3], POSITION_LOW, POSITION_HIGH)
        delta = target - start_pos
        distance = float(np.linalg.norm(delta))
        if distance > MAX_STEP_M:
            target = start_pos + delta * (MAX_STEP_M / distance)
        rotvec = action[3:6]
        turn = rotvec - self._rotvec
        if np.linalg.norm(turn) > MAX_STEP_RAD:
            rotvec = self._rotvec + turn * (MAX_STEP_RAD / np.linalg.norm(turn))
        target_quat = axis_angle_to_quat(rotvec)
        self._rotvec = quat_to_axis_angle(target_quat)
        self._width = float(np.clip(action[6], 0.0, MAX_GRIPPER_WIDTH))
        self.data.ctrl[:] = self._width / 2
        fractions = np.arange(1, SUBSTEPS + 1) / SUBSTEPS
        positions = start_pos + fractions[:, None] * (target - start_pos)
        turning = not np.allclose(start_quat, target_quat, atol=1e-9)
        for i in range(SUBSTEPS):
            self.data.mocap_pos[self._mocap] = positions[i]
            if turning:
                self.data.mocap_quat[self._mocap] = _nlerp(start_quat, target_quat, fractions[i])
            mujoco.mj_step(self.model, self.data)
        self.steps += 1
        self._update_stages()
        return self.observe()

    def low_dim(self) -> dict[str, np.ndarray]:
        return {
            "robot0_eef_pos": self.data.xpos[self._gripper_body].astype(np.float32),
            "robot0_eef_rot_axis_angle": quat_to_axis_angle(self.data.xquat[self._gripper_body]).astype(
                np.float32
            ),
            "robot0_gripper_width": np.array([self._width], dtype=np.float32),
        }

    def object_state_obs(self) -> dict[str, np.ndarray]:
        """The privileged object state (``object_state=True``): its pose and the task's goal for it."""
        return {
            "object0_pose": np.array([*self.object_pos, self.object_yaw], dtype=np.float32),
            "object0_goal": np.asarray(self.layout[self.goal_layout_key], dtype=np.float32)[:2].copy(),
        }

    def render_camera(self, camera: str) -> np.ndarray:
        if self._renderer is None:
            self._renderer = OffscreenRenderer(self.model, self.image_size)
        return self._renderer.render(self.data, camera)

    def image_cameras(self) -> dict[str, str]:
        """Store key -> the MuJoCo camera that renders it (``camera{i}_rgb`` -> ``cameras[i]``)."""
        return {f"camera{i}_rgb": camera for i, camera in enumerate(self.cameras)}

    def observe(self) -> dict[str, np.ndarray]:
        obs = self.low_dim()
        if self.object_state:
            obs.update(self.object_state_obs())
        if self.render_images:
            for i, camera in enumerate(self.cameras):
                obs[f"camera{i}_rgb"] = self.render_camera(camera)
        return obs

    def render(self) -> np.ndarray:
        """A frame for videos: the configured cameras and the scene camera side by side."""
        frames = [self.render_camera(c) for c in self.cameras]
        if "scene" not in self.cameras:
            frames.append(self.render_camera("scene"))
        return np.concatenate(frames, axis=1)

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None

    def __del__(self) -> None:  # renderers hold GL contexts
        try:
            self.close()
        except Exception:
            pass
