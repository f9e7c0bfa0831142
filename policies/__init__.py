"""Policies: observation encoders, the policy families, the Lightning layer, training and inference.

Public entry points: :func:`train` (what ``demoscale train fit`` runs), :func:`load_policy`
(checkpoint -> :class:`Policy` with ``predict_action``), :func:`load_ensemble` (several diffusion
checkpoints -> one :class:`Policy` denoising with all of them), the family contract and registry
(:class:`PolicyNetwork`, :class:`PolicyConfig`, :class:`PolicyFamily`, :func:`register_family`,
:func:`get_family`), the reusable building blocks
(:mod:`~demoscale.policies.encoders`, :mod:`~demoscale.policies.normalize`,
:mod:`~demoscale.policies.unet1d`, :mod:`~demoscale.policies.rotation`) and the Lightning modules.
Heavy imports (torch, Lightning) happen on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "train",
    "TrainResult",
    "load_policy",
    "load_ensemble",
    "load_checkpoint",
    "CheckpointError",
    "Policy",
    "TemporalEnsembler",
    "DiffusionConfig",
    "DiffusionPolicy",
    "PolicyModule",
    "DiffusionPolicyModule",
    "PolicyDataModule",
    "PolicyConfig",
    "PolicyNetwork",
    "PolicyFamily",
    "register_family",
    "get_family",
]

_LAZY = {
    "train": "demoscale.policies.training",
    "TrainResult": "demoscale.policies.training",
    "load_policy": "demoscale.policies.inference",
    "load_ensemble": "demoscale.policies.ensemble",
    "load_checkpoint": "demoscale.policies.checkpoints",
    "CheckpointError": "demoscale.policies.checkpoints",
    "Policy": "demoscale.policies.inference",
    "TemporalEnsembler": "demoscale.policies.inference",
    "DiffusionConfig": "demoscale.policies.diffusion.config",
    "DiffusionPolicy": "demoscale.policies.diffusion.model",
    "PolicyModule": "demoscale.policies.lightning_module",
    "DiffusionPolicyModule": "demoscale.policies.diffusion.lightning",
    "PolicyDataModule": "demoscale.policies.data",
    "PolicyConfig": "demoscale.policies.base",
    "PolicyNetwork": "demoscale.policies.base",
    "PolicyFamily": "demoscale.policies.families",
    "register_family": "demoscale.policies.families",
    "get_family": "demoscale.policies.families",
}

if TYPE_CHECKING:
    from demoscale.policies.base import PolicyConfig, PolicyNetwork
    from demoscale.policies.checkpoints import CheckpointError, load_checkpoint
    from demoscale.policies.data import PolicyDataModule
    from demoscale.policies.diffusion.config import DiffusionConfig
    from demoscale.policies.diffusion.lightning import DiffusionPolicyModule
    from demoscale.policies.diffusion.model import DiffusionPolicy
    from demoscale.policies.ensemble import load_ensemble
    from demoscale.policies.families import PolicyFamily, get_family, register_family
    from demoscale.policies.inference import Policy, TemporalEnsembler, load_policy
    from demoscale.policies.lightning_module import PolicyModule
    from demoscale.policies.training import TrainResult, train


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'demoscale.policies' has no attribute {name!r}")
