"""Connecting to Ray: a private local instance by default, an existing cluster by address.

Used by cluster ingestion (``demoscale ingest ... --address``) and by the sweeps (``ray_jobs``,
which may import ``collect`` but not the other way round, so the helper lives here). Only what this
module starts is stopped: a private instance is shut down at the end; for an existing cluster,
``ray.shutdown()`` only disconnects this driver.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager


class ClusterConnectionError(ConnectionError):
    """The Ray cluster at the given address cannot be reached; the message names the address."""


def _host_port(address: str) -> tuple[str, int] | None:
    """``host:port`` of an explicit address (``ray://h:p`` or ``h:p``); None for 'auto'."""
    target = address.removeprefix("ray://")
    if target == "auto" or ":" not in target:
        return None
    host, _, port = target.rpartition(":")
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        raise ClusterConnectionError(
            f"Ray address {address!r} is not of the form HOST:PORT or ray://HOST:PORT"
        ) from None


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast, naming the address, when nothing listens there (``ray.init`` would retry for long)."""
    host_port = _host_port(address)
    if host_port is None:
        return
    try:
        with socket.create_connection(host_port, timeout=timeout_s):
            pass
    except OSError as err:
        raise ClusterConnectionError(f"cannot reach the Ray cluster at {address}: {err}") from None


@contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None) -> Iterator[dict]:
    """Yield with Ray initialised; undo only what was done here.

    ``address`` None or ``"local"``: start a private local instance (``num_cpus`` CPUs, no
    dashboard, worker logs kept out of the terminal) and shut it down afterwards. ``"auto"``,
    ``HOST:PORT`` or ``ray://HOST:PORT``: join that cluster, and only disconnect afterwards.
    If Ray is already initialised in this process, that connection is used and left as it is.
    """
    import ray

    if ray.is_initialized():
        yield {"started": False, "address": "existing"}
        return
    quiet = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR}
    if address in (None, "local"):
        # "local", not None: a stale ray_current_cluster file left by an earlier `ray start` would
        # otherwise make ray.init join that cluster and refuse num_cpus.
        ray.init(address="local", num_cpus=num_cpus, **quiet)
        kind = "local"
    else:
        check_reachable(address)
        try:
            ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
        except Exception as err:  # Ray raises several types for one cause: name the address
            raise ClusterConnectionError(f"cannot connect to the Ray cluster at {address}: {err}") from err
        kind = "cluster"
    try:
        yield {"started": True, "address": kind}
    finally:
        ray.shutdown()
