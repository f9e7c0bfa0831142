"""PIVOT-R-style waypoint head: predict the representation of the next waypoint frame.

The head reads the features of the observation window and regresses the representation of the frame
at ``next_waypoint_index`` (its encoder features, computed with the same encoder under no-grad, and
its normalised proprioceptive state): a stop-gradient target, trained with an MSE loss next to the
action loss. The action head is then conditioned on the *predicted* representation, so at inference
the slow waypoint module and the fast action module can run at different rates
(:mod:`demoscale.policies.executor`).

A building block of every family: the diffusion policy's variant with the head is
:class:`demoscale.policies.diffusion.waypoint.WaypointDiffusionPolicy`; WB-VIMA builds it in when
``waypoint_head`` is set.

Samples carry the waypoint frame as ``batch["waypoint_obs"]`` = key -> (B, 1, *shape) (the sampler's
``waypoint_keys`` option, which needs the store's ``next_waypoint_index`` column: ``demoscale store
label-waypoints STORE --threshold T``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn
from torch.nn import functional

WAYPOINT_OBS = "waypoint_obs"


def mlp_head(in_dim: int, hidden_dims: Sequence[int], out_dim: int) -> nn.Sequential:
    """An MLP (Linear + Mish per hidden size, then Linear) from features to a prediction: the
    waypoint head's network, and the diffusion policy's state-target head."""
    layers: list[nn.Module] = []
    for hidden in hidden_dims:
        layers += [nn.Linear(in_dim, hidden), nn.Mish()]
        in_dim = hidden
    return nn.Sequential(*layers, nn.Linear(in_dim, out_dim))


class WaypointHead(nn.Module):
    """MLP from observation features (B, in_dim) to the predicted waypoint representation (B, target_dim)."""

    def __init__(self, in_dim: int, target_dim: int, hidden_dims: Sequence[int] = (256,)):
        super().__init__()
        self.net = mlp_head(in_dim, hidden_dims, target_dim)
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
