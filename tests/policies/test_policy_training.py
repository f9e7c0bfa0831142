"""Training through the Lightning CLI on real stores on disk: overfitting, exact resume, loading, errors."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import build_tabletop_store, tiny_config
from demoscale.datasets import EpisodeStore
from demoscale.policies import load_policy, train

torch.set_num_threads(1)


def _read_losses(metrics_csv: Path) -> list[float]:
    import csv

    with open(metrics_csv) as handle:
        return [float(row["train/loss"]) for row in csv.DictReader(handle) if row.get("train/loss")]


@pytest.mark.parametrize("denoiser", ["unet", "mlp"])
def test_overfit_small_store_and_predict_training_actions(tmp_path, denoiser):
    store_path = build_tabletop_store(tmp_path / "overfit.zarr", n_episodes=2, length=12, seed=1)
    config = tiny_config(
        store_path,
        tmp_path / "run",
        obs_offsets={
            "robot0_eef_pos": [-1, 0],
            "robot0_eef_rot_axis_angle": [-1, 0],
            "robot0_gripper_width": [0],
        },
        horizon=4,
        n_action_steps=2,
        prediction_type="sample",
        num_train_timesteps=20,
        denoiser=denoiser,
        mlp_width=64,
        mlp_depth=2,
    )
    config["trainer"].update(
        {
            "max_steps": 120,
            "limit_val_batches": 0,
            "logger": True,
            "log_every_n_steps": 1,
            "deterministic": False,
        }
    )
    config["model"]["init_args"]["optimizer"].update({"lr": 2e-3, "warmup_steps": 5})
    config["model"]["init_args"]["ema"] = {"max_decay": 0.9}
    config["data"].update({"batch_size": 24, "val_fraction": 0.0})
    config["checkpoint"] = {"every_n_train_steps": 120}
    result = train(config)
    assert result.steps == 120
    assert result.samples_seen == 120 * 24
    assert Path(result.checkpoint_path).name == "last.ckpt"
    losses = _read_losses(next((tmp_path / "run").rglob("metrics.csv")))
    assert len(losses) >= 100
    assert np.mean(losses[-10:]) < 0.3 * np.mean(losses[:3]), (losses[:3], losses[-10:])

    policy = load_policy(result.checkpoint_path, num_inference_steps=10)
    store = EpisodeStore.open(store_path)
    errors, spans = [], []
    for episode_index in range(store.n_episodes):
        episode = store.episode(episode_index)
        spans.append(np.ptp(episode["action"][:, :3], axis=0).mean())
        for t in (1, 4, 7):
            window = {
                key: episode[key][[t + offset for offset in offsets]]
                for key, offsets in policy.obs_offsets.items()
            }
            predicted = policy.predict_action(window, seed=0)
            expected = episode["action"][t : t + policy.horizon]
            errors.append(np.abs(predicted[: len(expected), :3] - expected[:, :3]).mean())
    # Positions within a small fraction of each episode's range of motion.
    assert np.mean(errors) < 0.25 * np.mean(spans), (np.mean(errors), np.mean(spans))


def test_exact_resume_matches_uninterrupted_run(tabletop_store, tmp_path):
    config = tiny_config(tabletop_store, tmp_path / "straight")
    config["trainer"].update({"max_steps": 6, "limit_val_batches": 0})
    config["checkpoint"] = {"every_n_train_steps": 3, "save_top_k": -1}
    straight = train(config)
    # 3 training episodes x 24 frames / 16 = 4 batches per epoch: step 3 is mid-epoch, step 6 in epoch 2.
    middle = Path(straight.checkpoint_path).parent / "step0000003.ckpt"
    assert middle.exists(), sorted(p.name for p in middle.parent.iterdir())
    resumed = train(config, {"trainer.default_root_dir": str(tmp_path / "resumed"), "ckpt_path": str(middle)})
    assert resumed.steps == straight.steps == 6
    final_a = torch.load(straight.checkpoint_path, map_location="cpu", weights_only=False)
    final_b = torch.load(resumed.checkpoint_path, map_location="cpu", weights_only=False)
    assert final_a["state_dict"].keys() == final_b["state_dict"].keys()
    ema_keys = [k for k in final_a["state_dict"] if k.startswith("ema.averaged.")]
    assert ema_keys
    for key, value in final_a["state_dict"].items():
        assert torch.equal(value, final_b["state_dict"][key]), key
    state_a = final_a["optimizer_states"][0]["state"]
    state_b = final_b["optimizer_states"][0]["state"]
    for index in state_a:
        assert torch.equal(state_a[index]["exp_avg"], state_b[index]["exp_avg"])
    assert final_a["lr_schedulers"] == final_b["lr_schedulers"]
    # The resumed half really trained: its weights differ from the step-3 checkpoint.
    start = torch.load(middle, map_location="cpu", weights_only=False)["state_dict"]
    assert any(
        not torch.equal(start[k], v) for k, v in final_b["state_dict"].items() if k.startswith("policy.")
    )


def test_load_policy_needs_no_store_and_predicts_batches(tabletop_store, tmp_path):
    store_copy = tmp_path / "copy.zarr"
    shutil.copytree(tabletop_store, store_copy)
    config = tiny_config(store_copy, tmp_path / "run")
    config["trainer"].update({"max_steps": 2, "limit_val_batches": 0, "logger": True})
    result = train(config)
    resumed = train(config, {"ckpt_path": "last", "trainer.max_steps": 3})  # finds runs' last.ckpt
    assert resumed.steps == 3 and resumed.checkpoint_path == result.checkpoint_path
    # last.ckpt holds the final step even though no periodic checkpoint fell on it.
    assert torch.load(resumed.checkpoint_path, weights_only=False)["global_step"] == 3
    episode = EpisodeStore.open(store_copy).episode(1)
    shutil.rmtree(store_copy)  # the checkpoint alone must be enough

    policy = load_policy(result.checkpoint_path, num_inference_steps=4)
    assert policy.obs_offsets["camera0_rgb"] == [-1, 0]
    assert policy.action_keys == ["action"] and policy.n_action_steps == 4
    assert policy.features["camera0_rgb"]["kind"] == "image"
    window = {key: episode[key][[3 + o for o in offsets]] for key, offsets in policy.obs_offsets.items()}
    single = policy.predict_action(window, seed=0)
    assert single.shape == (8, 7) and np.isfinite(single).all()
    batch = {key: np.stack([value, value]) for key, value in window.items()}
    batched = policy.predict_action_batch(batch, seed=0)
    assert batched.shape == (2, 8, 7)
    np.testing.assert_allclose(batched[0], single, atol=1e-4)
    with pytest.raises(KeyError, match="camera0_rgb"):
        policy.predict_action({k: v for k, v in window.items() if k != "camera0_rgb"})


def test_bad_inputs_fail_before_training(tabletop_store, tmp_path):
    config = tiny_config(tabletop_store, tmp_path / "run")
    config["model"]["init_args"]["policy"]["obs_offsets"]["camera9_rgb"] = [0]
    with pytest.raises(Exception, match="camera9_rgb"):
        train(config)
    assert not (tmp_path / "run" / "checkpoints").exists()

    # data.episodes reaches the DataModule: an episode the store lacks fails before training.
    with pytest.raises(Exception, match="episode indices must be in 0:4"):
        train(tiny_config(tabletop_store, tmp_path / "run"), {"data.episodes": [1, 5]})

    config = tiny_config(tabletop_store, tmp_path / "run", horizon=32)
    with pytest.raises(ValueError, match="longer than every training episode"):
        train(config)

    # Fewer training windows than one batch (the last partial batch is dropped): an error, not a
    # run that "finishes" without a step.
    with pytest.raises(ValueError, match="fewer than one batch"):
        train(tiny_config(tabletop_store, tmp_path / "run"), {"data.episodes": [0], "data.batch_size": 64})

    checkpoint = tmp_path / "other.ckpt"
    torch.save(
        {"state_dict": {}, "demoscale": {"family": "pivot_r", "features": {}, "stats": {}}}, checkpoint
    )
    with pytest.raises(ValueError, match="pivot_r"):
        load_policy(checkpoint)
    # Resuming a diffusion run from another family's checkpoint names both families.
    from demoscale.policies import DiffusionPolicyModule

    with pytest.raises(ValueError, match="'pivot_r' policy.*'diffusion'"):
        DiffusionPolicyModule().on_load_checkpoint(torch.load(checkpoint, weights_only=False))
    torch.save({"state_dict": {}}, tmp_path / "plain.ckpt")
    with pytest.raises(ValueError, match="not a demoscale policy checkpoint"):
        load_policy(tmp_path / "plain.ckpt")


def test_normalisation_statistics_are_required(tabletop_store):
    from demoscale.policies.diffusion.config import DiffusionConfig
    from demoscale.policies.diffusion.model import DiffusionPolicy
    from demoscale.policies.normalize import MissingStatisticsError

    store = EpisodeStore.open(tabletop_store)
    config = DiffusionConfig(
        obs_offsets={"robot0_eef_pos": [0]}, horizon=8, down_dims=[16, 32], step_embed_dim=16
    )
    policy = DiffusionPolicy(config, store.features)
    batch = {"obs": {"robot0_eef_pos": torch.zeros(2, 1, 3)}, "action": torch.zeros(2, 8, 7)}
    with pytest.raises(MissingStatisticsError):
        policy.compute_loss(batch)


def test_print_config_runs_from_the_command_line(tabletop_store):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "demoscale",
            "train",
            "fit",
            "--config",
            "configs/tabletop_laptop.yaml",
            "--store",  # the name every command gives the store; the Lightning CLI's is --data.store
            str(tabletop_store),
            "--print_config",
        ],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "DiffusionPolicyModule" in out.stdout
    assert "action_representation: absolute" in out.stdout and "pooling: spatial_softmax" in out.stdout
    assert "every_n_train_steps: 500" in out.stdout
    assert f"store: {tabletop_store}" in out.stdout


def test_angle_observations_are_fed_as_cos_sin_so_a_wrap_is_no_jump(tabletop_store):
    """PushT's block angle wraps from 2 pi to 0: the same pose must look the same to the policy."""
    from demoscale.policies import DiffusionConfig, DiffusionPolicy
    from demoscale.policies.diffusion.model import policy_statistics

    store = EpisodeStore.open(tabletop_store)
    config = DiffusionConfig(
        obs_offsets={"robot0_eef_rot_axis_angle": [0]},
        horizon=4,
        n_action_steps=2,
        down_dims=[8, 16],
        angle_obs={"robot0_eef_rot_axis_angle": [2]},
    )
    policy = DiffusionPolicy(config, store.features, policy_statistics(store, config))
    near_zero = torch.tensor([[[0.1, -0.2, 1e-4]]])
    near_two_pi = torch.tensor([[[0.1, -0.2, 2 * np.pi - 1e-4]]])
    encode = policy.normalize_obs
    a = encode({"robot0_eef_rot_axis_angle": near_zero})["robot0_eef_rot_axis_angle"]
    b = encode({"robot0_eef_rot_axis_angle": near_two_pi})["robot0_eef_rot_axis_angle"]
    assert a.shape[-1] == 4  # two kept entries, then cos and sin
    assert torch.allclose(a, b, atol=1e-3)
    plain_config = DiffusionConfig(**{**config.__dict__, "angle_obs": {}})
    plain = DiffusionPolicy(plain_config, store.features, policy_statistics(store, plain_config))
    a_plain = plain.normalize_obs({"robot0_eef_rot_axis_angle": near_zero})["robot0_eef_rot_axis_angle"]
    b_plain = plain.normalize_obs({"robot0_eef_rot_axis_angle": near_two_pi})["robot0_eef_rot_axis_angle"]
    assert (a_plain - b_plain).abs().max() > 0.5  # without it, the same pose jumps across the range


def test_obs_indices_select_entries_of_a_low_dim_observation(tabletop_store):
    """PushT's image policy sees the agent position (state[:2]) only, not the block's pose."""
    from demoscale.policies import DiffusionConfig, DiffusionPolicy
    from demoscale.policies.diffusion.model import policy_statistics

    store = EpisodeStore.open(tabletop_store)
    config = DiffusionConfig(
        obs_offsets={"robot0_eef_rot_axis_angle": [-1, 0]},
        horizon=4,
        n_action_steps=2,
        down_dims=[8, 16],
        obs_indices={"robot0_eef_rot_axis_angle": [0, 2]},
        angle_obs={"robot0_eef_rot_axis_angle": [2]},
    )
    stats = policy_statistics(store, config)
    full = store.stats("robot0_eef_rot_axis_angle")
    assert stats["robot0_eef_rot_axis_angle"]["min"].tolist() == [np.float32(full["min"][0]), -1.0, -1.0]
    policy = DiffusionPolicy(config, store.features, stats)
    obs = torch.tensor([[[0.3, 5.0, 0.0], [0.3, -5.0, np.pi / 2]]])
    seen = policy.transform_obs({"robot0_eef_rot_axis_angle": obs})["robot0_eef_rot_axis_angle"]
    expected = torch.tensor([[[0.3, 1.0, 0.0], [0.3, 0.0, 1.0]]])
    assert torch.allclose(seen, expected, atol=1e-6)  # entry 1 is not seen at all
    with pytest.raises(ValueError, match="outside obs_indices"):
        DiffusionConfig(
            obs_offsets={"state": [0]}, obs_indices={"state": [0, 1]}, angle_obs={"state": [4]}
        ).validate()
    with pytest.raises(ValueError, match="noise_scale must be a finite number >= 0"):
        DiffusionConfig(obs_offsets={"state": [0]}, noise_scale=-0.5).validate()


def test_observation_noise_is_drawn_while_training_only(tabletop_store):
    from demoscale.policies import DiffusionConfig, DiffusionPolicy
    from demoscale.policies.diffusion.model import policy_statistics

    store = EpisodeStore.open(tabletop_store)
    config = DiffusionConfig(
        obs_offsets={"robot0_eef_pos": [-1, 0]},
        horizon=4,
        n_action_steps=2,
        down_dims=[8, 16],
        obs_noise_std=0.05,
    )
    stats = policy_statistics(store, config)
    policy = DiffusionPolicy(config, store.features, stats)
    obs = {"robot0_eef_pos": torch.tensor([[[0.1, -0.1, 0.0], [0.12, -0.1, 0.01]]])}
    clean = DiffusionPolicy(
        DiffusionConfig(**{**config.__dict__, "obs_noise_std": 0.0}), store.features, stats
    )
    reference = clean.train().normalize_obs(obs)["robot0_eef_pos"]
    first, second = (policy.train().normalize_obs(obs)["robot0_eef_pos"] for _ in range(2))
    assert not torch.equal(first, second) and 0.005 < (first - reference).abs().mean() < 0.2
    assert torch.equal(policy.eval().normalize_obs(obs)["robot0_eef_pos"], reference)
    with pytest.raises(ValueError, match="obs_noise_std"):
        DiffusionConfig(obs_offsets={"robot0_eef_pos": [0]}, obs_noise_std=-0.1).validate()
