"""The diffusion policy family in the shared Lightning layer (``demoscale train fit --config ...``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from demoscale.policies.diffusion.config import DiffusionConfig
from demoscale.policies.diffusion.model import check_keys, policy_statistics
from demoscale.policies.lightning_module import PolicyModule


class DiffusionPolicyModule(PolicyModule):
    """Diffusion policy (UMI / Diffusion Policy style) trained with Lightning.

    Args:
        policy: the network and representation settings (:class:`DiffusionConfig`).
        kwargs: ``optimizer``, ``ema``, ``compile``, ``seed``, ``global_batch_size`` of :class:`PolicyModule`.
    """

    family = "diffusion"

    def __init__(self, policy: DiffusionConfig | None = None, **kwargs: Any):
        # No Lightning hparams: the CLI's config.yaml records the run, and the checkpoint's own
        # metadata (on_save_checkpoint) rebuilds the policy.
        super().__init__(policy or DiffusionConfig(), **kwargs)

    def check_features(self, features: Mapping[str, Any]) -> None:
        check_keys(self.policy_config, features)

    def policy_statistics(
        self, store: Any, episodes: Sequence[int] | None
    ) -> dict[str, dict[str, np.ndarray]]:
        # Relative actions and pose histories need statistics of derived quantities.
        return policy_statistics(store, self.policy_config, episodes, seed=self.seed)
