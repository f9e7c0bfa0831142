"""The WB-VIMA policy family in the shared Lightning layer (``demoscale train fit --config ...``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from ..config_utils import to_plain
from ..lightning_module import EMAConfig, OptimizerConfig, PolicyModule
from .config import WBVIMAConfig
from .model import WBVIMAPolicy, validate_against_features


class WBVIMAModule(PolicyModule):
    """WB-VIMA-style whole-body policy trained with Lightning.

    Args:
        policy: the network settings (:class:`WBVIMAConfig`; the chain of parts is configuration).
        optimizer, ema, compile, seed, global_batch_size: see :class:`PolicyModule`.
    """

    family = "wbvima"

    def __init__(
        self,
        policy: WBVIMAConfig | None = None,
        optimizer: OptimizerConfig | None = None,
        ema: EMAConfig | None = None,
        compile: bool = False,
        seed: int = 0,
        global_batch_size: int | None = None,
    ):
        super().__init__(
            optimizer=optimizer, ema=ema, compile=compile, seed=seed, global_batch_size=global_batch_size
        )
        self.policy_config = policy or WBVIMAConfig()
        self.save_hyperparameters(
            {
                "policy": to_plain(self.policy_config),
                "optimizer": to_plain(self.optimizer_config),
                "ema": to_plain(self.ema_config),
                "compile": compile,
                "seed": seed,
                "global_batch_size": global_batch_size,
            }
        )

    def check_features(self, features: Mapping[str, Any]) -> None:
        validate_against_features(self.policy_config, features)

    def build_policy(self, features: Mapping[str, Any], stats: Mapping[str, Any] | None) -> nn.Module:
        return WBVIMAPolicy(self.policy_config, features, stats)

    def policy_statistics(
        self, store: Any, episodes: Sequence[int] | None
    ) -> dict[str, dict[str, np.ndarray]]:
        config = self.policy_config
        keys = list(config.action_keys) + ([config.proprio_key] if config.proprio_key else [])
        return {
            key: {name: np.asarray(value, dtype=np.float32) for name, value in store.stats(key).items()}
            for key in keys
        }

    def policy_config_dict(self) -> dict[str, Any]:
        return to_plain(self.policy_config)

    def data_window(self) -> dict[str, Any]:
        window: dict[str, Any] = {
            "obs_offsets": self.policy_config.obs_offsets,
            "action_keys": list(self.policy_config.action_keys),
            "horizon": self.policy_config.horizon,
        }
        if self.policy_config.waypoint_keys:
            window["waypoint_keys"] = list(self.policy_config.waypoint_keys)
        return window

    def encoder_parameters(self) -> list[nn.Parameter]:
        # The timm camera backbones train at the encoder learning rate; the PointNet does not.
        from ..encoders import ImageEncoder

        params: list[nn.Parameter] = []
        for module in self.policy.token_encoders.values():
            if isinstance(module, ImageEncoder):
                params.extend(module.parameters())
        return params

    def _log_parts(self, losses: Mapping[str, torch.Tensor], stage: str, batch: Mapping[str, Any]) -> None:
        size = int(batch["action"].shape[0])
        for name, value in losses.items():
            if name != "loss":
                self.log(f"{stage}/{name}", value, batch_size=size, sync_dist=stage == "val")

    def training_step(self, batch: Mapping[str, Any], batch_idx: int) -> torch.Tensor:
        with self._seeded(batch_idx, "train"):
            losses = self.policy.compute_losses(batch)
        self.log("train/loss", losses["loss"], prog_bar=True, batch_size=int(batch["action"].shape[0]))
        self._log_parts(losses, "train", batch)
        return losses["loss"]

    def validation_step(self, batch: Mapping[str, Any], batch_idx: int) -> torch.Tensor:
        with self._seeded(batch_idx, "val"):
            losses = self.inference_policy.compute_losses(batch)
        self.log(
            "val/loss",
            losses["loss"],
            prog_bar=True,
            sync_dist=True,
            batch_size=int(batch["action"].shape[0]),
        )
        self._log_parts(losses, "val", batch)
        return losses["loss"]
