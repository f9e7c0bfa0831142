"""Writers that race, die or fail half-way, and damaged files: real processes, real stores on disk."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from demoscale.__main__ import main as demoscale_main
from demoscale.datasets import (
    EpisodeStore,
    FeatureSpec,
    StoreError,
    StoreLockTimeout,
    repair_store,
    writer_lock,
)

FEATURES = {
    "camera0_rgb": FeatureSpec(kind="image", shape=(24, 24, 3), dtype="uint8"),
    "action": FeatureSpec(kind="low_dim", shape=(2,), dtype="float32"),
}


def _episode(k: int, length: int | None = None) -> dict[str, np.ndarray]:
    """Episode k: every value says which episode (and frame) it belongs to."""
    length = length or 4 + k % 3
    frames = np.full((length, 24, 24, 3), (k * 7) % 256, np.uint8)
    frames[:, :, :, 1] = np.arange(length, dtype=np.uint8)[:, None, None]
    return {"camera0_rgb": frames, "action": np.stack([np.full(length, k, np.float32), np.arange(length)], 1)}


def _append(store: EpisodeStore, k: int, length: int | None = None) -> int | None:
    return store.append_episode(
        _episode(k, length), env_id=str(k % 3), object_id="0", source=f"ep-{k}", source_sha256=f"sha-{k}"
    )


def _check_each_once(path: Path, expected: set[int]) -> None:
    """Every expected episode exactly once, with its own data, and the store valid."""
    store = EpisodeStore.open(path)
    store.validate(deep=True)
    hashes = store.episodes["source_sha256"].tolist()
    assert sorted(hashes) == sorted(f"sha-{k}" for k in expected)
    for index, digest in enumerate(hashes):
        k = int(digest.split("-")[1])
        episode = store.episode(index)
        np.testing.assert_array_equal(episode["action"], _episode(k)["action"])
        np.testing.assert_array_equal(episode["camera0_rgb"], _episode(k)["camera0_rgb"])  # png: exact


def _writer(path: str, episodes: list[int], ready, go) -> None:
    store = EpisodeStore.open(path, mode="a")
    ready.put(os.getpid())
    go.wait(30)
    for k in episodes:
        _append(store, k)


def test_two_writer_processes_write_every_episode_once(tmp_path: Path) -> None:
    """Two processes append at the same moment (with 4 episodes in common): none lost, none mixed."""
    path = tmp_path / "shared.zarr"
    store = EpisodeStore.create(path, FEATURES, image_codec="png")
    _append(store, 0)
    context = multiprocessing.get_context("fork")
    ready, go = context.Queue(), context.Event()
    first, second = list(range(1, 25)), list(range(21, 45))
    writers = [context.Process(target=_writer, args=(str(path), ks, ready, go)) for ks in (first, second)]
    for writer in writers:
        writer.start()
    for _ in writers:
        ready.get(timeout=60)
    go.set()
    for writer in writers:
        writer.join(120)
        assert writer.exitcode == 0
    _check_each_once(path, set(range(0, 45)))


def test_second_writer_waits_with_a_message_then_times_out_clearly(
    tmp_path: Path, caplog, lock_holder
) -> None:
    path = tmp_path / "busy.zarr"
    store = EpisodeStore.create(path, FEATURES, image_codec="png")
    _append(store, 0)
    before = {p: p.read_bytes() for p in path.rglob("*") if p.is_file()}
    with lock_holder(path) as holder:
        with pytest.raises(StoreLockTimeout, match=rf"another writer \(pid {holder.pid} .*still held it"):
            with writer_lock(path, timeout=0.5):
                pass
        assert f"another writer holds the store (pid {holder.pid}" in caplog.text
        with pytest.raises(StoreLockTimeout, match=f"pid {holder.pid}"):
            with store.transaction(lock_timeout=0):
                _append(store, 1)
        assert {p: p.read_bytes() for p in path.rglob("*") if p.is_file()} == before
    _append(store, 1)  # the lock is free again (a dead holder's flock goes with it)
    _check_each_once(path, {0, 1})


def test_empty_store_has_an_episodes_table_and_info(tmp_path: Path, capsys) -> None:
    store = EpisodeStore.create(tmp_path / "empty.zarr", FEATURES, image_codec="png")
    assert store.episode_starts.tolist() == [] and len(store.episodes) == 0
    assert store.info()["n_episodes"] == 0
    store.validate(deep=True)
    assert demoscale_main(["store", "info", str(tmp_path / "empty.zarr")]) == 0
    assert "episodes   0   frames 0" in capsys.readouterr().out
    assert _append(EpisodeStore.open(tmp_path / "empty.zarr", mode="a"), 3) == 0


def _create_then_append_one(path: str, created) -> None:
    store = EpisodeStore.create(path, FEATURES, image_codec="png")
    created.set()
    _append(store, 0, length=3000)  # long enough to be killed inside


def test_kill_in_the_first_append_leaves_a_usable_store(tmp_path: Path) -> None:
    path = tmp_path / "first.zarr"
    context = multiprocessing.get_context("fork")
    created = context.Event()
    child = context.Process(target=_create_then_append_one, args=(str(path), created))
    child.start()
    assert created.wait(60)
    time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    store = EpisodeStore.open(path, mode="a")
    assert store.info()["n_episodes"] in (0, 1) and len(store.episodes) == store.n_episodes
    _append(store, 5)
    assert store.episodes["source_sha256"].tolist()[-1] == "sha-5"
    store.validate(deep=True)


def _create_forever(folder: str, progress) -> None:
    for i in range(10_000):
        EpisodeStore.create(Path(folder) / f"s{i}.zarr", FEATURES, image_codec="png")
        progress.put(i)


def test_kill_during_creation_leaves_no_store_or_a_whole_one(tmp_path: Path) -> None:
    """Creation is atomic: a creator killed at any moment leaves no half-made store behind."""
    rng = np.random.default_rng(1)
    context = multiprocessing.get_context("fork")
    for round_ in range(3):
        folder = tmp_path / f"round{round_}"
        folder.mkdir()
        progress = context.Queue()
        child = context.Process(target=_create_forever, args=(str(folder), progress))
        child.start()
        progress.get(timeout=60)
        time.sleep(float(rng.uniform(0.0, 0.3)))
        os.kill(child.pid, signal.SIGKILL)
        child.join()
        stores = sorted(folder.glob("s*.zarr"), key=lambda p: int(p.name[1:-5]))
        for path in stores:
            EpisodeStore.open(path).validate()  # every store that exists is whole
        # The store being created when the kill came can be created (and used) now.
        following = folder / f"s{len(stores)}.zarr"
        _append(EpisodeStore.open_or_create(following, FEATURES, image_codec="png"), 1)
        assert not list(folder.glob(".*creating*"))


def test_store_left_without_attributes_is_removed_by_repair(tmp_path: Path, capsys) -> None:
    """What a creation killed before its root attributes leaves (older versions could): repair clears it."""
    path = tmp_path / "unfinished.zarr"
    root = zarr.open_group(zarr.storage.LocalStore(path), mode="w-", zarr_format=3)
    root.create_group("data").create_array("action", shape=(0, 2), chunks=(16, 2), dtype="float32")
    root.create_group("meta").create_array("episode_ends", shape=(0,), chunks=(16,), dtype="int64")
    with pytest.raises(StoreError, match="not a demoscale episode store.*store repair"):
        EpisodeStore.open(path)
    assert demoscale_main(["store", "repair", str(path)]) == 0
    assert "removed an unfinished store" in capsys.readouterr().out
    assert not path.exists()
    _append(EpisodeStore.open_or_create(path, FEATURES, image_codec="png"), 2)


def test_store_with_data_but_no_attributes_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "foreign.zarr"
    root = zarr.open_group(zarr.storage.LocalStore(path), mode="w-", zarr_format=3)
    root.create_array("values", shape=(3,), dtype="int64")[:] = [1, 2, 3]
    with pytest.raises(StoreError, match="holds data"):
        repair_store(path)
    assert path.exists()


def _append_in_transaction_forever(path: str, progress) -> None:
    store = EpisodeStore.open(path, mode="a")
    with store.transaction():
        for k in range(100, 10_000):
            _append(store, k)
            progress.put(k)


def test_transaction_is_all_or_nothing(tmp_path: Path) -> None:
    path = tmp_path / "batch.zarr"
    store = EpisodeStore.create(path, FEATURES, image_codec="png")
    for k in range(3):
        _append(store, k)
    before = {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    # A failure after two staged episodes: every file as it was, byte for byte.
    with pytest.raises(RuntimeError, match="late failure"):
        with store.transaction():
            _append(store, 3)
            _append(store, 4)
            assert store.n_episodes == 3  # staged episodes are invisible until the commit
            raise RuntimeError("late failure")
    assert {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()} == before
    assert store.n_episodes == 3
    # A writer killed inside its transaction: the old episodes only, and the store appendable.
    context = multiprocessing.get_context("fork")
    progress = context.Queue()
    child = context.Process(target=_append_in_transaction_forever, args=(str(path), progress))
    child.start()
    for _ in range(3):
        progress.get(timeout=60)
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    assert EpisodeStore.open(path).n_episodes == 3
    with store.transaction():
        for k in (3, 4):
            _append(store, k)
        _append(store, 4)  # the same content twice in one batch is written once
    _check_each_once(path, {0, 1, 2, 3, 4})


@pytest.fixture
def healthy(tmp_path: Path) -> Path:
    path = tmp_path / "healthy.zarr"
    store = EpisodeStore.create(path, FEATURES, image_codec="png")
    for k in range(6):
        _append(store, k)
    return path


def _flip(path: Path, position: int, count: int) -> None:
    """Invert ``count`` bytes at ``position`` (negative: from the end) of a file, keeping its size."""
    data = bytearray(path.read_bytes())
    position = position % len(data)
    data[position : position + count] = bytes(255 - b for b in data[position : position + count])
    path.write_bytes(bytes(data))


def _garbage_in_a_middle_frame(store: Path) -> None:
    shard = store / "data/camera0_rgb/c/0"
    frames_bytes = shard.stat().st_size - (16 * 1000 + 4)  # the shard index of 1,000 frames is last
    _flip(shard, frames_bytes // 2, 16)


@pytest.mark.parametrize(
    ("damage", "default_finds", "message"),
    [
        (lambda p: (p / "data/action/c/0/0").unlink(), True, r"data/action/c/0/0 \(frames 0:30 .*missing"),
        (
            lambda p: (p / "data/action/c/0/0").write_bytes((p / "data/action/c/0/0").read_bytes()[:-9]),
            True,
            r"data/action/c/0/0 .*damaged chunk file: zstd",
        ),
        (
            lambda p: (p / "data/camera0_rgb/c/0").write_bytes((p / "data/camera0_rgb/c/0").read_bytes()[:-700]),
            True,
            r"data/camera0_rgb/c/0 .*shard",
        ),
        (_garbage_in_a_middle_frame, False, r"data/camera0_rgb frames (1[0-9]|2[0-5]):\d+ \(episode \d\): damaged"),
        (lambda p: _flip(p / "data/action/c/0/0", -40, 4), False, r"data/action frames 0:30 .*cannot be read"),
    ],
    ids=["missing-low-dim-chunk", "truncated-low-dim-chunk", "truncated-image-shard", "garbage-in-image-shard",
         "bit-flips-in-low-dim-chunk"],
)  # fmt: skip
def test_validate_finds_damaged_chunks(healthy: Path, capsys, damage, default_finds, message) -> None:
    damage(healthy)
    if default_finds:
        with pytest.raises(StoreError, match=message):
            EpisodeStore.open(healthy).validate()
    else:
        EpisodeStore.open(healthy).validate()  # presence and sizes are fine: only reading finds it
    with pytest.raises(StoreError, match=message):
        EpisodeStore.open(healthy).validate(deep=True)
    assert demoscale_main(["store", "validate", "--deep", "--no-progress", str(healthy)]) == 1
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("column", ["episode_ends", "source_sha256"])
def test_corrupt_index_chunks_give_messages_not_tracebacks(healthy: Path, capsys, column) -> None:
    (healthy / "meta" / column / "c" / "0").write_bytes(os.urandom(40))
    # validate's answer is "invalid" (1); info reports a store it cannot open as an input error (2)
    # and one that opens but cannot be read as a failure (1).
    for command, codes in ((["info"], (1, 2)), (["validate"], (1,)), (["validate", "--deep"], (1,))):
        assert demoscale_main(["store", *command, str(healthy)]) in codes
        err = capsys.readouterr().err
        assert f"meta/{column}" in err and "Traceback" not in err


def test_repair_cuts_an_uncommitted_tail(healthy: Path, capsys) -> None:
    store = EpisodeStore.open(healthy, mode="a")
    store.stats("action")
    committed = {p.relative_to(healthy) for p in healthy.rglob("*") if p.is_file()}
    # What a writer killed after its data writes, before its commit, leaves behind.
    action = zarr.open_array(str(healthy / "data" / "action"), mode="r+")
    action.resize((40, 2))
    action[30:40] = 9.0
    assert EpisodeStore.open(healthy).info()["uncommitted_frames"] == 10
    assert demoscale_main(["store", "repair", str(healthy)]) == 0
    assert "removed 10 uncommitted frames from data/action" in capsys.readouterr().out
    assert EpisodeStore.open(healthy).info()["uncommitted_frames"] == 0
    assert {p.relative_to(healthy) for p in healthy.rglob("*") if p.is_file()} == committed
    assert demoscale_main(["store", "repair", str(healthy)]) == 0
    assert "nothing to repair" in capsys.readouterr().out
    _check_each_once(healthy, set(range(6)))


def test_remote_store_transaction_rolls_back_to_its_committed_episodes() -> None:
    """No lock and no byte-level undo at a remote URL: a failed batch still stays invisible."""
    url = "memory://rollback/store.zarr"
    store = EpisodeStore.create(url, FEATURES, image_codec="png")
    _append(store, 0)
    with pytest.raises(RuntimeError):
        with store.transaction():
            _append(store, 1)
            raise RuntimeError("late failure")
    reopened = EpisodeStore.open(url)
    assert reopened.n_episodes == 1 and reopened.info()["uncommitted_frames"] == 0
