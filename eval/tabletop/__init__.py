"""The tabletop (UMI-like) task family: a mocap-driven parallel gripper with a wrist camera."""
