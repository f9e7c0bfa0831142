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
