"""Source-format fixtures for the ingestion tests: small synthetic episodes in the real layouts."""

from __future__ import annotations

import numpy as np
import pytest


def _smooth_images(rng: np.random.Generator, length: int, size: int) -> np.ndarray:
    """Frames with gradients and a moving square: compressible like camera images, not noise."""
    ys, xs = np.mgrid[0:size, 0:size]
    frames = np.empty((length, size, size, 3), np.uint8)
    base = rng.integers(0, 120, size=3)
    for t in range(length):
        frame = np.stack([base[c] + (xs + ys * (c + 1) + 3 * t) % 100 for c in range(3)], axis=-1)
        x0 = (2 * t) % (size - 8)
        frame[4:12, x0 : x0 + 8] = 250
        frames[t] = frame
    return frames


def umi_episode(
    rng: np.random.Generator, length: int, robots: int = 1, size: int = 32
) -> dict[str, np.ndarray]:
    episode = {}
    for i in range(robots):
        episode[f"robot{i}_eef_pos"] = rng.normal(size=(length, 3)).astype(np.float32)
        episode[f"robot{i}_eef_rot_axis_angle"] = rng.normal(size=(length, 3)).astype(np.float32)
        episode[f"robot{i}_gripper_width"] = rng.uniform(0, 0.08, size=(length, 1)).astype(np.float32)
        episode[f"camera{i}_rgb"] = _smooth_images(rng, length, size)
    return episode


def joylo_episode(
    rng: np.random.Generator,
    length: int,
    points: int = 64,
    size: int = 32,
    arm_columns: int = 6,
    cameras: tuple[str, ...] = ("head", "left_wrist"),
) -> dict[str, np.ndarray]:
    """A raw JoyLo episode as flat HDF5 paths (the writers' in-memory layout)."""
    f32 = np.float32
    episode: dict[str, np.ndarray] = {}
    for part, dof in (("left_arm", arm_columns), ("right_arm", arm_columns), ("torso", 4)):
        for field in ("joint_position", "joint_velocity", "joint_effort"):
            episode[f"obs/joint_state/{part}/{field}"] = rng.normal(size=(length, dof)).astype(f32)
    for side in ("left_gripper", "right_gripper"):
        for field in ("gripper_position", "gripper_velocity", "gripper_effort"):
            episode[f"obs/gripper_state/{side}/{field}"] = rng.uniform(0, 100, size=length).astype(f32)
    episode["obs/point_cloud/fused/xyz"] = rng.normal(size=(length, points, 3)).astype(f32)
    episode["obs/point_cloud/fused/rgb"] = rng.integers(0, 256, size=(length, points, 3), dtype=np.uint8)
    mask = np.ones((length, points), bool)
    mask[:, points - 5 :] = False
    episode["obs/point_cloud/fused/padding_mask"] = mask
    episode["obs/odom/position"] = rng.normal(size=(length, 3)).astype(f32)
    quat = rng.normal(size=(length, 4))
    episode["obs/odom/orientation"] = (quat / np.linalg.norm(quat, axis=1, keepdims=True)).astype(f32)
    episode["obs/odom/linear_velocity"] = rng.normal(size=(length, 3)).astype(f32)
    episode["obs/odom/angular_velocity"] = rng.normal(size=(length, 3)).astype(f32)
    for camera in cameras:
        episode[f"obs/rgb/{camera}/img"] = _smooth_images(rng, length, size)
    episode["action/left_arm"] = rng.normal(size=(length, 6)).astype(f32)
    episode["action/right_arm"] = rng.normal(size=(length, 6)).astype(f32)
    episode["action/torso"] = rng.normal(size=(length, 4)).astype(f32)
    episode["action/left_gripper"] = rng.uniform(0, 100, size=length).astype(f32)
    episode["action/right_gripper"] = rng.uniform(0, 100, size=length).astype(f32)
    episode["action/mobile_base"] = rng.normal(size=(length, 3)).astype(f32)
    return episode


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


@pytest.fixture(scope="session")
def make_umi_episode():
    return umi_episode


@pytest.fixture(scope="session")
def make_joylo_episode():
    return joylo_episode


def write_umi_zip_fixture(path, episodes, lossless: bool = False):
    """A UMI dataset.zarr.zip written with zarr + numcodecs directly (not through demoscale's writer)."""
    import zipfile

    import zarr
    from imagecodecs.numcodecs import Jpegxl, register_codecs

    register_codecs(verbose=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    folder = path.parent / (path.name + ".d")
    root = zarr.open_group(str(folder), mode="w", zarr_format=2)
    ends = np.cumsum([len(e["robot0_eef_pos"]) for e in episodes]).astype(np.int64)
    root.create_group("meta").create_array("episode_ends", data=ends, chunks=ends.shape, compressor=None)
    data = root.create_group("data")
    for key in episodes[0]:
        full = np.concatenate([e[key] for e in episodes])
        if key.startswith("camera"):
            chunks, compressor = (1, *full.shape[1:]), Jpegxl(level=99, lossless=lossless)
        else:
            chunks, compressor = (len(episodes[0][key]), *full.shape[1:]), None
        data.create_array(key, data=full, chunks=chunks, compressor=compressor)
    for key in [k for k in episodes[0] if k.endswith("_eef_pos")]:
        robot = key[: -len("_eef_pos")]
        for name, row in (("demo_start_pose", 0), ("demo_end_pose", -1)):
            rows = []
            for e in episodes:
                pose = np.concatenate([e[f"{robot}_eef_pos"][row], e[f"{robot}_eef_rot_axis_angle"][row]])
                rows.append(np.repeat(pose[None].astype(np.float64), len(e[key]), 0))
            data.create_array(
                f"{robot}_{name}",
                data=np.concatenate(rows),
                chunks=(len(episodes[0][key]), 6),
                compressor=None,
            )
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        for file in sorted(folder.rglob("*")):
            if file.is_file():
                archive.write(file, file.relative_to(folder).as_posix())
    import shutil

    shutil.rmtree(folder)
    return path


def store_snapshot(location):
    """Every file of a store directory with its sha256 (None when there is no store)."""
    import hashlib
    from pathlib import Path

    location = Path(location)
    if not location.exists():
        return None
    return {
        p.relative_to(location).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(location.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="session")
def umi_zip_fixture():
    return write_umi_zip_fixture


@pytest.fixture(scope="session")
def snapshot():
    return store_snapshot
