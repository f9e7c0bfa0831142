"""robomimic HDF5 datasets: validation and ingestion into an episode store.

Layout: group ``data`` (attributes ``total`` and ``env_args``, a JSON string) with one group per
demonstration, ``data/demo_<i>/{actions (N, A), states, rewards, dones, obs/<key>, next_obs/<key>}``;
images are uint8 (N, H, W, C); ``mask/<filter>`` lists demonstration names (e.g. ``train``,
``valid``).

Stored: every ``obs/<key>`` under its own name (uint8 (N, H, W, 1|3|4) arrays as images, the rest
low-dim with their source dtype), ``actions`` as ``action``; the names of the mask filters that list
a demonstration become its tags. ``states``, ``rewards``, ``dones`` and ``next_obs`` are not stored
(``next_obs`` is ``obs`` shifted by one step).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from demoscale.collect.driver import IngestSummary, ingest
from demoscale.collect.source_format import (
    ContentHash,
    EpisodePlan,
    IngestError,
    LoadedEpisode,
    SourceFormat,
    SourcePlan,
    open_hdf5,
    option,
    validating,
)
from demoscale.collect.sources import SourceIds

DEFAULT_RATE_HZ = 20.0  # robosuite's default control frequency


def _is_image(values: np.ndarray) -> bool:
    return values.dtype == np.uint8 and values.ndim == 4 and values.shape[-1] in (1, 3, 4)


def read_demo(file, path: Path, demo: str) -> dict[str, np.ndarray]:
    """The store arrays of one demonstration (checked: present, equal lengths, finite)."""
    group = file[f"data/{demo}"]
    arrays: dict[str, np.ndarray] = {}
    if "actions" not in group:
        raise IngestError(f"{path}: key 'data/{demo}/actions', episode {demo}: required dataset is missing")
    if "obs" not in group or not len(group["obs"]):
        raise IngestError(f"{path}: key 'data/{demo}/obs', episode {demo}: no observations")
    sources = {"action": "actions", **{key: f"obs/{key}" for key in sorted(group["obs"])}}
    for key, member in sources.items():
        try:
            values = np.asarray(group[member][()])
        except Exception as error:
            raise IngestError(
                f"{path}: key 'data/{demo}/{member}', episode {demo}: cannot be read: {error}"
            ) from error
        if values.ndim == 1:
            values = values[:, None]
        if values.ndim == 0:
            raise IngestError(
                f"{path}: key 'data/{demo}/{member}', episode {demo}: scalar, expected (N, ...)"
            )
        if np.issubdtype(values.dtype, np.floating) and not np.isfinite(values).all():
            frame = int(np.flatnonzero(~np.isfinite(values.reshape(len(values), -1)).all(axis=1))[0])
            raise IngestError(
                f"{path}: key 'data/{demo}/{member}', episode {demo}: NaN or infinite at frame {frame}"
            )
        arrays[key] = values
    lengths = {key: len(values) for key, values in arrays.items()}
    if len(set(lengths.values())) != 1:
        raise IngestError(f"{path}: episode {demo}: datasets have different lengths {lengths}")
    if not lengths["action"]:
        raise IngestError(
            f"{path}: key 'data/{demo}/actions', episode {demo}: 0 steps (an empty demonstration)"
        )
    return arrays


def _demos(file, path: Path) -> list[str]:
    if "data" not in file:
        raise IngestError(f"{path}: no 'data' group: not a robomimic file")
    demos = [name for name in file["data"] if name.startswith("demo")]
    if not demos:
        raise IngestError(f"{path}: no demonstrations under data/")

    def order(name: str) -> tuple[int, str]:
        suffix = name.rsplit("_", 1)[-1]
        return (int(suffix) if suffix.isdigit() else 1 << 60, name)

    return sorted(demos, key=order)


def _mask_tags(file) -> dict[str, list[str]]:
    tags: dict[str, list[str]] = {}
    if "mask" in file:
        for name in sorted(file["mask"]):
            for demo in np.asarray(file[f"mask/{name}"][()]).reshape(-1):
                demo = demo.decode() if isinstance(demo, bytes) else str(demo)
                tags.setdefault(demo, []).append(name)
    return tags


@dataclass(frozen=True)
class RobomimicOptions:
    rate_hz: float | None = option(None, "control rate (default: the file's control_freq, else 20)")


@dataclass(frozen=True)
class RobomimicDemo:
    """One planned demonstration: its file and ``data/<demo>`` group."""

    path: str
    demo: str


class RobomimicFormat(SourceFormat):
    """robomimic HDF5 files (the :class:`~demoscale.collect.source_format.SourceFormat` contract)."""

    name = "robomimic"
    summary = "a robomimic HDF5 file"
    src_help = "the .hdf5 file (or a directory searched for *.hdf5)"
    patterns = ("*.hdf5",)
    what = "robomimic HDF5 file"
    options_type = RobomimicOptions

    def plan(
        self, path: Path, ids: SourceIds, options: RobomimicOptions, limit: int | None, progress: bool
    ) -> SourcePlan:
        """Validate a whole robomimic file (its demonstrations must share keys and shapes)."""
        path = Path(path).resolve()
        plans, signature = [], None
        with open_hdf5(path) as file:
            demos = _demos(file, path)
            try:
                env_args = json.loads(file["data"].attrs.get("env_args", "{}"))
            except (TypeError, json.JSONDecodeError):
                env_args = {}
            ids = SourceIds(task=env_args.get("env_name")).override(ids)  # the task defaults to the env name
            tags = _mask_tags(file)
            for demo in validating(demos[:limit], path, progress, unit="demo"):
                arrays = read_demo(file, path, demo)
                demo_signature = {key: (values.shape[1:], values.dtype.str) for key, values in arrays.items()}
                if signature is None:
                    signature = demo_signature
                elif demo_signature != signature:
                    raise IngestError(
                        f"{path}: episode {demo} has different keys/shapes from the first demonstration"
                    )
                digest = ContentHash().arrays(arrays).hexdigest()
                load_args = RobomimicDemo(str(path), demo)
                plans.append(
                    EpisodePlan(
                        f"{path}#{demo}",
                        digest,
                        len(arrays["action"]),
                        load_args,
                        ids,
                        tags=tuple(tags.get(demo, [])),
                    )
                )
        rate_hz = options.rate_hz
        if rate_hz is None:
            rate_hz = float((env_args.get("env_kwargs") or {}).get("control_freq", DEFAULT_RATE_HZ))
        return SourcePlan(robomimic_features(signature, rate_hz), plans)

    def load(self, demo: RobomimicDemo, want_encoded: bool) -> LoadedEpisode:
        path = Path(demo.path)
        with open_hdf5(path) as file:
            return read_demo(file, path, demo.demo), None


ROBOMIMIC = RobomimicFormat()


def robomimic_features(signature: Mapping[str, tuple], rate_hz: float) -> dict:
    from demoscale.datasets import FeatureSpec

    features = {}
    for key, (shape, dtype) in signature.items():
        if np.dtype(dtype) == np.uint8 and len(shape) == 3 and shape[-1] in (1, 3, 4):
            features[key] = FeatureSpec(
                kind="image", shape=shape, dtype="uint8", rate_hz=rate_hz, units="rgb"
            )
        else:
            features[key] = FeatureSpec(
                kind="low_dim", shape=shape, dtype=np.dtype(dtype).name, rate_hz=rate_hz
            )
    return features


def ingest_robomimic(
    src: str | os.PathLike, store: str | os.PathLike, *, rate_hz: float | None = None, **common: Any
) -> IngestSummary:
    """Ingest a robomimic HDF5 file into ``store`` (all ``obs/`` keys, ``actions`` as ``action``,
    mask filters as tags). ``task`` defaults to the file's ``env_args`` env name; ``rate_hz`` to
    its control frequency, else 20 Hz. The whole file is validated before anything is written.
    ``common`` are the driver's keywords (:func:`demoscale.collect.ingest`).
    """
    return ingest(ROBOMIMIC, src, store, RobomimicOptions(rate_hz=rate_hz), **common)
