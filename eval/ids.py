"""Environment and object ids, and the disjoint ranges used for training and held-out evaluation.

Every simulated scene is generated deterministically from an integer environment id, every
manipulated object from an integer object id. The ids are split into two disjoint ranges:

=========  ==========================  ==========================
split      environment ids             object ids
=========  ==========================  ==========================
``train``  0 .. 9,999                  0 .. 9,999
``unseen`` 1,000,000 .. 1,009,999      1,000,000 .. 1,009,999
=========  ==========================  ==========================

Demonstrations are collected on ``train`` ids only; ``unseen`` ids never appear in training data,
so a policy evaluated on them meets scenes and objects it has not seen. ``env_id("train", k)`` is
the k-th training environment (k counts from 0); subsets of the first n ids are nested in n.
"""

from __future__ import annotations

SPLITS: dict[str, range] = {
    "train": range(0, 10_000),
    "unseen": range(1_000_000, 1_010_000),
}


class IdRangeError(ValueError):
    """An id or split outside the documented ranges."""


def _check_split(split: str) -> range:
    if split not in SPLITS:
        raise IdRangeError(f"unknown split {split!r}; expected one of {sorted(SPLITS)}")
    return SPLITS[split]


def _nth(split: str, k: int, kind: str) -> int:
    ids = _check_split(split)
    if not 0 <= int(k) < len(ids):
        raise IdRangeError(f"{kind} index k={k} is outside the {split!r} split (0 <= k < {len(ids)})")
    return ids.start + int(k)


def env_id(split: str, k: int) -> int:
    """The ``k``-th environment id of ``split`` (``train`` or ``unseen``)."""
    return _nth(split, k, "environment")


def object_id(split: str, k: int) -> int:
    """The ``k``-th object id of ``split`` (``train`` or ``unseen``)."""
    return _nth(split, k, "object")


def env_ids(split: str, n: int) -> list[int]:
    """The first ``n`` environment ids of ``split``."""
    return [env_id(split, k) for k in range(n)] if n > 0 else []


def object_ids(split: str, n: int) -> list[int]:
    """The first ``n`` object ids of ``split``."""
    return [object_id(split, k) for k in range(n)] if n > 0 else []


PAIRINGS = ("grid", "unique")


def pair_ids(envs: list[int], objects: list[int], pairing: str = "grid") -> list[tuple[int, int]]:
    """(environment id, object id) pairs: every combination (``grid``), or environment k with object
    k (``unique``: each environment its own object, the data-scaling-laws study's layout)."""
    if pairing not in PAIRINGS:
        raise ValueError(f"pairing must be one of {PAIRINGS}, got {pairing!r}")
    if pairing == "unique":
        if len(envs) != len(objects):
            raise ValueError(
                f"pairing 'unique' needs as many objects as environments, got {len(envs)} and {len(objects)}"
            )
        return list(zip(envs, objects, strict=True))
    return [(e, o) for e in envs for o in objects]


def split_of(any_id: int) -> str:
    """The split an environment or object id belongs to; :class:`IdRangeError` outside every range."""
    value = int(any_id)
    for name, ids in SPLITS.items():
        if value in ids:
            return name
    described = ", ".join(f"{name}: {r.start}..{r.stop - 1}" for name, r in SPLITS.items())
    raise IdRangeError(f"id {any_id} is outside the documented ranges ({described})")


def check_id(any_id: int, kind: str = "id") -> int:
    """Return ``any_id`` as an int if it lies in a documented range; raise :class:`IdRangeError` otherwise."""
    try:
        split_of(any_id)
    except IdRangeError as error:
        raise IdRangeError(f"{kind} {error.args[0][3:]}") from None
    return int(any_id)
