"""JoyLo ingestion: raw per-episode files and merged BRS files, the 21-dim layouts, bad input."""

from __future__ import annotations

import shutil

import h5py
import numpy as np
import pytest
from demoscale.collect import IngestError, ingest_joylo, write_brs_merged, write_joylo_episode
from demoscale.collect.ingest_cli import main as cli_main
from demoscale.datasets import EpisodeStore


def _rotate_into_base(quat_xyzw, vectors):
    """v_base = R(q)^T v_world, with the rotation matrix written out (independent of scipy)."""
    x, y, z, w = (quat_xyzw / np.linalg.norm(quat_xyzw, axis=1, keepdims=True)).T.astype(np.float64)
    matrix = np.stack(
        [
            np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)], -1),
            np.stack([2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)], -1),
            np.stack([2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)], -1),
        ],
        axis=1,
    )
    return np.einsum("tji,tj->ti", matrix, vectors.astype(np.float64))


@pytest.fixture(scope="module")
def raw_tree(tmp_path_factory, make_joylo_episode):
    """Two raw episodes (arms recorded with 7 columns) under <task>/env_<i>/object_<j>/."""
    rng = np.random.default_rng(3)
    root = tmp_path_factory.mktemp("joylo") / "raw"
    episodes = [make_joylo_episode(rng, n, arm_columns=7) for n in (9, 12)]
    paths = [
        write_joylo_episode(root / f"clean_house/env_{i}/object_{i + 5}/episode_{i}.h5", episode)
        for i, episode in enumerate(episodes)
    ]
    return root, paths, episodes


def test_raw_files_give_the_documented_keys_and_values(tmp_path, raw_tree):
    root, paths, episodes = raw_tree
    summary = ingest_joylo(root, tmp_path / "store", progress=False)
    assert (summary.episodes_written, summary.frames_written) == (2, 21)
    store = EpisodeStore.open(tmp_path / "store")
    store.validate()
    assert list(store.episodes["env_id"]) == ["0", "1"] and list(store.episodes["object_id"]) == ["5", "6"]
    assert set(store.episodes["task"]) == {"clean_house"}
    assert store.episodes["source"][1] == str(paths[1].resolve())
    assert store.features["pointcloud_xyz"].kind == "point_cloud" and store.features[
        "pointcloud_xyz"
    ].shape == (64, 3)
    assert {"head_rgb", "left_wrist_rgb"} <= set(store.features) and "right_wrist_rgb" not in store.features

    source, stored = episodes[1], store.episode(1)
    expected_action = np.concatenate(
        [
            source["action/mobile_base"],
            source["action/torso"],
            source["action/left_arm"],
            source["action/left_gripper"][:, None],
            source["action/right_arm"],
            source["action/right_gripper"][:, None],
        ],
        axis=1,
    )
    np.testing.assert_array_equal(stored["action"], expected_action)
    np.testing.assert_array_equal(stored["action_left_arm"], source["action/left_arm"])
    np.testing.assert_array_equal(stored["action_right_gripper"][:, 0], source["action/right_gripper"])
    base_velocity = _rotate_into_base(source["obs/odom/orientation"], source["obs/odom/linear_velocity"])[
        :, :2
    ]
    yaw_rate = _rotate_into_base(source["obs/odom/orientation"], source["obs/odom/angular_velocity"])[:, 2]
    np.testing.assert_allclose(stored["odom_base_velocity"][:, :2], base_velocity, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(stored["odom_base_velocity"][:, 2], yaw_rate, rtol=1e-5, atol=1e-5)
    proprio = stored["proprio"]
    np.testing.assert_array_equal(proprio[:, :3], stored["odom_base_velocity"])
    np.testing.assert_array_equal(proprio[:, 3:7], source["obs/joint_state/torso/joint_position"])
    np.testing.assert_array_equal(proprio[:, 7:13], source["obs/joint_state/left_arm/joint_position"][:, :6])
    np.testing.assert_array_equal(proprio[:, 13], source["obs/gripper_state/left_gripper/gripper_position"])
    np.testing.assert_array_equal(
        proprio[:, 14:20], source["obs/joint_state/right_arm/joint_position"][:, :6]
    )
    np.testing.assert_array_equal(stored["pointcloud_xyz"], source["obs/point_cloud/fused/xyz"])
    np.testing.assert_array_equal(stored["pointcloud_rgb"], source["obs/point_cloud/fused/rgb"])
    np.testing.assert_array_equal(stored["pointcloud_mask"], source["obs/point_cloud/fused/padding_mask"])
    np.testing.assert_array_equal(stored["odom_orientation"], source["obs/odom/orientation"])
    assert np.abs(stored["head_rgb"].astype(int) - source["obs/rgb/head/img"]).mean() < 4.0  # JPEG store

    again = ingest_joylo(root, tmp_path / "store", progress=False)
    assert (again.episodes_written, again.episodes_skipped) == (0, 2)


def test_merged_brs_file_uses_its_base_velocity(tmp_path, make_joylo_episode):
    rng = np.random.default_rng(4)
    episodes = [make_joylo_episode(rng, n, cameras=("head",)) for n in (6, 8)]
    episodes[1]["obs/odom/base_velocity"] = np.full((8, 3), 0.25, np.float32)
    for episode in episodes:  # a recording without a fused point cloud
        for key in [k for k in episode if k.startswith("obs/point_cloud/")]:
            del episode[key]
    merged = write_brs_merged(tmp_path / "merged.hdf5", episodes)
    assert (
        cli_main(["joylo", str(merged), "--store", str(tmp_path / "store"), "--env-id", "7", "--no-progress"])
        == 0
    )
    store = EpisodeStore.open(tmp_path / "store")
    assert store.n_episodes == 2 and store.n_frames == 14
    assert not any(key.startswith("pointcloud_") for key in store.features)
    assert store.episodes["source"][1] == f"{merged.resolve()}#demo_1"
    assert set(store.episodes["env_id"]) == {"7"}
    np.testing.assert_array_equal(store.episode(1)["odom_base_velocity"], np.full((8, 3), 0.25, np.float32))
    np.testing.assert_array_equal(store.episode(0)["action_torso"], episodes[0]["action/torso"])


def _edit_copy(source, target, edit):
    shutil.copy(source, target)
    with h5py.File(target, "r+") as file:
        edit(file)
    return target


def _replace(key, make_value):
    def edit(file):
        value = make_value(file[key][()])
        del file[key]
        file.create_dataset(key, data=value)

    return edit


def _with_nan(values):
    values = values.astype(np.float32)
    values[2, 1] = np.nan
    return values


BAD_RAW = {
    "truncated": (lambda good, bad: bad.write_bytes(good.read_bytes()[:2000]), "not a readable HDF5"),
    "missing key": (
        lambda good, bad: _edit_copy(good, bad, lambda f: f.__delitem__("action/torso")),
        "action/torso",
    ),
    "point cloud 4-d": (
        lambda good, bad: _edit_copy(
            good, bad, _replace("obs/point_cloud/fused/xyz", lambda v: np.concatenate([v, v[..., :1]], -1))
        ),
        "obs/point_cloud/fused/xyz",
    ),
    "nan": (lambda good, bad: _edit_copy(good, bad, _replace("action/left_arm", _with_nan)), "NaN"),
    "length mismatch": (
        lambda good, bad: _edit_copy(good, bad, _replace("obs/odom/position", lambda v: v[:-1])),
        "obs/odom/position",
    ),
}


@pytest.fixture(scope="module")
def baseline_store(tmp_path_factory, raw_tree):
    store = tmp_path_factory.mktemp("joylo_store") / "store"
    ingest_joylo(raw_tree[1][0], store, progress=False)
    return store


@pytest.mark.parametrize("case", list(BAD_RAW))
def test_bad_raw_file_raises_and_leaves_store_unchanged(tmp_path, raw_tree, baseline_store, snapshot, case):
    root, paths, _ = raw_tree
    store = tmp_path / "store"
    shutil.copytree(baseline_store, store)
    before = snapshot(store)
    source_dir = tmp_path / "sources"
    source_dir.mkdir()
    shutil.copy(paths[1], source_dir / "a_good.h5")  # a good file first: it must not be written either
    bad = source_dir / "b_bad.h5"
    make_bad, message = BAD_RAW[case]
    make_bad(paths[0], bad)
    with pytest.raises(IngestError, match=message) as raised:
        ingest_joylo(source_dir, store, progress=False)
    assert "b_bad.h5" in str(raised.value)
    assert snapshot(store) == before


def test_merged_file_failing_half_way_writes_nothing(
    tmp_path, make_joylo_episode, raw_tree, baseline_store, snapshot
):
    rng = np.random.default_rng(5)
    episodes = [make_joylo_episode(rng, 6, cameras=("head", "left_wrist")) for _ in range(3)]
    episodes[2]["obs/joint_state/torso/joint_position"][4, 0] = np.nan
    merged = write_brs_merged(tmp_path / "merged.hdf5", episodes)
    store = tmp_path / "store"
    shutil.copytree(baseline_store, store)
    before = snapshot(store)
    with pytest.raises(
        IngestError, match=r"merged.hdf5: key 'obs/joint_state/torso/joint_position', episode demo_2"
    ):
        ingest_joylo(merged, store, progress=False)
    assert snapshot(store) == before
    assert cli_main(["joylo", str(merged), "--store", str(store), "--no-progress"]) == 2
    assert snapshot(store) == before
