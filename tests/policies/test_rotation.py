"""Rotation conversions against scipy, and relative <-> absolute action round trips."""

from __future__ import annotations

import numpy as np
import torch
from demoscale.policies import actions, rotation
from scipy.spatial.transform import Rotation


def _random_axis_angle(n: int, seed: int = 0, max_angle: float = 3.0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    axes = rng.normal(size=(n, 3))
    axes /= np.linalg.norm(axes, axis=1, keepdims=True)
    angles = rng.uniform(0, max_angle, size=(n, 1))
    angles[:3] = [[0.0], [1e-7], [3.1]]  # identity, tiny and near-pi rotations
    return torch.tensor(axes * angles, dtype=torch.float64)


def test_axis_angle_matrix_matches_scipy_and_round_trips():
    axis_angle = _random_axis_angle(500)
    matrix = rotation.axis_angle_to_matrix(axis_angle)
    expected = Rotation.from_rotvec(axis_angle.numpy()).as_matrix()
    np.testing.assert_allclose(matrix.numpy(), expected, atol=1e-10)
    np.testing.assert_allclose(rotation.matrix_to_axis_angle(matrix).numpy(), axis_angle.numpy(), atol=1e-6)


def test_quaternion_matches_scipy_up_to_sign():
    matrix = torch.tensor(Rotation.random(200, random_state=1).as_matrix())
    quat_wxyz = rotation.matrix_to_quaternion(matrix).numpy()
    scipy_xyzw = Rotation.from_matrix(matrix.numpy()).as_quat()
    scipy_wxyz = np.concatenate([scipy_xyzw[:, 3:], scipy_xyzw[:, :3]], axis=1)
    scipy_wxyz *= np.sign(scipy_wxyz[:, :1])
    np.testing.assert_allclose(quat_wxyz, scipy_wxyz, atol=1e-9)


def test_rot6d_round_trip_and_gram_schmidt_of_noisy_input():
    matrix = torch.tensor(Rotation.random(100, random_state=2).as_matrix())
    rot6d = rotation.matrix_to_rot6d(matrix)
    assert rot6d.shape == (100, 6)
    np.testing.assert_allclose(rotation.rot6d_to_matrix(rot6d).numpy(), matrix.numpy(), atol=1e-12)
    noisy = rotation.rot6d_to_matrix(rot6d + 0.1 * torch.randn(100, 6, dtype=torch.float64))
    eye = torch.eye(3, dtype=torch.float64).expand(100, 3, 3)
    np.testing.assert_allclose((noisy.transpose(-1, -2) @ noisy).numpy(), eye.numpy(), atol=1e-10)
    np.testing.assert_allclose(torch.linalg.det(noisy).numpy(), 1.0, atol=1e-10)


def test_relative_pose_is_in_the_reference_frame():
    ref_pos = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    ref_rot = rotation.axis_angle_to_matrix(torch.tensor([[0.0, 0.0, np.pi / 2]], dtype=torch.float64))
    # One metre along world x is one metre along the reference frame's -y after a 90 degree yaw.
    rel_pos, rel_rot = rotation.pose_to_relative(
        ref_pos + torch.tensor([[1.0, 0.0, 0.0]]), ref_rot, ref_pos, ref_rot
    )
    np.testing.assert_allclose(rel_pos.numpy(), [[0.0, -1.0, 0.0]], atol=1e-12)
    np.testing.assert_allclose(rel_rot.numpy(), np.eye(3)[None], atol=1e-12)


def test_relative_action_round_trip_two_robots():
    rng = np.random.default_rng(3)
    batch, horizon, n_robots = 5, 16, 2
    per_robot = [
        np.concatenate(
            [
                rng.normal(size=(batch, horizon, 3)),
                _random_axis_angle(batch * horizon, seed=4 + r).numpy().reshape(batch, horizon, 3),
                rng.uniform(0, 0.08, size=(batch, horizon, 1)),
            ],
            axis=-1,
        )
        for r in range(n_robots)
    ]
    absolute = torch.tensor(np.concatenate(per_robot, axis=-1))
    ref_pos = torch.tensor(rng.normal(size=(batch, n_robots, 3)))
    ref_axis_angle = _random_axis_angle(batch * n_robots, seed=9).reshape(batch, n_robots, 3)
    relative = actions.absolute_to_relative(absolute, ref_pos, ref_axis_angle)
    assert relative.shape == (batch, horizon, 10 * n_robots)
    back = actions.relative_to_absolute(relative, ref_pos, ref_axis_angle)
    back_robots = back.reshape(batch, horizon, n_robots, 7)
    abs_robots = absolute.reshape(batch, horizon, n_robots, 7)
    np.testing.assert_allclose(back_robots[..., :3].numpy(), abs_robots[..., :3].numpy(), atol=1e-9)
    np.testing.assert_allclose(back_robots[..., 6].numpy(), abs_robots[..., 6].numpy(), atol=1e-12)
    np.testing.assert_allclose(
        rotation.axis_angle_to_matrix(back_robots[..., 3:6]).numpy(),
        rotation.axis_angle_to_matrix(abs_robots[..., 3:6]).numpy(),
        atol=1e-9,
    )
    # An action equal to the reference pose is the identity: zero position, identity rotation.
    same = torch.cat(
        [ref_pos[:, :1], ref_axis_angle[:, :1], torch.zeros(batch, 1, 1, dtype=torch.float64)], -1
    )
    rel_same = actions.absolute_to_relative(
        torch.cat([same, same], dim=-1).expand(batch, 1, 14).clone()[..., :7],
        ref_pos[:, :1],
        ref_axis_angle[:, :1],
    )
    np.testing.assert_allclose(rel_same[..., :3].numpy(), 0.0, atol=1e-12)
    np.testing.assert_allclose(
        rel_same[..., 3:9].numpy(), np.array([[[1, 0, 0, 0, 1, 0]]]).repeat(batch, 0), atol=1e-12
    )


def test_relative_actions_reject_other_layouts():
    try:
        actions.absolute_to_relative(torch.zeros(1, 4, 2), torch.zeros(1, 1, 3), torch.zeros(1, 1, 3))
    except ValueError as error:
        assert "multiple of 7" in str(error)
    else:
        raise AssertionError("a 2-D action was accepted as an end-effector pose")
