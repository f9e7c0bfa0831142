"""Waypoint labelling of demonstrations (AWE-style), and its per-step cache in an episode store.

Waypoints of one episode are

- every frame where the (binarised) gripper command changes: the first frame with the new command;
- every frame where the robot comes to rest (its speed falls to ``rest_speed`` or below after moving);
- the last frame;
- and the fewest further frames such that linear interpolation between consecutive waypoints
  (starting from frame 0) reconstructs every intermediate state within ``threshold``. The error of a
  segment is the maximum over its frames of the distance between the state and the interpolated
  point, plus ``rotation_weight`` times the rotation angle to the slerp-interpolated orientation when
  rotations are given. The fewest frames are found by dynamic programming over prefixes, separately
  between consecutive forced waypoints.

The store cache is a per-step int64 array ``next_waypoint_index``: for store frame ``t`` the global
frame index of the first waypoint strictly after ``t`` in the same episode (the last frame of an
episode maps to itself). It is kept beside the store's data as ``data/next_waypoint_index`` together
with the labelling parameters (attributes of that array), so it is computed once per store and
threshold.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

NEXT_WAYPOINT_KEY = "next_waypoint_index"

# Default state signals per store layout: (position specs, rotation spec, gripper specs).
_UMI_LIKE = ("robot0_eef_pos",)
_JOYLO_POSITIONS = ("odom_position", "proprio[3:10]", "proprio[11:17]")
_JOYLO_GRIPPERS = ("action_left_gripper", "action_right_gripper")


class WaypointError(ValueError):
    """Raised for invalid labelling inputs (bad threshold, shapes that do not match)."""


def _as_2d(values: np.ndarray, name: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim == 1:
        array = array[:, None]
    if array.ndim != 2:
        raise WaypointError(f"{name} must be (T,) or (T, D), got shape {array.shape}")
    return array


def gripper_toggle_frames(gripper: np.ndarray, min_range: float = 1e-6) -> np.ndarray:
    """Frames where any gripper column switches between open and closed (first frame of the new state).

    Each column is binarised at the midpoint of its range over the episode, so both binary commands
    and continuous widths (metres, millimetres of stroke) work; a column that never moves more than
    ``min_range`` has no toggles.
    """
    columns = _as_2d(gripper, "gripper")
    toggles: set[int] = set()
    for column in columns.T:
        low, high = float(column.min()), float(column.max())
        if high - low <= min_range:
            continue
        closed = column > (low + high) / 2
        toggles.update((np.flatnonzero(closed[1:] != closed[:-1]) + 1).tolist())
    return np.array(sorted(toggles), dtype=np.int64)


def rest_frames(speed: np.ndarray, rest_speed: float) -> np.ndarray:
    """Frames where ``speed`` falls to ``rest_speed`` or below after having been above it."""
    speed = np.asarray(speed, dtype=np.float64)
    moving = speed > rest_speed
    return (np.flatnonzero(moving[:-1] & ~moving[1:]) + 1).astype(np.int64)


def _quat_normalise(quats: np.ndarray) -> np.ndarray:
    return quats / np.linalg.norm(quats, axis=-1, keepdims=True)


def _axis_angle_to_quat(rotvec: np.ndarray) -> np.ndarray:
    from scipy.spatial.transform import Rotation

    return Rotation.from_rotvec(rotvec).as_quat()  # xyzw


def _segment_errors(
    positions: np.ndarray, quats: np.ndarray | None, starts: np.ndarray, end: int, rotation_weight: float
) -> np.ndarray:
    """Reconstruction error of the segments ``[i, end]`` for every ``i`` in ``starts`` (vectorised)."""
    span = end - starts  # (m,)
    inner = np.arange(starts.min() + 1, end)  # candidate intermediate frames
    if inner.size == 0:
        return np.zeros(len(starts))
    alpha = (inner[None, :] - starts[:, None]) / span[:, None]  # (m, k)
    valid = (alpha > 0) & (alpha < 1)
    alpha = np.clip(alpha, 0.0, 1.0)
    start_pos = positions[starts]  # (m, D)
    interpolated = start_pos[:, None, :] + alpha[..., None] * (positions[end] - start_pos)[:, None, :]
    error = np.linalg.norm(positions[inner][None, :, :] - interpolated, axis=-1)
    if quats is not None:
        q0 = quats[starts]  # (m, 4)
        q1 = np.broadcast_to(quats[end], q0.shape)
        dot = np.sum(q0 * q1, axis=-1)
        q1 = np.where(dot[:, None] < 0, -q1, q1)  # shortest arc
        theta = np.arccos(np.clip(np.abs(dot), -1.0, 1.0))[:, None]  # (m, 1)
        sin_theta = np.sin(theta)
        small = sin_theta < 1e-8
        w0 = np.where(small, 1.0 - alpha, np.sin((1.0 - alpha) * theta) / np.where(small, 1.0, sin_theta))
        w1 = np.where(small, alpha, np.sin(alpha * theta) / np.where(small, 1.0, sin_theta))
        slerped = _quat_normalise(w0[..., None] * q0[:, None, :] + w1[..., None] * q1[:, None, :])
        cos_half = np.abs(np.sum(slerped * quats[inner][None, :, :], axis=-1))
        error = error + rotation_weight * 2.0 * np.arccos(np.clip(cos_half, -1.0, 1.0))
    return np.where(valid, error, 0.0).max(axis=1)


def _fewest_waypoints(
    positions: np.ndarray,
    quats: np.ndarray | None,
    first: int,
    last: int,
    threshold: float,
    rotation_weight: float,
) -> list[int]:
    """Fewest frames in ``(first, last]``, ``last`` included, whose interpolation stays within threshold."""
    length = last - first
    best_count = np.full(length + 1, np.iinfo(np.int64).max, dtype=np.int64)
    previous = np.zeros(length + 1, dtype=np.int64)
    best_count[0] = 0
    for j in range(1, length + 1):
        starts = np.arange(first, first + j)
        feasible = _segment_errors(positions, quats, starts, first + j, rotation_weight) <= threshold
        feasible[-1] = True  # adjacent frames reconstruct exactly
        candidates = np.where(feasible, best_count[:j], np.iinfo(np.int64).max)
        # Ties go to the latest start: shorter final segments leave earlier ones long.
        i = j - 1 - int(np.argmin(candidates[::-1]))
        best_count[j] = candidates[i] + 1
        previous[j] = i
    chosen: list[int] = []
    j = length
    while j > 0:
        chosen.append(first + j)
        j = int(previous[j])
    return chosen[::-1]


def label_waypoints(
    positions: np.ndarray,
    gripper: np.ndarray | None = None,
    threshold: float = 0.005,
    *,
    rotations: np.ndarray | None = None,
    rotation_weight: float = 1.0,
    rest_speed: float | None = None,
    speeds: np.ndarray | None = None,
) -> np.ndarray:
    """Waypoint frame indices of one episode (sorted, unique, int64; always includes the last frame).

    Args:
        positions: (T, D) states to reconstruct (end-effector or base positions, joint positions).
        gripper: (T,) or (T, G) gripper commands or widths; their open/closed switches are waypoints.
        threshold: maximum allowed reconstruction error (units of ``positions``; radians for rotations).
        rotations: optional (T, 3) axis-angle vectors or (T, 4) quaternions (xyzw) of the end effector.
        rotation_weight: weight of the rotation angle error added to the position error.
        rest_speed: when given, frames where the speed falls to this value or below are waypoints.
        speeds: (T,) or (T, S) speed signals for the rest test (norm over columns); by default the
            per-frame displacement of ``positions``.
    """
    if not threshold > 0:
        raise WaypointError(f"waypoint threshold must be > 0, got {threshold}")
    positions = _as_2d(positions, "positions")
    n_frames = len(positions)
    if n_frames == 0:
        raise WaypointError("cannot label waypoints of an empty episode")
    quats = None
    if rotations is not None:
        rotations = _as_2d(rotations, "rotations")
        if len(rotations) != n_frames or rotations.shape[1] not in (3, 4):
            raise WaypointError(
                f"rotations must be (T, 3) axis-angle or (T, 4) xyzw with T={n_frames}, got {rotations.shape}"
            )
        quats = _quat_normalise(rotations) if rotations.shape[1] == 4 else _axis_angle_to_quat(rotations)

    forced = {n_frames - 1}
    if gripper is not None:
        gripper = _as_2d(gripper, "gripper")
        if len(gripper) != n_frames:
            raise WaypointError(f"gripper has {len(gripper)} frames, positions have {n_frames}")
        forced.update(gripper_toggle_frames(gripper).tolist())
    if rest_speed is not None:
        if speeds is None:
            # Forward difference: frame t is at rest when it does not move towards t + 1.
            speed = np.r_[np.linalg.norm(np.diff(positions, axis=0), axis=1), 0.0]
        else:
            speed_columns = _as_2d(speeds, "speeds")
            if len(speed_columns) != n_frames:
                raise WaypointError(f"speeds have {len(speed_columns)} frames, positions have {n_frames}")
            speed = np.linalg.norm(speed_columns, axis=1)
        forced.update(rest_frames(speed, rest_speed).tolist())

    waypoints: list[int] = []
    anchor = 0
    for target in sorted(forced):
        if target == 0:
            waypoints.append(0)
            continue
        waypoints.extend(_fewest_waypoints(positions, quats, anchor, target, threshold, rotation_weight))
        anchor = target
    return np.unique(np.array(waypoints, dtype=np.int64))


def next_waypoint_indices(waypoints: np.ndarray, n_frames: int, offset: int = 0) -> np.ndarray:
    """Per-frame index of the first waypoint strictly after each frame (the last frame maps to itself).

    ``offset`` is added to the result (the episode's first global frame in a store).
    """
    waypoints = np.asarray(waypoints, dtype=np.int64)
    frames = np.arange(n_frames)
    position = np.searchsorted(waypoints, frames, side="right")
    following = np.where(
        position < len(waypoints), waypoints[np.minimum(position, len(waypoints) - 1)], n_frames - 1
    )
    return following.astype(np.int64) + offset


_SPEC = re.compile(r"^(?P<key>[^\[\]]+)(\[(?P<start>-?\d*):(?P<stop>-?\d*)\])?$")


def _read_spec(episode: dict[str, np.ndarray], spec: str, episode_index: int) -> np.ndarray:
    """Read ``key`` or ``key[a:b]`` (columns) from one episode's arrays."""
    match = _SPEC.match(spec)
    if match is None:
        raise WaypointError(f"bad signal spec {spec!r}: expected 'key' or 'key[start:stop]'")
    key = match["key"]
    if key not in episode:
        raise WaypointError(f"episode {episode_index}: key {key!r} (from {spec!r}) is not in the store")
    values = _as_2d(episode[key].reshape(len(episode[key]), -1), key)
    if match["start"] is not None or match["stop"] is not None:
        start = int(match["start"]) if match["start"] else None
        stop = int(match["stop"]) if match["stop"] else None
        values = values[:, start:stop]
    return values


def default_signals(feature_keys: Sequence[str]) -> dict[str, Any]:
    """Signals used for labelling a store with the given keys: position/rotation/gripper specs.

    UMI-like stores (``robot{i}_eef_pos``) use the end-effector positions, the first robot's
    axis-angle rotation and the gripper widths; JoyLo stores use odometry position and torso/arm joint
    positions, with the gripper commands; anything else uses ``action``.
    """
    keys = set(feature_keys)
    if "robot0_eef_pos" in keys:
        robots = sorted(int(m[1]) for k in keys if (m := re.match(r"robot(\d+)_eef_pos$", k)))
        return {
            "positions": [f"robot{i}_eef_pos" for i in robots],
            "rotation": "robot0_eef_rot_axis_angle" if "robot0_eef_rot_axis_angle" in keys else None,
            "grippers": [f"robot{i}_gripper_width" for i in robots if f"robot{i}_gripper_width" in keys],
        }
    if "proprio" in keys and all(k in keys for k in _JOYLO_GRIPPERS):
        positions = [s for s in _JOYLO_POSITIONS if s.split("[")[0] in keys]
        return {"positions": positions, "rotation": None, "grippers": list(_JOYLO_GRIPPERS)}
    if "action" in keys:
        return {"positions": ["action"], "rotation": None, "grippers": []}
    raise WaypointError(f"no default waypoint signals for a store with keys {sorted(keys)}; pass them")


def label_store_waypoints(
    store_path: str,
    threshold: float,
    *,
    positions: Sequence[str] | None = None,
    rotation: str | None = None,
    grippers: Sequence[str] | None = None,
    rotation_weight: float = 1.0,
    rest_speed: float | None = None,
    overwrite: bool = False,
) -> np.ndarray:
    """Label every episode of a store and cache the per-step ``next_waypoint_index`` array in it.

    Signals are given as ``key`` or ``key[start:stop]`` specs (columns of a feature); by default they
    come from :func:`default_signals`. Returns the (n_frames,) int64 array of global frame indices.
    An existing cache computed with the same parameters is returned as is; a cache with different
    parameters is replaced only with ``overwrite=True``.
    """
    from demoscale.datasets.store import EpisodeStore
    from tqdm import tqdm

    if not threshold > 0:
        raise WaypointError(f"waypoint threshold must be > 0, got {threshold}")
    store = EpisodeStore.open(store_path, mode="r")
    signals = default_signals(list(store.features))
    if positions is not None:
        signals["positions"] = list(positions)
    if rotation is not None:
        signals["rotation"] = rotation
    if grippers is not None:
        signals["grippers"] = list(grippers)
    parameters = {
        "threshold": float(threshold),
        "positions": list(signals["positions"]),
        "rotation": signals["rotation"],
        "grippers": list(signals["grippers"]),
        "rotation_weight": float(rotation_weight),
        "rest_speed": None if rest_speed is None else float(rest_speed),
    }
    cached = read_next_waypoint_index(store_path, with_parameters=True)
    if cached is not None:
        values, cached_parameters = cached
        if cached_parameters == parameters:
            return values
        if not overwrite:
            raise WaypointError(
                f"{store_path}: {NEXT_WAYPOINT_KEY} exists with parameters {cached_parameters}; "
                "pass overwrite=True (--overwrite) to relabel"
            )

    keys = {spec.split("[")[0] for spec in signals["positions"] + signals["grippers"]}
    if signals["rotation"]:
        keys.add(signals["rotation"])
    ends = np.asarray(store.episode_ends, dtype=np.int64)
    starts = np.asarray(store.episode_starts, dtype=np.int64)
    result = np.empty(store.n_frames, dtype=np.int64)
    for episode_index, (start, end) in enumerate(
        tqdm(list(zip(starts, ends, strict=True)), desc="label waypoints", disable=len(ends) < 20)
    ):
        arrays = {key: store.read(key, int(start), int(end)) for key in keys}
        episode_positions = np.concatenate(
            [_read_spec(arrays, spec, episode_index) for spec in signals["positions"]], axis=1
        )
        gripper = (
            np.concatenate([_read_spec(arrays, spec, episode_index) for spec in signals["grippers"]], axis=1)
            if signals["grippers"]
            else None
        )
        episode_rotations = (
            _read_spec(arrays, signals["rotation"], episode_index) if signals["rotation"] else None
        )
        waypoints = label_waypoints(
            episode_positions,
            gripper,
            threshold,
            rotations=episode_rotations,
            rotation_weight=rotation_weight,
            rest_speed=rest_speed,
        )
        result[start:end] = next_waypoint_indices(waypoints, int(end - start), offset=int(start))
    _write_next_waypoint_index(store_path, result, parameters)
    return result


def _write_next_waypoint_index(store_path: str, values: np.ndarray, parameters: dict[str, Any]) -> None:
    from demoscale.datasets.store import EpisodeStore

    store = EpisodeStore.open(store_path, mode="a")
    store.write_derived(NEXT_WAYPOINT_KEY, values.astype(np.int64), {"waypoint_parameters": parameters})


def read_next_waypoint_index(
    store_path: str, with_parameters: bool = False
) -> np.ndarray | tuple[np.ndarray, dict[str, Any]] | None:
    """The cached ``next_waypoint_index`` array of a store (and its parameters), or None if absent.

    A cache whose length no longer matches the store's frames (episodes appended after labelling)
    counts as absent.
    """
    from demoscale.datasets.store import EpisodeStore

    derived = EpisodeStore.open(store_path, mode="r").read_derived(NEXT_WAYPOINT_KEY)
    if derived is None:
        return None
    values = np.asarray(derived.values, dtype=np.int64)
    if with_parameters:
        return values, dict(derived.attrs.get("waypoint_parameters", {}))
    return values
