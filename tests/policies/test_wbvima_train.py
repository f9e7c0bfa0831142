"""WB-VIMA end to end on a real JoyLo-layout store on disk: CLI training overfits, load_policy acts."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from demoscale.datasets import EpisodeStore, FeatureSpec

N_POINTS = 24
JOYLO_PARTS = (
    ("mobile_base", 3),
    ("torso", 4),
    ("left_arm", 6),
    ("left_gripper", 1),
    ("right_arm", 6),
    ("right_gripper", 1),
)


def build_joylo_store(path: Path, n_episodes: int = 3, length: int = 24, seed: int = 0) -> Path:
    """A store with the JoyLo keys of docs/interfaces.md: whole-body action and its parts, proprio,
    odometry and a fused point cloud (a coloured blob that follows the right arm's first joint)."""
    rng = np.random.default_rng(seed)
    low = lambda n, units="": FeatureSpec(kind="low_dim", shape=(n,), units=units)  # noqa: E731
    features = {
        "action": low(21),
        "proprio": low(21),
        "odom_base_velocity": low(3, "m/s"),
        "odom_position": low(3, "m"),
        "odom_orientation": low(4, "xyzw"),
        "pointcloud_xyz": FeatureSpec(kind="point_cloud", shape=(N_POINTS, 3), dtype="float32", units="m"),
        "pointcloud_rgb": FeatureSpec(kind="point_cloud", shape=(N_POINTS, 3), dtype="uint8"),
        "pointcloud_mask": FeatureSpec(kind="point_cloud", shape=(N_POINTS,), dtype="bool"),
    }
    features.update({f"action_{name}": low(dim) for name, dim in JOYLO_PARTS})
    store = EpisodeStore.create(path, features)
    t = np.linspace(0.0, 1.0, length, dtype=np.float32)[:, None]
    for episode in range(n_episodes):
        phase = rng.uniform(0, np.pi)
        action = np.concatenate(
            [np.sin(3 * t + phase + k) * (0.2 + 0.05 * k) for k in range(21)], axis=1
        ).astype(np.float32)
        action[:, [13, 20]] = (t > 0.5).astype(np.float32)  # grippers close half-way
        proprio = np.concatenate([action[:1], action[:-1]]).astype(np.float32)  # state lags the command
        centre = np.concatenate([proprio[:, 14:16], proprio[:, 3:4]], axis=1)
        xyz = (centre[:, None, :] + 0.05 * rng.normal(size=(length, N_POINTS, 3))).astype(np.float32)
        rgb = np.broadcast_to(
            (np.array([200, 50 + 40 * episode, 30]) * np.ones((N_POINTS, 1))), (length, N_POINTS, 3)
        )
        mask = np.ones((length, N_POINTS), dtype=bool)
        mask[:, -4:] = False  # padding points
        episode_data = {
            "action": action,
            "proprio": proprio,
            "odom_base_velocity": proprio[:, :3],
            "odom_position": np.cumsum(proprio[:, :3], axis=0) * 0.1,
            "odom_orientation": np.tile(np.array([0, 0, 0, 1], dtype=np.float32), (length, 1)),
            "pointcloud_xyz": xyz,
            "pointcloud_rgb": rgb.astype(np.uint8),
            "pointcloud_mask": mask,
        }
        start = 0
        for name, dim in JOYLO_PARTS:
            episode_data[f"action_{name}"] = action[:, start : start + dim]
            start += dim
        store.append_episode(
            episode_data,
            env_id=str(episode),
            object_id="0",
            task="whole_body_synthetic",
            operator="scripted",
            source=f"joylo/{episode}",
            source_sha256=f"{seed:04d}{episode:060d}",
            success=True,
        )
    return path


@pytest.fixture(scope="module")
def joylo_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_joylo_store(tmp_path_factory.mktemp("joylo") / "joylo.zarr")


def wbvima_config(
    store: Path, root: Path, max_steps: int, lr: float = 3e-3, batch_size: int = 16, **policy_overrides
) -> dict:
    policy = {
        "embed_dim": 32,
        "n_heads": 4,
        "n_layers": 1,
        "dropout": 0.0,
        "proprio_hidden_dims": [32],
        "point_cloud": {"crop_min": [-1.0, -1.0, -1.0], "crop_max": [1.0, 1.0, 1.0], "n_points": N_POINTS},
        "point_cloud_encoder": {"hidden_dims": [16, 32]},
        "down_dims": [32, 64],
        "step_embed_dim": 32,
        "num_inference_steps": 4,
    }
    policy.update(policy_overrides)
    return {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu",
            "devices": 1,
            "max_steps": max_steps,
            "log_every_n_steps": 1,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "num_sanity_val_steps": 0,
            "limit_val_batches": 0,
            "default_root_dir": str(root),
            "gradient_clip_val": 1.0,
        },
        "model": {
            "class_path": "demoscale.policies.wbvima.lightning.WBVIMAModule",
            "init_args": {
                "policy": policy,
                "optimizer": {"lr": lr, "warmup_steps": 5, "weight_decay": 1e-4, "schedule": "constant"},
                "ema": {"enabled": False},
            },
        },
        "data": {"store": str(store), "batch_size": batch_size, "num_workers": 0, "val_fraction": 0.0},
        "checkpoint": {"every_n_train_steps": max_steps},
    }


def logged(root: Path, name: str) -> list[float]:
    (metrics,) = root.rglob("metrics.csv")
    with metrics.open() as handle:
        return [float(row[name]) for row in csv.DictReader(handle) if row.get(name)]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_wbvima_trains_through_the_cli_and_loads_for_inference(joylo_store, tmp_path):
    """A short run (x0-prediction learns fastest) through `demoscale train fit`'s code path."""
    from demoscale.policies import load_policy, train

    config = wbvima_config(
        joylo_store, tmp_path / "run", max_steps=12, batch_size=8, prediction_type="sample"
    )
    result = train(config)
    assert result.steps == 12
    losses = logged(tmp_path / "run", "train/loss")
    assert np.mean(losses[-4:]) < 0.5 * np.mean(losses[:2]), losses
    for part in ("mobile_base", "torso", "arms"):
        assert logged(tmp_path / "run", f"train/loss_{part}")

    policy = load_policy(result.checkpoint_path)
    assert policy.family == "wbvima"
    assert policy.action_keys[0] == "action_mobile_base" and policy.horizon == 8
    store = EpisodeStore.open(joylo_store)
    window = {key: store.read(key, 4, 6) for key in policy.obs_offsets}
    chunk = policy.predict_action(window, seed=0)
    assert chunk.shape == (8, 21) and np.isfinite(chunk).all()
    # Absolute units: the prediction lies near the recorded actions' range, not in [-1, 1] noise.
    recorded = store.read("action", 0, store.n_frames)
    assert (chunk >= recorded.min(0) - 0.5).all() and (chunk <= recorded.max(0) + 0.5).all()


@pytest.mark.slow
def test_wbvima_overfits_joylo_episodes_with_epsilon_prediction(joylo_store, tmp_path):
    """The default (epsilon, DDIM 100 steps) objective on a few episodes: the loss falls well below its start."""
    from demoscale.policies import train

    result = train(wbvima_config(joylo_store, tmp_path / "run", max_steps=200))
    assert result.steps == 200
    losses = logged(tmp_path / "run", "train/loss")
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:5]), losses


def test_chain_that_does_not_match_the_store_fails_before_training(joylo_store, tmp_path):
    from demoscale.policies import train

    chain = [{"name": "mobile_base", "keys": ["action_mobile_base"], "dim": 3}]
    with pytest.raises(ValueError, match="add up to 3"):
        train(wbvima_config(joylo_store, tmp_path / "bad", max_steps=1, chain=chain))


@pytest.mark.parametrize("name", ["wbvima_joylo.yaml", "wbvima_sim.yaml", "wbvima_touch_shelf.yaml"])
def test_shipped_configs_parse_and_fit_a_joylo_store(name, capsys):
    import yaml
    from demoscale.policies.cli import make_cli
    from demoscale.policies.config_utils import from_plain
    from demoscale.policies.wbvima import WBVIMAConfig, validate_against_features
    from test_wbvima_model import joylo_features

    path = Path(__file__).resolve().parents[2] / "configs" / name
    with pytest.raises(SystemExit) as exit_info:
        make_cli(["fit", f"--config={path}", "--print_config"], run=True)
    assert exit_info.value.code in (0, None)
    assert "WBVIMAModule" in capsys.readouterr().out
    settings = yaml.safe_load(path.read_text())["model"]["init_args"]["policy"]
    config = from_plain(WBVIMAConfig, settings)
    assert [part.name for part in config.chain] == ["mobile_base", "torso", "arms"]
    validate_against_features(config, joylo_features(config.point_cloud.n_points))
