"""PIVOT-R-style waypoint head in the diffusion policy and in WB-VIMA, on labelled stores on disk."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import build_tabletop_store, tiny_config
from demoscale.datasets import EpisodeDataset, EpisodeStore
from demoscale.datasets.waypoints import label_store_waypoints
from demoscale.policies.config_utils import from_plain
from demoscale.policies.diffusion.config import DiffusionConfig
from demoscale.policies.diffusion.model import policy_statistics
from demoscale.policies.diffusion.waypoint import WaypointDiffusionPolicy, make_diffusion_policy
from demoscale.policies.wbvima import WBVIMAConfig, WBVIMAPolicy
from test_wbvima_train import build_joylo_store, wbvima_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _attribute_names(network: torch.nn.Module) -> dict[str, set[str]]:
    return {name: set(vars(module)) for name, module in network.named_modules()}


def _train(policy: torch.nn.Module, dataset: EpisodeDataset, steps: int, lr: float = 3e-3) -> list[dict]:
    """Plain training steps on ``compute_losses``, which must leave no state behind on the network
    (nothing may pass from ``encode`` to the loss through attributes: unsafe under threads and DDP)."""
    attributes = _attribute_names(policy)
    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, shuffle=True, drop_last=True)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr)
    history: list[dict] = []
    while len(history) < steps:
        for batch in loader:
            losses = policy.compute_losses(batch)
            optimizer.zero_grad()
            losses["loss"].backward()
            optimizer.step()
            history.append({k: float(v) for k, v in losses.items()})
            if len(history) == steps:
                break
    assert _attribute_names(policy) == attributes, "compute_losses left attributes on the network"
    return history


def test_waypoint_head_trains_in_the_diffusion_policy(tmp_path):
    path = build_tabletop_store(tmp_path / "tabletop.zarr", n_episodes=3)
    label_store_waypoints(str(path), threshold=0.005)
    policy_settings = tiny_config(path, tmp_path)["model"]["init_args"]["policy"]
    config = from_plain(
        DiffusionConfig, {**policy_settings, "waypoint_head": True, "waypoint_hidden_dims": [64]}
    )
    store = EpisodeStore.open(path)
    torch.manual_seed(0)
    policy = make_diffusion_policy(config, store.features, policy_statistics(store, config))
    assert isinstance(policy, WaypointDiffusionPolicy)
    dataset = EpisodeDataset(
        str(path), config.obs_offsets, config.action_keys, config.horizon, waypoint_keys=policy.waypoint_keys
    )
    history = _train(policy, dataset, steps=30)
    first = np.mean([h["waypoint_loss"] for h in history[:3]])
    last = np.mean([h["waypoint_loss"] for h in history[-3:]])
    assert last < 0.5 * first, [round(h["waypoint_loss"], 4) for h in history]

    # The action head reads the predicted waypoint: a different prediction changes the actions.
    policy.eval()
    batch = next(iter(torch.utils.data.DataLoader(dataset, batch_size=2)))
    generator = torch.Generator().manual_seed(0)
    reference = policy.predict_action(batch["obs"], generator=generator)
    with torch.no_grad():
        policy.waypoint_head.net[-1].bias.add_(3.0)
    shifted = policy.predict_action(batch["obs"], generator=torch.Generator().manual_seed(0))
    assert not torch.allclose(reference, shifted)


def test_waypoint_head_trains_in_wbvima(tmp_path):
    path = build_joylo_store(tmp_path / "joylo.zarr", n_episodes=2)
    label_store_waypoints(str(path), threshold=0.05, rest_speed=1e-4)
    settings = wbvima_config(path, tmp_path, max_steps=1)["model"]["init_args"]["policy"]
    config = from_plain(WBVIMAConfig, {**settings, "waypoint_head": True, "waypoint_hidden_dims": [32]})
    store = EpisodeStore.open(path)
    stats = {key: store.stats(key) for key in [*config.action_keys, "proprio"]}
    torch.manual_seed(0)
    policy = WBVIMAPolicy(config, store.features, stats)
    dataset = EpisodeDataset(
        str(path), config.obs_offsets, config.action_keys, config.horizon, waypoint_keys=config.waypoint_keys
    )
    assert dataset[0]["waypoint_obs"]["pointcloud_xyz"].shape == (1, 24, 3)
    history = _train(policy, dataset, steps=20)
    first = np.mean([h["waypoint_loss"] for h in history[:3]])
    last = np.mean([h["waypoint_loss"] for h in history[-3:]])
    assert last < 0.5 * first, [round(h["waypoint_loss"], 4) for h in history]


@pytest.mark.slow
@pytest.mark.parametrize("family", ["wbvima", "diffusion"])
def test_waypoint_head_through_the_cli(tmp_path, family):
    """`waypoint_head: true` reaches the sampler through the policy's data window, and the checkpoint loads."""
    from demoscale.policies import load_policy, train

    if family == "wbvima":
        path = build_joylo_store(tmp_path / "joylo.zarr", n_episodes=2)
        config = wbvima_config(path, tmp_path / "run", max_steps=3, waypoint_head=True)
    else:
        path = build_tabletop_store(tmp_path / "tabletop.zarr", n_episodes=3)
        config = tiny_config(path, tmp_path / "run", waypoint_head=True)
        config["trainer"].update(max_steps=3, limit_val_batches=0)
    label_store_waypoints(str(path), threshold=0.01)
    result = train(config)
    assert result.steps == 3
    policy = load_policy(result.checkpoint_path)
    assert policy.network.waypoint_head is not None
    store = EpisodeStore.open(path)
    window = {key: store.read(key, 0, 2) for key in policy.obs_offsets}
    window = {key: value[-len(policy.obs_offsets[key]) :] for key, value in window.items()}
    assert np.isfinite(policy.predict_action(window, seed=0)).all()
