"""A FiLM-conditioned MLP denoiser over a whole (flattened) action chunk.

The alternative to :class:`~demoscale.policies.unet1d.ConditionalUnet1D` when compute is scarce:
on one CPU core the small 1-D U-Net costs about 100 ms per forward+backward of a 64-chunk batch
(dozens of tiny convolutions), an MLP of the same width about 2 ms, so a laptop-sized policy spends
its budget on the image encoder and takes several times more optimiser steps in the same minutes.
It has no temporal inductive bias, which matters little for the short chunks of such policies.
"""

from __future__ import annotations

import torch
from torch import nn

from .unet1d import step_embedding_mlp


class FiLMResidualMLPBlock(nn.Module):
    """LayerNorm -> Linear -> Mish, modulated by a per-feature scale and bias from the condition."""

    def __init__(self, width: int, cond_dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.linear = nn.Linear(width, width)
        self.film = nn.Linear(cond_dim, 2 * width)
        self.out = nn.Linear(width, width)
        self.act = nn.Mish()

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        scale, bias = self.film(cond).chunk(2, dim=-1)
        hidden = self.act(self.linear(self.norm(x)))
        return x + self.out(self.act(hidden * (1 + scale) + bias))


class ConditionalMLP(nn.Module):
    """(B, horizon, action_dim) noisy chunk, diffusion step, global condition -> (B, horizon, action_dim).

    Args:
        action_dim, horizon: the chunk's shape (fixed: the MLP sees the chunk flattened).
        cond_dim: size of the global condition vector (0 for none).
        width: hidden width; depth: number of FiLM residual blocks.
        step_embed_dim: size of the diffusion-step embedding.
    """

    def __init__(
        self,
        action_dim: int,
        horizon: int,
        cond_dim: int,
        width: int = 256,
        depth: int = 3,
        step_embed_dim: int = 64,
    ):
        super().__init__()
        if depth < 1 or width < 1:
            raise ValueError(f"MLP denoiser needs depth >= 1 and width >= 1, got depth={depth} width={width}")
        self.action_dim, self.horizon = int(action_dim), int(horizon)
        self.step_embedding = step_embedding_mlp(step_embed_dim)
        film_dim = step_embed_dim + cond_dim
        self.input = nn.Linear(self.horizon * self.action_dim, width)
        self.blocks = nn.ModuleList([FiLMResidualMLPBlock(width, film_dim) for _ in range(depth)])
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, self.horizon * self.action_dim))

    @property
    def horizon_multiple(self) -> int:
        return 1

    def forward(
        self, sample: torch.Tensor, step: torch.Tensor, global_cond: torch.Tensor | None = None
    ) -> torch.Tensor:
        if tuple(sample.shape[1:]) != (self.horizon, self.action_dim):
            raise ValueError(
                f"MLP denoiser built for chunks of {(self.horizon, self.action_dim)}, got {tuple(sample.shape[1:])}"
            )
        if step.ndim == 0:
            step = step.expand(sample.shape[0])
        cond = self.step_embedding(step.to(sample.device))
        if global_cond is not None:
            cond = torch.cat([cond, global_cond], dim=-1)
        x = self.input(sample.flatten(1))
        for block in self.blocks:
            x = block(x, cond)
        return self.head(x).view(sample.shape)
