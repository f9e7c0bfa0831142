"""End-effector action representations: absolute [pos, axis-angle, gripper] <-> relative [pos, rot6d, gripper].

The UMI / tabletop ``action`` layout is, per robot, ``[pos(3), axis_angle(3), gripper(1)]`` (7 values),
robots concatenated. For learning, UMI-style policies express each action relative to the latest
observed end-effector pose of the same robot: ``[rel_pos(3), rel_rot6d(6), gripper(1)]`` (10 values).
The gripper width stays absolute.
"""

from __future__ import annotations

import torch
from demoscale.policies import rotation

ABSOLUTE_DIM_PER_ROBOT = 7
RELATIVE_DIM_PER_ROBOT = 10


def n_robots_from_action_dim(action_dim: int) -> int:
    """Number of robots of a [pos, axis-angle, gripper]-per-robot action; raises on other layouts."""
    if action_dim % ABSOLUTE_DIM_PER_ROBOT != 0:
        raise ValueError(
            f"relative actions need the [pos(3), axis_angle(3), gripper(1)] per-robot layout, "
            f"but the action has {action_dim} values (not a multiple of {ABSOLUTE_DIM_PER_ROBOT})"
        )
    return action_dim // ABSOLUTE_DIM_PER_ROBOT


def absolute_to_relative(
    action: torch.Tensor, ref_pos: torch.Tensor, ref_axis_angle: torch.Tensor
) -> torch.Tensor:
    """(B, H, 7R) absolute actions -> (B, H, 10R) relative to reference poses (B, R, 3) + (B, R, 3)."""
    batch, horizon, dim = action.shape
    n_robots = n_robots_from_action_dim(dim)
    per_robot = action.reshape(batch, horizon, n_robots, ABSOLUTE_DIM_PER_ROBOT)
    ref_rot = rotation.axis_angle_to_matrix(ref_axis_angle)[:, None]  # (B, 1, R, 3, 3)
    rel_pos, rel_rot = rotation.pose_to_relative(
        per_robot[..., :3], rotation.axis_angle_to_matrix(per_robot[..., 3:6]), ref_pos[:, None], ref_rot
    )
    out = torch.cat([rel_pos, rotation.matrix_to_rot6d(rel_rot), per_robot[..., 6:7]], dim=-1)
    return out.reshape(batch, horizon, n_robots * RELATIVE_DIM_PER_ROBOT)


def relative_to_absolute(
    relative: torch.Tensor, ref_pos: torch.Tensor, ref_axis_angle: torch.Tensor
) -> torch.Tensor:
    """Inverse of :func:`absolute_to_relative`: (B, H, 10R) -> (B, H, 7R)."""
    batch, horizon, dim = relative.shape
    n_robots = dim // RELATIVE_DIM_PER_ROBOT
    per_robot = relative.reshape(batch, horizon, n_robots, RELATIVE_DIM_PER_ROBOT)
    ref_rot = rotation.axis_angle_to_matrix(ref_axis_angle)[:, None]
    pos, rot = rotation.pose_to_absolute(
        per_robot[..., :3], rotation.rot6d_to_matrix(per_robot[..., 3:9]), ref_pos[:, None], ref_rot
    )
    out = torch.cat([pos, rotation.matrix_to_axis_angle(rot), per_robot[..., 9:10]], dim=-1)
    return out.reshape(batch, horizon, n_robots * ABSOLUTE_DIM_PER_ROBOT)


def relative_pose_history(
    pos: torch.Tensor, axis_angle: torch.Tensor, current_index: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Observed pose windows (B, T, 3) + (B, T, 3) -> relative to frame ``current_index``: (B, T, 3), (B, T, 6)."""
    rot = rotation.axis_angle_to_matrix(axis_angle)
    ref_pos = pos[:, current_index : current_index + 1]
    ref_rot = rot[:, current_index : current_index + 1]
    rel_pos, rel_rot = rotation.pose_to_relative(pos, rot, ref_pos, ref_rot)
    return rel_pos, rotation.matrix_to_rot6d(rel_rot)
