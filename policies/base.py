"""The contract every policy family implements: its config and its network.

A family is three things, named once in the registry (:mod:`demoscale.policies.families`):

- a **config** dataclass (:class:`PolicyConfig`): what the policy observes and predicts; YAML maps onto
  it under ``model.init_args.policy`` and checkpoints carry it as a plain dict;
- a **network** (:class:`PolicyNetwork`), a plain ``nn.Module`` built by ``network(config, features,
  stats)`` from the store's feature spec and normalisation statistics (``stats`` is None when a
  checkpoint's weights, statistics included, are loaded right after); subclassing
  :class:`PolicyNetworkBase` adds ``compute_loss`` and ``predict_action``;
- a **LightningModule**, a subclass of :class:`~demoscale.policies.lightning_module.PolicyModule` whose
  ``family`` is the registry name and whose ``__init__(self, policy: Config | None = None, **kwargs)``
  types ``policy`` with the config class (so the training CLI parses YAML into it) and passes
  ``kwargs`` on to the base. Training, validation, logging, EMA, checkpoints and loading
  are the base module's; a family overrides only what differs (``policy_statistics``,
  ``check_features``, ``encoder_parameters``).

Inference composes the network's two halves: ``encode(obs)`` (the slow module: observation window ->
condition) and ``act_from_condition(condition, obs, num_inference_steps, generator)`` (the fast
module: condition -> action chunk in absolute units), so that
:class:`~demoscale.policies.executor.HierarchicalExecutor` can run them at different rates. Nothing
passes between calls through the network's attributes: ``compute_losses`` recomputes what it needs
(safe under threads, DDP and ``torch.compile``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

LOSS = "loss"  # the key of the total loss in ``compute_losses``' result; every other key is a logged part


@runtime_checkable
class PolicyConfig(Protocol):
    """What every family's config states (fields or properties).

    Attributes:
        obs_offsets: observed store key -> frame offsets of its window (each <= 0, containing 0).
        action_keys: store keys concatenated, in order, into the predicted action vector.
        horizon: actions per predicted chunk.
        n_action_steps: actions of a chunk executed before the policy is asked again.

    Optional: ``inference_delay`` (control steps a chunk's computation takes on the robot, simulated in
    rollouts; see :func:`check_execution`; absent = 0), ``num_inference_steps`` (the default of
    iterative samplers, overridable at load time),
    ``waypoint_keys`` (keys of the next-waypoint frame the training samples must carry; empty or
    absent = none), ``target_keys`` (low-dim keys whose current frame the training samples carry as
    ``targets``, predicted but never observed; empty or absent = none), ``validate()`` (raise ValueError on settings that cannot work; called when the
    LightningModule is built, before any data is read).
    """

    @property
    def obs_offsets(self) -> Mapping[str, list[int]]: ...

    @property
    def action_keys(self) -> list[str]: ...

    @property
    def horizon(self) -> int: ...

    @property
    def n_action_steps(self) -> int: ...


@runtime_checkable
class PolicyNetwork(Protocol):
    """What every family's network provides (on batches in the sample format of ``demoscale.datasets``).

    Attributes:
        config: the family's config (a :class:`PolicyConfig`).
        action_dim: size of one action vector (the sum of the ``action_keys`` sizes).
    """

    config: Any
    action_dim: int

    def compute_losses(self, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """Training losses of a batch: ``"loss"`` (the total to minimise) and any parts worth logging.

        Randomness (noise, augmentation) comes from torch's global generator, which the
        LightningModule seeds per step.
        """
        ...

    def encode(self, obs: Mapping[str, torch.Tensor]) -> Any:
        """Observation windows (key -> (B, T, ...)) -> a condition (a tensor, or a dict of them)."""
        ...

    def act_from_condition(
        self,
        condition: Any,
        obs: Mapping[str, torch.Tensor],
        num_inference_steps: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """A condition from :meth:`encode` (and the same observation windows) -> (B, horizon,
        action_dim) actions in the store's absolute units; no gradient needed."""
        ...


class PolicyNetworkBase(nn.Module):
    """An optional base class of a family's network: the conveniences every network shares, built on
    the contract's methods (it adds no parameters, so state-dict keys are unchanged)."""

    def compute_loss(self, batch: Mapping[str, Any], **kwargs: Any) -> torch.Tensor:
        """The total training loss (``compute_losses(batch)["loss"]``)."""
        return self.compute_losses(batch, **kwargs)[LOSS]

    @torch.no_grad()
    def predict_action(
        self,
        obs: Mapping[str, torch.Tensor],
        num_inference_steps: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Observation windows (B, T, ...) -> (B, horizon, action_dim) actions in absolute units: both
        halves at once."""
        return self.act_from_condition(self.encode(obs), obs, num_inference_steps, generator)


CONFIG_MEMBERS = ("obs_offsets", "action_keys", "horizon", "n_action_steps")
NETWORK_MEMBERS = ("config", "action_dim", "compute_losses", "encode", "act_from_condition")


def check_execution(
    horizon: int, n_action_steps: int, inference_delay: int = 0, temporal_ensemble: float | None = None
) -> None:
    """Raise ValueError unless a chunk of ``horizon`` actions can be executed ``n_action_steps`` at a
    time with ``inference_delay`` (and, if ``temporal_ensemble`` is a decay, ensembled).

    With a delay d, a chunk predicted from the observation at step t is first acted on at step t + d,
    from its action d (time-aligned, as on a robot that keeps moving while the policy computes):
    actions [d, n) of each chunk run, then its actions [n, n + d) while the next one is computed. So
    d <= n and n + d <= horizon. d = 0 is the usual receding-horizon execution. Temporal ensembling
    replans every step from the newest observation (one action per prediction), so it takes no delay.
    """
    if temporal_ensemble is not None and inference_delay:
        raise ValueError(
            "temporal ensembling replans at every step from the newest observation; "
            f"it does not combine with an inference delay ({inference_delay})"
        )
    if not 1 <= n_action_steps <= horizon:
        raise ValueError(f"n_action_steps {n_action_steps} must be in 1..horizon={horizon}")
    if not 0 <= inference_delay <= n_action_steps or n_action_steps + inference_delay > horizon:
        raise ValueError(
            f"inference_delay {inference_delay} must be in 0..n_action_steps={n_action_steps} with "
            f"n_action_steps + inference_delay <= horizon={horizon}: the previous chunk must cover the "
            "steps while the next one is computed"
        )


def check_noise_scale(noise_scale: float) -> None:
    """Raise ValueError unless ``noise_scale`` (the standard deviation of a sampler's starting noise
    relative to the training noise's) is a finite number >= 0."""
    if not (isinstance(noise_scale, int | float) and math.isfinite(noise_scale) and noise_scale >= 0):
        raise ValueError(
            f"noise_scale must be a finite number >= 0 (1.0: the training noise), got {noise_scale!r}"
        )


def check_chunk_samples(chunk_samples: int, coherence_decay: float) -> None:
    """Raise ValueError unless the values themselves are valid, whatever the execution: at least one
    candidate chunk per replan, a coherence decay in (0, 1]."""
    if not (isinstance(chunk_samples, int) and chunk_samples >= 1):
        raise ValueError(f"chunk_samples must be an integer >= 1 (1: no selection), got {chunk_samples!r}")
    if not (isinstance(coherence_decay, int | float) and 0 < coherence_decay <= 1):
        raise ValueError(f"coherence_decay must be in (0, 1], got {coherence_decay!r}")


def check_chunk_selection(
    chunk_samples: int,
    coherence_decay: float,
    n_action_steps: int,
    horizon: int,
    temporal_ensemble: float | None,
) -> None:
    """Raise ValueError unless ``chunk_samples`` candidate chunks per replan, kept by their coherence
    with the previous chunk (weights ``coherence_decay ** i`` over the shared steps), can run with
    this execution: at least one candidate, a decay in (0, 1], a previous chunk that still covers a
    step of the next one (``n_action_steps < horizon``), and chunks rather than temporal ensembling
    (which averages every chunk instead of keeping one)."""
    check_chunk_samples(chunk_samples, coherence_decay)
    if chunk_samples == 1:
        return
    if temporal_ensemble is not None:
        raise ValueError(
            f"chunk_samples {chunk_samples} keeps one candidate chunk; it does not combine with temporal "
            "ensembling, which averages every chunk"
        )
    if n_action_steps >= horizon:
        raise ValueError(
            f"chunk_samples {chunk_samples} needs chunks that overlap: n_action_steps {n_action_steps} "
            f"leaves no action of a {horizon}-action chunk to compare the next one with"
        )


def check_network(network: Any, family: str) -> None:
    """Raise TypeError naming what a family's network (or its config) lacks of the contract."""
    missing = [name for name in NETWORK_MEMBERS if not hasattr(network, name)]
    config = getattr(network, "config", None)
    if config is not None:
        missing += [f"config.{name}" for name in CONFIG_MEMBERS if not hasattr(config, name)]
    if missing:
        raise TypeError(
            f"the network of policy family {family!r} ({type(network).__name__}) lacks {missing} of the "
            "policy contract (demoscale.policies.base.PolicyNetwork)"
        )
