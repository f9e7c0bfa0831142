"""The task registry: task name -> where its definition lives, loaded only when asked for.

Adding a task family is one entry in :data:`TASKS`: ``"name": "module.path:attribute"``, where the
attribute is a :class:`TaskDefinition` (or anything with the same members). Importing
``demoscale.eval`` never imports MuJoCo or any task module; :func:`get_task` does, for the one task
it is asked about.

A task's environments follow :class:`SimEnv`: observations are dicts keyed by the store keys of
docs/interfaces.md, actions are the task's ``action`` layout (absolute targets), and stage scores
are latched over an episode.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

# name -> "module:attribute" of a TaskDefinition.
TASKS: dict[str, str] = {
    "reach": "demoscale.eval.tabletop.tasks:REACH",
    "push": "demoscale.eval.tabletop.tasks:PUSH",
    "pick_place": "demoscale.eval.tabletop.tasks:PICK_PLACE",
    "fetch_shelf": "demoscale.eval.wholebody.tasks:FETCH_SHELF",
    "touch_shelf": "demoscale.eval.wholebody.tasks:TOUCH_SHELF",
    "pusht": "demoscale.eval.pusht:PUSHT",
}


class UnknownTaskError(KeyError):
    """A task name that is not in the registry."""

    def __str__(self) -> str:
        return str(self.args[0])


class SimEnv(Protocol):
    """One simulated (environment, object) pair; ``reset(seed)`` draws a new episode layout."""

    task: str
    env_id: int
    object_id: int
    max_steps: int
    n_stages: int

    def reset(self, seed: int) -> dict[str, np.ndarray]:
        """Start an episode; returns the first observation (store keys -> arrays)."""

    def step(self, action: np.ndarray) -> dict[str, np.ndarray]:
        """Apply one control step (``action`` in the task's layout); returns the next observation."""

    def stages(self) -> list[bool]:
        """For each stage 1..n_stages, whether it has been reached in this episode (latched)."""

    def success(self) -> bool:
        """Whether the task is accomplished in the current state."""

    def expert(self, seed: int, **options: Any) -> Expert:
        """A scripted expert for the current episode (call after :meth:`reset`); ``options`` are the
        task's own expert settings (collection's ``expert_options``; most tasks take none)."""

    def render(self) -> np.ndarray:
        """An RGB frame for videos (uint8 HxWx3)."""

    # Optional: ``image_cameras() -> dict[str, str]``, store key -> the simulator camera that renders
    # it. Collection records it (with the image size and options) in the raw files and so in the
    # store and the checkpoint, and evaluation defaults to it and refuses another camera.

    # Optional: ``metrics() -> dict[str, float]``, the task's own per-rollout measures beside the
    # stage score (PushT: the Diffusion Policy paper's max coverage). Each becomes a rollouts.csv
    # column and a ``mean_<name>`` with its interval in the summary; see TaskDefinition.metrics.

    def close(self) -> None:
        """Release renderers and other resources."""


class Expert(Protocol):
    """A scripted demonstrator: observation in, absolute action target out."""

    def act(self, obs: Mapping[str, np.ndarray]) -> np.ndarray: ...


@dataclass(frozen=True)
class TaskDefinition:
    """What the evaluation and collection code needs to know about one task.

    - ``make_env(env_id, object_id, image_size=96, **options) -> SimEnv``;
    - ``write_demos(directory, episodes, rate_hz, capture=None) -> list[Path]`` writes successful
      episodes (lists of observation dicts + actions, see :func:`demoscale.eval.collect_sim`) in the
      task family's raw source format (UMI zip for tabletop, JoyLo HDF5 for whole-body), with
      ``capture`` (:func:`capture_sources`) recorded in the file's attributes;
    - ``observation_features``: store key -> shape (for ``image_size``-dependent keys use the
      ``image_keys`` set; their shape is ``(image_size, image_size, 3)``);
    - ``action_dim`` and ``max_steps`` (episode limit at ``rate_hz``);
    - ``metrics``: names of the per-rollout measures its environments return from ``metrics()``
      (values in [0, 1]), reported beside the stage score;
    - ``eval_envs``: how many environments ``demoscale eval`` rolls out by default (one rollout each);
    - ``images_optional``: its ``make_env`` takes ``images=False`` to skip rendering the image
      observations (evaluation does so for a policy that observes none of ``image_keys``);
    - ``source_format``: the ingest format (``demoscale ingest NAME``) of what ``write_demos`` writes.
    """

    name: str
    family: str
    make_env: Callable[..., SimEnv]
    write_demos: Callable[[Path, Sequence[Mapping[str, np.ndarray]], float], list[Path]]
    low_dim_features: Mapping[str, tuple[int, ...]]
    image_keys: tuple[str, ...]
    action_dim: int
    max_steps: int
    n_stages: int
    rate_hz: float = 10.0
    description: str = ""
    metrics: tuple[str, ...] = ()
    eval_envs: int = 10
    images_optional: bool = False
    extras: Mapping[str, Any] = field(default_factory=dict)
    source_format: str = "umi"

    def observation_shapes(self, image_size: int) -> dict[str, tuple[int, ...]]:
        """Store key -> per-frame shape of the observations at ``image_size``."""
        shapes = {key: (image_size, image_size, 3) for key in self.image_keys}
        shapes.update({key: tuple(shape) for key, shape in self.low_dim_features.items()})
        return shapes


def _plain(value: Any) -> Any:
    """``value`` as JSON-ready data (tuples become lists), the form it takes in stores and checkpoints."""
    import json

    return json.loads(json.dumps(value, default=list))


def capture_sources(
    env: Any, task: str, image_size: int, env_options: Mapping[str, Any] | None = None
) -> dict[str, dict[str, Any]]:
    """What produced each image (and point-cloud) key of ``env``'s observations: key -> ``{"task",
    "camera", "image_size", "env_options"}`` (the ``source`` of the store's FeatureSpec; empty when
    the environment does not name its cameras). A point cloud's camera is the cameras fused into it:
    a policy that sees only clouds (WB-VIMA) still knows its task and options."""
    cameras = env.image_cameras() if callable(getattr(env, "image_cameras", None)) else {}
    if callable(getattr(env, "point_cloud_cameras", None)):
        cameras = {**cameras, **env.point_cloud_cameras()}
    options = _plain(dict(env_options or {}))
    return {
        key: {"task": task, "camera": str(camera), "image_size": int(image_size), "env_options": options}
        for key, camera in cameras.items()
    }


def task_names() -> list[str]:
    """Names of every registered task."""
    return sorted(TASKS)


def get_task(name: str) -> TaskDefinition:
    """The :class:`TaskDefinition` registered as ``name`` (imports its module now)."""
    if name not in TASKS:
        raise UnknownTaskError(f"unknown task {name!r}; registered tasks: {', '.join(task_names())}")
    module_name, _, attribute = TASKS[name].partition(":")
    return getattr(importlib.import_module(module_name), attribute)


def make_env(task: str, env_id: int, object_id: int, seed: int = 0, image_size: int = 96, **options: Any):
    """Build the environment of ``task`` for (``env_id``, ``object_id``) and reset it with ``seed``."""
    env = get_task(task).make_env(env_id, object_id, image_size=image_size, **options)
    env.reset(seed)
    return env
