"""The tabletop ``object_state`` option: the simulator's object pose and goal as observations,
carried simulator -> UMI zip -> store -> checkpoint -> evaluation (a state policy is evaluated with
the option without being told)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from demoscale.datasets import EpisodeStore

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tabletop_pick_place_state.yaml"
OPTIONS = {"cameras": ["scene"], "object_state": True}


@pytest.mark.parametrize(
    "task, goal", [("pick_place", "container"), ("push", "target"), ("reach", "object_start")]
)
def test_the_option_observes_the_object_pose_and_the_tasks_goal(task: str, goal: str) -> None:
    from demoscale.eval import get_task

    definition = get_task(task)
    plain = definition.make_env(3, 4, image_size=32, cameras=("scene",))
    stated = definition.make_env(3, 4, image_size=32, cameras=("scene",), object_state=True)
    try:
        assert not any(key.startswith("object") for key in plain.reset(seed=7))
        obs = stated.reset(seed=7)
        for _ in range(3):
            obs = stated.step(stated.expert(7).act(obs))
        pose = np.array([*stated.object_pos, stated.object_yaw], np.float32)
        np.testing.assert_array_equal(obs["object0_pose"], pose)
        np.testing.assert_array_equal(obs["object0_goal"], np.asarray(stated.layout[goal], np.float32))
        assert obs["object0_pose"].shape == (4,) and obs["object0_goal"].shape == (2,)
    finally:
        plain.close()
        stated.close()


@pytest.fixture(scope="module")
def state_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from demoscale.collect.umi import ingest_umi
    from demoscale.eval import collect_sim

    root = tmp_path_factory.mktemp("object_state")
    collect_sim("pick_place", 1, 1, 2, root / "raw", image_size=32, env_options=OPTIONS, progress=False)
    ingest_umi(root / "raw", root / "store.zarr", progress=False)
    return root / "store.zarr"


def test_demos_carry_the_object_state_into_the_store(state_store: Path) -> None:
    store = EpisodeStore.open(state_store)
    assert store.features["object0_pose"].shape == (4,)
    assert store.features["object0_goal"].shape == (2,)
    assert store.features["object0_pose"].units == "simulator state"
    for index in range(store.n_episodes):
        episode = store.episode(index)
        pose, goal = episode["object0_pose"], episode["object0_goal"]
        assert pose.dtype == np.float32 and len(pose) == len(episode["action"])
        # The container stays where it is; the object (a successful demo) ends inside it, lifted
        # off the table in between.
        assert np.all(goal == goal[0])
        assert np.abs(pose[-1, :2] - goal[0]).max() < 0.07
        assert pose[:, 2].max() > pose[0, 2] + 0.02


def test_a_state_policy_is_evaluated_with_the_recorded_option(state_store: Path, tmp_path: Path) -> None:
    from demoscale.eval import evaluate
    from demoscale.eval.rollout import recorded_capture
    from demoscale.policies import load_policy, train

    trained = train(
        str(CONFIG),
        {"data.store": str(state_store), "trainer.max_steps": 2, "data.batch_size": 4,
         "model.init_args.global_batch_size": 4, "trainer.val_check_interval": 2,
         "checkpoint.every_n_train_steps": 2, "trainer.default_root_dir": str(tmp_path / "run"),
         "trainer.enable_progress_bar": False, "trainer.logger": False, "progress.every_s": 0},
    )  # fmt: skip
    policy = load_policy(trained.checkpoint_path)
    assert "camera0_rgb" not in policy.obs_offsets
    recorded = recorded_capture(policy)
    assert recorded["camera0_rgb"]["env_options"] == OPTIONS
    result = evaluate(trained.checkpoint_path, n_envs=1, episodes=1, max_steps=4, progress=False)
    assert result.summary["task"] == "pick_place"
    assert result.summary["env_options"] == OPTIONS


def test_a_malformed_object_array_is_refused(tmp_path: Path) -> None:
    from demoscale.collect import write_umi_zip

    steps = 3
    episode = {
        "robot0_eef_pos": np.zeros((steps, 3), np.float32),
        "robot0_eef_rot_axis_angle": np.zeros((steps, 3), np.float32),
        "robot0_gripper_width": np.zeros((steps, 1), np.float32),
        "object0_pose": np.zeros((steps, 4), np.int32),
    }
    with pytest.raises(ValueError, match=r"object0_pose must be \(T, k\) float"):
        write_umi_zip(tmp_path / "dataset.zarr.zip", [episode])


def test_the_whole_body_option_observes_the_object_in_the_base_frame(tmp_path: Path) -> None:
    from demoscale.collect import IngestError, ingest
    from demoscale.collect.joylo import write_joylo_episode
    from demoscale.eval import collect_sim, get_task

    definition = get_task("touch_shelf")
    plain = definition.make_env(2, 5, render=False)
    stated = definition.make_env(2, 5, render=False, object_state=True)
    try:
        assert "object0_pose" not in plain.reset(seed=3)
        obs = stated.reset(seed=3)
        x, y, yaw = stated.base_pose()
        world = stated.object_position()
        c, s = np.cos(yaw), np.sin(yaw)
        expected = [
            c * (world[0] - x) + s * (world[1] - y),
            -s * (world[0] - x) + c * (world[1] - y),
            world[2],
        ]
        np.testing.assert_allclose(obs["object0_pose"][:3], expected, atol=1e-6)
        assert obs["object0_pose"].dtype == np.float32 and obs["object0_pose"].shape == (4,)
    finally:
        plain.close()
        stated.close()

    # Through a JoyLo recording into the store: the robot drives up to the shelf, so the object
    # comes nearer in the base frame over a demonstration.
    options = {"render": False, "object_state": True}
    collect_sim("touch_shelf", 1, 1, 1, tmp_path / "raw", env_options=options, progress=False)
    ingest("joylo", tmp_path / "raw", tmp_path / "store.zarr", progress=False)
    store = EpisodeStore.open(tmp_path / "store.zarr")
    assert store.features["object0_pose"].frame == "base"
    pose = store.episode(0)["object0_pose"]
    assert pose[-1, 0] < pose[0, 0] - 0.3

    # A malformed object array in a recording is refused, naming it, and no store is made.
    (recording,) = (tmp_path / "raw").rglob("episode_0.h5")
    import h5py

    with h5py.File(recording) as file:
        flat = {}
        file.visititems(
            lambda name, item: flat.update({name: item[()]}) if isinstance(item, h5py.Dataset) else None
        )
        attrs = dict(file.attrs)
    flat["obs/object_state/object0_pose"] = flat["obs/object_state/object0_pose"].astype(np.int32)
    write_joylo_episode(tmp_path / "bad" / "episode_0.h5", flat, attrs)
    with pytest.raises(IngestError, match="object_state/object0_pose"):
        ingest("joylo", tmp_path / "bad", tmp_path / "bad.zarr", progress=False)
    assert not (tmp_path / "bad.zarr").exists()
