"""PIVOT-R-style waypoint head: predict the representation of the next waypoint frame.

The head reads the features of the observation window and regresses the representation of the frame
at ``next_waypoint_index`` (its encoder features, computed with the same encoder under no-grad, and
its normalised proprioceptive state): a stop-gradient target, trained with an MSE loss next to the
action loss. The action head is then conditioned on the *predicted* representation, so at inference
the slow waypoint module and the fast action module can run at different rates
(:mod:`demoscale.policies.executor`).

Samples carry the waypoint frame as ``batch["waypoint_obs"]`` = key -> (B, 1, *shape) (the sampler's
``waypoint_keys`` option, which needs the store's ``next_waypoint_index`` column: ``demoscale store
label-waypoints STORE --threshold T``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional

from .diffusion.model import DiffusionPolicy, make_denoiser

WAYPOINT_OBS = "waypoint_obs"


class WaypointHead(nn.Module):
    """MLP from observation features (B, in_dim) to the predicted waypoint representation (B, target_dim)."""

    def __init__(self, in_dim: int, target_dim: int, hidden_dims: Sequence[int] = (256,)):
        super().__init__()
        layers: list[nn.Module] = []
        dim = in_dim
        for hidden in hidden_dims:
            layers += [nn.Linear(dim, hidden), nn.Mish()]
            dim = hidden
        layers.append(nn.Linear(dim, target_dim))
        self.net = nn.Sequential(*layers)
        self.in_dim = in_dim
        self.target_dim = target_dim

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features)

    @staticmethod
    def loss(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """MSE to a stop-gradient target."""
        return functional.mse_loss(prediction, target.detach())


def waypoint_target(
    encode_frame: Callable[[Mapping[str, torch.Tensor]], torch.Tensor], batch: Mapping[str, object]
) -> torch.Tensor:
    """The (B, target_dim) representation of the waypoint frames in ``batch``, without gradient.

    ``encode_frame`` maps a one-frame observation dict (key -> (B, 1, *shape)) to (B, target_dim);
    policies pass their own encoder so that target and prediction live in the same space.
    """
    if WAYPOINT_OBS not in batch:
        raise KeyError(
            "the waypoint head needs batch['waypoint_obs']: build the data with waypoint_keys (the sampler "
            "option) on a store labelled with `demoscale store label-waypoints STORE --threshold T`"
        )
    with torch.no_grad():
        return encode_frame(batch[WAYPOINT_OBS]).detach()  # type: ignore[arg-type]


def make_diffusion_policy(
    config: Any, features: Mapping[str, Any], stats: Mapping[str, Any] | None = None
) -> nn.Module:
    """A :class:`DiffusionPolicy`, or a :class:`WaypointDiffusionPolicy` when ``config.waypoint_head``."""
    if getattr(config, "waypoint_head", False):
        return WaypointDiffusionPolicy(config, features, stats)
    return DiffusionPolicy(config, features, stats)


class WaypointDiffusionPolicy(DiffusionPolicy):
    """The diffusion policy with a PIVOT-R-style waypoint head.

    The head reads the encoded observation window and predicts the waypoint frame's representation:
    the camera features of that frame (same encoders, stop-gradient) and its low-dim state, normalised
    like the policy's observations (with relative actions, the waypoint pose is expressed relative to
    the current pose, as the pose history is). The denoiser is conditioned on the observation features
    concatenated with the predicted representation.
    """

    def __init__(self, config: Any, features: Mapping[str, Any], stats: Mapping[str, Any] | None = None):
        super().__init__(config, features, stats)
        feature_dim = self.obs_encoder.output_dim
        self.waypoint_dim = self._waypoint_target_dim()
        self.waypoint_head = WaypointHead(feature_dim, self.waypoint_dim, config.waypoint_hidden_dims)
        # The denoiser reads the observation features and the predicted waypoint representation.
        self.denoiser = make_denoiser(config, self.model_action_dim, feature_dim + self.waypoint_dim)
        self._pose_of = {key: pair for pair in self.pose_keys for key in pair}

    @property
    def waypoint_keys(self) -> list[str]:
        return list(self.obs_keys)

    def _waypoint_target_dim(self) -> int:
        size = 0
        for key in self.obs_keys:
            if self.features[key]["kind"] == "image":
                size += self.obs_encoder.encoder_for(key).feature_dim
            else:
                size += int(self.normalizer.slots[self.normalizer._key_to_slot[key]].scale.numel())
        return size

    def encode_waypoint_frame(
        self, waypoint_obs: Mapping[str, torch.Tensor], obs: Mapping[str, torch.Tensor]
    ) -> torch.Tensor:
        """Waypoint frame (key -> (B, 1, ...)) -> (B, waypoint_dim), given the current window ``obs``."""
        from .actions import relative_pose_history

        relative_poses: dict[str, torch.Tensor] = {}
        if self.relative and self.config.relative_obs:
            for pos_key, rot_key in self.pose_keys:
                now = self._current_index(pos_key)
                pos = torch.cat(
                    [waypoint_obs[pos_key].float(), obs[pos_key][:, now : now + 1].float()], dim=1
                )
                rot = torch.cat(
                    [waypoint_obs[rot_key].float(), obs[rot_key][:, now : now + 1].float()], dim=1
                )
                rel_pos, rel_rot = relative_pose_history(pos, rot, 1)
                relative_poses[pos_key], relative_poses[rot_key] = rel_pos[:, :1], rel_rot[:, :1]
        parts = []
        for key in self.obs_keys:
            if self.features[key]["kind"] == "image":
                parts.append(self.obs_encoder.encoder_for(key)(waypoint_obs[key]).flatten(1))
            else:
                value = relative_poses.get(key, waypoint_obs[key].float())
                parts.append(self.normalizer.normalize(key, value.flatten(2)).flatten(1))
        return torch.cat(parts, dim=-1)

    def encode(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        features = super().encode(obs)
        self._last_waypoint_prediction = self.waypoint_head(features)
        return torch.cat([features, self._last_waypoint_prediction], dim=-1)

    def compute_losses(
        self, batch: Mapping[str, Any], generator: torch.Generator | None = None
    ) -> dict[str, torch.Tensor]:
        """``action_loss`` (denoising), ``waypoint_loss`` (MSE to the waypoint frame) and their ``loss``."""
        action_loss = super().compute_loss(batch, generator)
        prediction = self._last_waypoint_prediction
        target = waypoint_target(lambda frame: self.encode_waypoint_frame(frame, batch["obs"]), batch)
        waypoint_loss = WaypointHead.loss(prediction, target)
        total = action_loss + self.config.waypoint_loss_weight * waypoint_loss
        return {"loss": total, "action_loss": action_loss, "waypoint_loss": waypoint_loss}

    def compute_loss(
        self, batch: Mapping[str, Any], generator: torch.Generator | None = None
    ) -> torch.Tensor:
        return self.compute_losses(batch, generator)["loss"]
