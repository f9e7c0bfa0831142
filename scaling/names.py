"""Names shared by the command line and the library; importing this module loads nothing else."""

# Axis columns a scaling law can be fitted over, in the order panels are drawn.
AXES: tuple[str, ...] = ("n_envs", "n_objects", "n_pairs", "demos_per_pair", "total_demos")
METHODS: tuple[str, ...] = ("loglog", "saturating", "joint")
BOOTSTRAP_MODES: tuple[str, ...] = ("auto", "rollouts", "trials", "both", "residuals")
