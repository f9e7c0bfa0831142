"""The registry of source formats: name -> the adapter object satisfying ``SourceFormat``.

Adding a format is one module (its adapter) and one line here; ``demoscale ingest NAME`` and
``demoscale.collect.ingest(NAME, ...)`` pick it up. Adapters are imported only when asked for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from demoscale.collect.source_format import SourceFormat

# name -> "module:attribute" of the adapter (imported when first asked for) or the adapter itself, in
# the order `demoscale ingest --help` lists them.
FORMATS: dict[str, str | SourceFormat] = {
    "umi": "demoscale.collect.umi:UMI_ZIP",
    "umi-session": "demoscale.collect.umi_session:UMI_SESSION",
    "joylo": "demoscale.collect.joylo:JOYLO",
    "robomimic": "demoscale.collect.robomimic:ROBOMIMIC",
    "replay-buffer": "demoscale.collect.replay_buffer:REPLAY_BUFFER",
    "lerobot": "demoscale.collect.lerobot:LEROBOT",
}


def source_format(name: str) -> SourceFormat:
    """The adapter registered as ``name``."""
    if name not in FORMATS:
        from demoscale.collect.source_format import IngestError

        raise IngestError(f"unknown source format {name!r}; formats: {', '.join(FORMATS)}")
    entry = FORMATS[name]
    if not isinstance(entry, str):
        return entry
    module, attribute = entry.split(":")
    return getattr(importlib.import_module(module), attribute)
