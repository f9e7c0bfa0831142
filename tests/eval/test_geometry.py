"""``demoscale.eval.geometry``: the yaw of quaternions, against scipy's Euler angles."""

from __future__ import annotations

import numpy as np
from demoscale.eval.geometry import quaternion_yaw
from scipy.spatial.transform import Rotation


def test_quaternion_yaw_is_the_first_intrinsic_zyx_euler_angle() -> None:
    rotations = Rotation.from_euler("ZYX", np.random.default_rng(0).uniform(-1.2, 1.2, (50, 3)))
    x, y, z, w = rotations.as_quat().T  # scipy orders quaternions (x, y, z, w)
    np.testing.assert_allclose(quaternion_yaw(w, x, y, z), rotations.as_euler("ZYX")[:, 0], atol=1e-9)
    # A pure yaw, scalar components, either side of the wrap at pi.
    for yaw in (0.3, -2.9, 3.1):
        assert np.isclose(float(quaternion_yaw(np.cos(yaw / 2), 0.0, 0.0, np.sin(yaw / 2))), yaw)
