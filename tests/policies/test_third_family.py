"""A third policy family, defined in this file alone, goes the whole public path.

It is registered at test time, trained through ``demoscale.policies.train`` (the Lightning CLI, its
class path in this module), saved, loaded with ``load_policy``, run by the executor and evaluated with
``demoscale.eval.evaluate`` on a simulated task: adding a family touches no project file.
"""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import pytest
import torch
from demoscale.datasets import EpisodeStore
from demoscale.eval import evaluate
from demoscale.policies import PolicyFamily, load_policy, register_family, train
from demoscale.policies.executor import HierarchicalExecutor, ReplayEnv
from demoscale.policies.families import UnknownFamilyError, get_family, unregister_family
from demoscale.policies.lightning_module import PolicyModule
from demoscale.policies.normalize import Normalizer
from torch import nn

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# -- the family: config, network, LightningModule -----------------------------------------------------
@dataclass
class LinearChunkConfig:
    obs_offsets: dict[str, list[int]] = field(
        default_factory=lambda: {"robot0_eef_pos": [-1, 0], "robot0_gripper_width": [0]}
    )
    action_keys: list[str] = field(default_factory=lambda: ["action"])
    horizon: int = 4
    n_action_steps: int = 2


class LinearChunkPolicy(nn.Module):
    """A linear map from the normalised observation window to a normalised action chunk."""

    def __init__(self, config: LinearChunkConfig, features: Mapping[str, Any], stats: Any = None):
        super().__init__()
        self.config = config
        self.action_dim = math.prod(features["action"]["shape"])
        keys = [*config.obs_offsets, "action"]
        self.normalizer = Normalizer(
            {k: features[k]["shape"] for k in keys}, dict.fromkeys(keys, "min_max"), stats
        )
        size = sum(
            len(offsets) * math.prod(features[k]["shape"]) for k, offsets in config.obs_offsets.items()
        )
        self.linear = nn.Linear(size, config.horizon * self.action_dim)

    def encode(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat(
            [self.normalizer.normalize(k, obs[k].float()).flatten(1) for k in self.config.obs_offsets], 1
        )

    def _chunk(self, condition: torch.Tensor) -> torch.Tensor:
        return self.linear(condition).view(-1, self.config.horizon, self.action_dim)

    def act_from_condition(
        self, condition: torch.Tensor, obs: Any, steps: Any = None, generator: Any = None
    ) -> torch.Tensor:
        return self.normalizer.unnormalize("action", self._chunk(condition))

    def compute_losses(self, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        error = (
            self._chunk(self.encode(batch["obs"])) - self.normalizer.normalize("action", batch["action"])
        ) ** 2
        return {"loss": error.mean(), "first_action_loss": error[:, 0].mean()}


class LinearChunkModule(PolicyModule):
    family = "linear_chunk"

    def __init__(self, policy: LinearChunkConfig | None = None, **kwargs: Any):
        super().__init__(policy or LinearChunkConfig(), **kwargs)


LINEAR_CHUNK = PolicyFamily("linear_chunk", LinearChunkConfig, LinearChunkPolicy, LinearChunkModule)


# -- the tests ----------------------------------------------------------------------------------------
@pytest.fixture
def linear_chunk_family():
    yield register_family(LINEAR_CHUNK)
    unregister_family(LINEAR_CHUNK.name)


def _config(store: str, root: str) -> dict[str, Any]:
    return {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu",
            "max_steps": 30,
            "log_every_n_steps": 1,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "num_sanity_val_steps": 0,
            "limit_val_batches": 1,
            "val_check_interval": 30,
            "check_val_every_n_epoch": None,
            "default_root_dir": root,
        },
        "model": {
            "class_path": f"{__name__}.LinearChunkModule",
            "init_args": {"optimizer": {"lr": 3e-2, "warmup_steps": 1}, "ema": {"max_decay": 0.9}},
        },
        "data": {"store": store, "batch_size": 8, "val_fraction": 0.25},
        "checkpoint": {"every_n_train_steps": 30},
        "progress": {"every_s": 0},
    }


def test_a_family_defined_outside_the_project_trains_loads_acts_and_is_evaluated(
    linear_chunk_family, tabletop_store, tmp_path
):
    result = train(_config(str(tabletop_store), str(tmp_path / "run")))
    assert result.steps == 30
    # The base module logs every part of compute_losses, for training and validation.
    for name in ("train/loss", "train/first_action_loss", "val/loss", "val/first_action_loss"):
        assert math.isfinite(result.metrics[name]), (name, result.metrics)
    (log,) = (tmp_path / "run").rglob("metrics.csv")
    losses = pd.read_csv(log)["train/loss"].dropna().to_numpy()
    assert losses[-5:].mean() < 0.5 * losses[:5].mean(), losses  # it learned

    policy = load_policy(result.checkpoint_path)
    assert isinstance(policy.network, LinearChunkPolicy)
    assert (policy.family, policy.action_dim, policy.horizon, policy.num_inference_steps) == (
        "linear_chunk",
        7,
        4,
        None,
    )

    # The executor drives it through the same encode / act_from_condition halves, in both modes.
    store = EpisodeStore.open(tabletop_store)
    for mode in ("sync", "async"):
        execution = HierarchicalExecutor(policy, mode=mode).run(ReplayEnv(store, episode=0), n_steps=6)
        assert execution.steps == 6 and execution.chunks >= 2

    evaluation = evaluate(
        result.checkpoint_path,
        "reach",
        split="unseen",
        n_envs=2,
        episodes=2,
        max_steps=6,
        video_episodes=0,
        progress=False,
    )
    assert len(evaluation.rollouts) == 2 and evaluation.summary["n_rollouts"] == 2
    assert (evaluation.rollouts["steps"] <= 6).all() and (evaluation.rollouts["steps"] >= 1).all()

    # Checkpoints name their family: once it is no longer registered, loading says so.
    unregister_family(LINEAR_CHUNK.name)
    with pytest.raises(UnknownFamilyError, match="'linear_chunk'.*registered: \\['diffusion', 'wbvima'\\]"):
        load_policy(result.checkpoint_path)


def test_the_registry_refuses_families_that_break_the_contract(linear_chunk_family, tabletop_store):
    features = {key: spec.to_dict() for key, spec in EpisodeStore.open(tabletop_store).features.items()}
    with pytest.raises(ValueError, match="already registered"):
        register_family(PolicyFamily("linear_chunk", LinearChunkConfig, nn.Linear, LinearChunkModule))
    with pytest.raises(ValueError, match="must match"):
        register_family(PolicyFamily("other_name", LinearChunkConfig, LinearChunkPolicy, LinearChunkModule))

    class NoHalves(nn.Module):
        def __init__(self, config: Any, features: Any, stats: Any = None):
            super().__init__()
            self.config, self.action_dim = config, 7

        def compute_losses(self, batch: Any) -> dict[str, torch.Tensor]:
            return {}

    broken = PolicyFamily("linear_chunk", LinearChunkConfig, NoHalves, LinearChunkModule)
    with pytest.raises(TypeError, match=r"lacks \['encode', 'act_from_condition'\]"):
        broken.build_network(LinearChunkConfig(), features)
    with pytest.raises(UnknownFamilyError, match="'act'.*registered"):
        get_family("act")
    assert get_family("diffusion").module_class().__name__ == "DiffusionPolicyModule"


def test_the_training_cli_names_a_registered_family_by_its_class_name(tabletop_store):
    # A fresh interpreter: nothing but the registry has imported the WB-VIMA module there.
    code = (
        "import sys\n"
        "from demoscale.policies.cli import make_cli\n"
        "cli = make_cli(['--model=WBVIMAModule', '--data.store=' + sys.argv[1]], run=False)\n"
        "print(type(cli.model).__module__, type(cli.model).__name__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tabletop_store)], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["demoscale.policies.wbvima.lightning", "WBVIMAModule"]
