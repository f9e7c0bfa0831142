"""Waypoint labelling on hand-made trajectories whose waypoints are known."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from demoscale.datasets.waypoints import (
    WaypointError,
    label_waypoints,
    next_waypoint_indices,
)


def _corner(n_leg: int = 10) -> np.ndarray:
    """Straight along x for n_leg steps, then straight along y: the corner is frame n_leg."""
    first = np.stack([np.arange(n_leg + 1), np.zeros(n_leg + 1)], axis=1)
    second = np.stack([np.full(n_leg, n_leg), np.arange(1, n_leg + 1)], axis=1)
    return np.concatenate([first, second]).astype(float) * 0.01


def test_corner_and_last_frame_are_the_only_waypoints():
    positions = _corner()
    assert label_waypoints(positions, threshold=1e-3).tolist() == [10, 20]


def test_straight_line_needs_only_the_last_frame():
    positions = np.linspace([0, 0, 0], [1, 2, 3], 30)
    assert label_waypoints(positions, threshold=1e-4).tolist() == [29]


def test_gripper_toggle_is_a_waypoint_even_on_a_straight_line():
    positions = np.linspace([0.0, 0.0], [1.0, 0.0], 21)
    gripper = np.where(np.arange(21) >= 7, 0.0, 0.08)  # closes at frame 7 (continuous width)
    assert label_waypoints(positions, gripper, threshold=1e-3).tolist() == [7, 20]


def test_pause_start_is_a_waypoint_with_rest_detection():
    # Moves 0..10 along x, stays at 10 over frames 10..15, then moves on along x to frame 25.
    x = np.concatenate([np.arange(11), np.full(5, 10.0), 10 + np.arange(1, 11)]) * 0.01
    positions = np.stack([x, np.zeros_like(x)], axis=1)
    assert label_waypoints(positions, threshold=1e-3, rest_speed=1e-6).tolist() == [10, 15, 25]
    # With a loose threshold interpolation alone needs only the last frame; the rest frame stays.
    assert label_waypoints(positions, threshold=1.0).tolist() == [25]
    assert label_waypoints(positions, threshold=1.0, rest_speed=1e-6).tolist() == [10, 25]


def test_larger_threshold_gives_fewer_waypoints():
    t = np.linspace(0, 2 * np.pi, 60)
    positions = np.stack([np.cos(t), np.sin(t)], axis=1) * 0.1
    counts = [len(label_waypoints(positions, threshold=th)) for th in (0.001, 0.005, 0.02)]
    assert counts[0] > counts[1] > counts[2] >= 1


def test_rotation_turnaround_is_a_waypoint():
    angles = np.concatenate([np.linspace(0, np.pi / 2, 11), np.linspace(np.pi / 2, 0, 11)[1:]])
    rotations = np.stack([np.zeros_like(angles), np.zeros_like(angles), angles], axis=1)  # axis-angle
    positions = np.zeros((len(angles), 3))
    assert label_waypoints(positions, threshold=1e-3, rotations=rotations).tolist() == [10, 20]
    # Ignoring rotations, a still end effector needs only its last frame.
    assert label_waypoints(positions, threshold=1e-3).tolist() == [20]


def _brute_force_count(positions: np.ndarray, threshold: float) -> int:
    """Fewest waypoints (last frame included) by trying every subset of the inner frames."""
    last = len(positions) - 1

    def error(i: int, j: int) -> float:
        ks = np.arange(i + 1, j)
        if ks.size == 0:
            return 0.0
        alpha = ((ks - i) / (j - i))[:, None]
        return float(
            np.linalg.norm(
                positions[ks] - (positions[i] + alpha * (positions[j] - positions[i])), axis=1
            ).max()
        )

    for size in range(last + 1):
        for inner in itertools.combinations(range(1, last), size):
            chain = [0, *inner, last]
            if all(error(a, b) <= threshold for a, b in itertools.pairwise(chain)):
                return size + 1
    raise AssertionError("unreachable")


def test_dynamic_programme_finds_the_fewest_waypoints():
    rng = np.random.default_rng(3)
    for _ in range(5):
        positions = np.cumsum(rng.normal(size=(9, 2)), axis=0)
        labelled = label_waypoints(positions, threshold=0.5)
        assert len(labelled) == _brute_force_count(positions, 0.5)
        assert labelled[-1] == 8


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(WaypointError, match="threshold must be > 0"):
        label_waypoints(np.zeros((5, 2)), threshold=0.0)
    with pytest.raises(WaypointError, match="threshold must be > 0"):
        label_waypoints(np.zeros((5, 2)), threshold=-1.0)
    with pytest.raises(WaypointError, match="gripper has 4 frames"):
        label_waypoints(np.zeros((5, 2)), np.zeros(4), threshold=0.1)
    with pytest.raises(WaypointError, match="rotations"):
        label_waypoints(np.zeros((5, 2)), threshold=0.1, rotations=np.zeros((5, 2)))


def test_next_waypoint_index_points_strictly_forward_within_the_episode():
    following = next_waypoint_indices(np.array([3, 7, 9]), 10, offset=100)
    assert following.tolist() == [103, 103, 103, 107, 107, 107, 107, 109, 109, 109]


def _umi_like_store(path, n_episodes: int = 2):
    from demoscale.datasets import EpisodeStore, FeatureSpec

    features = {
        "robot0_eef_pos": FeatureSpec(kind="low_dim", shape=(3,), dtype="float32", rate_hz=10.0, units="m"),
        "robot0_gripper_width": FeatureSpec(
            kind="low_dim", shape=(1,), dtype="float32", rate_hz=10.0, units="m"
        ),
        "action": FeatureSpec(kind="low_dim", shape=(4,), dtype="float32", rate_hz=10.0, units="m"),
    }
    store = EpisodeStore.create(str(path), features)
    corner = np.concatenate([_corner(), np.zeros((21, 1))], axis=1).astype(np.float32)  # waypoints 10, 20
    gripper = np.where(np.arange(21) >= 5, 0.0, 0.08).astype(np.float32)[:, None]  # toggles at 5
    for episode in range(n_episodes):
        store.append_episode(
            {
                "robot0_eef_pos": corner,
                "robot0_gripper_width": gripper,
                "action": np.concatenate([corner, gripper], axis=1),
            },
            env_id="0",
            object_id=str(episode),
            task="corner",
            operator="scripted",
            source=f"corner-{episode}",
            source_sha256=f"{episode:064x}",
            success=True,
        )
    return store


def test_store_labelling_caches_global_next_waypoint_indices(tmp_path):
    from demoscale.datasets.waypoints import label_store_waypoints, read_next_waypoint_index

    path = tmp_path / "corner.zarr"
    store = _umi_like_store(path)
    values = label_store_waypoints(str(path), threshold=1e-3)
    expected = next_waypoint_indices(np.array([5, 10, 20]), 21)
    assert values.tolist() == expected.tolist() + (expected + 21).tolist()
    assert read_next_waypoint_index(str(path)).tolist() == values.tolist()
    # Cached: the same parameters return the cache; other parameters need overwrite.
    assert label_store_waypoints(str(path), threshold=1e-3).tolist() == values.tolist()
    with pytest.raises(WaypointError, match="overwrite"):
        label_store_waypoints(str(path), threshold=0.5)
    loose = label_store_waypoints(str(path), threshold=0.5, overwrite=True)
    assert loose[0] == 5 and loose[6] == 20  # the toggle stays, the corner goes
    with pytest.raises(WaypointError, match="threshold must be > 0"):
        label_store_waypoints(str(path), threshold=0)
    # The store stays valid, and appending an episode makes the cache stale.
    store.validate()
    del store
    from demoscale.datasets import EpisodeStore

    appended = EpisodeStore.open(str(path), mode="a")
    appended.append_episode(
        {key: appended.read(key, 0, 21) for key in appended.features},
        env_id="1",
        object_id="0",
        task="corner",
        operator="scripted",
        source="corner-extra",
        source_sha256="f" * 64,
        success=True,
    )
    assert read_next_waypoint_index(str(path)) is None
    assert len(label_store_waypoints(str(path), threshold=0.5)) == 63


def test_sampler_returns_the_next_waypoint_frame(tmp_path):
    from demoscale.datasets import EpisodeDataset, StoreError, WindowSampler
    from demoscale.datasets.waypoints import label_store_waypoints

    path = tmp_path / "corner.zarr"
    _umi_like_store(path)
    window = {"robot0_eef_pos": [-1, 0]}
    with pytest.raises(StoreError, match="label-waypoints"):
        WindowSampler(str(path), window, ["action"], 4, waypoint_keys=["robot0_eef_pos"])
    label_store_waypoints(str(path), threshold=1e-3)  # waypoints 5, 10, 20 in each episode
    sampler = WindowSampler(
        str(path), window, ["action"], 4, waypoint_keys=["robot0_eef_pos", "robot0_gripper_width"]
    )
    corner = _corner()
    for index, frame, waypoint in ((0, 0, 5), (7, 7, 10), (10, 10, 20), (20, 20, 20), (21 + 12, 12, 20)):
        sample = sampler.sample(index)
        assert sample["frame_index"] == frame and sample["waypoint_index"] == waypoint
        assert sample["waypoint_obs"]["robot0_eef_pos"].shape == (1, 3)
        np.testing.assert_allclose(
            sample["waypoint_obs"]["robot0_eef_pos"][0, :2], corner[waypoint], atol=1e-6
        )
    item = EpisodeDataset(str(path), window, ["action"], 4, waypoint_keys=["robot0_gripper_width"])[0]
    assert (
        item["waypoint_obs"]["robot0_gripper_width"].dtype.is_floating_point and item["waypoint_index"] == 5
    )
    assert "waypoint_obs" not in WindowSampler(str(path), window, ["action"], 4).sample(0)
