"""The diffusion policy network: observation encoder + FiLM U-Net denoiser + diffusers scheduler.

:class:`DiffusionPolicy` is a plain ``nn.Module`` (no Lightning) implementing the policy contract
(:mod:`demoscale.policies.base`): ``compute_losses(batch)`` for training, ``encode(obs)`` and
``act_from_condition(...)`` (or both at once, ``predict_action(obs)``) for inference, on batches in
the sample format of ``demoscale.datasets``. Normalisation statistics live in buffers inside it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from demoscale.policies import actions as action_repr
from demoscale.policies.base import PolicyNetworkBase
from demoscale.policies.diffusion.config import DiffusionConfig
from demoscale.policies.encoders import ObservationEncoder, feature_to_dict
from demoscale.policies.mlp_denoiser import ConditionalMLP
from demoscale.policies.normalize import Normalizer
from demoscale.policies.unet1d import ConditionalUnet1D
from demoscale.policies.waypoint_head import mlp_head
from torch import nn

ACTION = "action"  # the normaliser key of the (concatenated, possibly relative) action vector


def make_scheduler(config: DiffusionConfig) -> Any:  # a diffusers scheduler
    """The diffusers noise scheduler named by the config."""
    from diffusers import DDIMScheduler, DDPMScheduler

    cls = DDIMScheduler if config.noise_scheduler == "ddim" else DDPMScheduler
    return cls(
        num_train_timesteps=config.num_train_timesteps,
        beta_schedule=config.beta_schedule,
        prediction_type=config.prediction_type,
        clip_sample=config.clip_sample,
    )


def default_pose_keys(n_robots: int) -> list[list[str]]:
    return [[f"robot{i}_eef_pos", f"robot{i}_eef_rot_axis_angle"] for i in range(n_robots)]


class DiffusionPolicy(PolicyNetworkBase):
    """Diffusion policy over action chunks.

    Args:
        config: network and representation settings (validated here).
        features: the store's feature spec (key -> FeatureSpec or dict); checked against the config.
        stats: normaliser key -> statistics dict (see :func:`policy_statistics`); may be omitted when
            a state dict (a checkpoint) will be loaded right after, but then every forward raises
            until statistics are present.
    """

    def __init__(
        self,
        config: DiffusionConfig,
        features: Mapping[str, Any],
        stats: Mapping[str, Mapping[str, np.ndarray]] | None = None,
    ):
        super().__init__()
        config.validate()
        self.config = config
        self.features = {key: feature_to_dict(spec) for key, spec in features.items()}
        check_keys(config, self.features)
        self.action_dim = sum(_size(self.features[key]["shape"]) for key in config.action_keys)
        self.relative = config.action_representation == "relative"
        self.pose_keys: list[list[str]] = []
        low_dim_shapes: dict[str, int] = {}
        if self.relative:
            n_robots = action_repr.n_robots_from_action_dim(self.action_dim)
            self.pose_keys = [list(pair) for pair in (config.pose_keys or default_pose_keys(n_robots))]
            if len(self.pose_keys) != n_robots:
                raise ValueError(f"{len(self.pose_keys)} pose_keys given for {n_robots} robots in the action")
            for pos_key, rot_key in self.pose_keys:
                for key in (pos_key, rot_key):
                    if key not in config.obs_offsets:
                        raise KeyError(
                            f"relative actions need the end-effector pose key {key!r} in obs_offsets "
                            f"(observed: {sorted(config.obs_offsets)})"
                        )
                if config.relative_obs:
                    low_dim_shapes[pos_key], low_dim_shapes[rot_key] = 3, 6
        self.model_action_dim = (
            action_repr.n_robots_from_action_dim(self.action_dim) * action_repr.RELATIVE_DIM_PER_ROBOT
            if self.relative
            else self.action_dim
        )
        self.obs_keys = list(config.obs_offsets)
        self.low_dim_keys = [key for key in self.obs_keys if self.features[key]["kind"] == "low_dim"]
        # key -> (entries seen as they are, angle entries seen as cos and sin)
        self.low_dim_views: dict[str, tuple[list[int], list[int]]] = {}
        for key in {*config.obs_indices, *config.angle_obs}:
            size = _size(self.features[key]["shape"])
            indices = [*config.obs_indices.get(key, []), *config.angle_obs.get(key, [])]
            if self.features[key]["kind"] != "low_dim" or max(indices) >= size:
                raise ValueError(f"obs_indices/angle_obs of {key!r} do not index the low-dim feature {key!r}")
            layout = low_dim_view_layout(config, key, size)
            low_dim_shapes[key] = len(layout)
            self.low_dim_views[key] = (
                [i for i, kind in layout if kind == "value"],
                [i for i, kind in layout if kind == "cos"],
            )
        shapes: dict[str, list[int]] = {
            key: [low_dim_shapes.get(key, _size(self.features[key]["shape"]))] for key in self.low_dim_keys
        }
        modes = {key: config.obs_norm_mode for key in self.low_dim_keys}
        shapes[ACTION] = [self.model_action_dim]
        modes[ACTION] = config.action_norm_mode
        # Auxiliary targets (training only), normalised like observations in slots of their own,
        # after every other slot so that checkpoints without them keep their layout.
        self.state_target_dims: dict[str, int] = {}
        target_shapes: dict[str, list[int]] = {}
        for key, indices in config.state_targets.items():
            if self.features[key]["kind"] != "low_dim" or max(indices) >= _size(self.features[key]["shape"]):
                raise ValueError(
                    f"state_targets[{key!r}] = {indices} does not index the low-dim feature {key!r}"
                )
            reference = config.state_target_reference
            if reference is not None and (
                self.features[reference]["kind"] != "low_dim"
                or len(indices) > _size(self.features[reference]["shape"])
            ):
                raise ValueError(
                    f"state_targets[{key!r}] has {len(indices)} entries, more than the reference "
                    f"{reference!r} has to be taken relative to"
                )
            self.state_target_dims[key] = len(indices)
            target_shapes[state_target_slot(key)] = [len(indices)]
            modes[state_target_slot(key)] = config.obs_norm_mode
        self.normalizer = Normalizer({**shapes, **target_shapes}, modes, stats)
        self.obs_encoder = ObservationEncoder(
            self.features,
            self.obs_keys,
            {key: len(offsets) for key, offsets in config.obs_offsets.items()},
            image=config.image,
            low_dim=config.low_dim,
            low_dim_shapes={key: shape[0] for key, shape in shapes.items() if key != ACTION},
            activation_checkpointing=config.activation_checkpointing,
        )
        target_dim = sum(self.state_target_dims.values())
        cond_dim = self.obs_encoder.output_dim + (target_dim if config.state_target_condition else 0)
        self.denoiser = make_denoiser(config, self.model_action_dim, cond_dim)
        self.state_head: nn.Module | None = None
        if self.state_target_dims:
            self.state_head = mlp_head(
                self.obs_encoder.output_dim, config.state_target_hidden_dims, target_dim
            )
        self.noise_scheduler = make_scheduler(config)
        self.num_inference_steps = config.num_inference_steps

    # -- representation ----------------------------------------------------------------------------
    def _current_index(self, key: str) -> int:
        return self.config.obs_offsets[key].index(0)

    def _reference_poses(self, obs: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        positions, rotations = [], []
        for pos_key, rot_key in self.pose_keys:
            positions.append(obs[pos_key][:, self._current_index(pos_key)].float())
            rotations.append(obs[rot_key][:, self._current_index(rot_key)].float())
        return torch.stack(positions, dim=1), torch.stack(rotations, dim=1)

    def transform_obs(self, obs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Raw observation windows -> the (un-normalised) values the encoder sees."""
        out = dict(obs)
        for key, (kept, angles) in self.low_dim_views.items():
            out[key] = low_dim_view(obs[key].float().flatten(2), kept, angles)
        if self.relative and self.config.relative_obs:
            for pos_key, rot_key in self.pose_keys:
                if self._current_index(pos_key) != self._current_index(rot_key):
                    raise ValueError(f"{pos_key!r} and {rot_key!r} need the same observation offsets")
                rel_pos, rel_rot6d = action_repr.relative_pose_history(
                    obs[pos_key].float(), obs[rot_key].float(), self._current_index(pos_key)
                )
                out[pos_key], out[rot_key] = rel_pos, rel_rot6d
        return out

    def normalize_obs(self, obs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        transformed = self.transform_obs(obs)
        out = {}
        for key in self.obs_keys:
            value = transformed[key]
            if key in self.low_dim_keys:
                value = self.normalizer.normalize(key, value.float().flatten(2))
                if self.training and self.config.obs_noise_std > 0.0:
                    value = value + self.config.obs_noise_std * torch.randn_like(value)
            out[key] = value
        return out

    def action_to_model(self, action: torch.Tensor, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Absolute actions (B, H, A) -> the normalised representation the U-Net denoises."""
        action = action.float()
        if self.relative:
            action = action_repr.absolute_to_relative(action, *self._reference_poses(obs))
        return self.normalizer.normalize(ACTION, action)

    def action_from_model(self, model_action: torch.Tensor, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        action = self.normalizer.unnormalize(ACTION, model_action.float())
        if self.relative:
            action = action_repr.relative_to_absolute(action, *self._reference_poses(obs))
        return action

    # -- training ----------------------------------------------------------------------------------
    def encode_features(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The observation encoder's output (what the state-target head reads)."""
        return self.obs_encoder(self.normalize_obs(obs))

    def encode(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The denoiser's condition: the encoded observation, and with ``state_target_condition``
        the head's (normalised) estimate of the targets beside it."""
        features = self.encode_features(obs)
        if not self.config.state_target_condition:
            return features
        assert self.state_head is not None
        return torch.cat([features, self.state_head(features).to(features.dtype)], dim=-1)

    def compute_losses(
        self, batch: Mapping[str, Any], generator: torch.Generator | None = None
    ) -> dict[str, torch.Tensor]:
        """Training losses of a batch in the datasets sample format: ``loss`` (denoising); with
        ``state_targets`` also ``action_loss`` and ``state_loss``, ``loss`` being their weighted sum."""
        features = self.encode_features(batch["obs"])
        if self.state_head is None:
            return {"loss": self.denoising_loss(batch, features, generator)}
        targets = self.normalized_targets(batch)
        cond = features
        if self.config.state_target_condition:
            # Teacher forcing: the store's values, blurred to the head's precision, stand in for the
            # estimate, so the denoiser learns the state policy and the head the estimator.
            noisy = targets + self.config.state_target_condition_noise * torch.randn_like(targets)
            cond = torch.cat([features, noisy.to(features.dtype)], dim=-1)
        action_loss = self.denoising_loss(batch, cond, generator)
        state_loss = F.mse_loss(self.state_head(features).float(), targets)
        total = action_loss + self.config.state_target_weight * state_loss
        return {"loss": total, "action_loss": action_loss, "state_loss": state_loss}

    def normalized_targets(self, batch: Mapping[str, Any]) -> torch.Tensor:
        """The batch's state targets, normalised and concatenated in ``state_targets`` order (B, D)."""
        if "targets" not in batch:
            raise KeyError(
                "state_targets need batch['targets']: build the data with target_keys (the policy's "
                f"data window does: {sorted(self.state_target_dims)})"
            )
        parts = []
        for key, indices in self.config.state_targets.items():
            value = batch["targets"][key].float().flatten(2)[..., indices]
            if self.config.state_target_reference is not None:
                value = value - self._target_reference(batch["obs"], len(indices)).unsqueeze(1)
            parts.append(self.normalizer.normalize(state_target_slot(key), value).flatten(1))
        return torch.cat(parts, dim=-1)

    def _target_reference(self, obs: Mapping[str, torch.Tensor], size: int) -> torch.Tensor:
        """The first ``size`` entries of the reference key's current frame (B, size), raw."""
        key = self.config.state_target_reference
        assert key is not None
        return obs[key][:, self._current_index(key)].float().flatten(1)[:, :size]

    @torch.no_grad()
    def predict_state_targets(self, obs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The head's estimate of each target (key -> (B, entries), in the store's units)."""
        if self.state_head is None:
            return {}
        prediction = self.state_head(self.encode_features(obs)).float()
        out, start = {}, 0
        for key, size in self.state_target_dims.items():
            part = prediction[:, start : start + size].unsqueeze(1)
            out[key] = self.normalizer.unnormalize(state_target_slot(key), part)[:, 0]
            if self.config.state_target_reference is not None:
                out[key] = out[key] + self._target_reference(obs, size)
            start += size
        return out

    def denoising_loss(
        self, batch: Mapping[str, Any], cond: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Denoising loss of the batch's action chunks given their encoded condition."""
        target_action = self.action_to_model(batch["action"], batch["obs"])
        batch_size = target_action.shape[0]
        device = target_action.device
        noise = torch.randn(target_action.shape, generator=generator, device=device)
        timesteps = torch.randint(
            0,
            self.noise_scheduler.config.num_train_timesteps,
            (batch_size,),
            generator=generator,
            device=device,
        )
        noisy = self.noise_scheduler.add_noise(target_action, noise, timesteps)
        prediction = self.denoiser(noisy, timesteps, cond).float()
        prediction_type = self.noise_scheduler.config.prediction_type
        if prediction_type == "epsilon":
            target = noise
        elif prediction_type == "sample":
            target = target_action
        else:
            target = self.noise_scheduler.get_velocity(target_action, noise, timesteps)
        loss = F.mse_loss(prediction, target, reduction="none")
        if self.config.mask_padding_loss and "action_is_pad" in batch:
            valid = (~batch["action_is_pad"].bool()).unsqueeze(-1).float()
            return (loss * valid).sum() / (valid.sum() * loss.shape[-1]).clamp_min(1.0)
        return loss.mean()

    # -- inference ---------------------------------------------------------------------------------
    @torch.no_grad()
    def act_from_condition(
        self,
        cond: torch.Tensor,
        obs: Mapping[str, torch.Tensor],
        num_inference_steps: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Denoise a chunk for an already encoded condition (``encode(obs)``); ``obs`` supplies the
        latest pose for relative actions. The executor's fast module."""
        sample = sample_chunk(
            self.config,
            (cond.shape[0], self.config.horizon, self.model_action_dim),
            lambda noisy, step: self.denoiser(noisy, step, cond).float(),
            cond.device,
            num_inference_steps or self.num_inference_steps,
            generator,
        )
        return self.action_from_model(sample, obs)


def state_target_slot(key: str) -> str:
    """The normaliser slot of an auxiliary target (apart from the key's slot, should it be observed)."""
    return f"target:{key}"


def sample_chunk(
    config: DiffusionConfig,
    shape: tuple[int, ...],
    predict: Any,
    device: torch.device,
    num_inference_steps: int,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Run the config's sampler from noise of ``shape`` (times ``config.noise_scale``) to a chunk in
    the model's normalised action space; ``predict(noisy, step)`` is the denoiser's output (noise or
    sample, as the config's ``prediction_type``) at each of the ``num_inference_steps`` steps."""
    scheduler = make_scheduler(config)  # a fresh one: set_timesteps mutates scheduler state
    scheduler.set_timesteps(num_inference_steps, device=device)
    sample = torch.randn(shape, generator=generator, device=device)
    if config.noise_scale != 1.0:  # a lower sampling temperature (see DiffusionConfig)
        sample = sample * config.noise_scale
    for step in scheduler.timesteps:
        sample = scheduler.step(
            predict(sample, step.to(device)), step, sample, generator=generator
        ).prev_sample
    return sample


def low_dim_view_layout(config: DiffusionConfig, key: str, size: int) -> list[tuple[int, str]]:
    """What the encoder sees of low-dim ``key``: (source index, ``value``/``cos``/``sin``) per entry:
    the selected entries (``obs_indices``, default all) that are not angles, then cos and sin of
    each angle (``angle_obs``)."""
    angles = list(config.angle_obs.get(key, []))
    selected = config.obs_indices.get(key, range(size))
    kept = [i for i in selected if i not in set(angles)]
    return [(i, "value") for i in kept] + [(i, "cos") for i in angles] + [(i, "sin") for i in angles]


def low_dim_view(values: torch.Tensor, kept: Sequence[int], angles: Sequence[int]) -> torch.Tensor:
    """(..., D) -> (..., len(kept) + 2 len(angles)): entries ``kept`` as they are, then cos and sin of
    the ``angles`` entries (radians)."""
    angle_values = values[..., list(angles)]
    return torch.cat([values[..., list(kept)], torch.cos(angle_values), torch.sin(angle_values)], dim=-1)


def make_denoiser(config: DiffusionConfig, action_dim: int, cond_dim: int) -> torch.nn.Module:
    """The noise/sample predictor the config names (``unet`` or ``mlp``)."""
    if config.denoiser == "mlp":
        return ConditionalMLP(
            action_dim,
            config.horizon,
            cond_dim,
            width=config.mlp_width,
            depth=config.mlp_depth,
            step_embed_dim=config.step_embed_dim,
        )
    return ConditionalUnet1D(
        action_dim,
        cond_dim,
        down_dims=config.down_dims,
        kernel_size=config.kernel_size,
        step_embed_dim=config.step_embed_dim,
        n_groups=config.n_groups,
        activation_checkpointing=config.activation_checkpointing,
    )


def _size(shape: Sequence[int]) -> int:
    size = 1
    for dim in shape:
        size *= int(dim)
    return size


def check_keys(config: DiffusionConfig, features: Mapping[str, Any]) -> None:
    """Raise KeyError naming the keys of the config that the store lacks (before building anything)."""
    features = {key: feature_to_dict(spec) for key, spec in features.items()}
    missing_obs = [key for key in config.obs_offsets if key not in features]
    missing_action = [key for key in config.action_keys if key not in features]
    missing_targets = [key for key in config.state_targets if key not in features]
    if missing_obs or missing_action or missing_targets:
        hint = (
            " (a simulator's object state: collect with --env-option object_state=true)"
            if any(key.startswith("object") for key in missing_targets)
            else ""
        )
        raise KeyError(
            f"the store lacks keys named by the policy config: observations {missing_obs}, actions "
            f"{missing_action}, state targets {missing_targets}{hint} (store features: {sorted(features)})"
        )
    for key in config.action_keys:
        if features[key]["kind"] != "low_dim":
            raise ValueError(
                f"action key {key!r} has kind {features[key]['kind']!r}; actions must be low_dim"
            )


# -- statistics -------------------------------------------------------------------------------------
def policy_statistics(
    store: Any, config: DiffusionConfig, episodes: Sequence[int] | None = None, seed: int = 0
) -> dict[str, dict[str, np.ndarray]]:
    """Normaliser statistics of a policy from a store.

    Absolute quantities use ``store.stats(key)`` (action statistics are the per-key statistics
    concatenated). Relative actions and relative pose histories are computed here from up to
    ``config.relative_stats_max_frames`` frames of ``episodes`` (all episodes by default): relative
    positions and grippers get their measured min/max/mean/std, 6-D rotations the fixed range [-1, 1].
    """
    features = {key: feature_to_dict(spec) for key, spec in store.features.items()}
    check_keys(config, features)
    stats: dict[str, dict[str, np.ndarray]] = {}
    for key in config.obs_offsets:
        if features[key]["kind"] == "low_dim":
            stats[key] = _float_stats(store.stats(key))
    unit = {"min": -1.0, "max": 1.0, "mean": 0.0, "std": 1.0}
    for key in {*config.obs_indices, *config.angle_obs}:
        # Selected entries keep their statistics; cos and sin have the fixed range [-1, 1].
        layout = low_dim_view_layout(config, key, len(stats[key]["min"]))
        stats[key] = {
            name: np.asarray([values[i] if kind == "value" else unit[name] for i, kind in layout], np.float32)
            for name, values in stats[key].items()
        }
    for key, indices in config.state_targets.items():
        if config.state_target_reference is None:
            stats[state_target_slot(key)] = {
                name: values[indices] for name, values in _float_stats(store.stats(key)).items()
            }
            continue
        # Relative targets: their statistics over every frame of the store (low-dim columns are small).
        n_frames = int(store.n_frames)
        target = np.asarray(store.read(key, 0, n_frames), np.float32).reshape(n_frames, -1)[:, indices]
        reference = np.asarray(store.read(config.state_target_reference, 0, n_frames), np.float32)
        relative = target - reference.reshape(n_frames, -1)[:, : len(indices)]
        stats[state_target_slot(key)] = {
            "min": relative.min(0), "max": relative.max(0), "mean": relative.mean(0), "std": relative.std(0)
        }  # fmt: skip
    per_key = [_float_stats(store.stats(key)) for key in config.action_keys]
    stats[ACTION] = {
        name: np.concatenate([s[name].reshape(-1) for s in per_key]) for name in ("min", "max", "mean", "std")
    }
    if config.action_representation != "relative":
        return stats

    action_dim = sum(_size(features[key]["shape"]) for key in config.action_keys)
    n_robots = action_repr.n_robots_from_action_dim(action_dim)
    pose_keys = config.pose_keys or default_pose_keys(n_robots)
    ends = np.asarray(store.episode_ends, dtype=np.int64)
    starts = np.concatenate([[0], ends[:-1]])
    chosen = np.arange(len(ends)) if episodes is None else np.asarray(list(episodes), dtype=np.int64)
    frames = np.concatenate([np.arange(starts[i], ends[i]) for i in chosen])
    rng = np.random.default_rng(seed)
    if len(frames) > config.relative_stats_max_frames:
        frames = np.sort(rng.choice(frames, config.relative_stats_max_frames, replace=False))
    episode_of = np.searchsorted(ends, frames, side="right")
    first, last = starts[episode_of], ends[episode_of] - 1
    n_frames = int(ends[-1])
    arrays = {
        key: np.asarray(store.read(key, 0, n_frames), dtype=np.float32)
        for key in {k for pair in pose_keys for k in pair}
    }
    action = np.concatenate(
        [
            np.asarray(store.read(key, 0, n_frames), dtype=np.float32).reshape(n_frames, -1)
            for key in config.action_keys
        ],
        axis=1,
    )
    chunk_index = np.clip(frames[:, None] + np.arange(config.horizon)[None], first[:, None], last[:, None])
    ref_pos = torch.from_numpy(np.stack([arrays[p][frames] for p, _ in pose_keys], axis=1))
    ref_rot = torch.from_numpy(np.stack([arrays[r][frames] for _, r in pose_keys], axis=1))
    relative = action_repr.absolute_to_relative(torch.from_numpy(action[chunk_index]), ref_pos, ref_rot)
    rel = relative.reshape(-1, n_robots, action_repr.RELATIVE_DIM_PER_ROBOT)
    action_stats = _tensor_stats(rel.reshape(-1, rel.shape[-1] * n_robots))
    _fix_rot6d(action_stats, n_robots, action_repr.RELATIVE_DIM_PER_ROBOT, rot_start=3)
    stats[ACTION] = action_stats
    if config.relative_obs:
        for pos_key, rot_key in pose_keys:
            offsets = np.asarray(config.obs_offsets[pos_key])
            window = np.clip(frames[:, None] + offsets[None], first[:, None], last[:, None])
            rel_pos, rel_rot6d = action_repr.relative_pose_history(
                torch.from_numpy(arrays[pos_key][window]),
                torch.from_numpy(arrays[rot_key][window]),
                list(offsets).index(0),
            )
            stats[pos_key] = _tensor_stats(rel_pos.reshape(-1, 3))
            stats[rot_key] = {
                "min": -np.ones(6, np.float32),
                "max": np.ones(6, np.float32),
                "mean": np.zeros(6, np.float32),
                "std": np.ones(6, np.float32),
            }
    return stats


def _float_stats(stats: Mapping[str, Any]) -> dict[str, np.ndarray]:
    return {
        name: np.asarray(stats[name], dtype=np.float32).reshape(-1) for name in ("min", "max", "mean", "std")
    }


def _tensor_stats(values: torch.Tensor) -> dict[str, np.ndarray]:
    values = values.double()
    return {
        "min": values.amin(0).float().numpy(),
        "max": values.amax(0).float().numpy(),
        "mean": values.mean(0).float().numpy(),
        "std": values.std(0).float().numpy(),
    }


def _fix_rot6d(stats: dict[str, np.ndarray], n_robots: int, per_robot: int, rot_start: int) -> None:
    """6-D rotation entries are unit-vector components: normalise them with the fixed range [-1, 1]."""
    for robot in range(n_robots):
        part = slice(robot * per_robot + rot_start, robot * per_robot + rot_start + 6)
        stats["min"][part], stats["max"][part] = -1.0, 1.0
        stats["mean"][part], stats["std"][part] = 0.0, 1.0
