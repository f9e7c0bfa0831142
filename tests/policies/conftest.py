"""Small synthetic episode stores on disk for the policy tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from demoscale.datasets import EpisodeStore, FeatureSpec

IMAGE_SIZE = 32


@pytest.fixture()
def one_torch_thread():
    """Tiny models run fastest on one thread; several threads thrash on a loaded machine. A module
    opts in with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def build_tabletop_store(path: Path, n_episodes: int = 4, length: int = 24, seed: int = 0) -> Path:
    """A UMI/tabletop-layout store: a camera, an end-effector pose and gripper, and the derived action.

    The end effector moves along a smooth random curve; the image shows a bright square at its
    position, and the action is the next frame's pose (the last frame repeats itself).
    """
    rng = np.random.default_rng(seed)
    features = {
        "camera0_rgb": FeatureSpec(kind="image", shape=(IMAGE_SIZE, IMAGE_SIZE, 3), dtype="uint8"),
        "robot0_eef_pos": FeatureSpec(kind="low_dim", shape=(3,), units="m"),
        "robot0_eef_rot_axis_angle": FeatureSpec(kind="low_dim", shape=(3,), units="rad"),
        "robot0_gripper_width": FeatureSpec(kind="low_dim", shape=(1,), units="m"),
        "action": FeatureSpec(kind="low_dim", shape=(7,), units="m,rad,m"),
    }
    store = EpisodeStore.create(path, features, image_codec="png")
    for episode in range(n_episodes):
        t = np.linspace(0.0, 1.0, length, dtype=np.float32)[:, None]
        start, direction = rng.uniform(-0.2, 0.2, 3), rng.uniform(-0.3, 0.3, 3)
        pos = (start + direction * t + 0.05 * np.sin(6 * t + episode)).astype(np.float32)
        rot = np.concatenate([0.3 * np.sin(2 * t + episode), 0.2 * t, 0.1 + 0 * t], axis=1).astype(np.float32)
        grip = (0.04 + 0.03 * (t > 0.5)).astype(np.float32)
        images = np.zeros((length, IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
        pixels = np.clip(((pos[:, :2] + 0.5) * IMAGE_SIZE).astype(int), 2, IMAGE_SIZE - 3)
        for frame, (x, y) in enumerate(pixels):
            images[frame, y - 2 : y + 3, x - 2 : x + 3] = 255
            images[frame, ..., 2] = int(grip[frame, 0] * 2000)
        state = np.concatenate([pos, rot, grip], axis=1)
        action = np.concatenate([state[1:], state[-1:]], axis=0)
        store.append_episode(
            {
                "camera0_rgb": images,
                "robot0_eef_pos": pos,
                "robot0_eef_rot_axis_angle": rot,
                "robot0_gripper_width": grip,
                "action": action,
            },
            env_id=str(episode % 2),
            object_id="0",
            task="synthetic",
            source=f"synthetic/{episode}",
            source_sha256=f"{seed:04d}{episode:060d}",
        )
    return path


@pytest.fixture(scope="session")
def tabletop_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tabletop_store(tmp_path_factory.mktemp("stores") / "tabletop.zarr")


def tiny_config(store: Path, root: Path, **policy_overrides) -> dict:
    """A complete training config for a tiny policy on a synthetic store (fast on one CPU core)."""
    policy = {
        "obs_offsets": {
            "camera0_rgb": [-1, 0],
            "robot0_eef_pos": [-1, 0],
            "robot0_eef_rot_axis_angle": [-1, 0],
            "robot0_gripper_width": [0],
        },
        "action_keys": ["action"],
        "horizon": 8,
        "n_action_steps": 4,
        "action_representation": "relative",
        "image": {"backbone": "test_resnet", "crop_fraction": 0.9, "color_jitter": [0.1, 0.1, 0.0, 0.0]},
        "down_dims": [32, 64],
        "step_embed_dim": 32,
        "num_train_timesteps": 50,
        "num_inference_steps": 10,
    }
    policy.update(policy_overrides)
    return {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu",
            "devices": 1,
            "max_steps": 20,
            "logger": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "num_sanity_val_steps": 0,
            "limit_val_batches": 2,
            "check_val_every_n_epoch": None,
            "val_check_interval": 10,
            "default_root_dir": str(root),
            "deterministic": True,
        },
        "model": {
            "class_path": "demoscale.policies.DiffusionPolicyModule",
            "init_args": {
                "policy": policy,
                "optimizer": {"lr": 1e-3, "warmup_steps": 5, "encoder_lr_multiplier": 1.0},
                "ema": {"max_decay": 0.99},
            },
        },
        "data": {"store": str(store), "batch_size": 16, "num_workers": 0, "val_fraction": 0.25},
        "checkpoint": {"every_n_train_steps": 10},
    }
