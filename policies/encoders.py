"""Observation encoders shared by every policy family.

The vocabulary: :class:`ImageEncoder` (a timm backbone by name, with training-only augmentation and
ImageNet normalisation), :class:`LowDimEncoder` (identity or MLP over proprioception-like vectors),
:class:`PointCloudEncoder` (PointNet-style per-point MLP + max-pool), and
:class:`ObservationEncoder`, which builds one encoder per observed key from the store's feature spec
and returns per-key, per-time-step features.

Inputs follow the sample format of ``demoscale.datasets``: images arrive as uint8 HWC windows
(B, n_offsets, H, W, 3), low-dim values as float32 (B, n_offsets, *shape) (already normalised by the
policy), point clouds as (B, n_offsets, N, 3) xyz (+ rgb uint8, + bool mask).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn
from torchvision.transforms import v2

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def feature_to_dict(feature: Any) -> dict[str, Any]:
    """A store ``FeatureSpec`` (dataclass, object or dict) as a plain dict (for checkpoints)."""
    if isinstance(feature, Mapping):
        out = dict(feature)
    elif dataclasses.is_dataclass(feature):
        out = dataclasses.asdict(feature)
    else:
        out = {name: getattr(feature, name) for name in ("kind", "shape", "dtype") if hasattr(feature, name)}
        for name in ("rate_hz", "units", "frame"):
            if hasattr(feature, name):
                out[name] = getattr(feature, name)
    out["shape"] = [int(s) for s in out["shape"]]
    return out


@dataclass
class ImageEncoderConfig:
    """How camera images are encoded.

    Attributes:
        backbone: a timm model name (``resnet18``, ``resnet10t``, ``vit_small_patch16_224``,
            ``vit_large_patch14_dinov2``, timm's tiny ``test_*`` models, ...). Built with
            ``num_classes=0`` so the output is the pooled feature (CLS token for ViTs).
        pretrained_path: a local checkpoint (state dict) to initialise the backbone from; nothing is
            ever downloaded. ``None`` = random initialisation.
        shared: one backbone for every camera (True) or one per camera (False).
        crop_fraction: random crop of this fraction of each side during training (centre crop at
            evaluation), resized back to the input size; 1.0 disables cropping.
        color_jitter: brightness, contrast, saturation, hue of ``ColorJitter`` in training; all zero
            disables it.
        resize: optional (H, W) the cropped image is resized to (default: the stored image size).
        channels_last: run the backbone in channels-last memory format (faster convolutions on CPU).
        imagenet_norm: normalise with the ImageNet mean/std after scaling to [0, 1].
        backbone_kwargs: extra keyword arguments for ``timm.create_model`` (e.g. ``img_size``).
        pooling: ``avg`` (the backbone's own global pooling) or ``spatial_softmax`` (robomimic-style
            keypoints: a 1x1 convolution to ``keypoints`` heat maps whose soft-argmax x, y are the
            features). Global pooling throws away where things are; keypoints keep it, which is what
            position-driven manipulation needs and why such policies learn far faster with them.
        keypoints: number of spatial-softmax keypoints (features = 2 x keypoints).
        feature_stage: with ``spatial_softmax``, the timm stage whose feature map is used (index into
            ``out_indices``; ``None`` = the last). An earlier stage keeps a finer map on small images.
    """

    backbone: str = "resnet18"
    pretrained_path: str | None = None
    shared: bool = False
    crop_fraction: float = 0.95
    color_jitter: tuple[float, float, float, float] = (0.3, 0.4, 0.5, 0.08)
    resize: tuple[int, int] | None = None
    channels_last: bool = False
    imagenet_norm: bool = True
    backbone_kwargs: dict[str, Any] = field(default_factory=dict)
    pooling: Literal["avg", "spatial_softmax"] = "avg"
    keypoints: int = 32
    feature_stage: int | None = None

    def __post_init__(self) -> None:
        if self.pooling not in ("avg", "spatial_softmax"):
            raise ValueError(f"image pooling must be 'avg' or 'spatial_softmax', got {self.pooling!r}")
        if self.keypoints < 1:
            raise ValueError(f"keypoints must be >= 1, got {self.keypoints}")


@dataclass
class LowDimEncoderConfig:
    """How low-dimensional observations are encoded: ``hidden_dims=[]`` means identity (flatten)."""

    hidden_dims: list[int] = field(default_factory=list)


@dataclass
class PointCloudEncoderConfig:
    """PointNet-style point-cloud encoder: per-point MLP over xyz(+rgb), masked max-pool."""

    hidden_dims: list[int] = field(default_factory=lambda: [64, 128, 256])
    use_rgb: bool = True


class SpatialSoftmax(nn.Module):
    """(N, C, h, w) feature map -> (N, 2K) expected x, y in [-1, 1] of K learned heat maps."""

    def __init__(self, channels: int, keypoints: int):
        super().__init__()
        self.to_heatmaps = nn.Conv2d(channels, keypoints, kernel_size=1)
        # A learned temperature: sharp maps localise, soft maps pass gradient early in training.
        self.log_temperature = nn.Parameter(torch.zeros(()))

    def forward(self, feature_map: torch.Tensor) -> torch.Tensor:
        heat = self.to_heatmaps(feature_map)
        n, k, h, w = heat.shape
        weights = torch.softmax(heat.flatten(2) / self.log_temperature.exp(), dim=-1).view(n, k, h, w)
        ys = torch.linspace(-1.0, 1.0, h, device=heat.device, dtype=heat.dtype)
        xs = torch.linspace(-1.0, 1.0, w, device=heat.device, dtype=heat.dtype)
        expected_x = (weights.sum(dim=2) * xs).sum(dim=-1)
        expected_y = (weights.sum(dim=3) * ys).sum(dim=-1)
        return torch.stack([expected_x, expected_y], dim=-1).flatten(1)


class KeypointBackbone(nn.Module):
    """A timm feature extractor (one stage's map) followed by :class:`SpatialSoftmax`."""

    def __init__(self, features: nn.Module, channels: int, keypoints: int):
        super().__init__()
        self.features = features
        self.keypoints = SpatialSoftmax(channels, keypoints)
        self.num_features = 2 * keypoints

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.keypoints(self.features(images)[-1])


def create_backbone(config: ImageEncoderConfig) -> nn.Module:
    """A timm backbone with its classifier removed; loads ``pretrained_path`` when given."""
    import timm

    if config.pooling == "spatial_softmax":
        stage = -1 if config.feature_stage is None else int(config.feature_stage)
        try:
            features = timm.create_model(
                config.backbone,
                pretrained=False,
                features_only=True,
                out_indices=(stage,),
                **config.backbone_kwargs,
            )
        except (RuntimeError, ValueError, IndexError) as error:
            raise ValueError(
                f"backbone {config.backbone!r} cannot give stage {stage}'s feature map for spatial "
                f"softmax ({error}); use pooling='avg' or another feature_stage"
            ) from error
        model: nn.Module = KeypointBackbone(features, features.feature_info.channels()[-1], config.keypoints)
        _load_pretrained(features, config)
        return model
    model = timm.create_model(config.backbone, pretrained=False, num_classes=0, **config.backbone_kwargs)
    _load_pretrained(model, config)
    return model


def _load_pretrained(model: nn.Module, config: ImageEncoderConfig) -> None:
    if config.pretrained_path:
        path = Path(config.pretrained_path)
        if not path.exists():
            raise FileNotFoundError(f"pretrained backbone checkpoint {path} does not exist")
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
            state = state.get("state_dict", state.get("model", state))
        missing, unexpected = model.load_state_dict(state, strict=False)
        # A classifier head in the file is expected to be unused; anything else missing is an error.
        if missing:
            raise RuntimeError(f"{path} does not match backbone {config.backbone!r}: missing {missing[:5]}")
        del unexpected


class ImageAugment(nn.Module):
    """uint8 (N, H, W, 3) -> float (N, 3, h, w): crop (random in training), resize, jitter, normalise."""

    def __init__(self, image_shape: Sequence[int], config: ImageEncoderConfig):
        super().__init__()
        height, width = int(image_shape[0]), int(image_shape[1])
        out_size = tuple(config.resize) if config.resize else (height, width)
        crop = (max(1, round(height * config.crop_fraction)), max(1, round(width * config.crop_fraction)))
        train_ops: list[nn.Module] = []
        eval_ops: list[nn.Module] = []
        if crop != (height, width):
            train_ops.append(v2.RandomCrop(crop))
            eval_ops.append(v2.CenterCrop(crop))
        if crop != out_size:
            train_ops.append(v2.Resize(out_size, antialias=True))
            eval_ops.append(v2.Resize(out_size, antialias=True))
        if any(config.color_jitter):
            brightness, contrast, saturation, hue = config.color_jitter
            train_ops.append(v2.ColorJitter(brightness, contrast, saturation, hue))
        self.train_transform = v2.Compose(train_ops) if train_ops else nn.Identity()
        self.eval_transform = v2.Compose(eval_ops) if eval_ops else nn.Identity()
        self.out_size = out_size
        mean, std = (IMAGENET_MEAN, IMAGENET_STD) if config.imagenet_norm else ((0.5,) * 3, (0.5,) * 3)
        self.register_buffer("mean", torch.tensor(mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, 3, 1, 1), persistent=False)

    # Left out of torch.compile: the crop and jitter parameters are drawn as Python numbers per batch
    # and torchvision's kernels see inputs of changing strides, so a compiled graph would recompile
    # batch after batch until dynamo's recompile limit; these few elementwise ops run eagerly.
    @torch.compiler.disable
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if images.dtype != torch.uint8:
            raise TypeError(f"images must be uint8 HWC, got {images.dtype}")
        # (N, H, W, 3) -> (N, 3, H, W) floats in [0, 1]. One transform call per batch: the crop and
        # jitter parameters are drawn once per batch (cheap; different batches differ).
        x = images.permute(0, 3, 1, 2).float().div_(255.0)
        x = self.train_transform(x) if self.training else self.eval_transform(x)
        return (x - self.mean) / self.std


class ImageEncoder(nn.Module):
    """(B, T, H, W, 3) uint8 -> (B, T, feature_dim) with a timm backbone."""

    def __init__(
        self,
        image_shape: Sequence[int],
        config: ImageEncoderConfig,
        backbone: nn.Module | None = None,
        activation_checkpointing: bool = False,
    ):
        super().__init__()
        self.augment = ImageAugment(image_shape, config)
        self.backbone = backbone if backbone is not None else create_backbone(config)
        self.channels_last = config.channels_last
        if self.channels_last:
            self.backbone = self.backbone.to(memory_format=torch.channels_last)
        if activation_checkpointing and hasattr(self.backbone, "set_grad_checkpointing"):
            self.backbone.set_grad_checkpointing(True)
        self.feature_dim = int(self.backbone.num_features)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        batch, steps = images.shape[:2]
        x = self.augment(images.reshape(batch * steps, *images.shape[2:]))
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.backbone(x).reshape(batch, steps, -1)


class LowDimEncoder(nn.Module):
    """(B, T, *shape) -> (B, T, out_dim): identity (flatten) or an MLP."""

    def __init__(self, in_dim: int, config: LowDimEncoderConfig):
        super().__init__()
        layers: list[nn.Module] = []
        dim = in_dim
        for hidden in config.hidden_dims:
            layers += [nn.Linear(dim, hidden), nn.Mish()]
            dim = hidden
        self.net = nn.Sequential(*layers) if layers else nn.Identity()
        self.feature_dim = dim

    def forward(self, values: torch.Tensor) -> torch.Tensor:
        return self.net(values.flatten(2))


# Points per chunk of the encoder's winner search (see PointCloudEncoder).
WINNER_SEARCH_POINTS = 8192


class PointCloudEncoder(nn.Module):
    """(B, T, N, 3) xyz [+ (B, T, N, 3) uint8 rgb] [+ (B, T, N) mask] -> (B, T, out_dim).

    xyz is expected already normalised (e.g. to [-1, 1] by a crop box); rgb is divided by 255.
    Points where the mask is False do not take part in the max-pool.

    While gradients are needed, the max-pool is computed in two passes that give the same features
    and the same parameter gradients as differentiating through every point: the per-point MLP runs
    on all points without autograd to find, for each output channel, the point that wins the
    max-pool; then only those winners (one per channel) go through the MLP again with autograd. The
    max-pool's gradient is zero at every other point, so nothing is lost, and the backward pass and
    the saved activations shrink from N points to ``out_dim`` points per cloud (1024 -> 128 at the
    simulator's size; the per-point tensors of the full pass were most of a WB-VIMA step's time).
    """

    # False (on the class or an instance): differentiate through every point, the reference
    # computation that benchmarks/train_step.py times against the winners-only pass.
    winner_backward = True

    def __init__(self, config: PointCloudEncoderConfig):
        super().__init__()
        layers: list[nn.Module] = []
        dim = 6 if config.use_rgb else 3
        for index, hidden in enumerate(config.hidden_dims):
            layers.append(nn.Linear(dim, hidden))
            if index < len(config.hidden_dims) - 1:
                layers += [nn.LayerNorm(hidden), nn.GELU()]
            dim = hidden
        self.net = nn.Sequential(*layers)
        self.use_rgb = config.use_rgb
        self.feature_dim = dim

    def _points(self, xyz: torch.Tensor, rgb: torch.Tensor | None) -> torch.Tensor:
        points = xyz.float()
        if self.use_rgb:
            if rgb is None:
                raise ValueError("PointCloudEncoder(use_rgb=True) needs rgb")
            points = torch.cat([points, rgb.float() / 255.0], dim=-1)
        return points

    def forward(
        self, xyz: torch.Tensor, rgb: torch.Tensor | None = None, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        points = self._points(xyz, rgb)
        keep = None if mask is None else mask[..., None].bool()
        needs_grad = torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())
        if not (needs_grad and self.winner_backward and len(self.net)):
            per_point = self.net(points)
            if keep is not None:
                per_point = per_point.masked_fill(~keep, float("-inf"))
            pooled = per_point.amax(dim=-2)
            return torch.nan_to_num(pooled, neginf=0.0)  # an all-masked cloud encodes to zeros
        winners = self._winners(points, keep)
        # The winner of channel c, through every layer but the last, then the last layer's row c.
        selected = points.gather(-2, winners[..., None].expand(*winners.shape, points.shape[-1]))
        hidden = self.net[:-1](selected)  # (..., out_dim, last hidden)
        last = self.net[-1]
        pooled = (hidden * last.weight).sum(dim=-1) + last.bias
        if keep is not None:  # an all-masked cloud encodes to zeros (and passes no gradient)
            pooled = pooled * keep.any(dim=-2).to(pooled.dtype)
        return pooled

    @torch.no_grad()
    def _winners(self, points: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        """(..., N, C) points -> (..., out_dim) index of the point that wins each channel's max-pool."""
        n_points, channels = points.shape[-2:]
        flat = points.reshape(-1, n_points, channels)
        flat_keep = None if keep is None else keep.reshape(-1, n_points, 1)
        body, weight = self.net[:-1], self.net[-1].weight
        # A few thousand points at a time keep the per-point activations in cache (about twice as
        # fast as one pass over the batch); the last layer's bias is a per-channel constant that
        # cannot move the argmax, so it is left out.
        per_chunk = max(1, WINNER_SEARCH_POINTS // n_points)
        winners = []
        for start in range(0, len(flat), per_chunk):
            scores = torch.matmul(body(flat[start : start + per_chunk]), weight.T)
            if flat_keep is not None:
                scores.masked_fill_(~flat_keep[start : start + per_chunk], float("-inf"))
            winners.append(scores.max(dim=-2).indices)  # faster than argmax along this axis
        if not winners:
            return torch.zeros((*points.shape[:-2], self.feature_dim), dtype=torch.long, device=points.device)
        return torch.cat(winners).view(*points.shape[:-2], self.feature_dim)


class ObservationEncoder(nn.Module):
    """Encode a window of observations: key -> (B, T, ...) to a flat (B, output_dim) condition.

    Args:
        features: the store's feature spec (key -> FeatureSpec or dict with ``kind`` and ``shape``).
        obs_keys: the observed keys, in order; each must be in ``features`` (checked here).
        n_offsets: key -> number of frames in the key's observation window.
        image: image encoder settings; low_dim: low-dim encoder settings.
        low_dim_shapes: optional key -> per-frame size overriding the store's shape (when the policy
            transforms a key before encoding, e.g. a pose history turned into relative pos + rot6d).
        activation_checkpointing: recompute image backbones in the backward pass.

    ``forward`` returns the concatenation over keys (in ``obs_keys`` order) and time of per-frame
    features; :meth:`encode_tokens` returns them per key as (B, T, D) for token-based policies.
    """

    def __init__(
        self,
        features: Mapping[str, Any],
        obs_keys: Sequence[str],
        n_offsets: Mapping[str, int],
        image: ImageEncoderConfig | None = None,
        low_dim: LowDimEncoderConfig | None = None,
        low_dim_shapes: Mapping[str, int] | None = None,
        activation_checkpointing: bool = False,
    ):
        super().__init__()
        image = image or ImageEncoderConfig()
        low_dim = low_dim or LowDimEncoderConfig()
        features = {key: feature_to_dict(spec) for key, spec in features.items()}
        missing = [key for key in obs_keys if key not in features]
        if missing:
            raise KeyError(
                f"observation keys {missing} are not in the store's features (available: {sorted(features)})"
            )
        self.obs_keys = list(obs_keys)
        self.encoders = nn.ModuleDict()
        self._slots: dict[str, str] = {}
        shared_backbone: nn.Module | None = None
        output_dim = 0
        for index, key in enumerate(self.obs_keys):
            spec = features[key]
            slot = f"k{index}"
            self._slots[key] = slot
            if spec["kind"] == "image":
                if image.shared and shared_backbone is None:
                    shared_backbone = create_backbone(image)
                encoder: nn.Module = ImageEncoder(
                    spec["shape"],
                    image,
                    backbone=shared_backbone,
                    activation_checkpointing=activation_checkpointing,
                )
            elif spec["kind"] == "low_dim":
                size = (low_dim_shapes or {}).get(key)
                if size is None:
                    size = 1
                    for dim in spec["shape"]:
                        size *= int(dim)
                encoder = LowDimEncoder(int(size), low_dim)
            else:
                raise ValueError(
                    f"observation key {key!r} has kind {spec['kind']!r}; this encoder handles 'image' and "
                    "'low_dim' keys (use PointCloudEncoder for point clouds)"
                )
            self.encoders[slot] = encoder
            output_dim += encoder.feature_dim * int(n_offsets[key])
        self.output_dim = output_dim

    def encoder_for(self, key: str) -> nn.Module:
        return self.encoders[self._slots[key]]

    def image_parameters(self) -> list[nn.Parameter]:
        """Parameters of the image backbones (for a separate learning rate); shared ones once."""
        seen: set[int] = set()
        params = []
        for module in self.encoders.values():
            if isinstance(module, ImageEncoder):
                for param in module.parameters():
                    if id(param) not in seen:
                        seen.add(id(param))
                        params.append(param)
        return params

    def encode_tokens(self, obs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {key: self.encoders[self._slots[key]](obs[key]) for key in self.obs_keys}

    def forward(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        tokens = self.encode_tokens(obs)
        return torch.cat([tokens[key].flatten(1) for key in self.obs_keys], dim=-1)
