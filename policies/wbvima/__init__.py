"""WB-VIMA-style whole-body policy: config, model and Lightning module."""

from .config import ChainPart, PointCloudInput, WBVIMAConfig, joylo_chain
from .model import WBVIMAConfigError, WBVIMAPolicy, build_attention_mask, validate_against_features

__all__ = [
    "ChainPart",
    "PointCloudInput",
    "WBVIMAConfig",
    "WBVIMAConfigError",
    "WBVIMAPolicy",
    "build_attention_mask",
    "joylo_chain",
    "validate_against_features",
]
