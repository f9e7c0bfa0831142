"""Batched transactions: episodes buffered and written together, shard files written directly.

The store writes a transaction's episodes in batches (``flush_bytes``) and its image frames straight
into the shard files; these tests check that what lands on disk is what zarr itself reads, across
shard boundaries and several flushes, and that a rollback after flushes still restores every byte.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr
from demoscale.datasets import EpisodeStore
from demoscale.datasets.codecs import decode_frame


@pytest.mark.parametrize("flush_bytes", [0, 20_000, 1 << 30], ids=["every-episode", "some", "once"])
def test_batched_episodes_read_back_exactly_through_the_store_and_through_zarr(
    tmp_path: Path, kit, flush_bytes: int
) -> None:
    store = EpisodeStore.create(tmp_path / "s.zarr", kit.features(), image_shard_frames=16)
    lengths = [7, 12, 30, 5, 9]  # 63 frames across 4 shards of 16; episode 2 spans three shards
    with store.transaction(flush_bytes=flush_bytes):
        for i, n in enumerate(lengths):
            kit.append(store, i, n, env_id=str(i % 2), object_id="0")
        assert store.n_episodes == 0  # buffered or written, but not committed
    store.validate(deep=True)
    reopened = EpisodeStore.open(tmp_path / "s.zarr")
    assert list(reopened.episodes["length"]) == lengths
    frames = zarr.open_array(zarr.storage.LocalStore(tmp_path / "s.zarr"), path="data/camera0_rgb", mode="r")
    assert frames.shape == (sum(lengths),)
    start = 0
    for i, n in enumerate(lengths):
        expected = kit.make_episode(i, n)
        stored = reopened.episode(i)
        for key in ("robot0_eef_pos", "action", "pointcloud_xyz"):
            np.testing.assert_array_equal(stored[key], expected[key])
        # zarr's own reader (not the store's shard reader) decodes the frames this writer wrote
        via_zarr = [decode_frame(bytes(b), "jpeg") for b in frames[start : start + n]]
        np.testing.assert_array_equal(np.stack(via_zarr), stored["camera0_rgb"])
        assert np.abs(stored["camera0_rgb"].astype(int) - expected["camera0_rgb"]).mean() < 4
        start += n


def test_a_batch_appended_to_a_partial_shard_keeps_the_frames_before_it(tmp_path: Path, kit) -> None:
    store = EpisodeStore.create(tmp_path / "s.zarr", kit.features(), image_shard_frames=16)
    kit.append(store, 0, 10, env_id="0", object_id="0")  # a single append: shard 0 holds 10
    before = store.read("camera0_rgb", 0, 10)
    with store.transaction(flush_bytes=0):
        kit.append(store, 1, 4, env_id="0", object_id="0")
        kit.append(store, 2, 20, env_id="0", object_id="0")
    store.validate(deep=True)
    np.testing.assert_array_equal(EpisodeStore.open(tmp_path / "s.zarr").read("camera0_rgb", 0, 10), before)
    assert store.n_frames == 34


def test_rollback_after_several_flushes_restores_every_byte(tmp_path: Path, kit) -> None:
    path = tmp_path / "s.zarr"
    store = EpisodeStore.create(path, kit.features(), image_shard_frames=16)
    with store.transaction():
        for i in range(3):
            kit.append(store, i, 11, env_id="0", object_id="0")
    before = kit.snapshot(path)
    with pytest.raises(RuntimeError, match="late failure"), store.transaction(flush_bytes=0):
        for i in range(3, 8):  # each episode flushed at once: shards 2..4 are rewritten several times
            kit.append(store, i, 11, env_id="1", object_id="0")
        raise RuntimeError("late failure")
    assert kit.snapshot(path) == before
    store.validate(deep=True)
    assert store.n_episodes == 3
    with store.transaction():
        kit.append(store, 9, 5, env_id="1", object_id="0")
    assert EpisodeStore.open(path).n_episodes == 4
