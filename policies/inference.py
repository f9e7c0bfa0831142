"""Load a trained policy from its checkpoint alone and predict action chunks in absolute units."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from demoscale.policies.base import check_noise_scale
from demoscale.policies.checkpoints import CheckpointError, load_checkpoint
from demoscale.policies.families import UnknownFamilyError, get_family
from demoscale.policies.lightning_module import CHECKPOINT_KEY


class Policy:
    """A trained policy ready to act (EMA weights, eval mode), over any family's network
    (:class:`~demoscale.policies.base.PolicyNetwork`).

    Attributes:
        obs_offsets: key -> frame offsets of the observation window the policy expects.
        features: the store's feature spec (key -> dict with kind, shape, dtype, ...).
        action_keys: store keys concatenated into the action vector.
        horizon: actions per predicted chunk.
        n_action_steps: how many actions of a chunk to execute before asking again.
        inference_delay: control steps between the observation a chunk is predicted from and its
            first executed action in rollouts (0: none; see
            :func:`~demoscale.policies.base.check_execution`). Like ``n_action_steps``, the saved
            config's value, which a caller may change before a rollout.
        temporal_ensemble: ``None`` (execute chunks) or a :class:`TemporalEnsembler` decay: rollouts
            then predict a chunk at every step and act on the average of the overlapping
            predictions (ACT's temporal ensembling). An inference setting, ``None`` when loaded.
        chunk_samples: candidate chunks sampled per replan in rollouts (1: the one sample). Above 1,
            the rollout keeps the candidate most coherent with the previous chunk (see
            :func:`most_coherent`; Bidirectional Decoding's backward coherence, Liu et al. 2024):
            a way to commit to the mode already under way instead of switching between modes
            from one chunk to the next. Costs ``chunk_samples`` times the sampling. An inference
            setting, 1 when loaded.
        coherence_decay: the weight ``coherence_decay ** i`` of the i-th shared step in that
            comparison (0.5: the nearest steps count most).
        noise_scale: the sampler's starting-noise scale (``DiffusionConfig.noise_scale``,
            ``WBVIMAConfig.noise_scale``: the saved config's value, changeable here); ``None`` for
            families whose sampler has none.
        family: the policy family of the checkpoint.
    """

    def __init__(
        self, network: torch.nn.Module, meta: Mapping[str, Any], device: str, num_inference_steps: int | None
    ):
        self.network = network.to(device).eval()
        self.device = torch.device(device)
        self.family = meta["family"]
        self.features = dict(meta["features"])
        config = network.config
        self.obs_offsets = {k: list(v) for k, v in config.obs_offsets.items()}
        self.action_keys = list(config.action_keys)
        self.horizon = int(config.horizon)
        self.n_action_steps = int(config.n_action_steps)
        self.inference_delay = int(getattr(config, "inference_delay", 0))  # older checkpoints: none
        self.temporal_ensemble: float | None = None
        self.chunk_samples = 1
        self.coherence_decay = 0.5
        default_steps = getattr(config, "num_inference_steps", None)  # only iterative samplers have one
        self.num_inference_steps = num_inference_steps or (int(default_steps) if default_steps else None)
        self.action_dim = int(network.action_dim)

    @property
    def noise_scale(self) -> float | None:
        value = getattr(self.network.config, "noise_scale", None)
        return None if value is None else float(value)

    @noise_scale.setter
    def noise_scale(self, value: float) -> None:
        if not hasattr(self.network.config, "noise_scale"):
            raise ValueError(f"{self.family} policies have no noise scale to set")
        check_noise_scale(value)
        self.network.config.noise_scale = float(value)

    def _to_tensors(self, obs_window: Mapping[str, np.ndarray], batched: bool) -> dict[str, torch.Tensor]:
        obs = {}
        for key, offsets in self.obs_offsets.items():
            if key not in obs_window:
                raise KeyError(
                    f"observation window lacks key {key!r} (the policy observes {sorted(self.obs_offsets)})"
                )
            value = np.asarray(obs_window[key])
            if not batched:
                value = value[None]
            spec = self.features[key]
            expected = (len(offsets), *spec["shape"])
            if tuple(value.shape[1:]) != expected:
                raise ValueError(
                    f"observation {key!r} has shape {tuple(value.shape[1:])} per window, expected {expected} "
                    f"(offsets {offsets})"
                )
            dtype = torch.uint8 if spec["kind"] == "image" else torch.float32
            obs[key] = torch.as_tensor(value).to(self.device, dtype)
        return obs

    def predict_action_batch(
        self, obs_windows: Mapping[str, np.ndarray], seed: int | None = None
    ) -> np.ndarray:
        """Batched windows (key -> (B, n_offsets, *shape)) -> (B, horizon, action_dim) absolute actions."""
        obs = self._to_tensors(obs_windows, batched=True)
        generator = None
        if seed is not None:
            generator = torch.Generator(self.device).manual_seed(seed)
        with torch.no_grad():
            condition = self.network.encode(obs)
            actions = self.network.act_from_condition(condition, obs, self.num_inference_steps, generator)
        return actions.float().cpu().numpy()

    def predict_action(self, obs_window: Mapping[str, np.ndarray], seed: int | None = None) -> np.ndarray:
        """One window (key -> (n_offsets, *shape), images uint8 HWC) -> (horizon, action_dim)."""
        obs = {k: np.asarray(v)[None] for k, v in obs_window.items() if k in self.obs_offsets}
        missing = [k for k in self.obs_offsets if k not in obs]
        if missing:
            raise KeyError(
                f"observation window lacks keys {missing} (the policy observes {sorted(self.obs_offsets)})"
            )
        return self.predict_action_batch(obs, seed=seed)[0]


def most_coherent(candidates: np.ndarray, previous: np.ndarray, shift: int, decay: float = 0.5) -> int:
    """The index of the candidate chunk (``candidates``: (n, horizon, action_dim)) that agrees best
    with ``previous``, the chunk predicted ``shift`` control steps earlier: candidate action i is for
    the step of previous action ``shift + i``. Distance: the Euclidean distance in action units per
    shared step, weighted ``decay ** i`` (so the steps about to run count most), as Bidirectional
    Decoding's backward coherence."""
    candidates, previous = np.asarray(candidates, float), np.asarray(previous, float)
    shared = previous.shape[0] - shift
    if shared < 1 or shared > candidates.shape[1]:
        raise ValueError(
            f"a chunk of {previous.shape[0]} actions {shift} steps earlier shares no step with chunks of "
            f"{candidates.shape[1]}"
        )
    distances = np.linalg.norm(candidates[:, :shared] - previous[None, shift:], axis=-1)
    weights = decay ** np.arange(shared)
    return int(np.argmin(distances @ (weights / weights.sum())))


class TemporalEnsembler:
    """Average the overlapping predictions of successive chunks for the current step.

    Call :meth:`add` with each new chunk (horizon, action_dim) predicted at control step ``step``;
    :meth:`action` returns the weighted mean of every stored prediction for ``step``, with weights
    ``exp(-decay * age)`` (age 0 = the newest chunk; ``decay=0`` = plain mean). Predictions for past
    steps are dropped.
    """

    def __init__(self, decay: float = 0.0):
        self.decay = decay
        self._chunks: list[tuple[int, np.ndarray]] = []

    def reset(self) -> None:
        self._chunks = []

    def add(self, step: int, chunk: np.ndarray) -> None:
        self._chunks.append((int(step), np.asarray(chunk)))

    def action(self, step: int) -> np.ndarray:
        self._chunks = [(s, c) for s, c in self._chunks if s + len(c) > step]
        if not self._chunks:
            raise ValueError(f"no stored chunk covers step {step}")
        values, weights = [], []
        for age, (start, chunk) in enumerate(reversed(self._chunks)):
            if start <= step:
                values.append(chunk[step - start])
                weights.append(np.exp(-self.decay * age))
        if not values:
            raise ValueError(f"no stored chunk covers step {step}")
        weights_arr = np.asarray(weights)[:, None]
        return (np.stack(values) * weights_arr).sum(0) / weights_arr.sum()


def load_policy(
    checkpoint_path: str | os.PathLike[str], device: str = "cpu", num_inference_steps: int | None = None
) -> Policy:
    """Rebuild a policy from a checkpoint alone (feature spec and statistics travel inside it).

    The file is read without running code from it (:func:`~demoscale.policies.checkpoints.load_checkpoint`);
    the checkpoint's ``family`` is looked up in the registry (:mod:`demoscale.policies.families`),
    whose entry rebuilds the config and the network. Raises
    :class:`~demoscale.policies.checkpoints.CheckpointError` (a ``ValueError``) for a hostile or
    damaged file or one that is not a demoscale policy, and :class:`~demoscale.policies.families.UnknownFamilyError`
    (also a ``ValueError``) for a family not registered. Uses the EMA
    weights when the run kept them.
    """
    path = os.fspath(checkpoint_path)
    checkpoint = load_checkpoint(path)
    meta = checkpoint.get(CHECKPOINT_KEY)
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path} is not a demoscale policy checkpoint (no '{CHECKPOINT_KEY}' metadata)")
    try:
        family = get_family(meta.get("family"))
    except UnknownFamilyError as error:
        raise UnknownFamilyError(f"{path}: {error}") from None
    try:
        network = family.build_network(family.config_from_dict(meta["policy_config"]), meta["features"])
        prefix = "ema.averaged." if meta.get("ema") else "policy."
        weights = checkpoint.get("state_dict")
        state = {k[len(prefix) :]: v for k, v in (weights or {}).items() if k.startswith(prefix)}
        if not state:
            raise CheckpointError(f"{path} has no weights under {prefix!r}")
        network.load_state_dict(state, strict=True)
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as error:
        raise CheckpointError(
            f"{path}: its policy metadata or weights do not fit together ({type(error).__name__}: {error})"
        ) from None
    return Policy(network, meta, device, num_inference_steps)
