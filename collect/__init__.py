"""Readers, validators and writers of the raw demonstration formats, and ingestion into the store.

One driver ingests every format: :func:`ingest` (``ingest("umi", src, store, ...)``) returns an
:class:`IngestSummary` and raises :class:`IngestError` on bad input, leaving the store as it was.
The formats are adapters registered in ``collect/formats.py`` (``FORMATS``), each satisfying
:class:`SourceFormat`; each also has a named shortcut with its options as keywords:

- :func:`ingest_umi` — UMI ``dataset.zarr.zip`` files (or a ``<task>/env_<i>/object_<j>/`` tree);
- :func:`ingest_umi_session` — a raw UMI session (``dataset_plan.pkl`` + ``demos/*/raw_video.mp4``);
- :func:`ingest_joylo` — JoyLo per-episode HDF5 files or a merged BRS file;
- :func:`ingest_robomimic` — a robomimic HDF5 file;
- :func:`ingest_replay_buffer` — a diffusion_policy replay buffer (e.g. PushT);
- :func:`ingest_lerobot` — a LeRobot dataset (codebase v2.1 or v3.0).

Writers of the source formats (used by the simulator, as hardware would write them):
:func:`write_umi_zip`, :func:`write_joylo_episode`, :func:`write_brs_merged`. And a store written
out in another format: :func:`export_lerobot` (a LeRobot v3.0 dataset).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from demoscale.collect.driver import IngestSummary, ingest
from demoscale.collect.formats import FORMATS, source_format
from demoscale.collect.source_format import IngestError, IngestLockTimeout, SourceFormat

__all__ = [
    "FORMATS",
    "IngestError",
    "IngestLockTimeout",
    "IngestSummary",
    "SourceFormat",
    "ingest",
    "source_format",
    "ingest_umi",
    "ingest_umi_session",
    "ingest_joylo",
    "ingest_robomimic",
    "ingest_replay_buffer",
    "ingest_lerobot",
    "export_lerobot",
    "write_umi_zip",
    "write_joylo_episode",
    "write_brs_merged",
]

_LAZY = {
    "ingest_umi": "demoscale.collect.umi",
    "write_umi_zip": "demoscale.collect.umi",
    "ingest_umi_session": "demoscale.collect.umi_session",
    "ingest_joylo": "demoscale.collect.joylo",
    "write_joylo_episode": "demoscale.collect.joylo",
    "write_brs_merged": "demoscale.collect.joylo",
    "ingest_robomimic": "demoscale.collect.robomimic",
    "ingest_replay_buffer": "demoscale.collect.replay_buffer",
    "ingest_lerobot": "demoscale.collect.lerobot",
    "export_lerobot": "demoscale.collect.lerobot_export",
}

if TYPE_CHECKING:
    from demoscale.collect.joylo import ingest_joylo, write_brs_merged, write_joylo_episode
    from demoscale.collect.lerobot import ingest_lerobot
    from demoscale.collect.lerobot_export import export_lerobot
    from demoscale.collect.replay_buffer import ingest_replay_buffer
    from demoscale.collect.robomimic import ingest_robomimic
    from demoscale.collect.umi import ingest_umi, write_umi_zip
    from demoscale.collect.umi_session import ingest_umi_session


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'demoscale.collect' has no attribute {name!r}")
