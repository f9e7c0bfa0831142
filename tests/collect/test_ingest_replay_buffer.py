"""diffusion_policy replay buffers: the real PushT data, zipped buffers, and bad image values."""

from __future__ import annotations

import re
import shutil
import zipfile

import numpy as np
import pytest
import zarr
from demoscale.collect import IngestError, ingest_replay_buffer
from demoscale.collect.ingest_cli import main as cli_main
from demoscale.datasets import EpisodeStore
from numcodecs import Blosc

PUSHT_LOW_DIM = ("state", "keypoint", "n_contacts", "action")


def _compare_with_source(store: EpisodeStore, source, n_frames: int) -> None:
    np.testing.assert_array_equal(
        store.read("img", 0, n_frames), source["data/img"][:n_frames].astype(np.uint8)
    )
    for key in PUSHT_LOW_DIM:
        stored = store.read(key, 0, n_frames)
        assert stored.dtype == source[f"data/{key}"].dtype
        np.testing.assert_array_equal(stored, source[f"data/{key}"][:n_frames])


def test_pusht_first_episodes(tmp_path, pusht_replay_path):
    summary = ingest_replay_buffer(
        pusht_replay_path,
        tmp_path / "store",
        env_id="0",
        object_id="0",
        task="pusht",
        max_episodes=2,
        progress=False,
    )
    source = zarr.open_group(str(pusht_replay_path), mode="r")
    ends = source["meta/episode_ends"][:2]
    assert (summary.episodes_written, summary.frames_written) == (2, int(ends[-1]))
    store = EpisodeStore.open(tmp_path / "store")
    store.validate()
    assert store.n_episodes == 2 and list(store.episode_ends) == list(ends)
    assert store.features["img"].kind == "image" and store.features["img"].dtype == "uint8"
    assert store.features["keypoint"].shape == (9, 2)
    _compare_with_source(store, source, int(ends[-1]))


@pytest.mark.slow
def test_pusht_full_ingest(tmp_path, pusht_replay_path):
    summary = ingest_replay_buffer(
        pusht_replay_path, tmp_path / "store", task="pusht", workers=2, progress=False
    )
    assert (summary.episodes_written, summary.frames_written) == (206, 25_650)
    store = EpisodeStore.open(tmp_path / "store")
    store.validate()
    assert (store.n_episodes, store.n_frames) == (206, 25_650)
    source = zarr.open_group(str(pusht_replay_path), mode="r")
    np.testing.assert_array_equal(store.episode_ends, source["meta/episode_ends"][:])
    _compare_with_source(store, source, 25_650)
    again = ingest_replay_buffer(pusht_replay_path, tmp_path / "store", progress=False)
    assert (again.episodes_written, again.episodes_skipped) == (0, 206)


def _write_buffer(path, images, lengths, rng):
    root = zarr.open_group(str(path), mode="w", zarr_format=2)
    ends = np.cumsum(lengths).astype(np.int64)
    root.create_group("meta").create_array("episode_ends", data=ends, chunks=ends.shape, compressor=None)
    data = root.create_group("data")
    compressor = Blosc(cname="zstd", clevel=5, shuffle=Blosc.BITSHUFFLE)
    data.create_array("img", data=images, chunks=(7, *images.shape[1:]), compressor=compressor)
    data.create_array(
        "state",
        data=rng.normal(size=(len(images), 5)).astype(np.float32),
        chunks=(7, 5),
        compressor=compressor,
    )
    data.create_array(
        "action",
        data=rng.normal(size=(len(images), 2)).astype(np.float32),
        chunks=(7, 2),
        compressor=compressor,
    )
    return path


def test_zipped_buffer_and_dry_run(tmp_path):
    rng = np.random.default_rng(6)
    images = rng.integers(0, 256, size=(23, 16, 16, 3)).astype(np.float32)
    folder = _write_buffer(tmp_path / "buffer.zarr", images, [8, 15], rng)
    zipped = tmp_path / "buffer.zarr.zip"
    with zipfile.ZipFile(zipped, "w", compression=zipfile.ZIP_STORED) as archive:
        for file in sorted(folder.rglob("*")):
            if file.is_file():
                archive.write(file, file.relative_to(folder).as_posix())
    dry = ingest_replay_buffer(zipped, tmp_path / "store", dry_run=True, progress=False)
    assert (dry.episodes_written, dry.frames_written) == (2, 23) and not (tmp_path / "store").exists()
    assert (
        cli_main(
            [
                "replay-buffer",
                str(zipped),
                "--store",
                str(tmp_path / "store"),
                "--image-codec",
                "png",
                "--no-progress",
            ]
        )
        == 0
    )
    store = EpisodeStore.open(tmp_path / "store")
    np.testing.assert_array_equal(store.read("img", 0, 23), images.astype(np.uint8))  # PNG: lossless
    assert store.episodes["source"][1].endswith("buffer.zarr.zip#episode=1")


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (
            lambda images: images.__setitem__((20, 3, 3, 0), 12.5),
            r"key 'img', episode 1: image values are not integral",
        ),
        (lambda images: images.__setitem__((19, 0, 0, 2), 256.0), r"key 'img', episode 1: image values span"),
        (lambda images: images.__setitem__((18, 1, 1, 1), np.nan), r"key 'img'.*NaN"),
    ],
)
def test_bad_image_values_fail_half_way_and_write_nothing(tmp_path, snapshot, corrupt, message):
    rng = np.random.default_rng(7)
    good = _write_buffer(
        tmp_path / "good.zarr", rng.integers(0, 256, size=(10, 8, 8, 3)).astype(np.float32), [10], rng
    )
    ingest_replay_buffer(good, tmp_path / "store", progress=False)
    before = snapshot(tmp_path / "store")
    images = rng.integers(0, 256, size=(23, 8, 8, 3)).astype(np.float32)
    corrupt(images)
    bad = _write_buffer(tmp_path / "bad.zarr", images, [8, 15], rng)
    with pytest.raises(IngestError, match=message) as raised:
        ingest_replay_buffer(bad, tmp_path / "store", progress=False)
    assert "bad.zarr" in str(raised.value)
    assert snapshot(tmp_path / "store") == before
    shutil.rmtree(bad)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_new_store_hashes_episodes_as_they_load_and_a_rerun_skips_them(tmp_path, workers):
    from demoscale.collect.driver import plan_sources
    from demoscale.collect.replay_buffer import REPLAY_BUFFER
    from demoscale.collect.sources import SourceIds

    rng = np.random.default_rng(8)
    images = rng.integers(0, 256, size=(30, 8, 8, 3)).astype(np.float32)
    buffer = _write_buffer(tmp_path / "buffer.zarr", images, [8, 15, 7], rng)
    sources = [(buffer.resolve(), SourceIds())]
    _, unhashed = plan_sources(REPLAY_BUFFER, sources, REPLAY_BUFFER.options_type(), hashes=False)
    _, hashed = plan_sources(REPLAY_BUFFER, sources, REPLAY_BUFFER.options_type())
    assert [plan.sha256 for plan in unhashed] == [None] * 3
    assert all(re.fullmatch("xxh3_128:[0-9a-f]{32}", plan.sha256) for plan in hashed)
    assert len({plan.sha256 for plan in hashed}) == 3

    # A new store: the plan leaves the hashes out and the write phase (in workers) computes the same.
    summary = ingest_replay_buffer(buffer, tmp_path / "store", workers=workers, progress=False)
    assert summary.episodes_written == 3
    store = EpisodeStore.open(tmp_path / "store")
    assert list(store.episodes["source_sha256"]) == [plan.sha256 for plan in hashed]
    np.testing.assert_array_equal(store.read("img", 0, 30), images.astype(np.uint8))
    again = ingest_replay_buffer(buffer, tmp_path / "store", workers=workers, progress=False)
    assert (again.episodes_written, again.episodes_skipped) == (0, 3)

    # The same content twice in one run into a new store is written once.
    twice = tmp_path / "twice"
    twice.mkdir()
    shutil.copytree(buffer, twice / "a.zarr")
    shutil.copytree(buffer, twice / "b.zarr")
    summary = ingest_replay_buffer(twice, tmp_path / "store2", workers=workers, progress=False)
    assert (summary.episodes_written, summary.episodes_skipped) == (3, 3)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_store_of_sha256_digests_goes_on_with_sha256_and_a_rerun_skips_what_it_holds(tmp_path, workers):
    """Stores written before digests named their hash hold bare sha256 digests: an ingest into one
    hashes with sha256, so that the episodes already in it are recognised."""
    from demoscale.collect.driver import plan_sources, store_content_hash
    from demoscale.collect.replay_buffer import REPLAY_BUFFER
    from demoscale.collect.source_format import content_hash, using_content_hash
    from demoscale.collect.sources import SourceIds

    rng = np.random.default_rng(10)
    images = rng.integers(0, 256, size=(30, 8, 8, 3)).astype(np.float32)
    buffer = _write_buffer(tmp_path / "buffer.zarr", images, [8, 15, 7], rng)
    with using_content_hash("sha256"):
        features, plans = plan_sources(
            REPLAY_BUFFER, [(buffer.resolve(), SourceIds())], REPLAY_BUFFER.options_type()
        )
    # The old store: the first two episodes, as an ingest recorded them then.
    old = EpisodeStore.create(tmp_path / "old.zarr", features, image_codec="jpeg")
    with old.transaction():
        for plan in plans[:2]:
            arrays, _ = REPLAY_BUFFER.load(plan.load_args, False)
            old.append_episode(
                arrays, env_id="0", object_id="0", source=plan.source, source_sha256=plan.sha256
            )
    assert store_content_hash(str(tmp_path / "old.zarr")) == "sha256"
    summary = ingest_replay_buffer(buffer, tmp_path / "old.zarr", workers=workers, progress=False)
    assert (summary.episodes_written, summary.episodes_skipped) == (1, 2)
    digests = list(EpisodeStore.open(tmp_path / "old.zarr").episodes["source_sha256"])
    assert digests == [plan.sha256 for plan in plans]
    assert all(re.fullmatch("[0-9a-f]{64}", digest) for digest in digests)
    assert content_hash({"x": np.arange(3)}, "sha256") != content_hash({"x": np.arange(3)})


def test_bad_image_values_found_while_loading_into_a_new_store_leave_no_store(tmp_path):
    rng = np.random.default_rng(9)
    images = rng.integers(0, 256, size=(23, 8, 8, 3)).astype(np.float32)
    images[20, 3, 3, 0] = 12.5
    bad = _write_buffer(tmp_path / "bad.zarr", images, [8, 15], rng)
    with pytest.raises(IngestError, match=r"bad\.zarr: key 'img', episode 1: image values are not integral"):
        ingest_replay_buffer(bad, tmp_path / "store", progress=False)
    assert not (tmp_path / "store").exists()
