"""A writer killed with SIGKILL at random moments leaves a readable store of whole episodes."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import numpy as np
from demoscale.datasets import EpisodeStore, FeatureSpec

FEATURES = {
    "camera0_rgb": FeatureSpec(kind="image", shape=(48, 48, 3), dtype="uint8"),
    "action": FeatureSpec(kind="low_dim", shape=(2,), dtype="float32"),
}


def _episode(k: int) -> dict[str, np.ndarray]:
    """Episode k has length 3 + k % 5 and values that encode (k, t)."""
    length = 3 + k % 5
    t = np.arange(length, dtype=np.float32)
    frames = np.broadcast_to((np.arange(48)[None, :, None, None] * 3 + k) % 256, (length, 48, 48, 3))
    return {
        "camera0_rgb": frames.astype(np.uint8),
        "action": np.stack([np.full(length, k, np.float32), t], 1),
    }


def _append_forever(path: str, progress) -> None:
    # Runs in a forked child (modules already loaded, so it starts at once) until it is killed.
    store = EpisodeStore.open_or_create(path, FEATURES)
    k = store.n_episodes
    while True:
        store.append_episode(
            _episode(k),
            env_id=str(k % 3),
            object_id=str(k % 2),
            source=f"episode-{k}",
            source_sha256=f"sha-{k}",
        )
        progress.put(k)
        k += 1


def _check_whole_episodes(path: Path) -> int:
    store = EpisodeStore.open(path)
    store.validate()
    lengths = np.diff(np.concatenate([[0], store.episode_ends]))
    expected = [3 + k % 5 for k in range(store.n_episodes)]
    assert lengths.tolist() == expected
    actions = store.read("action", 0, store.n_frames)
    episode_of_frame = np.repeat(np.arange(store.n_episodes), lengths)
    np.testing.assert_array_equal(actions[:, 0], episode_of_frame)
    assert store.episodes["source_sha256"].tolist() == [f"sha-{k}" for k in range(store.n_episodes)]
    return store.n_episodes


def test_kill_during_append_leaves_only_whole_episodes(tmp_path: Path) -> None:
    path = tmp_path / "killed.zarr"
    rng = np.random.default_rng(0)
    context = multiprocessing.get_context("fork")
    counts = []
    for _ in range(4):
        progress = context.Queue()
        child = context.Process(target=_append_forever, args=(str(path), progress))
        child.start()
        progress.get(timeout=60)  # one episode committed: the writer is mid-stream now
        time.sleep(float(rng.uniform(0.0, 0.4)))
        os.kill(child.pid, signal.SIGKILL)
        child.join()
        assert child.exitcode == -signal.SIGKILL
        counts.append(_check_whole_episodes(path))
    assert counts == sorted(counts) and counts[-1] >= 4
    # The store is still appendable after the kills, and the new episode follows the old ones.
    store = EpisodeStore.open(path, mode="a")
    n = store.n_episodes
    store.append_episode(_episode(n), env_id="0", object_id="0", source_sha256=f"sha-{n}")
    assert _check_whole_episodes(path) == n + 1
