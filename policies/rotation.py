"""Rotation representations and relative poses (torch, batched over any leading dimensions).

Conventions: rotation matrices act on column vectors; axis-angle vectors are ``angle * unit_axis``;
the 6-D representation is the first two columns of the rotation matrix (Zhou et al. 2019), which
is continuous and therefore easier for networks to regress than axis-angle.

A pose is (position (..., 3), rotation matrix (..., 3, 3)). A pose *relative* to a reference pose
(p0, R0) is expressed in the reference frame: ``p_rel = R0^T (p - p0)``, ``R_rel = R0^T R``.
"""

from __future__ import annotations

import torch

_EPS = 1e-8


def axis_angle_to_matrix(axis_angle: torch.Tensor) -> torch.Tensor:
    """(..., 3) axis-angle -> (..., 3, 3) rotation matrix (Rodrigues' formula)."""
    angle = torch.linalg.vector_norm(axis_angle, dim=-1, keepdim=True)  # (..., 1)
    # Small angles: sin(a)/a -> 1 and (1-cos a)/a^2 -> 1/2; use Taylor terms to stay differentiable.
    small = angle < 1e-4
    safe_angle = torch.where(small, torch.ones_like(angle), angle)
    sin_term = torch.where(small, 1.0 - angle**2 / 6.0, torch.sin(safe_angle) / safe_angle)
    cos_term = torch.where(small, 0.5 - angle**2 / 24.0, (1.0 - torch.cos(safe_angle)) / safe_angle**2)
    x, y, z = axis_angle.unbind(-1)
    zero = torch.zeros_like(x)
    skew = torch.stack([zero, -z, y, z, zero, -x, -y, x, zero], dim=-1).reshape(*axis_angle.shape[:-1], 3, 3)
    eye = torch.eye(3, dtype=axis_angle.dtype, device=axis_angle.device).expand_as(skew)
    return eye + sin_term[..., None] * skew + cos_term[..., None] * (skew @ skew)


def matrix_to_quaternion(matrix: torch.Tensor) -> torch.Tensor:
    """(..., 3, 3) rotation matrix -> (..., 4) unit quaternion (w, x, y, z) with w >= 0."""
    m = matrix
    m00, m11, m22 = m[..., 0, 0], m[..., 1, 1], m[..., 2, 2]
    # Four candidate solutions; pick per element the one with the largest (best-conditioned) denominator.
    candidates_sq = torch.stack(
        [1 + m00 + m11 + m22, 1 + m00 - m11 - m22, 1 - m00 + m11 - m22, 1 - m00 - m11 + m22], dim=-1
    )
    root = torch.sqrt(torch.clamp(candidates_sq, min=_EPS))  # 2 * |component|
    q_w = torch.stack(
        [
            root[..., 0] ** 2,
            m[..., 2, 1] - m[..., 1, 2],
            m[..., 0, 2] - m[..., 2, 0],
            m[..., 1, 0] - m[..., 0, 1],
        ],
        -1,
    )
    q_x = torch.stack(
        [
            m[..., 2, 1] - m[..., 1, 2],
            root[..., 1] ** 2,
            m[..., 1, 0] + m[..., 0, 1],
            m[..., 0, 2] + m[..., 2, 0],
        ],
        -1,
    )
    q_y = torch.stack(
        [
            m[..., 0, 2] - m[..., 2, 0],
            m[..., 1, 0] + m[..., 0, 1],
            root[..., 2] ** 2,
            m[..., 2, 1] + m[..., 1, 2],
        ],
        -1,
    )
    q_z = torch.stack(
        [
            m[..., 1, 0] - m[..., 0, 1],
            m[..., 2, 0] + m[..., 0, 2],
            m[..., 2, 1] + m[..., 1, 2],
            root[..., 3] ** 2,
        ],
        -1,
    )
    all_q = torch.stack([q_w, q_x, q_y, q_z], dim=-2) / (2.0 * root[..., None])
    best = candidates_sq.argmax(dim=-1)
    quat = torch.gather(all_q, -2, best[..., None, None].expand(*best.shape, 1, 4)).squeeze(-2)
    quat = quat / torch.linalg.vector_norm(quat, dim=-1, keepdim=True)
    return torch.where(quat[..., :1] < 0, -quat, quat)


def quaternion_to_axis_angle(quat: torch.Tensor) -> torch.Tensor:
    """(..., 4) quaternion (w, x, y, z) -> (..., 3) axis-angle with angle in [0, pi]."""
    quat = torch.where(quat[..., :1] < 0, -quat, quat)
    vec = quat[..., 1:]
    sin_half = torch.linalg.vector_norm(vec, dim=-1, keepdim=True)
    half_angle = torch.atan2(sin_half, quat[..., :1])
    angle = 2.0 * half_angle
    small = sin_half < 1e-6
    # angle / sin(angle/2) -> 2 as the angle -> 0.
    scale = torch.where(
        small, 2.0 / torch.clamp(quat[..., :1], min=_EPS), angle / torch.where(small, 1.0, sin_half)
    )
    return vec * scale


def matrix_to_axis_angle(matrix: torch.Tensor) -> torch.Tensor:
    """(..., 3, 3) rotation matrix -> (..., 3) axis-angle."""
    return quaternion_to_axis_angle(matrix_to_quaternion(matrix))


def matrix_to_rot6d(matrix: torch.Tensor) -> torch.Tensor:
    """(..., 3, 3) -> (..., 6): the first two columns, concatenated."""
    return torch.cat([matrix[..., :, 0], matrix[..., :, 1]], dim=-1)


def rot6d_to_matrix(rot6d: torch.Tensor) -> torch.Tensor:
    """(..., 6) -> (..., 3, 3) by Gram-Schmidt; any (non-degenerate) 6-vector maps to a rotation."""
    a1, a2 = rot6d[..., :3], rot6d[..., 3:]
    b1 = torch.nn.functional.normalize(a1, dim=-1)
    b2 = torch.nn.functional.normalize(a2 - (b1 * a2).sum(-1, keepdim=True) * b1, dim=-1)
    b3 = torch.linalg.cross(b1, b2, dim=-1)
    return torch.stack([b1, b2, b3], dim=-1)


def axis_angle_to_rot6d(axis_angle: torch.Tensor) -> torch.Tensor:
    """(..., 3) axis-angle -> (..., 6) rotation."""
    return matrix_to_rot6d(axis_angle_to_matrix(axis_angle))


def rot6d_to_axis_angle(rot6d: torch.Tensor) -> torch.Tensor:
    """(..., 6) rotation -> (..., 3) axis-angle."""
    return matrix_to_axis_angle(rot6d_to_matrix(rot6d))


def pose_to_relative(
    pos: torch.Tensor, rot: torch.Tensor, ref_pos: torch.Tensor, ref_rot: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Express poses (pos (..., 3), rot (..., 3, 3)) in the frame of a reference pose (broadcastable)."""
    ref_rot_t = ref_rot.transpose(-1, -2)
    rel_pos = (ref_rot_t @ (pos - ref_pos)[..., None])[..., 0]
    return rel_pos, ref_rot_t @ rot


def pose_to_absolute(
    rel_pos: torch.Tensor, rel_rot: torch.Tensor, ref_pos: torch.Tensor, ref_rot: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`pose_to_relative`."""
    pos = ref_pos + (ref_rot @ rel_pos[..., None])[..., 0]
    return pos, ref_rot @ rel_rot
