"""The diffusion policy with a PIVOT-R-style waypoint head (:mod:`demoscale.policies.waypoint_head`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from demoscale.policies.actions import relative_pose_history
from demoscale.policies.diffusion.config import DiffusionConfig
from demoscale.policies.diffusion.model import DiffusionPolicy, make_denoiser
from demoscale.policies.waypoint_head import WaypointHead, waypoint_target
from torch import nn


def make_diffusion_policy(
    config: DiffusionConfig, features: Mapping[str, Any], stats: Mapping[str, Any] | None = None
) -> nn.Module:
    """A :class:`DiffusionPolicy`, or a :class:`WaypointDiffusionPolicy` when ``config.waypoint_head``
    (the diffusion family's network in the registry)."""
    if config.waypoint_head:
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

    def __init__(
        self, config: DiffusionConfig, features: Mapping[str, Any], stats: Mapping[str, Any] | None = None
    ):
        super().__init__(config, features, stats)
        feature_dim = self.obs_encoder.output_dim
        self.waypoint_dim = self._waypoint_target_dim()
        self.waypoint_head = WaypointHead(feature_dim, self.waypoint_dim, config.waypoint_hidden_dims)
        # The denoiser reads the observation features and the predicted waypoint representation.
        self.denoiser = make_denoiser(config, self.model_action_dim, feature_dim + self.waypoint_dim)

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

    def encode_with_waypoint(self, obs: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(condition, predicted waypoint representation): the condition is the observation features
        concatenated with the prediction; training needs the prediction on its own for its loss."""
        features = super().encode(obs)
        prediction = self.waypoint_head(features)
        return torch.cat([features, prediction], dim=-1), prediction

    def encode(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return self.encode_with_waypoint(obs)[0]

    def compute_losses(
        self, batch: Mapping[str, Any], generator: torch.Generator | None = None
    ) -> dict[str, torch.Tensor]:
        """``action_loss`` (denoising), ``waypoint_loss`` (MSE to the waypoint frame) and their ``loss``."""
        condition, prediction = self.encode_with_waypoint(batch["obs"])
        action_loss = self.denoising_loss(batch, condition, generator)
        target = waypoint_target(lambda frame: self.encode_waypoint_frame(frame, batch["obs"]), batch)
        waypoint_loss = WaypointHead.loss(prediction, target)
        total = action_loss + self.config.waypoint_loss_weight * waypoint_loss
        return {"loss": total, "action_loss": action_loss, "waypoint_loss": waypoint_loss}
