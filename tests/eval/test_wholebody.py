"""Whole-body family (fetch_shelf): procedural ids, point clouds from depth, expert, JoyLo recordings."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from demoscale.eval import IdRangeError, UnknownTaskError, get_task, make_env
from demoscale.eval.collect_sim import run_expert_episode
from demoscale.eval.wholebody.pointcloud import backproject, sample_fixed, voxel_sample
from demoscale.eval.wholebody.scene import object_params, scene_params
from demoscale.eval.wholebody.tasks import episode_to_joylo, write_joylo_demos

NO_RENDER = {"render": False}


def test_scene_and_object_follow_the_ids_and_their_ranges() -> None:
    assert scene_params(5) == scene_params(5)
    assert object_params(1_000_007) == object_params(1_000_007)
    heights = {round(scene_params(i).shelf_height, 3) for i in range(8)}
    assert len(heights) > 4  # the shelf height varies with the environment
    assert {object_params(i).shape for i in range(10)} == {"box", "cylinder"}
    for bad in (-1, 10_000, 999_999, 1_010_000):
        with pytest.raises(IdRangeError):
            scene_params(bad)
        with pytest.raises(IdRangeError):
            object_params(bad)
    with pytest.raises(IdRangeError):
        get_task("fetch_shelf").make_env(20_000, 0)


def test_reset_is_deterministic_in_ids_and_seed() -> None:
    first = make_env("fetch_shelf", 4, 2, seed=3, image_size=48, n_points=256)
    second = make_env("fetch_shelf", 4, 2, seed=3, image_size=48, n_points=256)
    a, b = first.observe(), second.observe()
    for key in ("proprio", "odom_position", "pointcloud_xyz", "pointcloud_rgb", "head_rgb"):
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    other = second.reset(4)
    assert not np.array_equal(other["odom_position"], a["odom_position"])
    assert a["proprio"].shape == (21,) and a["proprio"].dtype == np.float32


def test_point_cloud_lies_on_rendered_geometry() -> None:
    env = make_env("fetch_shelf", 6, 1, seed=0, image_size=64, n_points=512)
    obs = env.observe()
    xyz, rgb, mask = obs["pointcloud_xyz"], obs["pointcloud_rgb"], obs["pointcloud_mask"]
    assert xyz.shape == (512, 3) and xyz.dtype == np.float32
    assert rgb.shape == (512, 3) and rgb.dtype == np.uint8
    assert mask.shape == (512,) and mask.dtype == bool and mask.all()
    points = xyz[mask]
    config = env.config
    # MuJoCo's clipping planes are fractions of the model extent: nothing closer than 3 cm is lost.
    assert env.model.vis.map.znear * env.model.stat.extent < 0.03
    assert np.all(points >= np.array(config.crop_min) - 1e-5) and np.all(
        points <= np.array(config.crop_max) + 1e-5
    )
    # The floor is the plane z = 0 of the base frame: many points sit on it, none below it.
    assert points[:, 2].min() > -0.01
    assert (np.abs(points[:, 2]) < 0.005).mean() > 0.2
    # The shelf board holding the object is seen at its height, in front of the robot.
    x, y, yaw = env.base_pose()
    board = env.scene.shelf_height
    near_board = np.abs(points[:, 2] - board) < 0.01
    assert near_board.sum() > 5
    assert points[near_board, 0].min() > env.scene.shelf_x - x - 0.3
    # Some points lie on the object (its centre, expressed in the base frame).
    centre = env.object_position() - np.array([x, y, 0.0])
    centre = np.array(
        [
            np.cos(yaw) * centre[0] + np.sin(yaw) * centre[1],
            -np.sin(yaw) * centre[0] + np.cos(yaw) * centre[1],
            centre[2],
        ]
    )
    half = np.array([env.object.half_depth, env.object.half_width, env.object.half_height]).max() + 0.01
    assert np.all(np.abs(points - centre) <= half + 0.01, axis=1).sum() >= 1


def test_backprojection_and_padding() -> None:
    depth = np.full((4, 6), 2.0)
    points = backproject(depth, fovy_deg=90.0)
    assert points.shape == (24, 3)
    np.testing.assert_allclose(points[:, 2], -2.0)
    assert points[:, 0].min() < 0 < points[:, 0].max() and abs(points[:, 1].max()) <= 2.0
    rng = np.random.default_rng(0)
    xyz, rgb, mask = sample_fixed(points, np.zeros((24, 3), np.uint8), 32, rng)
    assert mask.sum() == 24 and not mask[24:].any() and np.all(xyz[24:] == 0)
    cloud = rng.uniform(0, 1, (5000, 3))
    keep = voxel_sample(cloud, 300, rng)
    assert len(np.unique(keep)) == 300
    with pytest.raises(ValueError, match="sampling"):
        sample_fixed(points, np.zeros((24, 3), np.uint8), 8, rng, method="grid")


@pytest.mark.parametrize("env_id,object_id", [(3, 5)])  # 50 episodes: the slow test below
def test_expert_succeeds_on_training_ids(env_id: int, object_id: int) -> None:
    env = get_task("fetch_shelf").make_env(env_id, object_id, **NO_RENDER)
    episode, success = run_expert_episode(env, seed=1)
    assert success and env.stages() == [True] * 4 and env.score() == 1.0
    actions = episode["action"]
    assert actions.shape[1] == 21 and len(actions) <= env.max_steps
    assert np.abs(actions[:, 0]).max() > 0.2  # the base drove
    assert (
        actions[:, 3].max() > actions[0, 3] + 0.02 or actions[:, 3].min() < actions[0, 3] - 0.02
    )  # torso lift moved
    assert actions[:, 20].min() < 1.0 < actions[:, 20].max()  # right gripper closed and opened


def test_bad_actions_and_options_are_rejected() -> None:
    env = get_task("fetch_shelf").make_env(1, 1, **NO_RENDER)
    env.reset(0)
    with pytest.raises(ValueError, match="21"):
        env.step(np.zeros(20))
    with pytest.raises(ValueError, match="finite"):
        env.step(np.full(21, np.nan))
    with pytest.raises(ValueError, match="camera"):
        get_task("fetch_shelf").make_env(1, 1, cameras=("tail",))
    with pytest.raises(TypeError, match="options"):
        get_task("fetch_shelf").make_env(1, 1, n_pints=3)
    with pytest.raises(UnknownTaskError, match="fetch_shelf"):  # the message lists the known tasks
        make_env("fetch_shelve", 1, 1)


def test_recording_is_valid_joylo_and_ingests(tmp_path) -> None:
    env = make_env("fetch_shelf", 2, 3, seed=0, image_size=32, n_points=128)
    expert = env.expert(0)
    frames, actions = [], []
    obs = env.observe()
    for _ in range(6):
        action = expert.act(obs)
        frames.append(obs)
        actions.append(action)
        obs = env.step(action)
    episode = {key: np.stack([f[key] for f in frames]) for key in frames[0]}
    episode["action"] = np.stack(actions).astype(np.float32)
    pair_dir = tmp_path / "raw" / "fetch_shelf" / "env_2" / "object_3"
    shorter = {key: value[:4] for key, value in episode.items()}  # identical content would be deduplicated
    paths = write_joylo_demos(pair_dir, [episode, shorter], 10.0)
    assert [p.name for p in paths] == ["episode_0.h5", "episode_1.h5"]
    with h5py.File(paths[0], "r") as file:
        assert file.attrs["record_freq"] == 10.0 and file.attrs["horizon"] == 6
        assert file["obs/joint_state/torso/joint_position"].shape == (6, 4)
        assert file["obs/joint_state/right_arm/joint_velocity"].shape == (6, 6)
        assert file["obs/gripper_state/left_gripper/gripper_position"].shape == (6,)
        assert file["obs/point_cloud/fused/xyz"].shape == (6, 128, 3)
        assert file["obs/point_cloud/fused/padding_mask"].dtype == bool
        assert file["obs/rgb/head/img"].shape == (6, 32, 32, 3)
        assert file["action/mobile_base"].shape == (6, 3) and file["action/right_gripper"].shape == (6,)
        np.testing.assert_allclose(file["obs/odom/orientation"][()], episode["odom_orientation"])
    raw = episode_to_joylo(episode)
    np.testing.assert_allclose(raw["action/torso"], episode["action"][:, 3:7])

    from demoscale.collect.joylo import ingest_joylo
    from demoscale.datasets import EpisodeStore

    ingest_joylo(tmp_path / "raw", tmp_path / "store.zarr", progress=False)
    store = EpisodeStore.open(tmp_path / "store.zarr")
    assert store.n_episodes == 2 and store.n_frames == 10
    row = store.episodes.iloc[0]
    assert (row["env_id"], row["object_id"], row["task"]) == ("2", "3", "fetch_shelf")
    stored = store.episode(0)
    np.testing.assert_allclose(stored["action"], episode["action"], atol=1e-6)
    np.testing.assert_allclose(stored["proprio"], episode["proprio"], atol=1e-5)
    np.testing.assert_array_equal(stored["pointcloud_mask"], episode["pointcloud_mask"])
    assert stored["head_rgb"].shape == (6, 32, 32, 3)


@pytest.mark.slow
def test_expert_success_rate_over_fifty_training_episodes() -> None:
    task = get_task("fetch_shelf")
    successes = 0
    for k in range(50):
        env = task.make_env(k, (7 * k) % 50, **NO_RENDER)
        successes += run_expert_episode(env, seed=k)[1]
    assert successes >= 45, f"expert succeeded in {successes}/50 training episodes"


@pytest.mark.slow
def test_collect_sim_writes_fetch_shelf_demos_that_ingest(tmp_path) -> None:
    from demoscale.collect.joylo import ingest_joylo
    from demoscale.datasets import EpisodeStore
    from demoscale.eval import collect_sim

    result = collect_sim("fetch_shelf", 1, 1, 1, tmp_path / "raw", image_size=48, progress=False)
    assert result.n_demos == 1 and result.expert_success_rate == 1.0
    files = sorted((tmp_path / "raw" / "fetch_shelf" / "env_0" / "object_0").glob("*.h5"))
    assert [f.name for f in files] == ["episode_0.h5"]
    ingest_joylo(tmp_path / "raw", tmp_path / "store.zarr", progress=False)
    store = EpisodeStore.open(tmp_path / "store.zarr")
    assert store.n_episodes == 1 and store.n_frames == result.pairs[0].frames
    episode = store.episode(0)
    assert episode["pointcloud_xyz"].shape[1:] == (1024, 3) and episode["head_rgb"].shape[1:] == (48, 48, 3)
    assert episode["action"][:, 0].max() > 0.2  # the base drove to the shelf
    # The camera that rendered head_rgb travels in the JoyLo file into the store's feature spec.
    assert store.features["head_rgb"].source == {
        "task": "fetch_shelf", "camera": "head", "image_size": 48, "env_options": {}
    }  # fmt: skip


def test_triton_loading_after_rendering_does_not_crash() -> None:
    # Mesa's LLVM (software GL) and Triton's LLVM crash the process when Triton loads second; the env
    # loads Triton before its first GL context. A separate process, so a crash cannot take pytest down.
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("triton") is None:
        pytest.skip("Triton is not installed")
    script = (
        "from demoscale.eval import make_env\n"
        "env = make_env('fetch_shelf', 0, 0, image_size=16, n_points=32)\n"
        "import triton.knobs\n"
        "env.step(env.last_action)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
