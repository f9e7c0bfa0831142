"""PushT adapter: observations as the real replay buffer recorded them, coverage, replayed demos."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from demoscale.eval import IdRangeError, get_task, make_env
from demoscale.eval.pusht import SUCCESS_COVERAGE, ReplayEpisodes


@pytest.fixture(scope="module")
def replay(pusht_replay_path) -> ReplayEpisodes:
    return ReplayEpisodes(pusht_replay_path)


def test_observation_matches_recorded_frames(pusht_replay_path, replay: ReplayEpisodes) -> None:
    root = zarr.open_group(str(pusht_replay_path), mode="r")
    env = get_task("pusht").make_env(0, 0)
    env.reset(0)
    for frame in (0, 1000, 5000):
        recorded_state = replay.state[frame]
        env.set_state(recorded_state)
        obs = env.observe()
        assert obs["img"].shape == (96, 96, 3) and obs["img"].dtype == np.uint8
        assert obs["state"].shape == (5,) and obs["state"].dtype == np.float32
        np.testing.assert_allclose(obs["state"][:4], recorded_state[:4], atol=0.05)
        recorded_img = np.asarray(root["data/img"][frame])
        # Same orientation and scale: pixel values agree to within rounding.
        assert np.abs(obs["img"].astype(np.float32) - recorded_img).mean() < 1.0
        # A transposed or flipped image would not.
        assert np.abs(obs["img"].transpose(1, 0, 2).astype(np.float32) - recorded_img).mean() > 3.0
    env.close()


def test_replayed_human_episode_follows_the_recording(replay: ReplayEpisodes) -> None:
    env = make_env("pusht", 1, 0, seed=0, replay_path=replay.path)
    start, stop = replay.bounds(1)
    np.testing.assert_allclose(env.observe()["state"][:4], replay.state[start, :4], atol=1e-3)
    expert = env.expert(0)
    obs = env.observe()
    for frame in range(start, stop):
        obs = env.step(expert.act(obs))
        if frame + 1 < stop:
            np.testing.assert_allclose(obs["state"][:4], replay.state[frame + 1, :4], atol=1.0)
    assert expert.done
    # The human pushed the T most of the way onto the goal: a real coverage, stages 1-3 reached.
    assert 0.8 < env.coverage <= 1.0 and env.max_coverage >= env.coverage
    assert env.stages()[:3] == [True, True, True]
    assert env.success() == (env.coverage >= SUCCESS_COVERAGE)


def test_coverage_is_full_on_the_goal_and_low_away_from_it() -> None:
    env = get_task("pusht").make_env(3, 0)
    env.reset(0)
    env.set_state([100, 100, 256, 256, np.pi / 4])  # block exactly on the goal pose
    env.step(np.array([100.0, 100.0]))
    assert env.coverage > 0.99 and env.success() and env.stages() == [True] * 4
    env.reset(1)
    env.set_state([400, 100, 120, 420, 0.0])
    env.step(np.array([400.0, 100.0]))
    assert env.coverage < 0.2 and not env.success()


def test_ids_seed_the_initial_pose_and_bad_input_is_rejected(replay: ReplayEpisodes) -> None:
    a = make_env("pusht", 5, 0, seed=2).observe()["state"]
    b = make_env("pusht", 5, 0, seed=2).observe()["state"]
    c = make_env("pusht", 1_000_005, 0, seed=2).observe()["state"]
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    with pytest.raises(IdRangeError):
        make_env("pusht", 20_000, 0)
    with pytest.raises(ValueError, match="episodes"):
        make_env("pusht", 5_000, 0, replay_path=replay.path)
    env = make_env("pusht", 5, 0)
    with pytest.raises(ValueError, match="replay_path"):
        env.expert(0)
    with pytest.raises(ValueError, match="shape"):
        env.step(np.zeros(3))
    with pytest.raises(TypeError, match="options"):
        make_env("pusht", 5, 0, n_points=3)


@pytest.mark.slow  # the shared rollout loop imports torch: ~20-40 s on a loaded machine
def test_shared_evaluate_runs_the_replay_expert(replay: ReplayEpisodes, tmp_path) -> None:
    from demoscale.eval import evaluate

    result = evaluate(
        "expert",
        "pusht",
        split="train",
        n_envs=1,
        n_objects=1,
        episodes=1,
        out_dir=tmp_path,
        video_episodes=0,
        env_options={"replay_path": str(replay.path)},
        max_steps=len(replay.actions(0)) + 5,
        progress=False,
    )
    rollouts = result.rollouts
    assert len(rollouts) == 1 and rollouts["env_id"].tolist() == [0]
    # The replayed human demo pushes the T onto the goal (coverage >= 75%; the rollout stops early
    # if the block settles to >= 95%).
    assert rollouts["score"].iloc[0] >= 0.75 and rollouts["steps"].iloc[0] <= len(replay.actions(0)) + 5
    assert result.summary["n_rollouts"] == 1 and (tmp_path / "rollouts.csv").exists()


def test_env_options_from_the_command_line_are_parsed_as_yaml() -> None:
    from demoscale.eval.cli import parse_env_options

    assert parse_env_options(["replay_path=data/pusht.zarr", "n_points=3", "flag=true"]) == {
        "replay_path": "data/pusht.zarr",
        "n_points": 3,
        "flag": True,
    }
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_env_options(["replay_path"])


@pytest.mark.slow  # imports torch through the rollout loop
def test_eval_command_replays_the_human_demo_from_the_replay_buffer(replay: ReplayEpisodes, tmp_path) -> None:
    import json

    from demoscale.eval.cli import main

    code = main(
        [
            "expert",
            "--task",
            "pusht",
            "--split",
            "train",
            "--envs",
            "1",
            "--objects",
            "1",
            "--videos",
            "0",
            "--env-option",
            f"replay_path={replay.path}",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["n_rollouts"] == 1 and summary["score"] >= 0.75


def _recorded_max_coverage(replay: ReplayEpisodes, episode: int, n_steps: int) -> float:
    """The best coverage the recorded human episode reached in its first ``n_steps`` steps, from the
    recorded states (state k is observed before action k, so steps 1..n_steps end in states 1..n)."""
    env = get_task("pusht").make_env(0, 0, images=False)
    env.reset(0)
    start, stop = replay.bounds(episode)
    coverage = []
    for frame in range(start, min(stop, start + n_steps + 1)):
        env.set_state(replay.state[frame])
        coverage.append(float(env._gym._get_coverage()))
    env.close()
    return max(coverage)


@pytest.mark.slow  # imports torch through the rollout loop
def test_replayed_human_demos_score_the_coverage_they_reached(replay: ReplayEpisodes) -> None:
    """The literature's metrics on recorded episodes: replaying a human demo through the rollout
    loop reports the max coverage that episode reached in the same steps (min(coverage / 0.95, 1)
    for the paper's measure), and success exactly when that coverage reached 95%."""
    from demoscale.eval import evaluate

    episodes = list(range(12))
    n_steps = min(len(replay.actions(e)) for e in episodes) - 1
    result = evaluate(
        "expert",
        "pusht",
        split="train",
        n_envs=len(episodes),
        video_episodes=0,
        env_options={"replay_path": str(replay.path)},
        max_steps=n_steps,
        progress=False,
    )
    rollouts = result.rollouts.set_index("env_id")
    recorded = {e: _recorded_max_coverage(replay, e, n_steps) for e in episodes}
    for episode in episodes:
        row = rollouts.loc[episode]
        # Replayed actions retrace the recorded states (to float precision, measured: < 1e-6).
        assert row["raw_max_coverage"] == pytest.approx(recorded[episode], abs=1e-4), episode
        assert row["max_coverage"] == pytest.approx(min(row["raw_max_coverage"] / SUCCESS_COVERAGE, 1.0))
        assert bool(row["success"]) == (row["raw_max_coverage"] >= SUCCESS_COVERAGE)
    summary = result.summary
    assert summary["mean_max_coverage"] == pytest.approx(rollouts["max_coverage"].mean())
    assert (
        summary["mean_max_coverage_ci_low"]
        <= summary["mean_max_coverage"]
        <= summary["mean_max_coverage_ci_high"]
    )
