"""The WB-VIMA policy family in the shared Lightning layer (``demoscale train fit --config ...``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from ..config_utils import to_plain
from ..lightning_module import PolicyModule
from .config import WBVIMAConfig
from .model import validate_against_features


class WBVIMAModule(PolicyModule):
    """WB-VIMA-style whole-body policy trained with Lightning.

    Args:
        policy: the network settings (:class:`WBVIMAConfig`; the chain of parts is configuration).
        kwargs: ``optimizer``, ``ema``, ``compile``, ``seed``, ``global_batch_size`` of :class:`PolicyModule`.
    """

    family = "wbvima"

    def __init__(self, policy: WBVIMAConfig | None = None, **kwargs: Any):
        super().__init__(policy or WBVIMAConfig(), **kwargs)
        self.save_hyperparameters(
            {
                "policy": to_plain(self.policy_config),
                "optimizer": to_plain(self.optimizer_config),
                "ema": to_plain(self.ema_config),
                "compile": self.compile_policy,
                "seed": self.seed,
                "global_batch_size": self.global_batch_size,
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
