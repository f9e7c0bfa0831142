"""A tiny real episode store and a tiny real training config for the sweep tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from demoscale.datasets import EpisodeStore, FeatureSpec

N_ENVS, N_OBJECTS_PER_ENV, DEMOS_PER_PAIR, LENGTH = 2, 2, 3, 12


def build_sweep_store(path: Path) -> Path:
    """2 environments x 2 objects each x 3 demos of 12 frames; low-dim only, so training is quick."""
    features = {
        "robot0_eef_pos": FeatureSpec(kind="low_dim", shape=(3,), units="m"),
        "action": FeatureSpec(kind="low_dim", shape=(3,), units="m"),
    }
    store = EpisodeStore.create(path, features)
    rng = np.random.default_rng(0)
    count = 0
    for env in range(N_ENVS):
        for obj in range(N_OBJECTS_PER_ENV):
            for _ in range(DEMOS_PER_PAIR):
                pos = np.cumsum(rng.normal(0.0, 0.01, (LENGTH, 3)), axis=0).astype(np.float32)
                action = np.concatenate([pos[1:], pos[-1:]]).astype(np.float32)
                store.append_episode(
                    {"robot0_eef_pos": pos, "action": action},
                    env_id=str(env),
                    object_id=str(100 + 10 * env + obj),
                    task="reach",
                    operator="scripted",
                    source=f"synthetic/{count}",
                    source_sha256=f"{count:064d}",
                    success=True,
                )
                count += 1
    return path


def tiny_training_config() -> dict[str, Any]:
    """A diffusion policy small enough to take a few steps in seconds on one core."""
    return {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu",
            "devices": 1,
            "max_steps": 4,
            "logger": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "num_sanity_val_steps": 0,
            "limit_val_batches": 1,
            "check_val_every_n_epoch": None,
            "val_check_interval": 2,
        },
        "model": {
            "class_path": "demoscale.policies.DiffusionPolicyModule",
            "init_args": {
                "policy": {
                    "obs_offsets": {"robot0_eef_pos": [0]},
                    "action_keys": ["action"],
                    "horizon": 4,
                    "n_action_steps": 2,
                    "down_dims": [8, 16],
                    "step_embed_dim": 8,
                    "num_train_timesteps": 10,
                    "num_inference_steps": 4,
                },
                "optimizer": {"lr": 1e-3, "warmup_steps": 1},
            },
        },
        "data": {"store": "set-by-the-sweep", "batch_size": 8, "num_workers": 0, "val_fraction": 0.34},
        # keep every step checkpoint, so that a test can see which attempt wrote which
        "checkpoint": {"save_top_k": -1},
    }


@pytest.fixture(scope="session")
def sweep_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_sweep_store(tmp_path_factory.mktemp("sweep_store") / "store.zarr")


@pytest.fixture()
def sweep_files(tmp_path: Path, sweep_store: Path) -> dict[str, Any]:
    """A training config file next to a base sweep dict (offline evaluation, 4 steps per trial)."""
    training = tmp_path / "tiny_train.yaml"
    training.write_text(yaml.safe_dump(tiny_training_config()))
    sweep = {
        "name": "test",
        "store": str(sweep_store),
        "policies": {"tiny": {"config": str(training)}},
        "grid": {"n_envs": [1, 2], "n_objects": [1], "demos_per_pair": [2, 3], "seed": [0]},
        "eval": "offline",
        "budget": {"rule": "fixed", "steps": 4, "checkpoint_every_steps": 2},
        "resources": {"cpu": 1},
        "retries": 1,
        "num_cpus": 2,
        "output": str(tmp_path / "sweep_out"),
    }
    return {"sweep": sweep, "training": training, "output": tmp_path / "sweep_out"}
