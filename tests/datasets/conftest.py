"""Synthetic episodes and small real stores on disk for the datasets tests."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import zarr
from demoscale.datasets import EpisodeStore, FeatureSpec

IMAGE_SHAPE = (32, 40, 3)


def pytest_configure(config: pytest.Config) -> None:
    # zarr warns on every variable-length-bytes array (no ratified v3 spec yet); the store documents it.
    config.addinivalue_line("filterwarnings", r"ignore:The data type \(VariableLength")


def small_features() -> dict[str, FeatureSpec]:
    """One key of each kind, small enough for fast tests."""
    return {
        "camera0_rgb": FeatureSpec(kind="image", shape=IMAGE_SHAPE, dtype="uint8", rate_hz=10.0, units="rgb"),
        "robot0_eef_pos": FeatureSpec(
            kind="low_dim", shape=(3,), dtype="float32", rate_hz=10.0, units="m", frame="world"
        ),
        "action": FeatureSpec(kind="low_dim", shape=(4,), dtype="float32", rate_hz=10.0, units="m,m,m,m"),
        "pointcloud_xyz": FeatureSpec(kind="point_cloud", shape=(64, 3), dtype="float32", units="m"),
    }


def smooth_frames(length: int, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Smooth, moving gradients (realistic for JPEG), distinct per seed."""
    h, w = shape[:2]
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    t = np.arange(length, dtype=np.float32)[:, None, None]
    channels = shape[2] if len(shape) == 3 else 1
    planes = [
        127 + 100 * np.sin(0.15 * x[None] + 0.1 * y[None] * (c + 1) + 0.3 * t + seed) for c in range(channels)
    ]
    frames = np.stack(planes, axis=-1).clip(0, 255).astype(np.uint8)
    return frames if len(shape) == 3 else frames[..., 0]


def make_episode(episode_id: int, length: int) -> dict[str, np.ndarray]:
    """An episode whose values encode its id and frame index (so reads can be checked exactly)."""
    t = np.arange(length, dtype=np.float32)
    return {
        "camera0_rgb": smooth_frames(length, IMAGE_SHAPE, episode_id),
        "robot0_eef_pos": np.stack([np.full(length, episode_id, np.float32), t, t * 0.5], axis=1),
        "action": np.stack([np.full(length, episode_id, np.float32), t, -t, t * t], axis=1),
        "pointcloud_xyz": np.broadcast_to(
            (episode_id + t[:, None, None] / 100).astype(np.float32), (length, 64, 3)
        ).copy(),
    }


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def append_synthetic(
    store: EpisodeStore, episode_id: int, length: int, env_id: str, object_id: str
) -> int | None:
    return store.append_episode(
        make_episode(episode_id, length),
        env_id=env_id,
        object_id=object_id,
        task="push",
        operator="scripted",
        source=f"synthetic/{episode_id}",
        source_sha256=digest(f"synthetic/{episode_id}"),
        success=bool(episode_id % 2),
        tags=["train"] if episode_id % 3 else ["train", "hard"],
    )


def raw_group(path: str | Path) -> zarr.Group:
    """A store's zarr group opened with zarr itself, to damage or inspect it as another program would."""
    return zarr.open_group(str(path), mode="r+")


def snapshot(path: Path) -> dict[str, bytes]:
    """Every file of a store directory with its contents, to show an operation changed nothing."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture(scope="session")
def pristine_small_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """6 episodes over 3 environments x 2 objects, lengths 5..10; built once, copied per test."""
    path = tmp_path_factory.mktemp("pristine") / "small.zarr"
    store = EpisodeStore.create(path, small_features())
    for i in range(6):
        append_synthetic(store, i, 5 + i, env_id=str(i % 3), object_id=str(10 + i % 2))
    return path


@pytest.fixture
def small_store(pristine_small_store: Path, tmp_path: Path) -> EpisodeStore:
    """A private, writable copy of the 6-episode store."""
    path = tmp_path / "small.zarr"
    shutil.copytree(pristine_small_store, path)
    return EpisodeStore.open(path, mode="a")


@pytest.fixture
def kit() -> SimpleNamespace:
    """The synthetic-episode functions above, for tests (conftest modules are not importable by name)."""
    return SimpleNamespace(
        features=small_features,
        smooth_frames=smooth_frames,
        make_episode=make_episode,
        append=append_synthetic,
        digest=digest,
        snapshot=snapshot,
        raw_group=raw_group,
        image_shape=IMAGE_SHAPE,
    )
