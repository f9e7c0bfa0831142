"""The source-format writers produce files in exactly the documented layouts."""

from __future__ import annotations

import json
import zipfile

import h5py
import numpy as np
import pytest
import zarr
from demoscale.collect.joylo import write_brs_merged, write_joylo_episode
from demoscale.collect.umi import register_image_codecs, write_umi_zip


@pytest.mark.parametrize("robots", [1, 2])
def test_umi_writer_layout_and_values(tmp_path, rng, make_umi_episode, robots):
    episodes = [make_umi_episode(rng, n, robots=robots) for n in (12, 7, 15)]
    path = write_umi_zip(tmp_path / "dataset.zarr.zip", episodes, jpegxl_lossless=True, rate_hz=10.0)

    with zipfile.ZipFile(path) as archive:
        infos = archive.infolist()
        assert all(info.compress_type == zipfile.ZIP_STORED for info in infos)
        names = {info.filename for info in infos}
        ends_meta = json.loads(archive.read("meta/episode_ends/.zarray"))
        image_meta = json.loads(archive.read("data/camera0_rgb/.zarray"))
        pos_meta = json.loads(archive.read("data/robot0_eef_pos/.zarray"))
    assert ends_meta["zarr_format"] == 2 and ends_meta["compressor"] is None and ends_meta["dtype"] == "<i8"
    assert image_meta["compressor"]["id"] == "imagecodecs_jpegxl" and image_meta["compressor"]["level"] == 99
    assert image_meta["chunks"] == [1, 32, 32, 3]
    assert pos_meta["compressor"] is None and pos_meta["chunks"] == [12, 3]
    assert "data/camera0_rgb/33.0.0.0" in names  # one chunk per frame, 34 frames

    register_image_codecs()
    root = zarr.open_group(zarr.storage.ZipStore(path, mode="r"), mode="r")
    assert root["meta/episode_ends"][:].tolist() == [12, 19, 34]
    for i in range(robots):
        np.testing.assert_array_equal(
            root[f"data/camera{i}_rgb"][:], np.concatenate([e[f"camera{i}_rgb"] for e in episodes])
        )
        np.testing.assert_array_equal(
            root[f"data/robot{i}_eef_pos"][:], np.concatenate([e[f"robot{i}_eef_pos"] for e in episodes])
        )
        start = root[f"data/robot{i}_demo_start_pose"][:]
        end = root[f"data/robot{i}_demo_end_pose"][:]
        assert start.dtype == np.float64 and start.shape == (34, 6)
        second = episodes[1]
        expected_start = np.concatenate(
            [second[f"robot{i}_eef_pos"][0], second[f"robot{i}_eef_rot_axis_angle"][0]]
        )
        expected_end = np.concatenate(
            [second[f"robot{i}_eef_pos"][-1], second[f"robot{i}_eef_rot_axis_angle"][-1]]
        )
        np.testing.assert_array_equal(start[12:19], np.repeat(expected_start[None], 7, 0))
        np.testing.assert_array_equal(end[12:19], np.repeat(expected_end[None], 7, 0))
    assert root.attrs["rate_hz"] == 10.0


def test_umi_writer_rejects_unequal_lengths(tmp_path, rng, make_umi_episode):
    episode = make_umi_episode(rng, 10)
    episode["robot0_eef_pos"] = episode["robot0_eef_pos"][:9]
    with pytest.raises(ValueError, match="different lengths"):
        write_umi_zip(tmp_path / "bad.zarr.zip", [episode])


def test_joylo_writer_layout(tmp_path, rng, make_joylo_episode):
    episode = make_joylo_episode(rng, 11)
    path = write_joylo_episode(tmp_path / "episode_0.h5", episode, attrs={"head_rgb_freq": 10.0})
    with h5py.File(path, "r") as file:
        assert file.attrs["record_freq"] == 10.0 and file.attrs["horizon"] == 11
        assert file.attrs["head_rgb_freq"] == 10.0
        for key, value in episode.items():
            np.testing.assert_array_equal(file[key][()], value)
        for group in (
            "obs/joint_state/left_arm",
            "obs/gripper_state/right_gripper",
            "obs/odom",
            "obs/point_cloud/fused",
            "obs/rgb/head",
        ):
            np.testing.assert_array_equal(file[f"{group}/seq"][()], np.arange(11))
            assert file[f"{group}/stamp"].shape == (11,)


def test_brs_merged_writer_layout(tmp_path, rng, make_joylo_episode):
    episodes = [make_joylo_episode(rng, n) for n in (5, 8)]
    path = write_brs_merged(tmp_path / "merged.h5", episodes)
    with h5py.File(path, "r") as file:
        assert sorted(file) == ["demo_0", "demo_1"]
        assert sorted(file["demo_1"]) == ["action", "obs"]
        np.testing.assert_array_equal(file["demo_1/action/torso"][()], episodes[1]["action/torso"])
        assert file["demo_0/obs/odom/base_velocity"].shape == (5, 3)
