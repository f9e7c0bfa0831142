"""Exponential moving average of a model's weights, with the usual warm-up of the decay.

The averaged copy is a plain submodule, so it is saved in (and restored from) checkpoints with the
rest of the state. Evaluation and inference use it.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # a torch built without distributed support has no sharded tensors

    class DTensor:  # type: ignore[no-redef]
        pass


class EMA(nn.Module):
    """Holds ``averaged``, an EMA copy of a model.

    The decay at update ``n`` is ``min(max_decay, 1 - (1 + n / inv_gamma) ** -power)`` (zero for the
    first ``update_after`` updates), so short runs are not dominated by the random initialisation.

    Args:
        model: the model to average (deep-copied; the copy never requires gradients).
        max_decay: the decay approached after warm-up (0.9999 in Diffusion Policy / UMI).
        power: warm-up power (0.75 in Diffusion Policy).
        inv_gamma: warm-up scale.
        update_after: updates before averaging starts (the copy tracks the model exactly until then).
    """

    def __init__(
        self,
        model: nn.Module,
        max_decay: float = 0.9999,
        power: float = 0.75,
        inv_gamma: float = 1.0,
        update_after: int = 0,
    ):
        super().__init__()
        self.averaged = copy.deepcopy(model)
        self.averaged.requires_grad_(False)
        self.averaged.eval()
        self.max_decay = max_decay
        self.power = power
        self.inv_gamma = inv_gamma
        self.update_after = update_after
        self.register_buffer("n_updates", torch.zeros((), dtype=torch.long))

    def decay(self, n_updates: int) -> float:
        step = max(0, n_updates - self.update_after - 1)
        if step <= 0:
            return 0.0
        value = 1.0 - (1.0 + step / self.inv_gamma) ** -self.power
        return float(min(self.max_decay, max(0.0, value)))

    def train(self, mode: bool = True) -> EMA:
        # The averaged copy always stays in eval mode (no augmentation, no dropout).
        super().train(mode)
        self.averaged.eval()
        return self

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        self.n_updates += 1
        decay = self.decay(int(self.n_updates))
        ema_params = [_local(p) for p in self.averaged.parameters()]
        model_params = [_local(p.detach()) for p in model.parameters()]
        if decay == 0.0:
            torch._foreach_copy_(ema_params, model_params)
        else:
            torch._foreach_lerp_(ema_params, model_params, 1.0 - decay)
        # Buffers (normalisation statistics, norm running stats) are copied, not averaged.
        for ema_buffer, buffer in zip(self.averaged.buffers(), model.buffers(), strict=True):
            _local(ema_buffer).copy_(_local(buffer))


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a tensor sharded by FSDP2 (a DTensor), else the tensor: the model and
    its average are sharded alike, so averaging shard by shard is averaging the whole."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor
