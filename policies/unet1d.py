"""A 1-D temporal U-Net denoiser with FiLM conditioning (the Diffusion Policy / UMI architecture).

The input is a noisy action chunk (B, horizon, action_dim); the condition is a global vector (the
encoded observation window, and for hierarchical heads any upstream action chunks) plus the diffusion
step, which modulate every residual block by a per-channel scale and bias (FiLM).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class SinusoidalStepEmbedding(nn.Module):
    """Diffusion step (B,) -> (B, dim) sinusoidal embedding."""

    def __init__(self, dim: int):
        super().__init__()
        if dim % 2:
            raise ValueError(f"step embedding dim must be even, got {dim}")
        self.dim = dim

    def forward(self, step: torch.Tensor) -> torch.Tensor:
        half = self.dim // 2
        freqs = torch.exp(
            -math.log(10000.0) * torch.arange(half, device=step.device, dtype=torch.float32) / (half - 1)
        )
        angles = step.float()[:, None] * freqs[None]
        return torch.cat([angles.sin(), angles.cos()], dim=-1)


def step_embedding_mlp(dim: int) -> nn.Sequential:
    """Diffusion step (B,) -> (B, dim): sinusoidal features through a small MLP (shared by denoisers)."""
    return nn.Sequential(
        SinusoidalStepEmbedding(dim), nn.Linear(dim, 4 * dim), nn.Mish(), nn.Linear(4 * dim, dim)
    )


class ConvNormAct(nn.Sequential):
    """Conv1d -> GroupNorm -> Mish."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, n_groups: int):
        super().__init__(
            nn.Conv1d(in_channels, out_channels, kernel_size, padding=kernel_size // 2),
            nn.GroupNorm(n_groups, out_channels),
            nn.Mish(),
        )


class FiLMResidualBlock(nn.Module):
    """Two conv blocks; the condition scales and shifts the channels between them."""

    def __init__(self, in_channels: int, out_channels: int, cond_dim: int, kernel_size: int, n_groups: int):
        super().__init__()
        self.first = ConvNormAct(in_channels, out_channels, kernel_size, n_groups)
        self.second = ConvNormAct(out_channels, out_channels, kernel_size, n_groups)
        self.film = nn.Sequential(nn.Mish(), nn.Linear(cond_dim, 2 * out_channels))
        self.skip = nn.Conv1d(in_channels, out_channels, 1) if in_channels != out_channels else nn.Identity()

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        hidden = self.first(x)
        scale, bias = self.film(cond)[..., None].chunk(2, dim=1)
        hidden = self.second(hidden * (1 + scale) + bias)
        return hidden + self.skip(x)


class ConditionalUnet1D(nn.Module):
    """FiLM-conditioned 1-D U-Net over the time axis of an action chunk.

    Args:
        action_dim: channels of the denoised sequence.
        cond_dim: size of the global condition vector (0 for none).
        down_dims: channels per resolution level, e.g. ``[256, 512, 1024]`` (UMI) or ``[32, 64]``
            (laptops). The horizon must be divisible by ``2 ** (len(down_dims) - 1)``.
        kernel_size: temporal convolution kernel (5 in UMI).
        step_embed_dim: size of the diffusion-step embedding (128 in UMI).
        n_groups: GroupNorm groups (every entry of ``down_dims`` must be divisible by it).
        activation_checkpointing: recompute residual blocks in the backward pass to save memory.
    """

    def __init__(
        self,
        action_dim: int,
        cond_dim: int,
        down_dims: Sequence[int] = (256, 512, 1024),
        kernel_size: int = 5,
        step_embed_dim: int = 128,
        n_groups: int = 8,
        activation_checkpointing: bool = False,
    ):
        super().__init__()
        down_dims = list(down_dims)
        bad = [d for d in down_dims if d % n_groups]
        if bad:
            raise ValueError(f"U-Net down_dims {down_dims} must be divisible by n_groups={n_groups}")
        self.n_levels = len(down_dims)
        self.activation_checkpointing = activation_checkpointing
        self.step_embedding = step_embedding_mlp(step_embed_dim)
        film_dim = step_embed_dim + cond_dim

        def block(cin: int, cout: int) -> FiLMResidualBlock:
            return FiLMResidualBlock(cin, cout, film_dim, kernel_size, n_groups)

        channels = [action_dim, *down_dims]
        self.down = nn.ModuleList()
        for level, (cin, cout) in enumerate(zip(channels[:-1], channels[1:], strict=True)):
            is_last = level == self.n_levels - 1
            resample = nn.Conv1d(cout, cout, 3, stride=2, padding=1) if not is_last else nn.Identity()
            self.down.append(nn.ModuleList([block(cin, cout), block(cout, cout), resample]))
        self.mid = nn.ModuleList([block(down_dims[-1], down_dims[-1]), block(down_dims[-1], down_dims[-1])])
        self.up = nn.ModuleList()
        for cout, cin in reversed(list(zip(down_dims[:-1], down_dims[1:], strict=True))):
            upsample = nn.ConvTranspose1d(cout, cout, 4, stride=2, padding=1)
            self.up.append(nn.ModuleList([block(2 * cin, cout), block(cout, cout), upsample]))
        self.head = nn.Sequential(
            ConvNormAct(down_dims[0], down_dims[0], kernel_size, n_groups),
            nn.Conv1d(down_dims[0], action_dim, 1),
        )

    @property
    def horizon_multiple(self) -> int:
        """The horizon must be a multiple of this."""
        return 2 ** (self.n_levels - 1)

    def _run(self, module: nn.Module, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        if self.activation_checkpointing and self.training and torch.is_grad_enabled():
            return checkpoint(module, x, cond, use_reentrant=False)
        return module(x, cond)

    def forward(
        self, sample: torch.Tensor, step: torch.Tensor, global_cond: torch.Tensor | None = None
    ) -> torch.Tensor:
        """sample (B, horizon, action_dim), step (B,) or scalar, global_cond (B, cond_dim) -> (B, horizon, action_dim)."""
        if sample.shape[1] % self.horizon_multiple:
            raise ValueError(
                f"horizon {sample.shape[1]} is not a multiple of {self.horizon_multiple} "
                f"(required by {self.n_levels} U-Net levels)"
            )
        if step.ndim == 0:
            step = step.expand(sample.shape[0])
        cond = self.step_embedding(step.to(sample.device))
        if global_cond is not None:
            cond = torch.cat([cond, global_cond], dim=-1)
        x = sample.transpose(1, 2)
        skips = []
        for first, second, downsample in self.down:
            x = self._run(second, self._run(first, x, cond), cond)
            skips.append(x)
            x = downsample(x)
        for mid_block in self.mid:
            x = self._run(mid_block, x, cond)
        for first, second, upsample in self.up:
            x = torch.cat([x, skips.pop()], dim=1)
            x = upsample(self._run(second, self._run(first, x, cond), cond))
        return self.head(x).transpose(1, 2)
