"""Checkpoints saved by an earlier version still load and act the same (tests/fixtures/checkpoints/).

Each fixture is a tiny policy trained through ``demoscale train`` and saved as Lightning wrote it,
with one observation window and the actions ``load_policy`` predicted for it when it was saved. A
change to a network's parameter names or shapes, to the checkpoint metadata, to the configs that
rebuild a network, to normalisation or to sampling fails here instead of in a user's hands.
``tests/fixtures/checkpoints/regenerate.py`` rewrites them, for a deliberate format change only.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest
import torch
from demoscale.policies import get_family, load_policy
from demoscale.policies.lightning_module import CHECKPOINT_FORMAT, CHECKPOINT_KEY

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints"

# fixture name -> (family, action size, horizon)
SAVED = {
    "diffusion": ("diffusion", 7, 8),
    "diffusion_waypoint": ("diffusion", 7, 4),
    "wbvima": ("wbvima", 21, 4),
}


def _saved_window(name: str) -> tuple[dict[str, np.ndarray], np.ndarray, int]:
    with np.load(FIXTURES / f"{name}.npz") as saved:
        window = {key.removeprefix("obs/"): saved[key] for key in saved.files if key.startswith("obs/")}
        return window, saved["action"], int(saved["seed"])


@pytest.mark.parametrize("name", sorted(SAVED))
def test_saved_checkpoint_predicts_the_actions_it_predicted_when_saved(name: str) -> None:
    family, action_dim, horizon = SAVED[name]
    policy = load_policy(FIXTURES / f"{name}.ckpt")
    assert policy.family == family
    assert (policy.action_dim, policy.horizon) == (action_dim, horizon)
    window, expected, seed = _saved_window(name)
    assert set(window) == set(policy.obs_offsets)
    action = policy.predict_action(window, seed=seed)
    assert action.shape == expected.shape == (horizon, action_dim)
    np.testing.assert_allclose(action, expected, rtol=1e-4, atol=1e-5)
    # Batched prediction of the same window draws the same noise.
    batch = {key: value[None] for key, value in window.items()}
    np.testing.assert_allclose(
        policy.predict_action_batch(batch, seed=seed)[0], expected, rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize("name", sorted(SAVED))
def test_saved_checkpoint_metadata_is_readable_without_pickled_classes(name: str) -> None:
    # Only tensors and plain containers: the checkpoint opens with torch's restricted unpickler.
    checkpoint = torch.load(FIXTURES / f"{name}.ckpt", map_location="cpu", weights_only=True)
    meta = checkpoint[CHECKPOINT_KEY]
    assert meta["family"] == SAVED[name][0]
    assert 1 <= meta["format"] <= CHECKPOINT_FORMAT
    assert {"policy_config", "features", "stats", "ema", "module_class"} <= set(meta)
    prefix = "ema.averaged." if meta["ema"] else "policy."
    assert any(key.startswith(prefix) for key in checkpoint["state_dict"])
    # The module class it recorded (the diffusion module's old home among them) still imports.
    module_path, _, class_name = meta["module_class"].rpartition(".")
    module_class = getattr(importlib.import_module(module_path), class_name)
    assert module_class is get_family(meta["family"]).module_class()


def test_noise_scale_sets_the_sampling_temperature_of_a_saved_diffusion_policy() -> None:
    """Saved before the setting existed, a policy samples from the training noise (1.0); at 0 it is
    deterministic (every seed, the same chunk), in between its chunks vary less across seeds. The
    whole-body family's heads take the same setting."""
    policy = load_policy(FIXTURES / "diffusion.ckpt")
    window, expected, seed = _saved_window("diffusion")
    assert policy.noise_scale == 1.0
    np.testing.assert_allclose(policy.predict_action(window, seed=seed), expected, rtol=1e-4, atol=1e-5)

    def spread(scale: float) -> float:
        policy.noise_scale = scale
        chunks = np.stack([policy.predict_action(window, seed=s) for s in range(8)])
        return float(chunks.std(axis=0).mean())

    full, half, none = spread(1.0), spread(0.5), spread(0.0)
    assert none < 1e-6  # the same chunk up to float rounding
    assert 1e-4 < half < full
    for bad in (-0.1, float("nan")):
        with pytest.raises(ValueError, match="noise_scale must be a finite number >= 0"):
            policy.noise_scale = bad
    assert policy.noise_scale == 0.0  # a refused value leaves the setting as it was
    wholebody = load_policy(FIXTURES / "wbvima.ckpt")
    window, expected, seed = _saved_window("wbvima")
    assert wholebody.noise_scale == 1.0
    np.testing.assert_allclose(wholebody.predict_action(window, seed=seed), expected, rtol=1e-4, atol=1e-5)
    wholebody.noise_scale = 0.0
    chunks = [wholebody.predict_action(window, seed=s) for s in range(3)]
    assert max(float(np.abs(chunk - chunks[0]).max()) for chunk in chunks) < 1e-5
