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
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from demoscale.collect.ingest import ContentHash, EpisodePlan, IngestError, IngestSummary, write_plans
from tqdm import tqdm

DEFAULT_RATE_HZ = 20.0  # robosuite's default control frequency


def _is_image(values: np.ndarray) -> bool:
    return values.dtype == np.uint8 and values.ndim == 4 and values.shape[-1] in (1, 3, 4)


def _open(path: Path):
    import h5py

    try:
        return h5py.File(path, "r")
    except Exception as error:  # h5py raises OSError for truncated or non-HDF5 files
        raise IngestError(f"{path}: not a readable HDF5 file (truncated or corrupt?): {error}") from error


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


def plan_robomimic(path: str | os.PathLike, ids=None, progress: bool = False):
    """Validate a whole robomimic file; return (key signature, env_args dict, plans)."""
    from demoscale.collect.sources import SourceIds

    ids = ids or SourceIds()
    path = Path(path).resolve()
    plans, signature = [], None
    with _open(path) as file:
        demos = _demos(file, path)
        try:
            env_args = json.loads(file["data"].attrs.get("env_args", "{}"))
        except (TypeError, json.JSONDecodeError):
            env_args = {}
        tags = _mask_tags(file)
        for demo in tqdm(demos, desc=f"validate {path.name}", unit="demo", disable=not progress):
            arrays = read_demo(file, path, demo)
            demo_signature = {key: (values.shape[1:], values.dtype.str) for key, values in arrays.items()}
            if signature is None:
                signature = demo_signature
            elif demo_signature != signature:
                raise IngestError(
                    f"{path}: episode {demo} has different keys/shapes from the first demonstration"
                )
            digest = ContentHash()
            for key in sorted(arrays):
                digest.array(key, arrays[key])
            plans.append(
                EpisodePlan(
                    source=f"{path}#{demo}",
                    sha256=digest.hexdigest(),
                    length=len(arrays["action"]),
                    load_args={"path": str(path), "demo": demo},
                    env_id=ids.env_id,
                    object_id=ids.object_id,
                    task=ids.task or env_args.get("env_name"),
                    operator=ids.operator,
                    tags=tags.get(demo, []),
                )
            )
    return signature, env_args, plans


def load_robomimic_demo(args: Mapping, want_encoded: bool):
    """Loader for one planned robomimic demonstration."""
    path = Path(args["path"])
    with _open(path) as file:
        return read_demo(file, path, args["demo"]), None


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
    src: str | os.PathLike,
    store: str | os.PathLike,
    *,
    env_id: str | None = None,
    object_id: str | None = None,
    task: str | None = None,
    operator: str | None = None,
    rate_hz: float | None = None,
    image_codec: str | None = None,
    workers: int = 1,
    dry_run: bool = False,
    progress: bool = True,
    lock_timeout: float | None = None,
) -> IngestSummary:
    """Ingest a robomimic HDF5 file into ``store`` (all ``obs/`` keys, ``actions`` as ``action``,
    mask filters as tags). ``task`` defaults to the file's ``env_args`` env name; ``rate_hz`` to
    its control frequency, else 20 Hz. The whole file is validated before anything is written.
    """
    from demoscale.collect.sources import SourceIds

    started = time.perf_counter()
    ids = SourceIds(env_id=env_id, object_id=object_id, task=task, operator=operator)
    path = Path(src)
    signature, env_args, plans = plan_robomimic(path, ids, progress=progress)
    if rate_hz is None:
        rate_hz = float((env_args.get("env_kwargs") or {}).get("control_freq", DEFAULT_RATE_HZ))
    return write_plans(
        store,
        robomimic_features(signature, rate_hz),
        plans,
        load_robomimic_demo,
        sources=[str(path.resolve())],
        image_codec=image_codec,
        workers=workers,
        dry_run=dry_run,
        progress=progress,
        started=started,
        lock_timeout=lock_timeout,
    )
