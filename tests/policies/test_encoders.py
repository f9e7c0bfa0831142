"""Image encoders with spatial-softmax keypoints, and the MLP denoiser."""

from __future__ import annotations

import math

import pytest
import torch
from demoscale.policies.encoders import ImageEncoder, ImageEncoderConfig, SpatialSoftmax
from demoscale.policies.mlp_denoiser import ConditionalMLP

torch.set_num_threads(1)

TINY_RESNET = {"channels": [8, 16, 32, 64], "stem_width": 8}


def test_spatial_softmax_finds_the_hot_spot():
    layer = SpatialSoftmax(channels=1, keypoints=1)
    with torch.no_grad():
        layer.to_heatmaps.weight.fill_(1.0)
        layer.to_heatmaps.bias.zero_()
        layer.log_temperature.fill_(math.log(0.01))
    feature_map = torch.zeros(2, 1, 8, 8)
    feature_map[0, 0, 2, 5] = 10.0  # row 2, column 5
    feature_map[1, 0, 7, 0] = 10.0
    keypoints = layer(feature_map)
    expected = torch.tensor([[-1 + 2 * 5 / 7, -1 + 2 * 2 / 7], [-1.0, 1.0]])
    torch.testing.assert_close(keypoints, expected, atol=1e-4, rtol=0)


def test_keypoint_encoder_outputs_coordinates_and_trains_its_backbone():
    config = ImageEncoderConfig(
        backbone="resnet10t",
        backbone_kwargs=TINY_RESNET,
        pooling="spatial_softmax",
        keypoints=12,
        feature_stage=2,
        crop_fraction=0.9,
        color_jitter=(0.0, 0.0, 0.0, 0.0),
    )
    encoder = ImageEncoder((32, 32, 3), config).train()
    assert encoder.feature_dim == 24
    images = torch.randint(0, 256, (3, 2, 32, 32, 3), dtype=torch.uint8)
    features = encoder(images)
    assert features.shape == (3, 2, 24)
    assert features.abs().max() <= 1.0  # soft-argmax coordinates live in [-1, 1]
    features.sum().backward()
    first_conv = next(p for name, p in encoder.backbone.named_parameters() if "conv" in name)
    assert first_conv.grad is not None and first_conv.grad.abs().sum() > 0


def test_keypoint_encoder_rejects_a_stage_the_backbone_lacks():
    config = ImageEncoderConfig(
        backbone="resnet10t", backbone_kwargs=TINY_RESNET, pooling="spatial_softmax", feature_stage=9
    )
    with pytest.raises(ValueError, match="feature map"):
        ImageEncoder((32, 32, 3), config)


def test_unknown_pooling_is_refused():
    with pytest.raises(ValueError, match="pooling"):
        ImageEncoderConfig(pooling="max")


def test_mlp_denoiser_shapes_and_conditioning():
    torch.manual_seed(0)
    denoiser = ConditionalMLP(action_dim=10, horizon=6, cond_dim=5, width=32, depth=2, step_embed_dim=16)
    sample = torch.randn(4, 6, 10)
    cond = torch.randn(4, 5)
    out = denoiser(sample, torch.tensor(3), cond)
    assert out.shape == sample.shape
    # The output depends on the condition and on the step, not only on the noisy chunk.
    assert not torch.allclose(out, denoiser(sample, torch.tensor(3), cond + 1.0))
    assert not torch.allclose(out, denoiser(sample, torch.tensor(40), cond))
    with pytest.raises(ValueError, match="chunks of"):
        denoiser(torch.randn(4, 8, 10), torch.tensor(3), cond)


def test_point_cloud_winner_backward_equals_differentiating_every_point():
    # The training path recomputes only each channel's max-pool winner with autograd; features and
    # parameter gradients must be those of the plain masked max-pool over every point.
    from demoscale.policies.encoders import PointCloudEncoder, PointCloudEncoderConfig

    torch.manual_seed(0)
    encoder = PointCloudEncoder(PointCloudEncoderConfig(hidden_dims=[16, 32, 24]))
    generator = torch.Generator().manual_seed(1)
    xyz = torch.rand(3, 2, 700, 3, generator=generator) * 2 - 1
    rgb = torch.randint(0, 256, (3, 2, 700, 3), generator=generator, dtype=torch.uint8)
    mask = torch.rand(3, 2, 700, generator=generator) > 0.3
    mask[1, 0] = False  # an all-padding cloud encodes to zeros
    xyz[2, 1, 10:20], rgb[2, 1, 10:20] = xyz[2, 1, 0], rgb[2, 1, 0]  # duplicates tie in the max-pool
    weights = torch.randn(3, 2, 24, generator=generator)

    def features_and_gradients(winner_backward: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        encoder.winner_backward = winner_backward
        encoder.zero_grad()
        features = encoder(xyz, rgb, mask)
        (features * weights).sum().backward()
        return features.detach(), [p.grad.clone() for p in encoder.parameters()]

    reference, reference_grads = features_and_gradients(False)
    features, grads = features_and_gradients(True)
    torch.testing.assert_close(features, reference, rtol=1e-5, atol=1e-6)
    assert torch.equal(features[1, 0], torch.zeros(24))
    for grad, expected in zip(grads, reference_grads, strict=True):
        torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-6)
    with torch.no_grad():  # inference takes the plain path: bit for bit what it always computed
        assert torch.equal(encoder(xyz, rgb, mask), reference)
