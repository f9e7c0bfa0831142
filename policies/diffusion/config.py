"""Configuration of the diffusion policy (a typed, documented dataclass; YAML maps onto it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from demoscale.policies.base import check_execution, check_noise_scale
from demoscale.policies.encoders import ImageEncoderConfig, LowDimEncoderConfig


@dataclass
class DiffusionConfig:
    """Everything that defines a diffusion policy network and its input/output representation.

    Attributes:
        obs_offsets: observed key -> frame offsets of its window (``{"camera0_rgb": [-3, 0]}``); every
            key must be a feature of the store, and every window must contain offset 0.
        action_keys: store keys concatenated (in order) into the predicted action vector.
        horizon: length of the predicted action chunk (with the U-Net, a multiple of
            ``2 ** (len(down_dims) - 1)``).
        n_action_steps: actions of a chunk executed before the policy is queried again.
        inference_delay: control steps between the observation a chunk is predicted from and its
            first executed action, in rollouts (:func:`demoscale.policies.base.check_execution`).
        action_representation: ``absolute`` (the store's units) or ``relative`` (UMI-style: each
            action's pose relative to the latest observed end-effector pose, as pos + 6-D rotation
            + gripper; needs the [pos(3), axis_angle(3), gripper(1)]-per-robot action layout).
        pose_keys: per robot, the observed [position key, axis-angle key] used as the reference pose
            of relative actions; default ``robot{i}_eef_pos`` / ``robot{i}_eef_rot_axis_angle``.
        relative_obs: with relative actions, encode the observed pose history relative to the
            current pose (pos + 6-D rotation) instead of absolute poses.
        obs_indices: the entries of a low-dim observation the policy sees (key -> indices into the
            flattened feature; default: all), e.g. ``{"state": [0, 1]}`` for PushT's agent position
            alone beside an image.
        angle_obs: low-dim observation entries that are angles in radians (key -> indices into the
            flattened feature, e.g. ``{"state": [4]}`` for PushT's block angle); each is fed to the
            encoder as (cos, sin) after the key's other entries, so a wrap from 2 pi to 0 is no jump.
        obs_noise_std: standard deviation of Gaussian noise added to the normalised low-dim
            observations while training (0: none); a regulariser for state policies trained on few
            demonstrations. Never applied at inference or validation.
        obs_norm_mode: normalisation of low-dim observations (``min_max`` to [-1, 1] or ``mean_std``).
        action_norm_mode: normalisation of actions (``min_max`` or ``mean_std``).
        relative_stats_max_frames: frames sampled from the store to compute statistics of relative
            actions and observations.
        image: image-encoder settings (timm backbone name, crop, jitter, shared flag, ...).
        low_dim: low-dim encoder settings.
        denoiser: ``unet`` (the Diffusion Policy / UMI 1-D temporal U-Net) or ``mlp`` (a FiLM MLP over
            the flattened chunk, ``policies/mlp_denoiser.py``: tens of times cheaper per step on a CPU).
        down_dims, kernel_size, step_embed_dim, n_groups: 1-D U-Net size (``step_embed_dim`` is
            also the MLP's step embedding).
        mlp_width, mlp_depth: the MLP denoiser's hidden width and number of residual blocks.
        noise_scheduler: ``ddim`` or ``ddpm`` (diffusers); used for sampling at inference.
        num_train_timesteps, beta_schedule, prediction_type, clip_sample: the diffusion process.
        num_inference_steps: denoising steps at inference (16 for UMI's DDIM).
        noise_scale: standard deviation of the chain's starting noise at inference, 1.0 being the
            training noise's: below 1 samples at a lower temperature (fewer low-probability
            chunks), 0 makes the policy deterministic. An inference setting, changeable on a loaded
            policy (``Policy.noise_scale``). State PushT, 200 unseen states: success 0.49 at 1.0,
            0.59-0.61 at 0.75-0.25 at equal coverage, 0.56 at 0 with less coverage
            (docs/results/pusht_state_24k/noise_scales).
        activation_checkpointing: recompute encoder and U-Net activations in the backward pass.
        mask_padding_loss: ignore the loss on action steps past the end of the episode.
        waypoint_head: add the PIVOT-R-style waypoint head (``policies/waypoint_head.py``; needs the
            store's ``next_waypoint_index``); waypoint_hidden_dims, waypoint_loss_weight: its MLP and
            the weight of its MSE loss.
        state_targets: low-dim store keys the policy learns to predict from its encoded observation
            without observing them (key -> entries of the current frame), an auxiliary loss that
            exists only in training: e.g. ``{"object0_pose": [0, 1, 2]}`` makes an image encoder
            learn where the object is from a simulator's record of it (the tabletop
            ``object_state`` option). Inference never reads these keys.
        state_target_weight, state_target_hidden_dims: the weight of that MSE loss (on targets
            normalised like observations) and the hidden sizes of the MLP head predicting them.
        state_target_condition: also condition the denoiser on the targets, a pose-estimator-then-
            state-policy split inside one network: in training the denoiser sees the store's values
            (normalised, plus Gaussian noise of std ``state_target_condition_noise`` so that it
            learns to act on estimates as imprecise as the head's), at inference the head's estimate
            from the image. pick_place: a state policy told the object's pose succeeds 0.97 where
            the image policy reaches 0.5-0.6 (docs/results/pick_place_state); conditioned on its
            own estimate, 0.50-0.62 from 10 demonstrations per pair, whose head learns their
            placements rather than where an object is; 0.77 from 80 per pair without the random
            crop (docs/results/pick_place_state_condition_d80).
        state_target_reference: an observed low-dim key (e.g. ``robot0_eef_pos``) whose current
            value the targets are taken relative to: each target's entries minus the reference's
            first entries (as many, in order: both in one frame, e.g. world x, y, z), so the head
            predicts where the object is from the gripper, not from the table. A shift of the whole
            image (the random crop) moves both alike, so the relative vector is what an image shows
            without ambiguity. Estimates (``predict_state_targets``) are given back absolute.
    """

    obs_offsets: dict[str, list[int]] = field(default_factory=lambda: {"camera0_rgb": [-1, 0]})
    action_keys: list[str] = field(default_factory=lambda: ["action"])
    horizon: int = 16
    n_action_steps: int = 8
    inference_delay: int = 0
    action_representation: Literal["absolute", "relative"] = "absolute"
    pose_keys: list[list[str]] | None = None
    relative_obs: bool = True
    obs_indices: dict[str, list[int]] = field(default_factory=dict)
    angle_obs: dict[str, list[int]] = field(default_factory=dict)
    obs_noise_std: float = 0.0
    obs_norm_mode: Literal["min_max", "mean_std"] = "min_max"
    action_norm_mode: Literal["min_max", "mean_std"] = "min_max"
    relative_stats_max_frames: int = 20000
    image: ImageEncoderConfig = field(default_factory=ImageEncoderConfig)
    low_dim: LowDimEncoderConfig = field(default_factory=LowDimEncoderConfig)
    denoiser: Literal["unet", "mlp"] = "unet"
    down_dims: list[int] = field(default_factory=lambda: [256, 512, 1024])
    kernel_size: int = 5
    step_embed_dim: int = 128
    n_groups: int = 8
    mlp_width: int = 256
    mlp_depth: int = 3
    noise_scheduler: Literal["ddim", "ddpm"] = "ddim"
    num_train_timesteps: int = 50
    beta_schedule: str = "squaredcos_cap_v2"
    prediction_type: Literal["epsilon", "sample", "v_prediction"] = "epsilon"
    clip_sample: bool = True
    num_inference_steps: int = 16
    noise_scale: float = 1.0
    activation_checkpointing: bool = False
    mask_padding_loss: bool = True
    waypoint_head: bool = False
    waypoint_hidden_dims: list[int] = field(default_factory=lambda: [256])
    waypoint_loss_weight: float = 1.0
    state_targets: dict[str, list[int]] = field(default_factory=dict)
    state_target_weight: float = 1.0
    state_target_hidden_dims: list[int] = field(default_factory=lambda: [256])
    state_target_condition: bool = False
    state_target_condition_noise: float = 0.0
    state_target_reference: str | None = None

    @property
    def waypoint_keys(self) -> list[str]:
        """Keys of the waypoint frame the sampler must return (every observed key with the head)."""
        return list(self.obs_offsets) if self.waypoint_head else []

    @property
    def target_keys(self) -> list[str]:
        """Keys whose current frame training samples must carry (the ``state_targets``)."""
        return list(self.state_targets)

    def validate(self) -> None:
        """Raise ValueError on settings that cannot work, before any network is built."""
        if not self.obs_offsets:
            raise ValueError("obs_offsets is empty: the policy must observe at least one key")
        for key, offsets in self.obs_offsets.items():
            if 0 not in offsets:
                raise ValueError(f"observation window of {key!r} ({offsets}) must contain offset 0")
            if any(offset > 0 for offset in offsets):
                raise ValueError(f"observation window of {key!r} ({offsets}) looks into the future")
        if self.denoiser not in ("unet", "mlp"):
            raise ValueError(f"denoiser must be 'unet' or 'mlp', got {self.denoiser!r}")
        multiple = 2 ** (len(self.down_dims) - 1) if self.denoiser == "unet" else 1
        if self.horizon < 1 or self.horizon % multiple:
            raise ValueError(
                f"horizon {self.horizon} must be a positive multiple of {multiple} for down_dims {self.down_dims}"
            )
        check_execution(self.horizon, self.n_action_steps, self.inference_delay)
        check_noise_scale(self.noise_scale)
        if self.num_inference_steps > self.num_train_timesteps:
            raise ValueError(
                f"num_inference_steps {self.num_inference_steps} exceeds num_train_timesteps {self.num_train_timesteps}"
            )
        for name, table in (("obs_indices", self.obs_indices), ("angle_obs", self.angle_obs)):
            for key, indices in table.items():
                if key not in self.obs_offsets:
                    raise ValueError(f"{name} names {key!r}, which the policy does not observe")
                if not indices or len(set(indices)) != len(indices) or any(i < 0 for i in indices):
                    raise ValueError(
                        f"{name}[{key!r}] = {indices}: indices must be distinct, >= 0, not empty"
                    )
        for key, indices in self.angle_obs.items():
            if key in self.obs_indices and not set(indices) <= set(self.obs_indices[key]):
                raise ValueError(f"angle_obs[{key!r}] = {indices} names entries outside obs_indices[{key!r}]")
        for key, indices in self.state_targets.items():
            if key in self.obs_offsets:
                raise ValueError(
                    f"state_targets names {key!r}, which the policy observes: predict what it does not see"
                )
            if not indices or len(set(indices)) != len(indices) or any(i < 0 for i in indices):
                raise ValueError(
                    f"state_targets[{key!r}] = {indices}: indices must be distinct, >= 0, not empty"
                )
        if self.state_targets and self.waypoint_head:
            raise ValueError(
                "state_targets and waypoint_head cannot be combined (each conditions the loss its own way)"
            )
        if self.state_target_condition and not self.state_targets:
            raise ValueError("state_target_condition needs state_targets (the estimates it conditions on)")
        if self.state_target_reference is not None:
            if not self.state_targets:
                raise ValueError("state_target_reference needs state_targets (what is taken relative to it)")
            if 0 not in self.obs_offsets.get(self.state_target_reference, []):
                raise ValueError(
                    f"state_target_reference {self.state_target_reference!r} must be observed at offset 0 "
                    f"(obs_offsets: {sorted(self.obs_offsets)})"
                )
        if self.state_target_condition_noise < 0.0:
            raise ValueError(f"state_target_condition_noise {self.state_target_condition_noise} must be >= 0")
        if self.state_target_weight < 0.0:
            raise ValueError(f"state_target_weight {self.state_target_weight} must be >= 0")
        if self.obs_noise_std < 0.0:
            raise ValueError(f"obs_noise_std {self.obs_noise_std} must be >= 0")
        if not 0.0 < self.image.crop_fraction <= 1.0:
            raise ValueError(f"image.crop_fraction {self.image.crop_fraction} must be in (0, 1]")
