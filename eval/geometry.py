"""Small geometry shared by the simulated task families."""

from __future__ import annotations

import numpy as np


def quaternion_yaw(
    w: np.ndarray | float, x: np.ndarray | float, y: np.ndarray | float, z: np.ndarray | float
) -> np.ndarray:
    """The yaw (rotation about the world z axis, radians in (-pi, pi]) of unit quaternions given by
    their components, element-wise (the first of the intrinsic z-y-x Euler angles)."""
    return np.arctan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))
