"""Simulated tasks, rollout evaluation with confidence intervals, and real-robot score files.

Importing this package is light (no MuJoCo, no torch): task modules load when a task is asked for.
It sets the offscreen-rendering defaults (``MUJOCO_GL=egl``, ``LP_NUM_THREADS=0``; see
``eval/rendering.py``) unless they are set already: MuJoCo reads them when it is first imported, and
every task module is imported through this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import demoscale.eval.rendering  # noqa: F401  (first: the rendering defaults, before any MuJoCo import)

# collect_sim shares its name with its module: bind the function eagerly (the module is light) so
# that importing the module elsewhere never replaces the function on the package.
from demoscale.eval.collect_sim import collect_sim
from demoscale.eval.ids import IdRangeError, env_id, env_ids, object_id, object_ids, split_of
from demoscale.eval.tasks import TASKS, TaskDefinition, UnknownTaskError, get_task, make_env, task_names

if TYPE_CHECKING:  # pragma: no cover
    from demoscale.eval.rollout import (
        EvalResult,
        SpecMismatchError,
        evaluate,
        sequential_stop,
        wilson_interval,
    )
    from demoscale.eval.scores import import_scores

_LAZY = {
    "evaluate": "demoscale.eval.rollout",
    "EvalResult": "demoscale.eval.rollout",
    "wilson_interval": "demoscale.eval.rollout",
    "SpecMismatchError": "demoscale.eval.rollout",
    "sequential_stop": "demoscale.eval.rollout",
    "import_scores": "demoscale.eval.scores",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'demoscale.eval' has no attribute {name!r}")


__all__ = [
    "TASKS",
    "EvalResult",
    "IdRangeError",
    "SpecMismatchError",
    "TaskDefinition",
    "UnknownTaskError",
    "collect_sim",
    "env_id",
    "env_ids",
    "evaluate",
    "get_task",
    "import_scores",
    "make_env",
    "object_id",
    "object_ids",
    "sequential_stop",
    "split_of",
    "task_names",
    "wilson_interval",
]
