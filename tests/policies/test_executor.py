"""The asynchronous hierarchical executor with both policy families, on stores on disk."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import build_tabletop_store, tiny_config
from demoscale.datasets import EpisodeStore
from demoscale.policies.config_utils import from_plain
from demoscale.policies.diffusion.config import DiffusionConfig
from demoscale.policies.diffusion.model import DiffusionPolicy, policy_statistics
from demoscale.policies.executor import HierarchicalExecutor, LatestValue, ReplayEnv
from demoscale.policies.inference import Policy
from demoscale.policies.wbvima import PointCloudInput, WBVIMAPolicy
from test_wbvima_model import tiny_config as tiny_wbvima_config
from test_wbvima_train import build_joylo_store

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _as_policy(network: torch.nn.Module, family: str, store: EpisodeStore) -> Policy:
    features = {key: spec.to_dict() for key, spec in store.features.items()}
    return Policy(network, {"family": family, "features": features}, "cpu", num_inference_steps=3)


@pytest.fixture(scope="module")
def wbvima_policy(tmp_path_factory) -> tuple[Policy, EpisodeStore]:
    path = build_joylo_store(tmp_path_factory.mktemp("exec") / "joylo.zarr", n_episodes=1)
    store = EpisodeStore.open(path)
    config = tiny_wbvima_config(point_cloud=PointCloudInput(n_points=24), n_action_steps=4)
    stats = {key: store.stats(key) for key in [*config.action_keys, "proprio"]}
    torch.manual_seed(0)
    return _as_policy(WBVIMAPolicy(config, store.features, stats), "wbvima", store), store


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_executor_runs_wbvima_in_both_modes(wbvima_policy, mode):
    policy, store = wbvima_policy
    env = ReplayEnv(store, episode=0)
    result = HierarchicalExecutor(policy, mode=mode).run(env, n_steps=10)
    assert result.steps == 10 and len(env.actions) == 10 and result.control_rate_hz > 0
    assert all(action.shape == (21,) and np.isfinite(action).all() for action in env.actions)
    assert result.chunks >= (3 if mode == "sync" else 1)  # sync: every 4 steps
    assert result.slow_updates >= 1
    if mode == "sync":
        assert result.chunks == 3 and result.stalls == 0


def test_sync_executor_matches_predict_action(wbvima_policy):
    policy, store = wbvima_policy
    env = ReplayEnv(store, episode=0)
    HierarchicalExecutor(policy, mode="sync", seed=5).run(env, n_steps=4)
    first_window = {key: np.stack([store.read(key, 0, 1)[0]] * 2) for key in policy.obs_offsets}
    torch.manual_seed(0)
    expected = policy.predict_action(first_window, seed=5)
    np.testing.assert_allclose(np.stack(env.actions), expected[:4], rtol=1e-4, atol=1e-5)


def test_executor_runs_the_diffusion_policy_async(tmp_path):
    path = build_tabletop_store(tmp_path / "tabletop.zarr", n_episodes=1)
    store = EpisodeStore.open(path)
    config = from_plain(DiffusionConfig, tiny_config(path, tmp_path)["model"]["init_args"]["policy"])
    torch.manual_seed(0)
    network = DiffusionPolicy(config, store.features, policy_statistics(store, config))
    env = ReplayEnv(store, episode=0)
    result = HierarchicalExecutor(_as_policy(network, "diffusion", store), mode="async").run(env, n_steps=6)
    assert result.steps == 6 and len(env.actions) == 6 and result.chunks >= 1
    assert all(action.shape == (7,) and np.isfinite(action).all() for action in env.actions)


def test_sync_executor_matches_predict_action_for_the_diffusion_policy(tmp_path):
    # The executor's fast module is the network's own act_from_condition: same chunk as
    # predict_action, relative actions included (the tiny config is relative).
    path = build_tabletop_store(tmp_path / "tabletop.zarr", n_episodes=1)
    store = EpisodeStore.open(path)
    config = from_plain(DiffusionConfig, tiny_config(path, tmp_path)["model"]["init_args"]["policy"])
    torch.manual_seed(0)
    policy = _as_policy(
        DiffusionPolicy(config, store.features, policy_statistics(store, config)), "diffusion", store
    )
    env = ReplayEnv(store, episode=0)
    HierarchicalExecutor(policy, mode="sync", seed=5).run(env, n_steps=4)
    first_window = {
        key: np.stack([store.read(key, 0, 1)[0]] * len(offsets))
        for key, offsets in policy.obs_offsets.items()
    }
    expected = policy.predict_action(first_window, seed=5)
    np.testing.assert_allclose(np.stack(env.actions), expected[:4], rtol=1e-4, atol=1e-5)


class SucceedsOnFifthStep(ReplayEnv):
    """A replayed episode whose task counts as done from the fifth executed action on."""

    def success(self) -> bool:
        return len(self.actions) >= 5


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_episode_ends_at_the_first_success(wbvima_policy, mode):
    policy, store = wbvima_policy
    env = SucceedsOnFifthStep(store, episode=0)
    result = HierarchicalExecutor(policy, mode=mode).run(env, n_steps=12)
    assert result.success is True
    assert result.steps == 5 and len(env.actions) == 5


def test_latest_value_buffer_hands_over_the_newest_value():
    buffer = LatestValue()
    assert buffer.get() == (0, None)
    buffer.put("a")
    buffer.put("b")
    assert buffer.wait_newer(0, timeout=1.0) == (2, "b")
    assert buffer.wait_newer(2, timeout=0.01) == (2, "b")  # times out with the current value
    buffer.close()
    assert buffer.closed
