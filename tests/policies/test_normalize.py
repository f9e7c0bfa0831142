"""The normaliser: raises without statistics, round-trips, and travels in the state dict."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from demoscale.policies.normalize import MissingStatisticsError, Normalizer


def test_raises_without_statistics():
    normalizer = Normalizer({"state": [3]}, {"state": "min_max"})
    with pytest.raises(MissingStatisticsError, match="'state'"):
        normalizer.normalize("state", torch.zeros(2, 3))
    with pytest.raises(MissingStatisticsError, match="'other'"):
        normalizer.normalize("other", torch.zeros(2, 3))
    with pytest.raises(MissingStatisticsError, match="lack"):
        normalizer.set_stats("state", {"mean": np.zeros(3)})


@pytest.mark.parametrize("mode", ["min_max", "mean_std"])
def test_round_trip_and_range(mode):
    rng = np.random.default_rng(0)
    data = rng.normal(3.0, 2.0, size=(1000, 4)).astype(np.float32)
    data[:, 3] = 7.0  # a constant dimension must not blow up
    stats = {"min": data.min(0), "max": data.max(0), "mean": data.mean(0), "std": data.std(0)}
    normalizer = Normalizer({"x": [4]}, {"x": mode}, {"x": stats})
    values = torch.from_numpy(data)
    normalized = normalizer.normalize("x", values)
    assert torch.isfinite(normalized).all()
    if mode == "min_max":
        assert normalized[:, :3].min() >= -1 - 1e-5 and normalized[:, :3].max() <= 1 + 1e-5
        assert torch.allclose(normalized[:, :3].amin(0), torch.full((3,), -1.0), atol=1e-5)
    else:
        assert torch.allclose(normalized[:, :3].mean(0), torch.zeros(3), atol=1e-4)
    assert torch.allclose(normalized[:, 3], torch.zeros(1000), atol=1e-6)
    assert torch.allclose(normalizer.unnormalize("x", normalized), values, atol=1e-4)


def test_statistics_travel_in_the_state_dict():
    stats = {"min": np.array([-2.0, 0.0]), "max": np.array([2.0, 10.0])}
    source = Normalizer({"a": [2]}, {"a": "min_max"}, {"a": stats})
    target = Normalizer({"a": [2]}, {"a": "min_max"})
    target.load_state_dict(source.state_dict())
    out = target.normalize("a", torch.tensor([[2.0, 0.0]]))
    assert torch.allclose(out, torch.tensor([[1.0, -1.0]]))


def test_temporal_ensembler_averages_overlapping_chunks():
    from demoscale.policies import TemporalEnsembler

    ensembler = TemporalEnsembler(decay=0.0)
    ensembler.add(0, np.array([[0.0], [1.0], [2.0]]))
    assert ensembler.action(1) == pytest.approx([1.0])
    ensembler.add(1, np.array([[3.0], [5.0], [7.0]]))
    assert ensembler.action(1) == pytest.approx([2.0])  # mean of 1 (old chunk) and 3 (new chunk)
    assert ensembler.action(3) == pytest.approx([7.0])  # only the new chunk reaches step 3
    weighted = TemporalEnsembler(decay=np.log(3.0))  # newest weight 1, previous 1/3
    weighted.add(0, np.array([[0.0], [0.0]]))
    weighted.add(1, np.array([[4.0], [4.0]]))
    assert weighted.action(1) == pytest.approx([3.0])
    with pytest.raises(ValueError, match="step 9"):
        weighted.action(9)
