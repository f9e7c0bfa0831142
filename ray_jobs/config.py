"""The sweep configuration: a typed dataclass tree loaded from YAML.

A sweep file names the store, the policies (training config + overrides), the grid axes, how each
trial is evaluated, how long each trial trains, what each trial may use, and where results go.
``load_sweep_config`` checks every key and says which one is wrong.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOGGERS = ("csv", "tensorboard", "wandb", "mlflow")  # demoscale.policies.cli.LOGGERS, without torch


class SweepConfigError(ValueError):
    """A sweep file (or dict) that cannot describe a sweep; the message names the file and key."""


@dataclass
class TrialResources:
    """What one trial reserves on the Ray cluster: ``workers`` training workers of ``cpu`` CPUs and
    ``gpu`` GPUs each. One worker (the default) trains in the trial's own process, and a GPU
    fraction lets several trials share a GPU. With ``workers: N > 1`` the trial reserves one
    placement group of N such bundles (all or nothing) and trains as N ranks of a DDP run, one
    Ray actor per bundle (ray_jobs/workers.py); each rank then trains on one whole GPU (gpu 0 or 1)."""

    cpu: float = 1.0
    gpu: float = 0.0
    workers: int = 1


@dataclass
class PolicySpec:
    """One value of the policy axis: a training config file plus dotted-key overrides, and
    optionally its own ``resources`` (replacing the sweep's for this policy's trials, so that a
    large policy's trials get several GPU workers and a small one's a single CPU)."""

    config: str
    overrides: dict[str, Any] = field(default_factory=dict)
    resources: TrialResources | None = None


@dataclass
class GridSpec:
    """The grid axes. Either ``n_envs`` (with ``n_objects`` objects per env) or ``n_pairs``.

    ``policy`` lists names from ``SweepConfig.policies``; empty means all of them.
    ``demos_per_pair`` may hold ``None`` (every demo of each chosen pair).
    """

    policy: list[str] = field(default_factory=list)
    n_envs: list[int] = field(default_factory=list)
    n_objects: list[int] = field(default_factory=lambda: [1])
    n_pairs: list[int] = field(default_factory=list)
    demos_per_pair: list[int | None] = field(default_factory=lambda: [None])
    seed: list[int] = field(default_factory=lambda: [0])


@dataclass
class EvalSpec:
    """How a trained checkpoint is scored.

    ``mode: rollouts`` calls ``demoscale.eval.evaluate`` on ``split`` (held-out envs/objects): the
    first ``n_envs`` x ``n_objects`` pairs of the split, ``episodes`` rollouts in total spread
    round-robin over those pairs; ``seed`` is
    the same for every trial so that all trials are compared on the same unseen settings; ``options``
    are further keyword arguments of ``evaluate`` (no videos and no progress bar by default).
    ``mode: offline`` needs no simulator: the score is ``exp(-metric)`` of the training run's
    validation loss (see ray_jobs/README.md).
    """

    mode: str = "rollouts"
    task: str | None = None
    split: str = "unseen"
    n_envs: int = 8
    n_objects: int = 1
    episodes: int = 40
    workers: int = 1
    seed: int = 0
    metric: str = "val/loss"
    options: dict[str, Any] = field(default_factory=lambda: {"video_episodes": 0, "progress": False})


@dataclass
class BudgetRule:
    """Training steps per trial.

    ``rule: fixed``  -> ``steps``.
    ``rule: epochs`` -> ``clamp(ceil(epochs * n_frames / batch_size), min_steps, max_steps)``, where
    ``n_frames`` counts the frames of the trial's subset and ``batch_size`` defaults to the policy's
    ``data.batch_size``. Training writes a checkpoint every ``checkpoint_every_steps`` steps; a retried
    or resumed trial continues from the last one.
    """

    rule: str = "fixed"
    steps: int = 1000
    epochs: float = 10.0
    batch_size: int | None = None  # None: the policy's data.batch_size
    min_steps: int = 100
    max_steps: int | None = None
    checkpoint_every_steps: int = 200


@dataclass
class FaultInjection:
    """Testing aid: SIGKILL a trial's worker after its first checkpoint, on its first attempt only."""

    kill_after_first_checkpoint: list[str] = field(default_factory=list)  # trial ids, or ["*"]


@dataclass
class SweepConfig:
    """A whole sweep.

    Relative paths (store, policy configs, output) resolve against ``base_dir``: the working folder
    the config was loaded in, unless the YAML sets ``base_dir`` itself (relative to the YAML file).
    """

    store: str
    policies: dict[str, PolicySpec]
    grid: GridSpec
    eval: EvalSpec = field(default_factory=EvalSpec)
    budget: BudgetRule = field(default_factory=BudgetRule)
    resources: TrialResources = field(default_factory=TrialResources)
    retries: int = 2
    output: str = "runs/sweep"
    name: str = "sweep"
    num_cpus: int | None = None  # CPUs of the private local Ray instance; None = all of this machine
    max_concurrent_trials: int | None = None
    fault_injection: FaultInjection = field(default_factory=FaultInjection)
    base_dir: str = "."  # relative paths resolve against it
    # Experiment tracking of every trial's training: csv, tensorboard, wandb or mlflow (group = the
    # sweep's name, run = the trial id, files under <output>/tracking); None = the training default.
    logger: str | None = None

    def trial_resources(self, policy: str) -> TrialResources:
        """The resources of one trial of ``policy``: its own, else the sweep's."""
        return self.policies[policy].resources or self.resources

    def resolve(self, path: str) -> str:
        """``path`` as given if it is absolute or a URL, else relative to ``base_dir``."""
        if "://" in path or os.path.isabs(path):
            return path
        return str(Path(self.base_dir) / path)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_SECTIONS = {
    "grid": GridSpec,
    "budget": BudgetRule,
    "resources": TrialResources,
    "fault_injection": FaultInjection,
}


def _build(cls: type, data: Any, where: str) -> Any:
    """The one YAML -> dataclass path of the package (keys and types checked, named in errors)."""
    from demoscale.conventions import ConfigError, dataclass_from_dict

    if not isinstance(data, dict):
        raise SweepConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    try:
        return dataclass_from_dict(cls, data, where)
    except ConfigError as err:
        raise SweepConfigError(str(err)) from None


def _as_list(value: Any, where: str) -> list:
    if isinstance(value, list):
        return value
    if isinstance(value, (int, str)) or value is None:
        return [value]
    raise SweepConfigError(f"{where}: expected a list of values, got {value!r}")


def sweep_config_from_dict(data: dict[str, Any], source: str = "<dict>", base_dir: str = ".") -> SweepConfig:
    """Build and check a ``SweepConfig`` from plain data; ``source`` names it in error messages."""
    if not isinstance(data, dict):
        raise SweepConfigError(f"{source}: a sweep config must be a mapping")
    data = dict(data)
    for key in ("store", "policies", "grid"):
        if key not in data:
            raise SweepConfigError(f"{source}: missing required key '{key}'")
    kwargs: dict[str, Any] = {}
    policies = data.pop("policies")
    if not isinstance(policies, dict) or not policies:
        raise SweepConfigError(f"{source}: 'policies' must map policy names to {{config, overrides}}")
    kwargs["policies"] = {
        str(name): _build(
            PolicySpec, {"config": spec} if isinstance(spec, str) else spec, f"{source}: policies.{name}"
        )
        for name, spec in policies.items()
    }
    eval_data = data.pop("eval", {})
    if eval_data == "offline":
        eval_data = {"mode": "offline"}
    kwargs["eval"] = _build(EvalSpec, eval_data, f"{source}: eval")
    for key, cls in _SECTIONS.items():
        if key in data:
            section = data.pop(key)
            if key == "grid" and isinstance(section, dict):
                section = {k: _as_list(v, f"{source}: grid.{k}") for k, v in section.items()}
            kwargs[key] = _build(cls, section, f"{source}: {key}")
    config = _build(SweepConfig, {**data, **kwargs, "base_dir": data.get("base_dir", base_dir)}, source)
    validate_sweep_config(config, source)
    return config


def load_sweep_config(path: str | os.PathLike, overrides: dict[str, Any] | None = None) -> SweepConfig:
    """Read a sweep YAML file, with dotted ``overrides`` (``{"budget.steps": 200}``) applied on top.

    Relative paths inside it resolve against the current working folder, or against the file's own
    ``base_dir`` key (itself relative to the file) when it has one.
    """
    from demoscale.conventions import ConfigError, apply_overrides, read_yaml

    try:  # the one YAML reader of every command: safe loading, and a message naming the file
        data = read_yaml(path, "sweep config")
    except ConfigError as err:
        raise SweepConfigError(str(err)) from None
    if overrides:
        try:
            data = apply_overrides(data, overrides, str(path))
        except ConfigError as err:
            raise SweepConfigError(str(err)) from None
    if "base_dir" in data:
        data["base_dir"] = str((Path(path).parent / str(data["base_dir"])).resolve())
    return sweep_config_from_dict(data, source=str(path), base_dir=os.getcwd())


def validate_sweep_config(config: SweepConfig, source: str = "<config>") -> None:
    """Raise ``SweepConfigError`` naming the key for anything a sweep cannot run with."""
    grid = config.grid
    if bool(grid.n_envs) == bool(grid.n_pairs):
        raise SweepConfigError(
            f"{source}: grid needs exactly one of 'n_envs' (with 'n_objects') or 'n_pairs'"
        )
    for axis in ("n_envs", "n_objects", "n_pairs", "seed"):
        for value in getattr(grid, axis):
            if not isinstance(value, int) or isinstance(value, bool) or (value < 1 and axis != "seed"):
                raise SweepConfigError(
                    f"{source}: grid.{axis} values must be positive integers, got {value!r}"
                )
    for value in grid.demos_per_pair:
        if value is not None and (not isinstance(value, int) or value < 1):
            raise SweepConfigError(f"{source}: grid.demos_per_pair values must be positive integers or null")
    unknown = sorted(set(grid.policy) - set(config.policies))
    if unknown:
        raise SweepConfigError(f"{source}: grid.policy names {unknown} not defined under 'policies'")
    if not grid.policy:
        grid.policy = list(config.policies)
    if config.eval.mode not in {"rollouts", "offline"}:
        raise SweepConfigError(
            f"{source}: eval.mode must be 'rollouts' or 'offline', got {config.eval.mode!r}"
        )
    if config.eval.mode == "rollouts" and not config.eval.task:
        raise SweepConfigError(
            f"{source}: eval.task is required for rollout evaluation (or use 'eval: offline')"
        )
    if config.budget.rule not in {"fixed", "epochs"}:
        raise SweepConfigError(
            f"{source}: budget.rule must be 'fixed' or 'epochs', got {config.budget.rule!r}"
        )
    if config.budget.checkpoint_every_steps < 1:
        raise SweepConfigError(f"{source}: budget.checkpoint_every_steps must be >= 1")
    sections = {"resources": config.resources}
    sections.update({f"policies.{name}.resources": spec.resources for name, spec in config.policies.items()})
    for where, resources in sections.items():
        if resources is not None:
            _validate_resources(resources, f"{source}: {where}")
    if config.retries < 0:
        raise SweepConfigError(f"{source}: retries must be >= 0")
    if config.logger is not None and config.logger not in LOGGERS:
        raise SweepConfigError(f"{source}: logger must be one of {', '.join(LOGGERS)}, got {config.logger!r}")


def _validate_resources(resources: TrialResources, where: str) -> None:
    if resources.cpu <= 0 or not 0 <= resources.gpu:
        raise SweepConfigError(f"{where}: cpu must be > 0 and gpu >= 0")
    if resources.workers < 1:
        raise SweepConfigError(f"{where}: workers must be >= 1, got {resources.workers}")
    if resources.workers > 1 and resources.gpu not in (0, 1):
        raise SweepConfigError(
            f"{where}: with workers > 1 each worker trains on one whole GPU (NCCL runs one rank per "
            f"GPU): gpu must be 0 or 1, got {resources.gpu}"
        )
