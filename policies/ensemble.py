"""Several trainings of one diffusion policy denoising together: an ensemble at inference.

Each denoising step averages the members' predictions (each from its own encoding of the
observation) before the scheduler takes the step, so the ensemble samples one chunk along one noise
trajectory, as a single network would: averaging finished chunks instead would average the modes
of different samples. The members must agree on everything that gives their outputs a meaning: the
family (``diffusion``), the feature spec, the chunk (observation offsets, action keys, horizon), the
sampler (scheduler, train timesteps, prediction type) and the action normalisation (trained on the
same data). Independent trainings differ mostly in where they fail; on state PushT three of them
averaged this way cover more of the goal than any of them alone (docs/results/pusht_state_24k_ensemble_pilot).

``load_ensemble(paths)`` returns an ordinary :class:`~demoscale.policies.inference.Policy` (its
inference settings, e.g. ``noise_scale``, apply to the ensemble as a whole), at the members' summed
cost per prediction.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from demoscale.policies.inference import Policy, load_policy

# What members must share for their averaged output to mean one thing.
SHARED_CONFIG = (
    "obs_offsets",
    "action_keys",
    "horizon",
    "action_representation",
    "noise_scheduler",
    "num_train_timesteps",
    "beta_schedule",
    "prediction_type",
    "clip_sample",
)


class EnsembleNetwork(torch.nn.Module):
    """Diffusion networks denoising one chunk together (see the module note); the policy contract's
    ``encode`` / ``act_from_condition``, with the first member's config (and its ``noise_scale``)."""

    def __init__(self, members: Sequence[torch.nn.Module]) -> None:
        super().__init__()
        self.members = torch.nn.ModuleList(members)
        lead = self.members[0]
        self.config = lead.config
        self.action_dim = lead.action_dim
        self.num_inference_steps = lead.num_inference_steps

    def encode(self, obs: Mapping[str, torch.Tensor]) -> list[Any]:
        return [member.encode(obs) for member in self.members]

    def act_from_condition(
        self,
        conds: Sequence[Any],
        obs: Mapping[str, torch.Tensor],
        num_inference_steps: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        from demoscale.policies.diffusion.model import sample_chunk

        lead = self.members[0]
        first = conds[0]

        def predict(noisy: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
            outputs = [m.denoiser(noisy, step, c).float() for m, c in zip(self.members, conds, strict=True)]
            return torch.stack(outputs).mean(0)

        sample = sample_chunk(
            self.config,
            (first.shape[0], self.config.horizon, lead.model_action_dim),
            predict,
            first.device,
            num_inference_steps or self.num_inference_steps,
            generator,
        )
        return lead.action_from_model(sample, obs)


def check_members(policies: Sequence[Policy], names: Sequence[str]) -> None:
    """Raise ValueError unless the loaded ``policies`` can denoise together (see the module note)."""
    from demoscale.policies.diffusion.model import DiffusionPolicy

    if len(policies) < 2:
        raise ValueError(f"an ensemble needs at least two checkpoints, got {len(policies)}")
    lead, lead_name = policies[0], names[0]
    for policy, name in zip(policies, names, strict=True):
        if policy.family != "diffusion" or not isinstance(policy.network, DiffusionPolicy):
            raise ValueError(
                f"{name}: only diffusion policies denoise together, this one is {policy.family!r}"
            )
        if policy.features != lead.features:
            raise ValueError(f"{name}: its feature spec differs from {lead_name}'s")
        for field in SHARED_CONFIG:
            mine, theirs = getattr(policy.network.config, field), getattr(lead.network.config, field)
            if mine != theirs:
                raise ValueError(f"{name}: {field} {mine!r} differs from {lead_name}'s {theirs!r}")
        ours = lead.network.normalizer.state_dict()
        for key, value in policy.network.normalizer.state_dict().items():
            if key not in ours or not torch.equal(value, ours[key]):
                raise ValueError(
                    f"{name}: its normalisation statistics differ from {lead_name}'s (not trained on the same data)"
                )


def load_ensemble(
    checkpoint_paths: Sequence[str | os.PathLike[str]],
    device: str = "cpu",
    num_inference_steps: int | None = None,
) -> Policy:
    """Load two or more diffusion checkpoints as one :class:`Policy` whose network averages their
    predictions at every denoising step (the first checkpoint's config, metadata and inference
    settings). Raises ValueError for members that cannot denoise together, naming the file and
    what differs."""
    names = [os.fspath(path) for path in checkpoint_paths]
    policies = [load_policy(name, device=device, num_inference_steps=num_inference_steps) for name in names]
    check_members(policies, names)
    lead = policies[0]
    meta = {"family": lead.family, "features": lead.features}
    network = EnsembleNetwork([policy.network for policy in policies])
    return Policy(network, meta, device, num_inference_steps)
