"""WB-VIMA-style whole-body visuomotor policy.

Per observed step the policy builds observation tokens (point cloud through a PointNet, proprioception
through an MLP, optional cameras through the shared timm encoder) and one learned readout token. A
small causal transformer mixes them: the observation tokens of one step share a position id and see
each other and all earlier steps; nothing attends to readout tokens, which only read. The last step's
readout embedding conditions a chain of 1-D conditional U-Net diffusion heads decoded along the
kinematic chain (mobile base, then torso given the base chunk, then arms given both): each head's
condition is the readout embedding concatenated with the flattened upstream action chunks (ground
truth in training, with an independent noise level per part; denoised ones at inference).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from diffusers import DDIMScheduler
from torch import nn

from ..base import PolicyNetworkBase
from ..encoders import ImageEncoder, LowDimEncoder, LowDimEncoderConfig, PointCloudEncoder, feature_to_dict
from ..normalize import Normalizer
from ..unet1d import ConditionalUnet1D
from ..waypoint_head import WaypointHead, waypoint_target
from .config import WBVIMAConfig


class WBVIMAConfigError(ValueError):
    """Raised when a WB-VIMA config does not fit the store it is trained on."""


def build_attention_mask(n_steps: int, n_obs_tokens: int) -> torch.Tensor:
    """Boolean (L, L) mask, True = may NOT attend, for ``n_steps`` groups of ``[obs..., readout]`` tokens.

    A query sees the observation tokens of its own and every earlier step; a readout token also sees
    itself; no token sees any other readout token, and nothing sees the future.
    """
    tokens_per_step = n_obs_tokens + 1
    length = n_steps * tokens_per_step
    step = torch.arange(length) // tokens_per_step
    is_readout = torch.arange(length) % tokens_per_step == n_obs_tokens
    allowed = (step[None, :] <= step[:, None]) & ~is_readout[None, :]
    allowed |= torch.eye(length, dtype=torch.bool) & is_readout[:, None]
    return ~allowed


def validate_against_features(config: WBVIMAConfig, features: Mapping[str, Any]) -> None:
    """Raise :class:`WBVIMAConfigError` when the chain, point cloud or keys do not fit the store."""
    specs = {key: feature_to_dict(spec) for key, spec in features.items()}
    for part in config.chain:
        missing = [key for key in part.keys if key not in specs]
        if missing:
            raise WBVIMAConfigError(
                f"chain part {part.name!r}: action keys {missing} are not in the store (keys: {sorted(specs)})"
            )
        size = sum(
            int(torch.tensor(specs[key]["shape"]).prod()) if specs[key]["shape"] else 1 for key in part.keys
        )
        if size != part.dim:
            raise WBVIMAConfigError(
                f"chain part {part.name!r}: dim {part.dim} but its keys {part.keys} hold {size} values"
            )
    total = sum(part.dim for part in config.chain)
    if config.action_key is not None:
        if config.action_key not in specs:
            raise WBVIMAConfigError(
                f"action_key {config.action_key!r} is not in the store (keys: {sorted(specs)})"
            )
        action_dim = int(torch.tensor(specs[config.action_key]["shape"]).prod())
        if total != action_dim:
            dims = {part.name: part.dim for part in config.chain}
            raise WBVIMAConfigError(
                f"chain dims {dims} add up to {total}, but the store's {config.action_key!r} has {action_dim} dims"
            )
    if config.proprio_key is not None and config.proprio_key not in specs:
        raise WBVIMAConfigError(
            f"proprio_key {config.proprio_key!r} is not in the store (keys: {sorted(specs)})"
        )
    cloud = config.point_cloud
    if cloud is not None:
        for name, key, width in (
            ("xyz_key", cloud.xyz_key, 3),
            ("rgb_key", cloud.rgb_key, 3),
            ("mask_key", cloud.mask_key, None),
        ):
            if key is None:
                continue
            if key not in specs:
                raise WBVIMAConfigError(
                    f"point_cloud.{name} {key!r} is not in the store (keys: {sorted(specs)})"
                )
            shape = list(specs[key]["shape"])
            expected_rank = 2 if width else 1
            if len(shape) != expected_rank or (width and shape[1] != width):
                want = "(N, 3)" if width else "(N,)"
                raise WBVIMAConfigError(
                    f"point cloud key {key!r} has per-frame shape {tuple(shape)}, expected {want}"
                )
            if cloud.n_points is not None and shape[0] != cloud.n_points:
                raise WBVIMAConfigError(
                    f"point cloud key {key!r} has {shape[0]} points per frame, config expects {cloud.n_points}"
                )
        if config.point_cloud_encoder.use_rgb and cloud.rgb_key is None:
            raise WBVIMAConfigError("point_cloud_encoder.use_rgb is true but point_cloud.rgb_key is null")
        if len(cloud.crop_min) != 3 or len(cloud.crop_max) != 3:
            raise WBVIMAConfigError("point_cloud.crop_min and crop_max must have 3 values each")
        if any(high <= low for low, high in zip(cloud.crop_min, cloud.crop_max, strict=True)):
            raise WBVIMAConfigError(
                f"point_cloud crop box is empty: min {cloud.crop_min}, max {cloud.crop_max}"
            )
    for key in config.image_keys:
        if key not in specs or specs[key]["kind"] != "image":
            raise WBVIMAConfigError(f"image key {key!r} is not an image feature of the store")
    if config.point_cloud is None and config.proprio_key is None and not config.image_keys:
        raise WBVIMAConfigError(
            "WB-VIMA needs at least one observation (point cloud, proprioception or images)"
        )
    multiple = 2 ** (len(config.down_dims) - 1)
    if config.horizon % multiple:
        raise WBVIMAConfigError(
            f"horizon {config.horizon} must be a multiple of {multiple} for down_dims {config.down_dims}"
        )


class WBVIMAPolicy(PolicyNetworkBase):
    """The whole-body policy: normalisation, observation tokens, transformer, chained diffusion heads.

    Args:
        config: the policy settings.
        features: the store's feature spec (kept in checkpoints).
        stats: key -> statistics (``EpisodeStore.stats``) for the proprioception and action keys
            (None when the weights, statistics included, come from a checkpoint).
    """

    def __init__(
        self,
        config: WBVIMAConfig,
        features: Mapping[str, Any],
        stats: Mapping[str, Mapping[str, Any]] | None = None,
    ):
        super().__init__()
        validate_against_features(config, features)
        self.config = config
        self.features = {key: feature_to_dict(spec) for key, spec in features.items()}
        embed = config.embed_dim

        norm_keys = list(config.action_keys) + ([config.proprio_key] if config.proprio_key else [])
        self.normalizer = Normalizer(
            {key: self.features[key]["shape"] or [1] for key in norm_keys},
            {key: "min_max" for key in norm_keys},
            {key: stats[key] for key in norm_keys if key in (stats or {})},
        )

        # Observation token encoders, in token order.
        self.token_keys: list[str] = []
        self.token_encoders = nn.ModuleDict()
        self.token_projections = nn.ModuleDict()
        if config.point_cloud is not None:
            encoder = PointCloudEncoder(config.point_cloud_encoder)
            self._add_token("point_cloud", encoder, encoder.feature_dim)
            self.register_buffer("crop_min", torch.tensor(config.point_cloud.crop_min, dtype=torch.float32))
            self.register_buffer("crop_max", torch.tensor(config.point_cloud.crop_max, dtype=torch.float32))
        if config.proprio_key is not None:
            size = int(torch.tensor(self.features[config.proprio_key]["shape"]).prod())
            encoder = LowDimEncoder(size, LowDimEncoderConfig(hidden_dims=list(config.proprio_hidden_dims)))
            self._add_token("proprio", encoder, encoder.feature_dim)
            outside = [d for d in config.hidden_proprio_dims if not 0 <= d < size]
            if outside:
                raise ValueError(
                    f"hidden_proprio_dims {outside} are outside the {size}-D {config.proprio_key!r}"
                )
            visible = torch.ones(size)
            visible[list(config.hidden_proprio_dims)] = 0.0
            # Derived from the config, so not part of the weights (older checkpoints load unchanged).
            self.register_buffer("proprio_visible", visible, persistent=False)
        for key in config.image_keys:
            encoder = ImageEncoder(self.features[key]["shape"], config.image)
            self._add_token(key, encoder, encoder.feature_dim)
        n_tokens = len(self.token_keys)
        self.n_obs_tokens = n_tokens

        self.readout = nn.Parameter(torch.randn(1, 1, embed) * 0.02)
        self.type_embedding = nn.Parameter(torch.randn(n_tokens + 1, embed) * 0.02)
        self.position_embedding = nn.Parameter(torch.randn(config.obs_window, embed) * 0.02)
        if config.multimodal_attention:
            layer = nn.TransformerEncoderLayer(
                embed,
                config.n_heads,
                4 * embed,
                config.dropout,
                activation="gelu",
                batch_first=True,
                norm_first=True,
            )
            self.transformer = nn.TransformerEncoder(layer, config.n_layers, enable_nested_tensor=False)
            self.register_buffer(
                "attention_mask", build_attention_mask(config.obs_window, n_tokens), persistent=False
            )
        else:
            self.fusion = nn.Sequential(
                nn.Linear(config.obs_window * n_tokens * embed, 2 * embed),
                nn.GELU(),
                nn.Linear(2 * embed, embed),
            )
        self.output_norm = nn.LayerNorm(embed)

        self.waypoint_head: WaypointHead | None = None
        waypoint_dim = 0
        if config.waypoint_head:
            waypoint_dim = self.waypoint_target_dim
            self.waypoint_head = WaypointHead(embed, waypoint_dim, config.waypoint_hidden_dims)

        # Head layout: one head per chain part, or one joint head.
        if config.autoregressive:
            self.head_parts = [(part.name, part.dim) for part in config.chain]
        else:
            self.head_parts = [("whole_body", sum(part.dim for part in config.chain))]
        self.heads = nn.ModuleList()
        upstream = 0
        for _, dim in self.head_parts:
            self.heads.append(
                ConditionalUnet1D(
                    dim,
                    embed + waypoint_dim + upstream * config.horizon,
                    down_dims=config.down_dims,
                    kernel_size=config.kernel_size,
                    step_embed_dim=config.step_embed_dim,
                    n_groups=config.n_groups,
                )
            )
            upstream += dim
        self.noise_scheduler = DDIMScheduler(
            num_train_timesteps=config.num_train_timesteps,
            beta_schedule=config.beta_schedule,
            prediction_type=config.prediction_type,
            clip_sample=True,
        )
        self.num_inference_steps = config.num_inference_steps

    def _add_token(self, name: str, encoder: nn.Module, feature_dim: int) -> None:
        self.token_keys.append(name)
        self.token_encoders[name] = encoder
        self.token_projections[name] = nn.Linear(feature_dim, self.config.embed_dim)

    # ---- shapes and keys -------------------------------------------------------------------------
    @property
    def obs_keys(self) -> list[str]:
        """Store keys the policy observes."""
        return self.config.obs_keys

    @property
    def obs_offsets(self) -> dict[str, list[int]]:
        return self.config.obs_offsets

    @property
    def action_dim(self) -> int:
        return sum(part.dim for part in self.config.chain)

    @property
    def waypoint_target_dim(self) -> int:
        proprio = 0
        if self.config.proprio_key is not None:
            proprio = int(torch.tensor(self.features[self.config.proprio_key]["shape"]).prod())
        return self.n_obs_tokens * self.config.embed_dim + proprio

    # ---- observation encoding ---------------------------------------------------------------------
    def _check_point_cloud(self, obs: Mapping[str, torch.Tensor]) -> None:
        cloud = self.config.point_cloud
        assert cloud is not None
        xyz = obs[cloud.xyz_key]
        if xyz.ndim != 4 or xyz.shape[-1] != 3:
            raise ValueError(f"point cloud {cloud.xyz_key!r} must be (B, T, N, 3), got {tuple(xyz.shape)}")
        if cloud.n_points is not None and xyz.shape[2] != cloud.n_points:
            raise ValueError(
                f"point cloud {cloud.xyz_key!r} has {xyz.shape[2]} points, config expects {cloud.n_points}"
            )
        for key, trailing in ((cloud.rgb_key, (3,)), (cloud.mask_key, ())):
            if key is not None and tuple(obs[key].shape) != tuple(xyz.shape[:3]) + trailing:
                raise ValueError(
                    f"point cloud {key!r} has shape {tuple(obs[key].shape)}, expected {tuple(xyz.shape[:3]) + trailing}"
                )

    def encode_tokens(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """key -> (B, T, ...) observations -> (B, T, n_obs_tokens, embed_dim) projected tokens."""
        tokens = []
        for name in self.token_keys:
            if name == "point_cloud":
                cloud = self.config.point_cloud
                assert cloud is not None
                self._check_point_cloud(obs)
                xyz = obs[cloud.xyz_key].float()
                xyz = (2.0 * (xyz - self.crop_min) / (self.crop_max - self.crop_min) - 1.0).clamp(-1.0, 1.0)
                rgb = obs[cloud.rgb_key] if cloud.rgb_key is not None else None
                mask = obs[cloud.mask_key] if cloud.mask_key is not None else None
                features = self.token_encoders[name](xyz, rgb, mask)
            elif name == "proprio":
                features = self.token_encoders[name](self.observed_proprio(obs))
            else:
                features = self.token_encoders[name](obs[name])
            tokens.append(self.token_projections[name](features))
        return torch.stack(tokens, dim=2)

    def observed_proprio(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The proprioception as the policy sees it: normalised, hidden entries zeroed, and with
        ``proprio_noise_std`` of noise while training."""
        key = self.config.proprio_key
        assert key is not None
        proprio = self.normalizer.normalize(key, obs[key].float())
        if self.training and self.config.proprio_noise_std > 0.0:
            proprio = proprio + self.config.proprio_noise_std * torch.randn_like(proprio)
        if self.config.hidden_proprio_dims:
            proprio = proprio * self.proprio_visible.view(*([1] * (proprio.dim() - 1)), -1)
        return proprio

    def readout_embedding(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Observation window -> (B, embed_dim): the last step's readout (or the fused tokens)."""
        tokens = self.encode_tokens(obs)  # (B, T, n, E)
        batch, steps = tokens.shape[:2]
        if steps != self.config.obs_window:
            raise ValueError(
                f"observation window has {steps} steps, the policy was built for {self.config.obs_window}"
            )
        if not self.config.multimodal_attention:
            return self.output_norm(self.fusion(tokens.flatten(1)))
        readout = self.readout.expand(batch, steps, 1, -1)
        sequence = torch.cat([tokens, readout], dim=2) + self.type_embedding[None, None]
        sequence = sequence + self.position_embedding[None, :, None]  # one position id per step
        mixed = self.transformer(sequence.flatten(1, 2), mask=self.attention_mask)
        mixed = mixed.view(batch, steps, self.n_obs_tokens + 1, -1)
        return self.output_norm(mixed[:, -1, -1])

    def encode_waypoint_frame(self, waypoint_obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """One-frame observations (B, 1, ...) -> (B, waypoint_target_dim): its tokens + normalised proprio."""
        parts = [self.encode_tokens(waypoint_obs).flatten(1)]
        if self.config.proprio_key is not None:
            key = self.config.proprio_key
            parts.append(self.normalizer.normalize(key, waypoint_obs[key].float()).flatten(1))
        return torch.cat(parts, dim=-1)

    def encode(self, obs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The slow part of the policy: readout embedding (+ predicted waypoint representation)."""
        readout = self.readout_embedding(obs)
        out = {"readout": readout}
        if self.waypoint_head is not None:
            out["waypoint"] = self.waypoint_head(readout)
        return out

    def _global_condition(self, condition: Mapping[str, torch.Tensor]) -> torch.Tensor:
        if self.waypoint_head is not None:
            return torch.cat([condition["readout"], condition["waypoint"]], dim=-1)
        return condition["readout"]

    # ---- actions ----------------------------------------------------------------------------------
    def normalize_action(self, action: torch.Tensor) -> torch.Tensor:
        """(B, H, action_dim) absolute actions in chain order -> normalised."""
        return self._map_action(action, self.normalizer.normalize)

    def unnormalize_action(self, action: torch.Tensor) -> torch.Tensor:
        return self._map_action(action, self.normalizer.unnormalize)

    def _map_action(self, action: torch.Tensor, fn: Any) -> torch.Tensor:
        if action.shape[-1] != self.action_dim:
            raise ValueError(f"action has {action.shape[-1]} dims, the chain has {self.action_dim}")
        out, start = [], 0
        for key in self.config.action_keys:
            shape = self.features[key]["shape"] or [1]
            size = int(torch.tensor(shape).prod())
            chunk = action[..., start : start + size]
            out.append(fn(key, chunk.reshape(*chunk.shape[:-1], *shape)).reshape(chunk.shape))
            start += size
        return torch.cat(out, dim=-1)

    def _split_parts(self, action: torch.Tensor) -> list[torch.Tensor]:
        return list(torch.split(action, [dim for _, dim in self.head_parts], dim=-1))

    def compute_losses(self, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """Training losses: ``loss`` (total), ``action_loss``, one ``loss_<part>`` per head, ``waypoint_loss``."""
        obs = batch["obs"]
        action = self.normalize_action(batch["action"].float())
        valid = (
            (~batch["action_is_pad"]).float()[..., None]
            if "action_is_pad" in batch
            else torch.ones_like(action[..., :1])
        )
        condition = self.encode(obs)
        global_cond = self._global_condition(condition)
        losses: dict[str, torch.Tensor] = {}
        upstream: list[torch.Tensor] = []
        total = 0.0
        for (name, _), head, target in zip(
            self.head_parts, self.heads, self._split_parts(action), strict=True
        ):
            noise = torch.randn_like(target)
            # An independent noise level per part: each head learns to denoise from any level while
            # its upstream chunks are the ground truth (teacher forcing).
            steps = torch.randint(
                0, self.noise_scheduler.config.num_train_timesteps, (target.shape[0],), device=target.device
            )
            noisy = self.noise_scheduler.add_noise(target, noise, steps)
            cond = torch.cat([global_cond, *[chunk.flatten(1) for chunk in upstream]], dim=-1)
            prediction = head(noisy, steps, cond)
            goal = noise if self.config.prediction_type == "epsilon" else target
            part_loss = ((prediction - goal) ** 2 * valid).sum() / (valid.sum() * target.shape[-1]).clamp(
                min=1.0
            )
            losses[f"loss_{name}"] = part_loss
            total = total + part_loss
            upstream.append(target)
        losses["action_loss"] = total / len(self.head_parts)
        losses["loss"] = losses["action_loss"]
        if self.waypoint_head is not None:
            target = waypoint_target(self.encode_waypoint_frame, batch)
            losses["waypoint_loss"] = WaypointHead.loss(condition["waypoint"], target)
            losses["loss"] = losses["loss"] + self.config.waypoint_loss_weight * losses["waypoint_loss"]
        return losses

    def _scheduler(self, num_inference_steps: int | None = None) -> DDIMScheduler:
        # A private copy per call: set_timesteps mutates the scheduler, and the executor may call
        # from another thread.
        scheduler = copy.deepcopy(self.noise_scheduler)
        scheduler.set_timesteps(num_inference_steps or self.num_inference_steps)
        return scheduler

    @torch.no_grad()
    def sample_actions(
        self,
        condition: Mapping[str, torch.Tensor],
        generator: torch.Generator | None = None,
        fixed_parts: Mapping[str, torch.Tensor] | None = None,
        num_inference_steps: int | None = None,
    ) -> torch.Tensor:
        """Denoise the chain part by part -> (B, H, action_dim) NORMALISED actions.

        ``fixed_parts`` (part name -> normalised chunk) replaces the denoised chunk of those parts, so
        that their effect on downstream heads can be inspected.
        """
        global_cond = self._global_condition(condition)
        batch = global_cond.shape[0]
        scheduler = self._scheduler(num_inference_steps)
        upstream: list[torch.Tensor] = []
        for (name, dim), head in zip(self.head_parts, self.heads, strict=True):
            if fixed_parts is not None and name in fixed_parts:
                upstream.append(fixed_parts[name].to(global_cond))
                continue
            cond = torch.cat([global_cond, *[chunk.flatten(1) for chunk in upstream]], dim=-1)
            sample = torch.randn(
                (batch, self.config.horizon, dim),
                generator=generator,
                device=global_cond.device,
                dtype=global_cond.dtype,
            )
            if self.config.noise_scale != 1.0:  # a lower sampling temperature (see the config)
                sample = sample * self.config.noise_scale
            for step in scheduler.timesteps:
                prediction = head(sample, step.to(global_cond.device), cond)
                sample = scheduler.step(prediction, step, sample, generator=generator).prev_sample
            upstream.append(sample)
        return torch.cat(upstream, dim=-1)

    @torch.no_grad()
    def act_from_condition(
        self,
        condition: Mapping[str, torch.Tensor],
        obs: Mapping[str, torch.Tensor] | None = None,
        num_inference_steps: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """The fast part: denoise actions for a condition from :meth:`encode` -> absolute units.

        ``obs`` is not needed (actions are absolute); it is accepted so that both policy families
        share one slow/fast interface (``encode``, ``act_from_condition``).
        """
        return self.unnormalize_action(
            self.sample_actions(condition, generator, num_inference_steps=num_inference_steps)
        )
