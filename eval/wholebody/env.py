"""The whole-body environment: JoyLo action layout in, store-key observations out, at 10 Hz.

Action (21, absolute targets, docs/interfaces.md): mobile base ``[vx, vy, yaw rate]`` in the base
frame (m/s, rad/s), torso joint positions (4: lift in m, two pitch joints and yaw in rad), left arm
joint positions (6, rad), left gripper opening (mm, 0 closed .. 100 open), right arm (6), right
gripper (1).

Observations use the keys the JoyLo ingester writes: ``proprio`` (21, the base part being the base
velocity in the base frame), ``odom_base_velocity``, ``odom_position``, ``odom_orientation`` (xyzw),
``pointcloud_xyz``/``pointcloud_rgb``/``pointcloud_mask`` (fused from the configured cameras, in the
base frame: origin on the floor under the base centre, x forward, z up) and ``<camera>_rgb``. Keys
starting with ``joylo_`` (joint velocities and efforts, 16 = torso 4, left arm 6, right arm 6;
gripper velocities and efforts, 2) exist only so that recordings carry the raw recorder's fields.
With ``object_state=True`` the simulator's object state is observed too: ``object0_pose`` (4: the
object's x, y, z in the base frame and its yaw relative to the base), for policies told where the
object is instead of seeing it (a diagnostic of what limits a point-cloud policy).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mujoco
import numpy as np
from demoscale.eval.geometry import quaternion_yaw
from demoscale.eval.rendering import load_triton_first
from demoscale.eval.wholebody.pointcloud import backproject, sample_fixed
from demoscale.eval.wholebody.scene import (
    SceneParams,
    build_mjcf,
    object_params,
    scene_params,
    touch_scene_params,
)

CONTROL_HZ = 10.0
TORSO_JOINTS = ("torso_lift", "torso_pitch1", "torso_pitch2", "torso_yaw")
ARM_JOINTS = {side: tuple(f"{side}_arm_j{i}" for i in range(1, 7)) for side in ("left", "right")}
CAMERAS = ("head", "left_wrist", "right_wrist")
STAGES = ("reach_shelf", "grasp", "carry_to_table", "place")
TOUCH_STAGES = ("at_shelf", "torso_at_height", "touch")
# Arms folded in front of the chest, clear of the shelf while driving.
TUCKED_ARM = {
    "left": np.array([1.3, -0.5, 0.0, -2.5, 0.0, 1.2]),
    "right": np.array([1.3, 0.5, 0.0, -2.5, 0.0, 1.2]),
}


@dataclass(frozen=True)
class WholeBodyConfig:
    """Rendering, point-cloud and episode options of the whole-body family."""

    image_size: int = 96
    cameras: tuple[str, ...] = ("head",)  # RGB observations
    point_cloud_cameras: tuple[str, ...] = ("head",)  # fused into the point cloud
    n_points: int = 1024  # 4096 in real BRS recordings; 1024 keeps laptop training cheap
    point_sampling: str = "voxel"  # or "fps" (slow in numpy), "random"
    crop_min: tuple[float, float, float] = (-0.3, -2.0, -0.05)  # base frame (m)
    crop_max: tuple[float, float, float] = (2.5, 2.0, 2.0)
    max_steps: int = 350
    substeps: int = field(default=50)  # 0.002 s physics steps per 0.1 s control step
    object_state: bool = False  # observe object0_pose (see the module docstring)

    def __post_init__(self) -> None:
        for camera in (*self.cameras, *self.point_cloud_cameras):
            if camera not in CAMERAS:
                raise ValueError(f"unknown camera {camera!r}; expected some of {CAMERAS}")
        if self.n_points <= 0 or self.image_size <= 0:
            raise ValueError("n_points and image_size must be positive")


def yaw_to_xyzw(yaw: float) -> np.ndarray:
    return np.array([0.0, 0.0, np.sin(yaw / 2), np.cos(yaw / 2)])


class WholeBodyEnv:
    """One (environment, object) pair of the whole-body ``fetch_shelf`` task (see module docstring).

    Stages (latched over an episode): the base reaches the shelf; the object is lifted off the
    board between the fingers; it is carried over the table; it rests on the table, released
    (= success).
    """

    task = "fetch_shelf"
    n_stages = len(STAGES)
    action_dim = 21
    start_right_gripper_mm = 80.0  # open, ready to grasp

    @staticmethod
    def scene_for(env_id: int) -> SceneParams:
        """The procedural scene of ``env_id`` for this task."""
        return scene_params(env_id)

    def __init__(self, env_id: int, object_id: int, config: WholeBodyConfig | None = None) -> None:
        self.config = config or WholeBodyConfig()
        self.scene = self.scene_for(env_id)
        self.object = object_params(object_id)
        self.env_id, self.object_id = self.scene.env_id, self.object.object_id
        self.max_steps = self.config.max_steps
        self.model = mujoco.MjModel.from_xml_string(build_mjcf(self.scene, self.object))
        self.data = mujoco.MjData(self.model)
        model = self.model
        self._qpos = {name: model.joint(name).qposadr[0] for name in self._joint_names()}
        self._dof = {name: model.joint(name).dofadr[0] for name in self._joint_names()}
        self._act = {model.actuator(i).name: i for i in range(model.nu)}
        self._object_qpos = model.joint("object").qposadr[0]
        self._object_body = model.body("object").id
        self._object_geom = model.geom("object").id
        self._finger_geoms = {
            side: {model.body(f"{side}_finger_{f}").geomadr[0] for f in ("a", "b")}
            for side in ("left", "right")
        }
        self._renderer: mujoco.Renderer | None = None
        self._rng = np.random.default_rng(0)
        self._stages = [False] * self.n_stages
        self.steps = 0
        self.object_start = np.zeros(3)
        self.last_action = np.zeros(self.action_dim)

    @staticmethod
    def _joint_names() -> list[str]:
        names = ["base_x", "base_y", "base_yaw", *TORSO_JOINTS]
        for side in ("left", "right"):
            names += [*ARM_JOINTS[side], f"{side}_finger_a", f"{side}_finger_b"]
        return names

    # ----------------------------------------------------------------- episode
    def reset(self, seed: int) -> dict[str, np.ndarray]:
        """Start an episode: small seeded changes of the start pose and of the object's placement."""
        self._rng = np.random.default_rng([self.env_id, self.object_id, int(seed), 11])
        rng = np.random.default_rng([self.env_id, self.object_id, int(seed)])
        model, data = self.model, self.data
        mujoco.mj_resetData(model, data)
        data.qpos[self._qpos["base_x"]] = rng.uniform(-0.15, 0.15)
        data.qpos[self._qpos["base_y"]] = rng.uniform(-0.15, 0.15)
        data.qpos[self._qpos["base_yaw"]] = rng.uniform(-0.15, 0.15)
        obj = self._object_qpos
        data.qpos[obj] += rng.uniform(-0.015, 0.02)
        data.qpos[obj + 1] += rng.uniform(-0.08, 0.08)
        yaw = rng.uniform(-0.3, 0.3) if self.object.shape == "box" else 0.0
        data.qpos[obj + 3 : obj + 7] = [np.cos(yaw / 2), 0, 0, np.sin(yaw / 2)]
        start = np.zeros(self.action_dim)
        start[7:13], start[14:20] = TUCKED_ARM["left"], TUCKED_ARM["right"]
        start[13], start[20] = 0.0, self.start_right_gripper_mm  # the left hand stays closed and tucked
        for side, offset in (("left", 7), ("right", 14)):
            for name, value in zip(ARM_JOINTS[side], start[offset : offset + 6], strict=True):
                data.qpos[self._qpos[name]] = value
            for finger in ("a", "b"):
                data.qpos[self._qpos[f"{side}_finger_{finger}"]] = start[offset + 6] / 2000.0
        self._apply(start)
        mujoco.mj_forward(model, data)
        mujoco.mj_step(model, data, nstep=100)  # let the object settle on the board
        self.object_start = data.xpos[self._object_body].copy()
        self._stages = [False] * self.n_stages
        self.steps = 0
        self.last_action = start
        return self.observe()

    def step(self, action: np.ndarray) -> dict[str, np.ndarray]:
        """Apply one 0.1 s control step of a 21-dim whole-body action; returns the next observation."""
        action = np.asarray(action, np.float64).reshape(-1)
        if action.shape != (self.action_dim,) or not np.all(np.isfinite(action)):
            raise ValueError(f"{self.task} expects a finite action of shape (21,), got {action.shape}")
        self._apply(action)
        mujoco.mj_step(self.model, self.data, nstep=self.config.substeps)
        self.steps += 1
        self.last_action = action.copy()
        self._update_stages()
        return self.observe()

    def _apply(self, action: np.ndarray) -> None:
        ctrl, act = self.data.ctrl, self._act
        yaw = self.data.qpos[self._qpos["base_yaw"]]
        vx, vy, wz = action[:3]
        ctrl[act["base_x"]] = np.cos(yaw) * vx - np.sin(yaw) * vy
        ctrl[act["base_y"]] = np.sin(yaw) * vx + np.cos(yaw) * vy
        ctrl[act["base_yaw"]] = wz
        names = [*TORSO_JOINTS, *ARM_JOINTS["left"], "left_gripper", *ARM_JOINTS["right"], "right_gripper"]
        for name, value in zip(names, action[3:], strict=True):
            if name.endswith("gripper"):
                side = name.split("_")[0]
                stroke = np.clip(value, 0.0, 100.0) / 2000.0
                ctrl[act[f"{side}_finger_a"]] = ctrl[act[f"{side}_finger_b"]] = stroke
            else:
                low, high = self.model.jnt_range[self.model.joint(name).id]
                ctrl[act[name]] = np.clip(value, low, high)
        limited = self.model.actuator_ctrllimited.astype(bool)
        ranges = self.model.actuator_ctrlrange[limited]
        ctrl[limited] = np.clip(ctrl[limited], ranges[:, 0], ranges[:, 1])

    # ----------------------------------------------------------------- state
    def base_pose(self) -> tuple[float, float, float]:
        q = self.data.qpos
        return q[self._qpos["base_x"]], q[self._qpos["base_y"]], q[self._qpos["base_yaw"]]

    def base_velocity_world(self) -> np.ndarray:
        v = self.data.qvel
        return np.array([v[self._dof["base_x"]], v[self._dof["base_y"]], v[self._dof["base_yaw"]]])

    def base_velocity(self) -> np.ndarray:
        """``[vx, vy, yaw rate]`` in the base frame."""
        vx, vy, wz = self.base_velocity_world()
        yaw = self.base_pose()[2]
        return np.array([np.cos(yaw) * vx + np.sin(yaw) * vy, -np.sin(yaw) * vx + np.cos(yaw) * vy, wz])

    def joint_positions(self, names) -> np.ndarray:
        return np.array([self.data.qpos[self._qpos[n]] for n in names])

    def gripper_opening_mm(self, side: str) -> float:
        q = self.data.qpos
        return 1000.0 * (q[self._qpos[f"{side}_finger_a"]] + q[self._qpos[f"{side}_finger_b"]])

    def object_position(self) -> np.ndarray:
        return self.data.xpos[self._object_body].copy()

    def proprio(self) -> np.ndarray:
        parts = [
            self.base_velocity(),
            self.joint_positions(TORSO_JOINTS),
            self.joint_positions(ARM_JOINTS["left"]),
            [self.gripper_opening_mm("left")],
            self.joint_positions(ARM_JOINTS["right"]),
            [self.gripper_opening_mm("right")],
        ]
        return np.concatenate(parts).astype(np.float32)

    def _held_by(self) -> str | None:
        """The hand whose two fingers both touch the object, if any."""
        touching: dict[str, set[int]] = {"left": set(), "right": set()}
        for contact in self.data.contact[: self.data.ncon]:
            pair = {contact.geom1, contact.geom2}
            if self._object_geom not in pair:
                continue
            other = (pair - {self._object_geom}).pop() if len(pair) == 2 else -1
            for side, geoms in self._finger_geoms.items():
                if other in geoms:
                    touching[side].add(other)
        for side, geoms in self._finger_geoms.items():
            if touching[side] == geoms:
                return side
        return None

    def _touching_fingers(self) -> bool:
        fingers = set().union(*self._finger_geoms.values())
        for contact in self.data.contact[: self.data.ncon]:
            if self._object_geom in (contact.geom1, contact.geom2) and (
                contact.geom1 in fingers or contact.geom2 in fingers
            ):
                return True
        return False

    def _over_table(self, xy: np.ndarray, margin: float = 0.0) -> bool:
        s = self.scene
        return bool(
            s.table_x + margin <= xy[0] <= s.table_x + 0.5 - margin and abs(xy[1] - s.table_y) <= 0.4 - margin
        )

    def success(self) -> bool:
        """The object rests upright on the table top and no finger touches it."""
        position = self.object_position()
        bottom = position[2] - self.object.half_height
        speed = np.linalg.norm(self.data.cvel[self._object_body][3:])
        upright = self.data.xmat[self._object_body][8] > 0.9
        return bool(
            self._over_table(position[:2], margin=0.01)
            and abs(bottom - self.scene.table_height) < 0.02
            and speed < 0.05
            and upright
            and not self._touching_fingers()
        )

    def _update_stages(self) -> None:
        x, y, _ = self.base_pose()
        position = self.object_position()
        held = self._held_by() is not None
        reached = x > self.scene.shelf_x - 0.75 and abs(y - self.scene.shelf_y) < 0.5
        grasped = held and position[2] > self.object_start[2] + 0.02
        carried = held and self._over_table(position[:2]) and position[2] > self.scene.table_height
        checks = (reached, grasped, carried, self.success())
        for index, reached_now in enumerate(checks):
            # Stages count in order: a later stage needs the earlier ones.
            if reached_now and all(self._stages[:index]):
                self._stages[index] = True

    def stages(self) -> list[bool]:
        """For each stage of :data:`STAGES`, whether it has been reached in this episode."""
        return list(self._stages)

    def stage_score(self) -> int:
        """Number of stages reached (stages are reached in order)."""
        return int(sum(self._stages))

    def score(self) -> float:
        """Staged score in [0, 1]: stages reached / number of stages."""
        return sum(self._stages) / self.n_stages

    # ----------------------------------------------------------------- rendering
    def _get_renderer(self) -> mujoco.Renderer:
        if self._renderer is None:
            load_triton_first()
            size = self.config.image_size
            self._renderer = mujoco.Renderer(self.model, size, size)
        return self._renderer

    def _render_camera(self, camera: str, depth: bool) -> tuple[np.ndarray, np.ndarray | None]:
        renderer = self._get_renderer()
        renderer.update_scene(self.data, camera)
        rgb = renderer.render().copy()
        if not depth:
            return rgb, None
        renderer.enable_depth_rendering()
        try:
            depth_image = renderer.render().copy()
        finally:
            renderer.disable_depth_rendering()
        return rgb, depth_image

    def render(self) -> np.ndarray:
        """The head camera image (uint8 HxWx3), for videos."""
        return self._render_camera("head", depth=False)[0]

    def _cameras(self) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
        wanted = dict.fromkeys(self.config.cameras, False)
        for camera in self.config.point_cloud_cameras:
            wanted[camera] = True
        return {camera: self._render_camera(camera, depth) for camera, depth in wanted.items()}

    def _points_base_frame(self, camera: str, depth: np.ndarray) -> np.ndarray:
        cam = self.model.camera(camera).id
        points = backproject(depth, float(self.model.cam_fovy[cam]))
        world = points @ self.data.cam_xmat[cam].reshape(3, 3).T + self.data.cam_xpos[cam]
        x, y, yaw = self.base_pose()
        c, s = np.cos(yaw), np.sin(yaw)
        rel = world - np.array([x, y, 0.0])
        return np.stack([c * rel[:, 0] + s * rel[:, 1], -s * rel[:, 0] + c * rel[:, 1], rel[:, 2]], axis=1)

    def fused_point_cloud(self, images) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(xyz (N,3) float32 base frame, rgb (N,3) uint8, mask (N,) bool) from rendered depth."""
        xyz, rgb = [], []
        for camera in self.config.point_cloud_cameras:
            colour, depth = images[camera]
            xyz.append(self._points_base_frame(camera, depth))
            rgb.append(colour.reshape(-1, 3))
        xyz, rgb = np.concatenate(xyz), np.concatenate(rgb)
        inside = np.all((xyz >= self.config.crop_min) & (xyz <= self.config.crop_max), axis=1)
        return sample_fixed(
            xyz[inside], rgb[inside], self.config.n_points, self._rng, self.config.point_sampling
        )

    # ----------------------------------------------------------------- observations
    def image_cameras(self) -> dict[str, str]:
        """Store key -> the MuJoCo camera that renders it (``<camera>_rgb``)."""
        return {f"{camera}_rgb": camera for camera in self.config.cameras}

    def point_cloud_cameras(self) -> dict[str, str]:
        """Point-cloud store key -> the cameras fused into it (``"head"``, ``"head+left_wrist"``)."""
        if not self.config.point_cloud_cameras:
            return {}
        fused = "+".join(self.config.point_cloud_cameras)
        return {key: fused for key in ("pointcloud_xyz", "pointcloud_rgb", "pointcloud_mask")}

    def observe(self) -> dict[str, np.ndarray]:
        """The observation dict (store keys; see the module docstring)."""
        images = self._cameras()
        x, y, yaw = self.base_pose()
        obs = {
            "proprio": self.proprio(),
            "odom_base_velocity": self.base_velocity().astype(np.float32),
            "odom_position": np.array([x, y, 0.0], np.float32),
            "odom_orientation": yaw_to_xyzw(yaw).astype(np.float32),
        }
        if self.config.point_cloud_cameras:
            xyz, rgb, mask = self.fused_point_cloud(images)
            obs.update(pointcloud_xyz=xyz, pointcloud_rgb=rgb, pointcloud_mask=mask)
        for camera in self.config.cameras:
            obs[f"{camera}_rgb"] = images[camera][0]
        if self.config.object_state:
            obs["object0_pose"] = self.object_pose_base_frame()
        obs.update(self._raw_extras())
        return obs

    def object_pose_base_frame(self) -> np.ndarray:
        """The object's (x, y, z) in the base frame and its yaw relative to the base's (float32)."""
        x, y, yaw = self.base_pose()
        position = self.object_position()
        c, s = np.cos(yaw), np.sin(yaw)
        dx, dy = position[0] - x, position[1] - y
        w, qx, qy, qz = self.data.xquat[self._object_body]
        object_yaw = quaternion_yaw(w, qx, qy, qz)
        relative_yaw = (object_yaw - yaw + np.pi) % (2 * np.pi) - np.pi
        return np.array([c * dx + s * dy, -s * dx + c * dy, position[2], relative_yaw], np.float32)

    def _raw_extras(self) -> dict[str, np.ndarray]:
        """Joint velocities and efforts the raw JoyLo recorder stores (not ingested into stores)."""
        data = self.data
        names = [*TORSO_JOINTS, *ARM_JOINTS["left"], *ARM_JOINTS["right"]]
        dofs = [self._dof[n] for n in names]
        fingers = {side: [self._dof[f"{side}_finger_{f}"] for f in ("a", "b")] for side in ("left", "right")}
        return {
            "joylo_joint_velocity": data.qvel[dofs].astype(np.float32),
            "joylo_joint_effort": data.qfrc_actuator[dofs].astype(np.float32),
            "joylo_gripper_velocity": np.array(
                [1000.0 * data.qvel[fingers[side]].sum() for side in ("left", "right")], np.float32
            ),
            "joylo_gripper_effort": np.array(
                [data.qfrc_actuator[fingers[side]].mean() for side in ("left", "right")], np.float32
            ),
        }

    def expert(self, seed: int, **options: float):
        """The scripted expert for the current episode (call after :meth:`reset`); ``options``: where
        its base stops (:class:`~demoscale.eval.wholebody.expert.FetchShelfExpert`'s ranges)."""
        from demoscale.eval.wholebody.expert import FetchShelfExpert

        return FetchShelfExpert(self, seed, **options)

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None


class TouchShelfEnv(WholeBodyEnv):
    """One (environment, object) pair of ``touch_shelf``: drive to the shelf, set the torso to the
    board's height, touch the object on the board with a hand.

    The scene is :func:`~demoscale.eval.wholebody.scene.touch_scene_params` (a nearer shelf, a
    higher board). Stages (latched, in order): the base stands in front of the shelf (within
    :data:`AT_SHELF_DEPTH` of its front edge, within :data:`AT_SHELF_LATERAL` of its centre line);
    the right shoulder is :data:`SHOULDER_ABOVE_BOARD` above the board; a hand (palm or finger)
    touches the object while it still stands on the board (= success, which stays reached).
    """

    task = "touch_shelf"
    n_stages = len(TOUCH_STAGES)
    start_right_gripper_mm = 0.0  # closed: the fingertips touch, and the wrist stays off the shelf

    @staticmethod
    def scene_for(env_id: int) -> SceneParams:
        return touch_scene_params(env_id)

    def __init__(self, env_id: int, object_id: int, config: WholeBodyConfig | None = None) -> None:
        super().__init__(env_id, object_id, config)
        model = self.model
        bodies = [f"{side}_{part}" for side in ("left", "right") for part in ("hand", "finger_a", "finger_b")]
        self._hand_geoms = {
            geom for geom in range(model.ngeom) if model.body(int(model.geom_bodyid[geom])).name in bodies
        }
        self._shoulder_body = model.body("right_shoulder").id

    def shoulder_above_board(self) -> float:
        """Height of the right shoulder above the object's board (m)."""
        return float(self.data.xpos[self._shoulder_body][2] - self.scene.shelf_height)

    def hand_touches_object(self) -> bool:
        """Whether a palm or finger geom of either hand is in contact with the object."""
        for contact in self.data.contact[: self.data.ncon]:
            pair = (contact.geom1, contact.geom2)
            if self._object_geom in pair and (pair[0] in self._hand_geoms or pair[1] in self._hand_geoms):
                return True
        return False

    def hand_object_distance(self) -> float:
        """The smallest distance (m) between a palm or finger geom of either hand and the object
        (MuJoCo's geom distance, searched up to 1 m; 0 or less in contact)."""
        return min(
            mujoco.mj_geomDistance(self.model, self.data, geom, self._object_geom, 1.0, None)
            for geom in self._hand_geoms
        )

    def object_on_board(self) -> bool:
        """Whether the object still stands upright where it started on the board."""
        position = self.object_position()
        upright = self.data.xmat[self._object_body][8] > 0.9
        return bool(abs(position[2] - self.object_start[2]) < 0.02 and upright)

    def _update_stages(self) -> None:
        x, y, _ = self.base_pose()
        scene = self.scene
        at_shelf = scene.shelf_x - x < AT_SHELF_DEPTH and abs(y - scene.shelf_y) < AT_SHELF_LATERAL
        low, high = SHOULDER_ABOVE_BOARD
        at_height = low <= self.shoulder_above_board() <= high
        touching = self.hand_touches_object() and self.object_on_board()
        for index, reached_now in enumerate((at_shelf, at_height, touching)):
            if reached_now and all(self._stages[:index]):
                self._stages[index] = True

    def success(self) -> bool:
        """The hand has touched the standing object with the base at the shelf and the torso at height."""
        return bool(self._stages[-1])

    def expert(self, seed: int, **options: float):
        """The scripted expert for the current episode (call after :meth:`reset`); ``options``: where
        its base stops (:class:`~demoscale.eval.wholebody.expert.FetchShelfExpert`'s ranges)."""
        from demoscale.eval.wholebody.expert import TouchShelfExpert

        return TouchShelfExpert(self, seed, **options)


# touch_shelf stage thresholds (see TouchShelfEnv): base centre to the shelf's front edge (m), base
# centre to the shelf's centre line (m), right shoulder above the board (m).
AT_SHELF_DEPTH = 0.6
AT_SHELF_LATERAL = 0.45
SHOULDER_ABOVE_BOARD = (0.05, 0.35)
