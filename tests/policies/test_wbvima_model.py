"""WB-VIMA model: attention mask, conditioning order of the chained heads, config checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from demoscale.policies.encoders import PointCloudEncoderConfig
from demoscale.policies.wbvima import (
    ChainPart,
    PointCloudInput,
    WBVIMAConfig,
    WBVIMAConfigError,
    WBVIMAPolicy,
    build_attention_mask,
)

N_POINTS = 16


pytestmark = pytest.mark.usefixtures("one_torch_thread")


PARTS = [
    ("action_mobile_base", 3),
    ("action_torso", 4),
    ("action_left_arm", 6),
    ("action_left_gripper", 1),
    ("action_right_arm", 6),
    ("action_right_gripper", 1),
]


def joylo_features(n_points: int = N_POINTS) -> dict:
    features = {
        "action": {"kind": "low_dim", "shape": [21]},
        "proprio": {"kind": "low_dim", "shape": [21]},
        "pointcloud_xyz": {"kind": "point_cloud", "shape": [n_points, 3]},
        "pointcloud_rgb": {"kind": "point_cloud", "shape": [n_points, 3]},
        "pointcloud_mask": {"kind": "point_cloud", "shape": [n_points]},
    }
    features.update({key: {"kind": "low_dim", "shape": [dim]} for key, dim in PARTS})
    return features


def unit_stats(features: dict) -> dict:
    return {
        key: {"min": -np.ones(spec["shape"]), "max": np.ones(spec["shape"])}
        for key, spec in features.items()
        if spec["kind"] == "low_dim"
    }


def tiny_config(**overrides) -> WBVIMAConfig:
    settings = dict(
        embed_dim=32,
        n_heads=4,
        n_layers=1,
        dropout=0.0,
        proprio_hidden_dims=[32],
        point_cloud_encoder=PointCloudEncoderConfig(hidden_dims=[16, 32]),
        down_dims=[16, 32],
        step_embed_dim=16,
        num_inference_steps=4,
    )
    settings.update(overrides)
    return WBVIMAConfig(**settings)


def random_obs(batch: int = 3, steps: int = 2, seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return {
        "pointcloud_xyz": torch.rand(batch, steps, N_POINTS, 3, generator=generator) * 2 - 1,
        "pointcloud_rgb": torch.randint(
            0, 256, (batch, steps, N_POINTS, 3), generator=generator, dtype=torch.uint8
        ),
        "pointcloud_mask": torch.rand(batch, steps, N_POINTS, generator=generator) > 0.2,
        "proprio": torch.rand(batch, steps, 21, generator=generator) * 2 - 1,
    }


def test_attention_mask_is_causal_and_readouts_only_read():
    mask = build_attention_mask(n_steps=3, n_obs_tokens=2)  # layout per step: obs, obs, readout
    allowed = ~mask
    readouts = [2, 5, 8]
    for query in range(9):
        for key in readouts:
            assert allowed[query, key] == (query == key), (query, key)
    # Observation tokens of one step see each other and every earlier step, never a later one.
    assert allowed[0, 1] and allowed[1, 0] and allowed[3, 0] and allowed[4, 1]
    assert not allowed[0, 3] and not allowed[1, 4] and not allowed[3, 6]
    # The last readout sees every observation token.
    assert allowed[8, [0, 1, 3, 4, 6, 7]].all()


def test_transformer_outputs_respect_the_mask():
    torch.manual_seed(0)
    policy = WBVIMAPolicy(tiny_config(), joylo_features(), unit_stats(joylo_features())).eval()
    steps, n_tokens = 2, policy.n_obs_tokens + 1
    sequence = torch.randn(1, steps * n_tokens, policy.config.embed_dim)
    run = lambda x: policy.transformer(x, mask=policy.attention_mask)  # noqa: E731
    base = run(sequence)
    changed_readouts = sequence.clone()
    changed_readouts[:, n_tokens - 1 :: n_tokens] += 5.0
    out = run(changed_readouts)
    observation_positions = [i for i in range(steps * n_tokens) if i % n_tokens != n_tokens - 1]
    torch.testing.assert_close(out[:, observation_positions], base[:, observation_positions])
    changed_future = sequence.clone()
    changed_future[:, n_tokens:] += 5.0  # everything of step 1
    torch.testing.assert_close(run(changed_future)[:, :n_tokens], base[:, :n_tokens])


def test_heads_are_conditioned_along_the_kinematic_chain():
    torch.manual_seed(0)
    features = joylo_features()
    policy = WBVIMAPolicy(tiny_config(), features, unit_stats(features)).eval()
    condition = policy.encode(random_obs())

    def sample(**fixed):
        return policy.sample_actions(condition, torch.Generator().manual_seed(7), fixed_parts=fixed)

    base_a, base_b = torch.zeros(3, 8, 3), torch.ones(3, 8, 3)
    with_a, with_b = sample(mobile_base=base_a), sample(mobile_base=base_b)
    assert not torch.allclose(with_a[..., 3:7], with_b[..., 3:7])  # torso follows the base chunk
    assert not torch.allclose(with_a[..., 7:], with_b[..., 7:])  # arms too
    arms_a, arms_b = sample(arms=torch.zeros(3, 8, 14)), sample(arms=torch.ones(3, 8, 14))
    torch.testing.assert_close(arms_a[..., :7], arms_b[..., :7])  # base and torso ignore the arms

    # Teacher forcing: the base loss does not depend on arm targets; the torso loss depends on the base.
    batch = {"obs": random_obs(), "action": torch.rand(3, 8, 21) * 2 - 1}

    def losses(action):
        torch.manual_seed(3)
        return policy.compute_losses({**batch, "action": action})

    reference = losses(batch["action"])
    arms_changed = batch["action"].clone()
    arms_changed[..., 7:] = -arms_changed[..., 7:]
    changed = losses(arms_changed)
    torch.testing.assert_close(changed["loss_mobile_base"], reference["loss_mobile_base"])
    torch.testing.assert_close(changed["loss_torso"], reference["loss_torso"])
    base_changed = batch["action"].clone()
    base_changed[..., :3] = -base_changed[..., :3]
    assert not torch.allclose(losses(base_changed)["loss_torso"], reference["loss_torso"])


def test_ablations_build_and_predict_the_whole_action():
    features = joylo_features()
    for overrides in ({"autoregressive": False}, {"multimodal_attention": False}):
        policy = WBVIMAPolicy(tiny_config(**overrides), features, unit_stats(features)).eval()
        assert len(policy.heads) == (1 if overrides.get("autoregressive") is False else 3)
        action = policy.predict_action(random_obs(batch=2))
        assert action.shape == (2, 8, 21) and torch.isfinite(action).all()
        loss = policy.compute_loss({"obs": random_obs(batch=2), "action": torch.zeros(2, 8, 21)})
        assert torch.isfinite(loss)


def test_bad_chains_and_point_clouds_fail_before_training():
    features = joylo_features()
    stats = unit_stats(features)
    short_chain = [
        ChainPart("mobile_base", ["action_mobile_base"], 3),
        ChainPart("torso", ["action_torso"], 4),
    ]
    with pytest.raises(WBVIMAConfigError, match="add up to 7.*'action' has 21"):
        WBVIMAPolicy(tiny_config(chain=short_chain), features, stats)
    wrong_dim = [ChainPart("mobile_base", ["action_mobile_base"], 4)]
    with pytest.raises(WBVIMAConfigError, match="dim 4 but its keys"):
        WBVIMAPolicy(tiny_config(chain=wrong_dim), features, stats)
    with pytest.raises(WBVIMAConfigError, match="expects 4096"):
        WBVIMAPolicy(tiny_config(point_cloud=PointCloudInput(n_points=4096)), features, stats)
    flat_cloud = {**features, "pointcloud_xyz": {"kind": "point_cloud", "shape": [N_POINTS * 3]}}
    with pytest.raises(WBVIMAConfigError, match="expected \\(N, 3\\)"):
        WBVIMAPolicy(tiny_config(), flat_cloud, stats)
    policy = WBVIMAPolicy(tiny_config(), features, stats)
    obs = random_obs()
    obs["pointcloud_rgb"] = obs["pointcloud_rgb"][:, :, :5]
    with pytest.raises(ValueError, match="pointcloud_rgb"):
        policy.predict_action(obs)


def test_hidden_proprio_dims_are_not_seen_and_the_others_are():
    """Hiding the base velocity (the first 3 JoyLo proprioception entries): changing them leaves the
    readout unchanged; changing an arm joint still moves it."""
    torch.manual_seed(0)
    features = joylo_features()
    policy = WBVIMAPolicy(tiny_config(hidden_proprio_dims=[0, 1, 2]), features, unit_stats(features)).eval()
    obs = random_obs()
    base = policy.readout_embedding(obs)
    velocity_changed = {**obs, "proprio": obs["proprio"].clone()}
    velocity_changed["proprio"][..., :3] += 0.7
    torch.testing.assert_close(policy.readout_embedding(velocity_changed), base)
    joint_changed = {**obs, "proprio": obs["proprio"].clone()}
    joint_changed["proprio"][..., 10] += 0.7
    assert not torch.allclose(policy.readout_embedding(joint_changed), base)
    with pytest.raises(ValueError, match="outside"):
        WBVIMAPolicy(tiny_config(hidden_proprio_dims=[21]), features, unit_stats(features))


def test_proprio_noise_acts_while_training_only():
    torch.manual_seed(0)
    features = joylo_features()
    policy = WBVIMAPolicy(tiny_config(proprio_noise_std=0.5), features, unit_stats(features))
    obs = random_obs()
    clean = policy.normalizer.normalize("proprio", obs["proprio"].float())
    policy.train()
    noisy = policy.observed_proprio(obs)
    assert 0.3 < float((noisy - clean).std()) < 0.7  # the configured 0.5
    policy.eval()
    torch.testing.assert_close(policy.observed_proprio(obs), clean)
    with pytest.raises(ValueError, match="proprio_noise_std"):
        tiny_config(proprio_noise_std=-0.1)
