"""Whole-body simulated tasks (a Galaxea-R1-like mobile manipulator, JoyLo action layout).

- :mod:`.scene`: procedural scenes and objects from integer ids, and the MJCF;
- :mod:`.env`: :class:`~demoscale.eval.wholebody.env.WholeBodyEnv` (observations with store keys,
  fused point clouds from rendered depth);
- :mod:`.expert`: the scripted expert (damped-least-squares IK on MuJoCo Jacobians);
- :mod:`.tasks`: the ``fetch_shelf`` and ``touch_shelf`` registry entries and the JoyLo recording writer;
- :mod:`.bench`: physics and rendering throughput.
"""
