"""Whole-body touch_shelf: procedural ids, staged score, the expert on both splits, JoyLo recordings."""

from __future__ import annotations

from functools import partial

import h5py
import numpy as np
import pytest
from demoscale.eval import IdRangeError, get_task, make_env
from demoscale.eval.collect_sim import run_expert_episode
from demoscale.eval.ids import env_id, object_id
from demoscale.eval.wholebody.env import SHOULDER_ABOVE_BOARD, TOUCH_STAGES
from demoscale.eval.wholebody.scene import TOUCH_SHELF_HEIGHT, scene_params, touch_scene_params

NO_RENDER = {"render": False}


def test_scenes_follow_the_ids_and_need_the_torso() -> None:
    assert touch_scene_params(5) == touch_scene_params(5)
    scenes = [touch_scene_params(i) for i in range(20)]
    heights = [scene.shelf_height for scene in scenes]
    assert max(heights) - min(heights) > 0.25  # the board height varies with the environment
    assert all(TOUCH_SHELF_HEIGHT[0] <= h <= TOUCH_SHELF_HEIGHT[1] for h in heights)
    # The room (colours, light, clutter) is the environment's fetch_shelf room.
    room = scene_params(5)
    assert (touch_scene_params(5).floor_rgb, touch_scene_params(5).clutter) == (room.floor_rgb, room.clutter)
    for bad in (-1, 10_000, 1_010_000):
        with pytest.raises(IdRangeError):
            touch_scene_params(bad)
    # At the start (torso lift 0) the shoulder is not yet at the board's height: the torso must rise.
    env = make_env("touch_shelf", 2, 0, **NO_RENDER)
    assert env.shoulder_above_board() < SHOULDER_ABOVE_BOARD[0]


def test_stages_count_in_order() -> None:
    definition = get_task("touch_shelf")
    assert definition.family == "wholebody" and definition.max_steps <= 150
    assert definition.extras["stages"] == TOUCH_STAGES and definition.n_stages == 3
    env = definition.make_env(4, 1, **NO_RENDER)
    env.reset(0)
    action = env.last_action.copy()
    action[3] = 0.54  # torso all the way up while the base stays at the start
    for _ in range(20):
        env.step(action)
    assert SHOULDER_ABOVE_BOARD[0] <= env.shoulder_above_board()
    assert env.stages() == [False, False, False] and env.score() == 0.0  # the base never reached the shelf
    assert not env.success()


@pytest.mark.parametrize("split,k", [("train", 3), ("unseen", 7)])  # 50 episodes each: the slow test below
def test_expert_touches_the_object(split: str, k: int) -> None:
    env = get_task("touch_shelf").make_env(env_id(split, k), object_id(split, k), **NO_RENDER)
    episode, success = run_expert_episode(env, seed=k)
    assert success and env.stages() == [True] * 3 and env.score() == 1.0
    assert env.hand_touches_object()  # the episode ends at the touch
    actions = episode["action"]
    assert actions.shape[1] == 21 and len(actions) <= 100
    assert np.abs(actions[:, 0]).max() > 0.2  # the base drove
    assert actions[:, 3].max() > 0.2  # the torso rose
    assert np.abs(actions[-1, 14:20] - actions[0, 14:20]).max() > 0.3  # the right arm reached


def test_recording_is_joylo_with_point_clouds_and_ingests(tmp_path) -> None:
    from demoscale.collect.joylo import ingest_joylo
    from demoscale.datasets import EpisodeStore
    from demoscale.eval import collect_sim

    result = collect_sim("touch_shelf", 1, 1, 1, tmp_path / "raw", image_size=48, progress=False)
    assert result.n_demos == 1 and result.expert_success_rate == 1.0
    (path,) = sorted((tmp_path / "raw" / "touch_shelf" / "env_0" / "object_0").glob("*.h5"))
    frames = result.pairs[0].frames
    with h5py.File(path, "r") as file:
        assert file.attrs["task"] == "touch_shelf" and file.attrs["record_freq"] == 10.0
        assert file["obs/point_cloud/fused/xyz"].shape == (frames, 512, 3)
        assert file["obs/point_cloud/fused/padding_mask"].dtype == bool
        assert file["obs/joint_state/torso/joint_position"].shape == (frames, 4)
        assert file["action/mobile_base"].shape == (frames, 3)
        assert file["action/right_gripper"].shape == (frames,)
    ingest_joylo(tmp_path / "raw", tmp_path / "store.zarr", progress=False)
    store = EpisodeStore.open(tmp_path / "store.zarr")
    assert store.n_episodes == 1 and store.n_frames == frames
    assert store.episodes.iloc[0]["task"] == "touch_shelf"
    episode = store.episode(0)
    assert episode["action"].shape == (frames, 21) and episode["pointcloud_xyz"].shape[1:] == (512, 3)
    # The floor is outside touch_shelf's crop box: the points lie on the shelf, the object, the arms.
    points = episode["pointcloud_xyz"][episode["pointcloud_mask"]]
    assert points[:, 2].min() >= 0.03 - 1e-5
    assert store.features["head_rgb"].source == {
        "task": "touch_shelf", "camera": "head", "image_size": 48, "env_options": {}
    }  # fmt: skip
    # The clouds record what produced them too: a policy that sees only clouds (WB-VIMA) is then
    # evaluated on its task without --task.
    for key in ("pointcloud_xyz", "pointcloud_rgb", "pointcloud_mask"):
        assert store.features[key].source == {
            "task": "touch_shelf", "camera": "head", "image_size": 48, "env_options": {}
        }  # fmt: skip
    from types import SimpleNamespace

    from demoscale.eval.rollout import apply_capture, recorded_capture

    clouds_only = SimpleNamespace(
        features={k: v.to_dict() for k, v in store.features.items()},
        obs_offsets={"proprio": [-1, 0], "pointcloud_xyz": [-1, 0], "pointcloud_rgb": [-1, 0]},
    )
    recorded = recorded_capture(clouds_only)
    assert set(recorded) == {"pointcloud_xyz", "pointcloud_rgb"}
    assert apply_capture(recorded, None, None, None)[:2] == ("touch_shelf", 48)


WIDE_PLACEMENT = {"standoff_range": 0.1, "lateral_range": 0.15, "yaw_range": 0.15}


@pytest.mark.slow
@pytest.mark.parametrize("split", ["train", "unseen"])
@pytest.mark.parametrize("placement", [None, WIDE_PLACEMENT], ids=["default", "wide"])
def test_expert_success_rate_over_fifty_episodes(split: str, placement: dict | None) -> None:
    task = get_task("touch_shelf")
    successes, lengths = 0, []
    for k in range(50):
        env = task.make_env(env_id(split, k), object_id(split, (7 * k) % 50), **NO_RENDER)
        episode, success = run_expert_episode(env, seed=k, expert_options=placement)
        successes += success
        lengths.append(len(episode["action"]))
    assert successes >= 45, f"expert succeeded in {successes}/50 {split} episodes"
    assert max(lengths) <= task.max_steps + 1


def test_noise_injected_demos_record_the_experts_commands() -> None:
    """DART-style collection: the robot executes noisy commands, the expert corrects, and the
    recording keeps the expert's own (smooth) commands as the actions."""
    k = 3
    make = partial(get_task("touch_shelf").make_env, env_id("train", k), object_id("train", k), **NO_RENDER)
    clean_env, noisy_env = make(), make()
    clean, clean_success = run_expert_episode(clean_env, seed=k)
    noisy, _ = run_expert_episode(noisy_env, seed=k, action_noise=0.03)
    again, _ = run_expert_episode(make(), seed=k, action_noise=0.03)
    assert clean_success
    np.testing.assert_array_equal(noisy["action"], again["action"])  # the noise is the seed's
    joints = slice(3, 13)  # torso and left arm: position targets the simulator tracks

    def tracking_error(episode) -> float:
        return float(np.abs(episode["proprio"][1:, joints] - episode["action"][:-1, joints]).mean())

    assert tracking_error(clean) < 0.003 and tracking_error(noisy) > 0.01  # the executed commands were noisy
    # ... but the recorded ones are the expert's: smooth (noise of 0.03 recorded would give a mean
    # second difference of about 0.05).
    roughness = np.abs(np.diff(noisy["action"][:, joints], n=2, axis=0)).mean()
    assert roughness < 0.003
    with pytest.raises(ValueError, match="action_noise"):
        run_expert_episode(clean_env, seed=k, action_noise=-0.1)


def test_noise_can_be_restricted_to_the_experts_driving() -> None:
    """``noise_phases=["drive"]``: the base's commands are perturbed while the expert drives, and
    executed exactly once it stands at the shelf and reaches; a phase the expert never enters gets
    no noise at all."""
    k = 3
    make = partial(get_task("touch_shelf").make_env, env_id("train", k), object_id("train", k), **NO_RENDER)
    base_noise = [0.1, 0.1, 0.5] + [0.0] * 18
    episode, success = run_expert_episode(make(), seed=k, action_noise=base_noise, noise_phases=["drive"])
    assert success
    # The base tracks its velocity command within 1 mm/s: a larger gap is the injected noise.
    gap = np.abs(episode["proprio"][1:, :3] - episode["action"][:-1, :3]).max(axis=1)
    standing = np.abs(episode["action"][:-1, :3]).max(axis=1) == 0.0  # hold / reach / touch: no drive
    assert standing.sum() >= 10 and (~standing).sum() >= 10
    assert gap[standing].max() < 0.002
    assert gap[~standing].mean() > 0.1
    clean, _ = run_expert_episode(make(), seed=k)
    never, _ = run_expert_episode(make(), seed=k, action_noise=base_noise, noise_phases=["no such phase"])
    np.testing.assert_array_equal(never["proprio"], clean["proprio"])


def _stop_in_object_frame(env) -> np.ndarray:
    """Where the base stands when the hand touches: (ahead, aside) of it to the object (m) and its yaw."""
    x, y, yaw = env.base_pose()
    offset = env.object_position()[:2] - np.array([x, y])
    c, s = np.cos(yaw), np.sin(yaw)
    return np.array([c * offset[0] + s * offset[1], -s * offset[0] + c * offset[1], yaw])


def test_the_expert_stops_where_its_placement_ranges_say() -> None:
    """The default ranges are the expert's own draws (same episode bit for bit); wider ones spread
    where the base stops (ahead, aside, heading) and the expert still touches from there."""
    make = partial(get_task("touch_shelf").make_env, env_id("train", 3), object_id("train", 3), **NO_RENDER)
    plain, _ = run_expert_episode(make(), seed=3)
    explicit, _ = run_expert_episode(
        make(), seed=3, expert_options={"standoff_range": 0.03, "lateral_range": 0.01, "yaw_range": 0.04}
    )
    np.testing.assert_array_equal(plain["action"], explicit["action"])
    np.testing.assert_array_equal(plain["proprio"], explicit["proprio"])
    stops = {}
    for name, options in (("default", None), ("wide", WIDE_PLACEMENT)):
        rows = []
        for seed in range(6):
            env = make()
            _, success = run_expert_episode(env, seed=seed, expert_options=options)
            assert success, (name, seed)
            rows.append(_stop_in_object_frame(env))
        stops[name] = np.ptp(np.array(rows), axis=0)
    # The default spread: ~2 cm aside, ~0.08 rad of heading; the wide one several times that.
    assert np.all(stops["wide"][1:] > 3 * stops["default"][1:]), stops


def test_expert_options_are_checked_by_name() -> None:
    from demoscale.eval.collect_sim import collect_sim

    env = get_task("touch_shelf").make_env(env_id("train", 3), object_id("train", 3), **NO_RENDER)
    with pytest.raises(ValueError, match="does not take"):
        run_expert_episode(env, seed=0, expert_options={"reach_range": 0.1})
    with pytest.raises(ValueError, match="yaw_range must be in"):
        run_expert_episode(env, seed=0, expert_options={"yaw_range": 1.0})
    with pytest.raises(ValueError, match="the pusht expert does not take"):
        collect_sim("pusht", 1, 1, 1, "unused", expert_options={"lateral_range": 0.1}, progress=False)


def test_collect_cli_parses_expert_options() -> None:
    from demoscale.eval.collect_sim_cli import parse_expert_options

    assert parse_expert_options(["lateral_range=0.1", " yaw_range = 0.2"]) == {
        "lateral_range": 0.1,
        "yaw_range": 0.2,
    }
    for bad in ("lateral_range", "=0.1", "lateral_range=wide"):
        with pytest.raises(ValueError, match="KEY=NUMBER"):
            parse_expert_options([bad])
