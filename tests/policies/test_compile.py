"""``compile: true`` compiles the work training does (the network's parts), not a forward it never calls.

Dynamo traces with the ``eager`` backend here: the same graphs, no code generation (a CPU compile
takes about a minute on our machines).
"""

from __future__ import annotations

import pytest
import torch
from demoscale.datasets import EpisodeStore
from demoscale.policies.config_utils import from_plain
from demoscale.policies.diffusion.config import DiffusionConfig
from demoscale.policies.diffusion.model import DiffusionPolicy, policy_statistics
from demoscale.policies.lightning_module import compile_network
from torch._dynamo.utils import counters

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _policy(store_path) -> tuple[DiffusionPolicy, dict]:
    from demoscale.datasets import EpisodeDataset

    spec = {
        "obs_offsets": {
            "camera0_rgb": [-1, 0],
            "robot0_eef_pos": [-1, 0],
            "robot0_eef_rot_axis_angle": [-1, 0],
        },
        "horizon": 8,
        "n_action_steps": 4,
        "action_representation": "relative",
        "image": {"backbone": "test_resnet", "crop_fraction": 0.9, "color_jitter": [0.1, 0.1, 0.0, 0.0]},
        "down_dims": [16, 32],
        "step_embed_dim": 16,
    }
    config = from_plain(DiffusionConfig, spec)
    store = EpisodeStore.open(store_path)
    torch.manual_seed(0)
    policy = DiffusionPolicy(config, store.features, policy_statistics(store, config)).train()
    dataset = EpisodeDataset(store_path, config.obs_offsets, config.action_keys, config.horizon)
    batch = torch.utils.data.default_collate(dataset.__getitems__([0, 5, 9, 13]))
    return policy, batch


def test_compiling_a_network_compiles_what_compute_losses_runs(tabletop_store) -> None:
    policy, batch = _policy(tabletop_store)
    keys = list(policy.state_dict())
    torch.manual_seed(1)
    eager_loss = policy.compute_loss(batch)
    torch._dynamo.reset()
    counters.clear()
    assert compile_network(policy, backend="eager") == ["obs_encoder", "denoiser"]
    torch.manual_seed(1)
    compiled_loss = policy.compute_loss(batch)
    assert counters["frames"]["ok"] >= 2  # the encoder's and the denoiser's graphs were traced
    compiled_loss.backward()
    torch.testing.assert_close(compiled_loss, eager_loss)  # the same numbers (eager backend)
    assert list(policy.state_dict()) == keys  # checkpoints keep their keys
    # The image augmentation stays out of the graph: its random crops (new ones every batch) would
    # otherwise recompile batch after batch.
    graphs = counters["stats"]["unique_graphs"]
    for seed in (2, 3, 4):
        torch.manual_seed(seed)
        policy.compute_loss(batch).backward()
    assert counters["stats"]["unique_graphs"] == graphs
    torch._dynamo.reset()


def test_an_unknown_compile_mode_is_refused(tabletop_store) -> None:
    policy, _ = _policy(tabletop_store)
    with pytest.raises(ValueError, match="compile mode must be one of default, reduce-overhead"):
        compile_network(policy, "fastest")
