"""Bringing a store left behind by a killed writer or creator back to a clean state."""

from __future__ import annotations

import os
import shutil

import numpy as np
import zarr
from demoscale.datasets.locking import writer_lock
from demoscale.datasets.schema import FORMAT_NAME, StoreError
from demoscale.datasets.shards import local_path, open_zarr_store, remove_unfinished_creations
from demoscale.datasets.store import EpisodeStore


def repair_store(location: str | os.PathLike[str], lock_timeout: float | None = None) -> list[str]:
    """Bring a store left behind by a killed writer or creator back to a clean state.

    Under the writer lock: removes scratch folders of killed creations beside the store; removes a
    store that never got its root attributes (a creation killed by an older version) when it holds
    no data; cuts every array back to the committed episodes (an uncommitted tail, entries after
    the valid prefix of ``meta/episode_ends``, and committed episodes whose data is incomplete);
    removes leftover ``*.partial`` files and statistics cached for another frame count. Returns one
    line per action (empty when there was nothing to do).
    """
    location = os.fspath(location)
    local = local_path(location)
    actions: list[str] = []
    with writer_lock(location, lock_timeout, what="repair"):
        if local is not None:
            actions += [
                f"removed {p.name}, left by a store creation that was killed"
                for p in remove_unfinished_creations(local)
            ]
            if not local.exists():
                if actions:
                    return actions
                raise StoreError(f"{location}: no such store")
        try:
            root = zarr.open_group(open_zarr_store(location, read_only=False), mode="r+")
        except Exception as error:
            raise StoreError(
                f"{location}: cannot open as a zarr group ({type(error).__name__}: {error})"
            ) from None
        found = root.attrs.get("format")
        if found != FORMAT_NAME:
            if found is not None:
                raise StoreError(f"{location}: format {found!r} is not a demoscale episode store; left alone")
            return actions + [_remove_unfinished_store(location, root)]
        store = EpisodeStore(root, location, writable=True)
        if local is not None:
            leftovers = list(local.rglob("*.partial"))
            for leftover in leftovers:
                leftover.unlink(missing_ok=True)
            if leftovers:
                actions.append(f"removed {len(leftovers)} temporary *.partial file(s) of a killed writer")
        actions += _cut_to_committed(store)
        actions += _drop_stale_statistics(root, store.n_frames)
    return actions


def _remove_unfinished_store(location: str, root: zarr.Group) -> str:
    """Remove a store that never got its attributes, unless it holds data."""
    arrays = [(name, node) for name, node in root.members(max_depth=None) if isinstance(node, zarr.Array)]
    holding = [name for name, array in arrays if array.shape and array.shape[0] > 0]
    if holding:
        raise StoreError(
            f"{location}: has no store attributes but holds data ({', '.join(sorted(holding)[:5])}); "
            "not removing it"
        )
    local = local_path(location)
    if local is not None:
        shutil.rmtree(local)
    else:
        import fsspec

        fs, path = fsspec.core.url_to_fs(location)
        fs.rm(path, recursive=True)
    return "removed an unfinished store (created without its attributes, no data); the next ingest creates it"


def _cut_to_committed(store: EpisodeStore) -> list[str]:
    """Cut every array back to the committed episodes; one line per change."""
    actions = []
    raw_ends = store._read_ends()
    n, n_frames = store.n_episodes, store.n_frames
    if len(raw_ends) > n:
        valid = np.flatnonzero(np.diff(np.concatenate([[0], raw_ends])) <= 0)
        prefix = int(valid[0]) if len(valid) else len(raw_ends)
        if prefix > n:
            actions.append(
                f"dropped episodes {n}..{prefix - 1}: committed, but their data is incomplete "
                f"({'; '.join(store._notes)})"
            )
        if len(raw_ends) > prefix:
            actions.append(
                f"removed {len(raw_ends) - prefix} entries of meta/episode_ends after its valid prefix"
            )
    for path in store._array_paths():
        array = store._array(path)
        length = n_frames if path.startswith("data/") else n
        extra = array.shape[0] - length
        if extra > 0:
            array.resize((length, *array.shape[1:]))
            if path.startswith("data/"):
                actions.append(f"removed {extra} uncommitted frames from {path}")
    return actions


def _drop_stale_statistics(root: zarr.Group, n_frames: int) -> list[str]:
    stats = dict(root.attrs.get("stats", {}))
    stale = sorted(key for key, entry in stats.items() if entry.get("n_frames") != n_frames)
    if not stale:
        return []
    root.attrs["stats"] = {key: entry for key, entry in stats.items() if key not in stale}
    return [f"dropped cached statistics of {', '.join(stale)} (computed on another frame count)"]
