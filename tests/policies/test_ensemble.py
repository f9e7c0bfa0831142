"""Diffusion checkpoints denoising together (``load_ensemble``), on the saved fixture checkpoints:
an ensemble of one network with itself predicts exactly what that network predicts (the averaging
sits inside one sampling loop), a different member moves the prediction, and members that cannot
be averaged are refused with the file and the reason."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from demoscale.policies import load_ensemble, load_policy
from demoscale.policies.ensemble import check_members

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints"


def _window(name: str) -> tuple[dict[str, np.ndarray], int]:
    with np.load(FIXTURES / f"{name}.npz") as saved:
        return {k.removeprefix("obs/"): saved[k] for k in saved.files if k.startswith("obs/")}, int(
            saved["seed"]
        )


def test_an_ensemble_of_one_network_with_itself_predicts_what_it_predicts(tmp_path: Path) -> None:
    copy = tmp_path / "copy.ckpt"
    shutil.copy(FIXTURES / "diffusion.ckpt", copy)
    window, seed = _window("diffusion")
    single = load_policy(FIXTURES / "diffusion.ckpt")
    ensemble = load_ensemble([FIXTURES / "diffusion.ckpt", copy])
    assert (ensemble.horizon, ensemble.action_dim, ensemble.family) == (
        single.horizon,
        single.action_dim,
        "diffusion",
    )
    np.testing.assert_allclose(
        ensemble.predict_action(window, seed=seed),
        single.predict_action(window, seed=seed),
        rtol=1e-5,
        atol=1e-6,
    )
    # Its inference settings are the ensemble's: at noise scale 0 both are deterministic and agree.
    ensemble.noise_scale = single.noise_scale = 0.0
    np.testing.assert_allclose(
        ensemble.predict_action(window, seed=1), single.predict_action(window, seed=2), atol=1e-6
    )


def test_a_different_member_moves_the_prediction() -> None:
    window, seed = _window("diffusion")
    ensemble = load_ensemble([FIXTURES / "diffusion.ckpt", FIXTURES / "diffusion.ckpt"])
    before = ensemble.predict_action(window, seed=seed)
    with torch.no_grad():
        for parameter in ensemble.network.members[1].denoiser.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    after = ensemble.predict_action(window, seed=seed)
    assert np.abs(after - before).max() > 1e-3


def test_members_that_cannot_denoise_together_are_refused() -> None:
    names = [str(FIXTURES / "diffusion.ckpt"), str(FIXTURES / "wbvima.ckpt")]
    with pytest.raises(ValueError, match="wbvima.ckpt: only diffusion policies denoise together"):
        load_ensemble(names)
    with pytest.raises(ValueError, match="at least two checkpoints"):
        load_ensemble(names[:1])
    # Another diffusion fixture, on the same data, observing other keys.
    with pytest.raises(
        ValueError, match="diffusion_waypoint.ckpt: obs_offsets .* differs from .*diffusion.ckpt's"
    ):
        load_ensemble([FIXTURES / "diffusion.ckpt", FIXTURES / "diffusion_waypoint.ckpt"])
    # The same network with other normalisation statistics (trained on other data).
    a, b = load_policy(FIXTURES / "diffusion.ckpt"), load_policy(FIXTURES / "diffusion.ckpt")
    with torch.no_grad():
        next(iter(b.network.normalizer.buffers())).add_(1.0)
    with pytest.raises(ValueError, match="b.ckpt: its normalisation statistics differ from a.ckpt's"):
        check_members([a, b], ["a.ckpt", "b.ckpt"])
    b = load_policy(FIXTURES / "diffusion.ckpt")
    b.features = {**b.features, "extra": {"kind": "low_dim", "shape": [1]}}
    with pytest.raises(ValueError, match="b.ckpt: its feature spec differs from a.ckpt's"):
        check_members([a, b], ["a.ckpt", "b.ckpt"])
    b = load_policy(FIXTURES / "diffusion.ckpt")
    b.network.config.horizon = 4
    with pytest.raises(ValueError, match="b.ckpt: horizon 4 differs from a.ckpt's 8"):
        check_members([a, b], ["a.ckpt", "b.ckpt"])
