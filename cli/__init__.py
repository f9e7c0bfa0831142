"""demoscale: how much more robot data, and of what kind?

Subpackages (one per folder of the repository):

- ``demoscale.collect``   raw demonstration formats and ingestion into episode stores
- ``demoscale.datasets``  the episode store, subsets, the windowed sampler, the DataModule
- ``demoscale.policies``  encoders, diffusion policy, WB-VIMA, waypoint heads, Lightning CLI
- ``demoscale.eval``      simulated tasks, rollout evaluation, PushT, real-robot score files
- ``demoscale.ray_jobs``  Ray Tune sweeps over environment/object/demo counts
- ``demoscale.scaling``   power-law fits, plots and data-collection budgets
"""

__version__ = "0.1.0"

# The one confidence level of every statement the package makes, unless a ``confidence=`` argument
# (``--confidence`` on the command line) says otherwise: rollout intervals (success rate and mean
# score), scaling-law and prediction intervals, plot bands, and the decision rule of a budget (a plan
# must reach its target in this share of the bootstrap laws; "out of reach" needs this share to
# stay below it). Kept here, in the package root, because eval and scaling may not import each other.
DEFAULT_CONFIDENCE = 0.9
