"""The WB-VIMA policy family in the shared Lightning layer (``demoscale train fit --config ...``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from ..config_utils import to_plain
from ..lightning_module import EMAConfig, OptimizerConfig, PolicyModule
from .config import WBVIMAConfig
from .model import validate_against_features


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
            policy or WBVIMAConfig(),
            optimizer=optimizer,
            ema=ema,
            compile=compile,
            seed=seed,
            global_batch_size=global_batch_size,
        )
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

    def encoder_parameters(self) -> list[nn.Parameter]:
        # The timm camera backbones train at the encoder learning rate; the PointNet does not.
        from ..encoders import ImageEncoder

        params: list[nn.Parameter] = []
        for module in self.policy.token_encoders.values():
            if isinstance(module, ImageEncoder):
                params.extend(module.parameters())
        return params
