"""The diffusion policy family in the shared Lightning layer (``demoscale train fit --config ...``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from demoscale.policies.diffusion.config import DiffusionConfig
from demoscale.policies.diffusion.model import check_keys, policy_statistics
from demoscale.policies.lightning_module import EMAConfig, OptimizerConfig, PolicyModule


class DiffusionPolicyModule(PolicyModule):
    """Diffusion policy (UMI / Diffusion Policy style) trained with Lightning.

    Args:
        policy: the network and representation settings (:class:`DiffusionConfig`).
        optimizer, ema, compile, seed, global_batch_size: see :class:`PolicyModule`.
    """

    family = "diffusion"

    def __init__(
        self,
        policy: DiffusionConfig | None = None,
        optimizer: OptimizerConfig | None = None,
        ema: EMAConfig | None = None,
        compile: bool = False,
        seed: int = 0,
        global_batch_size: int | None = None,
    ):
        # No Lightning hparams: the CLI's config.yaml records the run, and the checkpoint's own
        # metadata (on_save_checkpoint) rebuilds the policy.
        super().__init__(
            policy or DiffusionConfig(),
            optimizer=optimizer,
            ema=ema,
            compile=compile,
            seed=seed,
            global_batch_size=global_batch_size,
        )

    def check_features(self, features: Mapping[str, Any]) -> None:
        check_keys(self.policy_config, features)

    def policy_statistics(
        self, store: Any, episodes: Sequence[int] | None
    ) -> dict[str, dict[str, np.ndarray]]:
        # Relative actions and pose histories need statistics of derived quantities.
        return policy_statistics(store, self.policy_config, episodes, seed=self.seed)
