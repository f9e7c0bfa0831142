"""Configuration of the WB-VIMA-style whole-body policy (plain dataclasses, filled from YAML)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..base import check_execution, check_noise_scale
from ..encoders import ImageEncoderConfig, PointCloudEncoderConfig


@dataclass
class ChainPart:
    """One link of the kinematic chain decoded by its own diffusion head.

    Attributes:
        name: a label for logs (``mobile_base``, ``torso``, ``arms``).
        keys: the store's action keys that make up this part, in order (their sizes add up to ``dim``).
        dim: the size of this part's action vector.
    """

    name: str
    keys: list[str]
    dim: int


def joylo_chain() -> list[ChainPart]:
    """The JoyLo / Galaxea R1 chain: mobile base, then torso, then both arms with their grippers."""
    return [
        ChainPart("mobile_base", ["action_mobile_base"], 3),
        ChainPart("torso", ["action_torso"], 4),
        ChainPart(
            "arms", ["action_left_arm", "action_left_gripper", "action_right_arm", "action_right_gripper"], 14
        ),
    ]


@dataclass
class PointCloudInput:
    """Which store keys hold the point cloud, and the crop box that maps xyz to [-1, 1].

    ``n_points`` (when set) is the number of points every frame must have.
    """

    xyz_key: str = "pointcloud_xyz"
    rgb_key: str | None = "pointcloud_rgb"
    mask_key: str | None = "pointcloud_mask"
    crop_min: list[float] = field(default_factory=lambda: [-1.0, -1.0, -1.0])
    crop_max: list[float] = field(default_factory=lambda: [1.0, 1.0, 1.0])
    n_points: int | None = None


@dataclass
class WBVIMAConfig:
    """WB-VIMA: per-step observation tokens, a causal transformer with readout tokens, and diffusion
    heads decoded autoregressively along the kinematic chain.

    Attributes:
        chain: the parts decoded in order (each conditioned on all earlier ones).
        action_key: the store's whole-body action key; the chain's dims must add up to its size.
        obs_window: number of observed frames (offsets ``-(obs_window-1) .. 0``).
        horizon: action chunk length; n_action_steps: how many of them are executed per prediction.
        inference_delay: control steps between the observation a chunk is predicted from and its
            first executed action, in rollouts (:func:`demoscale.policies.base.check_execution`).
        proprio_key: the proprioception key (None: no proprioception token).
        proprio_hidden_dims: MLP of the proprioception encoder.
        proprio_noise_std: standard deviation of Gaussian noise added to the normalised ([-1, 1])
            proprioception while training (not at inference), as the diffusion policy's
            ``obs_noise_std``.
        hidden_proprio_dims: entries of the proprioception vector the policy does not see (set to
            zero after normalisation). The JoyLo proprioception starts with the base velocity,
            which a simulated base tracks exactly: the last command is then in the observation,
            and a policy can copy it instead of reading the scene ([0, 1, 2] hides it).
        point_cloud: point-cloud keys and crop box (None: no point-cloud token).
        point_cloud_encoder: PointNet settings (6 channels with rgb, 3 without).
        image_keys: camera keys encoded with the shared timm encoder, one token each per step.
        image: the image encoder settings.
        embed_dim, n_layers, n_heads, dropout: the transformer.
        autoregressive: decode the chain part by part (False: one joint head over the whole action).
        multimodal_attention: mix tokens with the transformer (False: concatenate tokens + MLP).
        down_dims, kernel_size, step_embed_dim, n_groups: each head's 1-D conditional U-Net.
        num_train_timesteps, num_inference_steps, beta_schedule, prediction_type: the DDIM schedule.
        noise_scale: every head's starting noise at inference, relative to the training noise's
            (as ``DiffusionConfig.noise_scale``: below 1 a lower sampling temperature).
        waypoint_head: add the PIVOT-R-style waypoint head (needs ``next_waypoint_index`` in the store).
        waypoint_hidden_dims, waypoint_loss_weight: its MLP and the weight of its MSE loss.
    """

    chain: list[ChainPart] = field(default_factory=joylo_chain)
    action_key: str | None = "action"
    obs_window: int = 2
    horizon: int = 8
    n_action_steps: int = 8
    inference_delay: int = 0
    proprio_key: str | None = "proprio"
    proprio_hidden_dims: list[int] = field(default_factory=lambda: [256, 256])
    proprio_noise_std: float = 0.0
    hidden_proprio_dims: list[int] = field(default_factory=list)
    point_cloud: PointCloudInput | None = field(default_factory=PointCloudInput)
    point_cloud_encoder: PointCloudEncoderConfig = field(default_factory=PointCloudEncoderConfig)
    image_keys: list[str] = field(default_factory=list)
    image: ImageEncoderConfig = field(default_factory=ImageEncoderConfig)
    embed_dim: int = 256
    n_layers: int = 2
    n_heads: int = 8
    dropout: float = 0.1
    autoregressive: bool = True
    multimodal_attention: bool = True
    down_dims: list[int] = field(default_factory=lambda: [64, 128])
    kernel_size: int = 5
    step_embed_dim: int = 64
    n_groups: int = 8
    num_train_timesteps: int = 100
    num_inference_steps: int = 16
    noise_scale: float = 1.0
    beta_schedule: str = "squaredcos_cap_v2"
    prediction_type: str = "epsilon"
    waypoint_head: bool = False
    waypoint_hidden_dims: list[int] = field(default_factory=lambda: [256])
    waypoint_loss_weight: float = 1.0

    def __post_init__(self) -> None:
        # YAML / checkpoint dicts become the nested dataclasses.
        self.chain = [ChainPart(**part) if isinstance(part, dict) else part for part in self.chain]
        if isinstance(self.point_cloud, dict):
            self.point_cloud = PointCloudInput(**self.point_cloud)
        if isinstance(self.point_cloud_encoder, dict):
            self.point_cloud_encoder = PointCloudEncoderConfig(**self.point_cloud_encoder)
        if isinstance(self.image, dict):
            self.image = ImageEncoderConfig(**self.image)
        if not self.chain:
            raise ValueError("chain must list at least one part")
        if self.proprio_noise_std < 0.0:
            raise ValueError(f"proprio_noise_std {self.proprio_noise_std} must be >= 0")
        if (self.proprio_noise_std > 0.0 or self.hidden_proprio_dims) and self.proprio_key is None:
            raise ValueError("proprio_noise_std and hidden_proprio_dims need a proprio_key")
        if self.obs_window < 1:
            raise ValueError(f"obs_window must be >= 1, got {self.obs_window}")
        check_execution(self.horizon, self.n_action_steps, self.inference_delay)
        check_noise_scale(self.noise_scale)

    @property
    def action_keys(self) -> list[str]:
        """All action keys in chain order (the sampler's ``action_keys``)."""
        return [key for part in self.chain for key in part.keys]

    @property
    def obs_keys(self) -> list[str]:
        """Store keys the policy observes: point cloud, proprioception, cameras."""
        keys: list[str] = []
        if self.point_cloud is not None:
            cloud = self.point_cloud
            keys += [key for key in (cloud.xyz_key, cloud.rgb_key, cloud.mask_key) if key is not None]
        if self.proprio_key is not None:
            keys.append(self.proprio_key)
        return keys + list(self.image_keys)

    @property
    def obs_offsets(self) -> dict[str, list[int]]:
        """Observed key -> frame offsets ``-(obs_window-1) .. 0``."""
        offsets = list(range(-(self.obs_window - 1), 1))
        return {key: list(offsets) for key in self.obs_keys}

    @property
    def waypoint_keys(self) -> list[str]:
        """Keys of the waypoint frame the sampler must return (empty without the waypoint head)."""
        return self.obs_keys if self.waypoint_head else []
