"""Connecting to Ray for a sweep: ``collect.ray_cluster``'s session, with Tune's working folder kept.

The session helper itself lives in ``demoscale.collect.ray_cluster`` (cluster ingestion uses it too,
and ``collect`` may not import this package); only what a sweep adds is here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from demoscale.collect.ray_cluster import ClusterConnectionError, check_reachable
from demoscale.collect.ray_cluster import ray_session as _ray_session

__all__ = ["ClusterConnectionError", "check_reachable", "ray_session"]


@contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None) -> Iterator[dict]:
    """:func:`demoscale.collect.ray_cluster.ray_session` for a sweep (same arguments)."""
    # Tune would otherwise change each trial's working folder; paths are resolved in the driver anyway.
    os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")
    with _ray_session(address, num_cpus) as session:
        yield session
