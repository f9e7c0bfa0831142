"""A thin Lightning layer over the policy networks.

:class:`PolicyModule` holds what every policy family shares: building the family's network (looked up
in :mod:`demoscale.policies.families`) from the DataModule's store (feature spec + normalisation
statistics) in ``setup``, the training and validation steps (every part of ``compute_losses`` logged
once, as ``train/<part>`` / ``val/<part>``), AdamW with an encoder learning-rate multiplier and a
warm-up + cosine schedule, an EMA of the weights (used for validation and inference), per-step random
seeds (so a resumed run draws the same noise), optional ``torch.compile`` and FSDP2 sharding, and
checkpoint metadata that lets :func:`demoscale.policies.load_policy` rebuild the policy without a
store.

A family subclasses it next to its network (``policies/diffusion/lightning.py``,
``policies/wbvima/lightning.py``): it sets ``family`` to its registry name and declares
``__init__(self, policy: Config | None = None, **kwargs)``; the contract is in
:mod:`demoscale.policies.base`.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import lightning as L
import numpy as np
import torch
from demoscale.policies.base import LOSS
from demoscale.policies.config_utils import to_plain
from demoscale.policies.ema import EMA
from demoscale.policies.encoders import feature_to_dict
from demoscale.policies.families import PolicyFamily, get_family
from torch import nn

CHECKPOINT_KEY = "demoscale"
CHECKPOINT_FORMAT = 1
# FSDP2 plan: a child network with more parameters than this is its own FSDP unit (its all-gather
# overlaps the previous unit's compute); smaller children travel with the root's unit.
FSDP_CHILD_MIN_PARAMS = 1_000_000


@dataclass
class OptimizerConfig:
    """AdamW + linear warm-up + cosine decay (per optimizer step).

    Attributes:
        lr: peak learning rate of the denoiser / heads.
        encoder_lr_multiplier: the image backbones train at ``lr * encoder_lr_multiplier`` (0.1 in
            UMI for a fine-tuned ViT).
        weight_decay, betas, eps: AdamW settings.
        warmup_steps: linear warm-up length in optimizer steps.
        schedule: ``cosine`` (to ``min_lr_ratio * lr`` at the last step, or at ``decay_steps``) or
            ``constant``.
        min_lr_ratio: final learning rate as a fraction of the peak.
        decay_steps: the cosine's length in optimizer steps, warm-up included (default: the whole
            training). Training may stop before it, to evaluate the early checkpoints of a long
            schedule without paying for its end.
    """

    lr: float = 3e-4
    encoder_lr_multiplier: float = 0.1
    weight_decay: float = 1e-6
    betas: tuple[float, float] = (0.95, 0.999)
    eps: float = 1e-8
    warmup_steps: int = 500
    schedule: str = "cosine"
    min_lr_ratio: float = 0.0
    decay_steps: int | None = None


def learning_rate_factor(step: int, config: OptimizerConfig, total_steps: int) -> float:
    """The peak learning rate's multiplier at optimizer ``step`` of a ``total_steps`` training:
    linear warm-up, then constant or a cosine to ``min_lr_ratio`` over ``decay_steps`` (default
    ``total_steps``), held there after."""
    if config.schedule not in ("cosine", "constant"):
        raise ValueError(f"optimizer.schedule must be 'cosine' or 'constant', got {config.schedule!r}")
    if config.decay_steps is not None and config.decay_steps <= config.warmup_steps:
        raise ValueError(
            f"optimizer.decay_steps ({config.decay_steps}) must exceed warmup_steps ({config.warmup_steps})"
        )
    warmup = config.warmup_steps
    if step < warmup:
        return (step + 1) / warmup
    if config.schedule == "constant":
        return 1.0
    total = config.decay_steps or total_steps
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return config.min_lr_ratio + (1.0 - config.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass
class EMAConfig:
    """EMA of the weights; ``enabled=False`` evaluates the raw weights."""

    enabled: bool = True
    max_decay: float = 0.9999
    power: float = 0.75
    update_after: int = 0


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def compile_network(network: nn.Module, mode: str | None = None, backend: str | None = None) -> list[str]:
    """``torch.compile`` (in place) every direct child module of a policy network; returns their names.

    The network itself is not what training calls: the module calls ``compute_losses`` (and
    inference ``encode`` / ``act_from_condition``), which ``Module.compile`` of the network would
    never reach, as it wraps ``__call__`` only. The children (observation encoders, the denoiser,
    heads) are called through ``__call__``, so compiling each of them compiles the work, with the
    contract's methods around them left as they are. ``backend`` (default inductor) is for tests
    (``eager``: dynamo's tracing without code generation).
    """
    if mode is not None and mode not in COMPILE_MODES:
        raise ValueError(f"compile mode must be one of {', '.join(COMPILE_MODES)}, got {mode!r}")
    compiled = []
    for name, child in network.named_children():
        if any(True for _ in child.parameters()):  # parameter-free helpers (normalisers) stay eager
            child.compile(mode=mode) if backend is None else child.compile(backend=backend)
            compiled.append(name)
    return compiled


class PolicyModule(L.LightningModule):
    """Shared training logic of every policy family (see the module docstring).

    Args:
        policy: the family's config (None: the config class's defaults).
        optimizer: optimizer and learning-rate schedule.
        ema: EMA settings.
        compile: ``torch.compile`` the network's parts (:func:`compile_network`; in place, state-dict
            keys are unchanged): ``true`` in torch's default mode, or a mode by name
            (``reduce-overhead`` adds CUDA graphs, ``max-autotune`` also tunes kernels).
        seed: base of the per-step seeds (noise, diffusion steps, augmentation).
        global_batch_size: samples per optimizer step over all devices; the CLI derives gradient
            accumulation from it and the DataModule's micro-batch size. ``None`` = one micro-batch.
    """

    family: str = ""  # the registry name (demoscale.policies.families)

    def __init__(
        self,
        policy: Any = None,
        optimizer: OptimizerConfig | None = None,
        ema: EMAConfig | None = None,
        compile: bool | str = False,
        seed: int = 0,
        global_batch_size: int | None = None,
    ):
        super().__init__()
        self.policy_config = policy if policy is not None else self.family_spec().config_class()()
        validate = getattr(self.policy_config, "validate", None)
        if callable(validate):
            validate()
        self.optimizer_config = optimizer or OptimizerConfig()
        self.ema_config = ema or EMAConfig()
        self.compile_policy = compile
        self.seed = seed
        self.global_batch_size = global_batch_size
        self.policy: nn.Module | None = None
        self.ema: EMA | None = None
        self.features: dict[str, dict[str, Any]] | None = None
        self.stats: dict[str, dict[str, np.ndarray]] | None = None
        self._sharded = False

    @classmethod
    def family_spec(cls) -> PolicyFamily:
        """This module's entry in the family registry."""
        if not cls.family:
            raise TypeError(f"{cls.__name__} sets no `family`: a policy module names its registered family")
        return get_family(cls.family)

    # -- what a family may override ----------------------------------------------------------------
    def build_policy(self, features: Mapping[str, Any], stats: Mapping[str, Any] | None) -> nn.Module:
        """The family's network (the registry's builder) for this module's config."""
        return self.family_spec().build_network(self.policy_config, features, stats)

    def policy_statistics(
        self, store: Any, episodes: Sequence[int] | None
    ) -> dict[str, dict[str, np.ndarray]]:
        """Normaliser statistics from the store: ``store.stats(key)`` of every low-dim key the policy
        observes or predicts. Families with derived quantities (relative actions) override this."""
        config = self.policy_config
        keys = dict.fromkeys([*config.obs_offsets, *config.action_keys])
        return {
            key: {name: np.asarray(value, dtype=np.float32) for name, value in store.stats(key).items()}
            for key in keys
            if feature_to_dict(store.features[key])["kind"] == "low_dim"
        }

    def check_features(self, features: Mapping[str, Any]) -> None:
        """Raise before training when the store lacks what the config names."""
        config = self.policy_config
        missing = [key for key in [*config.obs_offsets, *config.action_keys] if key not in features]
        if missing:
            raise KeyError(
                f"the store lacks keys named by the {self.family} policy config: {missing} "
                f"(store features: {sorted(features)})"
            )

    def policy_config_dict(self) -> dict[str, Any]:
        """The config as a plain dict (what checkpoints carry)."""
        return to_plain(self.policy_config)

    def data_window(self) -> dict[str, Any] | None:
        """``{"obs_offsets", "action_keys", "horizon"}`` (+ ``waypoint_keys`` and ``target_keys``
        when the config names some) the DataModule should serve."""
        config = self.policy_config
        window: dict[str, Any] = {
            "obs_offsets": {key: list(offsets) for key, offsets in config.obs_offsets.items()},
            "action_keys": list(config.action_keys),
            "horizon": int(config.horizon),
        }
        waypoint_keys = list(getattr(config, "waypoint_keys", None) or [])
        if waypoint_keys:
            window["waypoint_keys"] = waypoint_keys
        target_keys = list(getattr(config, "target_keys", None) or [])
        if target_keys:
            window["target_keys"] = target_keys
        return window

    # -- building ----------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        if self.policy is not None:
            return
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if datamodule is None:
            raise RuntimeError(f"{type(self).__name__} needs a DataModule with a store to build its network")
        if hasattr(datamodule, "setup") and getattr(datamodule, "store", None) is None:
            datamodule.setup(stage)
        store = datamodule.store
        features = {key: feature_to_dict(spec) for key, spec in store.features.items()}
        self.check_features(features)
        episodes = getattr(datamodule, "train_episodes", None)
        window = self.data_window()
        if window is not None and episodes is not None:
            lengths = np.asarray(store.episode_ends)[episodes] - np.asarray(store.episode_starts)[episodes]
            if window["horizon"] > int(lengths.max()):
                raise ValueError(
                    f"horizon {window['horizon']} is longer than every training episode of "
                    f"{getattr(datamodule, 'store_location', 'the store')} (longest: {int(lengths.max())} frames)"
                )
        self.build(features, self.policy_statistics(store, episodes))

    def build(self, features: Mapping[str, Any], stats: Mapping[str, Any] | None) -> None:
        """Create the network (and its EMA copy) from a feature spec and statistics."""
        self.features = {key: feature_to_dict(spec) for key, spec in features.items()}
        self.stats = (
            {
                key: {name: np.asarray(v, dtype=np.float32) for name, v in s.items()}
                for key, s in stats.items()
            }
            if stats is not None
            else None
        )
        self.policy = self.build_policy(self.features, self.stats)
        if self.ema_config.enabled:
            self.ema = EMA(
                self.policy,
                max_decay=self.ema_config.max_decay,
                power=self.ema_config.power,
                update_after=self.ema_config.update_after,
            )
        if self.compile_policy:
            mode = self.compile_policy if isinstance(self.compile_policy, str) else None
            compile_network(self.policy, mode)

    def configure_model(self) -> None:
        """FSDP2: shard the network when the strategy provides a device mesh (ModelParallelStrategy)."""
        if self.policy is None or self._sharded or self._trainer is None:
            return
        mesh = getattr(self, "device_mesh", None)
        if mesh is None:
            return
        from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

        # ModelParallelStrategy's mesh is 2-D (data_parallel x tensor_parallel). Sharding over the
        # whole mesh is HSDP: replicated across data_parallel and sharded across tensor_parallel,
        # which is size 1 without tensor parallelism, so nothing would be sharded at all. FSDP
        # shards over the data-parallel dimension.
        if mesh.mesh_dim_names and "data_parallel" in mesh.mesh_dim_names:
            mesh = mesh["data_parallel"]

        def shard(network: nn.Module) -> None:
            # Each large child first (so their all-gathers overlap), then the root.
            for child in network.children():
                if sum(p.numel() for p in child.parameters()) > FSDP_CHILD_MIN_PARAMS:
                    fully_shard(child, mesh=mesh)
            fully_shard(network, mesh=mesh)
            # FSDP gathers the root's parameters around forward() only; the contract's entry points
            # are these methods.
            for method in ("compute_losses", "encode", "act_from_condition"):
                register_fsdp_forward_method(network, method)

        # The EMA copy (a deep copy made before sharding: a sharded module cannot be deep-copied) is
        # sharded by the same plan, so each rank averages its own shards in place.
        shard(self.policy)
        if self.ema is not None:
            shard(self.ema.averaged)
        self._sharded = True

    @property
    def inference_policy(self) -> nn.Module:
        """The weights used for evaluation: the EMA copy when enabled."""
        if self.policy is None:
            raise RuntimeError("the policy network has not been built yet")
        return self.ema.averaged if self.ema is not None else self.policy

    # -- per-step randomness -----------------------------------------------------------------------
    def _step_seed(self, batch_idx: int, stage: str) -> int:
        rank = self.global_rank if self._trainer is not None else 0
        epoch = self.current_epoch if self._trainer is not None else 0
        stage_id = {"train": 0, "val": 1}[stage]
        return int(np.random.SeedSequence([self.seed, stage_id, epoch, batch_idx, rank]).generate_state(1)[0])

    @contextlib.contextmanager
    def _seeded(self, batch_idx: int, stage: str) -> Iterator[None]:
        # Noise, diffusion steps and augmentation are a function of (seed, epoch, batch, rank), so a
        # resumed run draws exactly what an uninterrupted one would.
        devices = [self.device.index or 0] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self._step_seed(batch_idx, stage))
            yield

    # -- loops -------------------------------------------------------------------------------------
    def training_step(self, batch: Mapping[str, Any], batch_idx: int) -> torch.Tensor:
        with self._seeded(batch_idx, "train"):
            losses = self.policy.compute_losses(batch)
        return self._log_losses(losses, "train", batch)

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        super().optimizer_step(*args, **kwargs)
        # Right after the weights change (once per optimizer step, also under gradient accumulation)
        # and before any callback can save a checkpoint of this step.
        if self.ema is not None:
            self.ema.update(self.policy)

    def validation_step(self, batch: Mapping[str, Any], batch_idx: int) -> torch.Tensor:
        with self._seeded(batch_idx, "val"):
            losses = self.inference_policy.compute_losses(batch)
        return self._log_losses(losses, "val", batch)

    def _log_losses(
        self, losses: Mapping[str, torch.Tensor], stage: str, batch: Mapping[str, Any]
    ) -> torch.Tensor:
        """Log ``<stage>/loss`` (on the progress bar) and every other part once; return the total."""
        if LOSS not in losses:
            raise KeyError(
                f"{type(self.policy).__name__}.compute_losses returned {sorted(losses)}, without the total "
                f"{LOSS!r} to minimise"
            )
        size, sync = _batch_size(batch), stage == "val"
        self.log(f"{stage}/{LOSS}", losses[LOSS], prog_bar=True, sync_dist=sync, batch_size=size)
        for name, value in losses.items():
            if name != LOSS:
                self.log(f"{stage}/{name}", value, sync_dist=sync, batch_size=size)
        return losses[LOSS]

    def configure_optimizers(self) -> dict[str, Any]:
        config = self.optimizer_config
        encoder_params = {id(p) for p in self.encoder_parameters()}
        groups = [
            {"params": [p for p in self.policy.parameters() if id(p) not in encoder_params], "lr": config.lr},
        ]
        if encoder_params:
            groups.append(
                {
                    "params": [p for p in self.policy.parameters() if id(p) in encoder_params],
                    "lr": config.lr * config.encoder_lr_multiplier,
                }
            )
        optimizer = torch.optim.AdamW(
            groups, lr=config.lr, betas=tuple(config.betas), eps=config.eps, weight_decay=config.weight_decay
        )
        total = max(1, int(self.trainer.estimated_stepping_batches))
        # LambdaLR evaluates step 0 on construction: a bad schedule fails here, before training.
        lr_factor = functools.partial(learning_rate_factor, config=config, total_steps=total)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def encoder_parameters(self) -> list[nn.Parameter]:
        encoder = getattr(self.policy, "obs_encoder", None)
        return (
            encoder.image_parameters() if encoder is not None and hasattr(encoder, "image_parameters") else []
        )

    # -- checkpoints -------------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[CHECKPOINT_KEY] = {
            "format": CHECKPOINT_FORMAT,
            "family": self.family,
            "module_class": f"{type(self).__module__}.{type(self).__qualname__}",
            "policy_config": self.policy_config_dict(),
            "features": self.features,
            "stats": {
                k: {n: np.asarray(v).tolist() for n, v in s.items()} for k, s in (self.stats or {}).items()
            },
            "ema": self.ema is not None,
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        meta = checkpoint.get(CHECKPOINT_KEY)
        if meta is None:
            raise ValueError("not a demoscale policy checkpoint (no 'demoscale' metadata)")
        if meta["family"] != self.family:
            raise ValueError(
                f"checkpoint holds a {meta['family']!r} policy, but this is a {self.family!r} module"
            )
        if self.policy is None:  # load_from_checkpoint: no DataModule, build from the checkpoint
            self.build(meta["features"], meta["stats"])


def _batch_size(batch: Mapping[str, Any]) -> int:
    return int(batch["action"].shape[0])


def __getattr__(name: str) -> Any:
    # The diffusion family's module lived here; run configs saved with that class path still resolve.
    if name == "DiffusionPolicyModule":
        from demoscale.policies.diffusion.lightning import DiffusionPolicyModule

        return DiffusionPolicyModule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
