"""Reading checkpoint files without running code from them.

A ``.ckpt`` is a pickle, and an ordinary ``torch.load`` runs whatever a hostile pickle asks for (a
``__reduce__`` that calls ``os.system``, say). Every checkpoint demoscale reads goes through
:func:`load_checkpoint`: ``torch.load(weights_only=True)``, which builds only tensors, plain
containers and numbers, plus the explicit allow-list :data:`CHECKPOINT_SAFE_GLOBALS`. Anything else
is refused with a :class:`CheckpointError` that names what the file asked for; a truncated or
random file is a :class:`CheckpointError` too, never a traceback.

The allow-list is empty on purpose: checked against every checkpoint the test suite writes
(diffusion, WB-VIMA and waypoint-head policies, with EMA, the callbacks' states, the optimizer and
scheduler states), Lightning and demoscale put nothing in them beyond what ``weights_only`` accepts
(the policy metadata under ``"demoscale"`` is plain dicts, lists, strings and numbers). A type that
a future checkpoint needs is added here, by name, after the same check.

Resuming training (``ckpt_path``) goes through Lightning's loader; the training CLI passes
``weights_only=True`` to it, so the same rule holds there (see ``policies/cli.py``).
"""

from __future__ import annotations

import os
from typing import Any

# Globals a checkpoint may name beyond torch's weights_only defaults (none needed today; see above).
CHECKPOINT_SAFE_GLOBALS: tuple[Any, ...] = ()


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded safely: hostile, damaged, or not a demoscale checkpoint."""


def load_checkpoint(path: str | os.PathLike[str], map_location: str = "cpu") -> dict[str, Any]:
    """The contents of a checkpoint file, loaded without running code from it.

    Raises FileNotFoundError for a missing file and :class:`CheckpointError` for one that names
    code (a global outside the allow-list), is damaged, or does not hold a dict.
    """
    import pickle

    import torch

    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    try:
        with torch.serialization.safe_globals(list(CHECKPOINT_SAFE_GLOBALS)):
            checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        names = _unsafe_globals(path)
        if names:
            raise CheckpointError(
                f"{path}: refused: its pickle names {', '.join(names)}, which no demoscale checkpoint "
                "holds; loading it could run code"
            ) from None
        raise CheckpointError(f"{path}: not a readable checkpoint (truncated or corrupt?): {error}") from None
    except Exception as error:  # torch raises RuntimeError, EOFError, ... for damaged files
        raise CheckpointError(
            f"{path}: not a readable checkpoint (truncated or corrupt?): {type(error).__name__}: {error}"
        ) from None
    if not isinstance(checkpoint, dict):
        raise CheckpointError(f"{path}: holds a {type(checkpoint).__name__}, not a checkpoint dict")
    return checkpoint


def _unsafe_globals(path: str) -> list[str]:
    """The globals outside the allow-list that the checkpoint's pickle names (read, never run)."""
    import torch

    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:
        return []
    allowed = {f"{g.__module__}.{g.__qualname__}" for g in CHECKPOINT_SAFE_GLOBALS}
    return sorted(name for name in names if name not in allowed)
