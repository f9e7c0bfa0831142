"""Per-key affine normalisation whose statistics live in buffers inside the model.

A checkpoint therefore carries its own statistics, and a policy loaded from it needs no store.
Statistics are the dictionaries returned by ``EpisodeStore.stats(key)`` (``min``, ``max``, ``mean``,
``std``, ...). A key whose statistics were never set raises :class:`MissingStatisticsError` instead of
passing data through unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
import torch
from torch import nn

NormMode = Literal["min_max", "mean_std", "identity"]
NORM_MODES: tuple[str, ...] = ("min_max", "mean_std", "identity")
# Below this range (or standard deviation) a dimension is treated as constant.
_DEGENERATE = 1e-6


class MissingStatisticsError(RuntimeError):
    """Raised when data is normalised with statistics that were never provided."""


class _AffineStats(nn.Module):
    """y = x * scale + offset, with NaN buffers until statistics are set."""

    def __init__(self, shape: Sequence[int], mode: str):
        super().__init__()
        self.mode = mode
        self.register_buffer("scale", torch.full(tuple(shape), float("nan")))
        self.register_buffer("offset", torch.full(tuple(shape), float("nan")))
        self._verified = False

    def _load_from_state_dict(self, *args: object, **kwargs: object) -> None:  # torch's signature
        self._verified = False
        super()._load_from_state_dict(*args, **kwargs)


class Normalizer(nn.Module):
    """Normalise and unnormalise named tensors (trailing dimensions = the feature shape).

    Args:
        shapes: key -> per-frame shape of the feature (the trailing dimensions of the tensors).
        modes: key -> ``"min_max"`` (to [-1, 1]), ``"mean_std"`` (zero mean, unit variance) or
            ``"identity"`` (explicitly unnormalised, e.g. 6-D rotations already in [-1, 1]).
        stats: optional key -> statistics dict to set right away (see :meth:`set_stats`).
    """

    def __init__(
        self,
        shapes: Mapping[str, Sequence[int]],
        modes: Mapping[str, str],
        stats: Mapping[str, Mapping[str, np.ndarray]] | None = None,
    ):
        super().__init__()
        self._key_to_slot: dict[str, str] = {}
        self.slots = nn.ModuleDict()
        for index, (key, shape) in enumerate(shapes.items()):
            mode = modes[key]
            if mode not in NORM_MODES:
                raise ValueError(f"normalisation mode {mode!r} for key {key!r} is not one of {NORM_MODES}")
            slot = f"k{index}"  # ModuleDict names may not contain dots; keys might.
            self._key_to_slot[key] = slot
            self.slots[slot] = _AffineStats(shape, mode)
            if mode == "identity":
                self.slots[slot].scale.fill_(1.0)
                self.slots[slot].offset.fill_(0.0)
        for key, key_stats in (stats or {}).items():
            self.set_stats(key, key_stats)

    @property
    def keys(self) -> list[str]:
        return list(self._key_to_slot)

    def _slot(self, key: str) -> _AffineStats:
        if key not in self._key_to_slot:
            raise MissingStatisticsError(
                f"no normalisation registered for key {key!r} (registered: {sorted(self._key_to_slot)})"
            )
        slot = self.slots[self._key_to_slot[key]]
        if not slot._verified:
            if torch.isnan(slot.scale).any() or torch.isnan(slot.offset).any():
                raise MissingStatisticsError(
                    f"normalisation statistics for key {key!r} were never set; compute them with "
                    f"EpisodeStore.stats({key!r}) and pass them to the policy"
                )
            slot._verified = True
        return slot

    def set_stats(self, key: str, stats: Mapping[str, np.ndarray]) -> None:
        """Set the statistics of ``key`` from a dict with ``min``/``max`` or ``mean``/``std``."""
        slot = self.slots[self._key_to_slot[key]]
        if slot.mode == "identity":
            return
        needed = ("min", "max") if slot.mode == "min_max" else ("mean", "std")
        missing = [name for name in needed if name not in stats or stats[name] is None]
        if missing:
            raise MissingStatisticsError(f"statistics for key {key!r} lack {missing} (mode {slot.mode!r})")
        first, second = (torch.as_tensor(np.asarray(stats[name]), dtype=torch.float32) for name in needed)
        first = first.expand_as(slot.scale).clone()
        second = second.expand_as(slot.scale).clone()
        if slot.mode == "min_max":
            span = second - first
            constant = span < _DEGENERATE
            scale = torch.where(constant, torch.ones_like(span), 2.0 / torch.where(constant, 1.0, span))
            offset = torch.where(constant, -(first + second) / 2.0, -1.0 - first * scale)
        else:
            std = torch.where(second < _DEGENERATE, torch.ones_like(second), second)
            scale = 1.0 / std
            offset = -first / std
        if not (torch.isfinite(scale).all() and torch.isfinite(offset).all()):
            raise MissingStatisticsError(f"statistics for key {key!r} are not finite: {dict(stats)}")
        slot.scale.copy_(scale)
        slot.offset.copy_(offset)
        slot._verified = False

    def normalize(self, key: str, value: torch.Tensor) -> torch.Tensor:
        slot = self._slot(key)
        return value * slot.scale + slot.offset

    def unnormalize(self, key: str, value: torch.Tensor) -> torch.Tensor:
        slot = self._slot(key)
        return (value - slot.offset) / slot.scale
