"""Image keys stored as video (h264, av1): quality, random access, transactions, validation, workers.

Real encoders and decoders (PyAV's libx264, libsvtav1, h264, libdav1d), real stores on disk, a real
DataLoader with worker processes, a writer killed with SIGKILL.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from demoscale.datasets import EpisodeDataset, EpisodeStore, FeatureSpec, StoreError, WindowSampler
from demoscale.datasets.codecs import encode_frames
from torch.utils.data import DataLoader

CODECS = ["h264", "av1"]
# PSNR floors of a round trip of the small camera-like frames below at each codec's default crf, by
# frame shape. Measured: h264 30.2 / 26.4 dB, av1 31.4 / 26.8 dB (per-frame JPEG q90 on the same
# frames: 31.9 / 28.6 dB; at 96x96 the three give 37.2, 38.3 and 39.1 dB). The sharp coloured block
# at this size is what 4:2:0 colour (and JPEG's) loses most on; the floors leave ~1.5 dB for other
# encoder builds.
PSNR_FLOOR_DB = {(32, 48): 28.5, (27, 37): 25.0}
GOP = 4
LENGTHS = [9, 1, 14, 4]  # GOPs cut short by episode ends; an episode of one frame


def _camera_frames(length: int, shape: tuple[int, int], seed: int) -> np.ndarray:
    """Camera-like frames: gradients, a block moving across, a little sensor noise."""
    rng = np.random.default_rng(seed)
    height, width = shape
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    frames = np.empty((length, height, width, 3), np.uint8)
    for t in range(length):
        image = np.stack([110 + 2 * xs + seed, 80 + 3 * ys, 160 - xs - ys + 4 * t], axis=-1)
        x0 = (3 * t + 2 * seed) % max(1, width - 10)
        image[height // 3 : height // 3 + 8, x0 : x0 + 10] = (220, 60, 40)
        image += rng.normal(0, 2, size=image.shape)
        frames[t] = np.clip(image, 0, 255).astype(np.uint8)
    return frames


def _features(shape: tuple[int, int] = (32, 48)) -> dict[str, FeatureSpec]:
    return {
        "camera0_rgb": FeatureSpec(kind="image", shape=(*shape, 3), dtype="uint8", rate_hz=10.0),
        "action": FeatureSpec(kind="low_dim", shape=(2,), dtype="float32", rate_hz=10.0),
    }


def _episode(index: int, length: int, shape: tuple[int, int] = (32, 48)) -> dict[str, np.ndarray]:
    t = np.arange(length, dtype=np.float32)
    return {
        "camera0_rgb": _camera_frames(length, shape, index),
        "action": np.stack([np.full(length, index, np.float32), t], axis=1),
    }


def _append(store: EpisodeStore, index: int, length: int, shape: tuple[int, int] = (32, 48)) -> None:
    store.append_episode(
        _episode(index, length, shape), env_id=str(index % 2), object_id="0", source_sha256=f"sha-{index}"
    )


def _psnr(decoded: np.ndarray, original: np.ndarray) -> float:
    mse = np.mean((decoded.astype(np.float64) - original.astype(np.float64)) ** 2)
    return float(10 * np.log10(255.0**2 / mse))


def _files(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module", params=CODECS)
def video_store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store of the 4 episodes of LENGTHS, key frames every GOP frames (read-only in the tests)."""
    path = tmp_path_factory.mktemp(request.param) / "video.zarr"
    store = EpisodeStore.create(
        path, _features(), image_codec=request.param, image_codec_options={"gop": GOP}
    )
    with store.transaction():
        for index, length in enumerate(LENGTHS):
            _append(store, index, length)
    return path


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("shape", [(32, 48), (27, 37)], ids=["even", "odd"])
def test_round_trip_stays_above_the_psnr_floor(tmp_path: Path, codec: str, shape: tuple[int, int]) -> None:
    store = EpisodeStore.create(tmp_path / "s.zarr", _features(shape), image_codec=codec)
    _append(store, 0, 20, shape)
    decoded = EpisodeStore.open(tmp_path / "s.zarr").episode(0)
    original = _episode(0, 20, shape)
    assert decoded["camera0_rgb"].shape == original["camera0_rgb"].shape
    assert decoded["camera0_rgb"].dtype == np.uint8
    assert _psnr(decoded["camera0_rgb"], original["camera0_rgb"]) >= PSNR_FLOOR_DB[shape]
    np.testing.assert_array_equal(decoded["action"], original["action"])  # low-dim keys untouched


def test_attributes_record_the_codec_and_the_video_layout(video_store: Path) -> None:
    store = EpisodeStore.open(video_store)
    info = store.info()
    assert info["image_codec"] in CODECS and info["version"] == 1  # adding a codec is not a new format
    assert store.image_codec_options["gop"] == GOP
    packets = store.read_encoded("camera0_rgb", 0, store.n_frames)
    assert len(packets) == sum(LENGTHS)
    # Key frames (several times a predicted frame) at each episode's start and every GOP frames.
    starts = store.episode_starts.tolist()
    key_frames = sorted({s + k for s, n in zip(starts, LENGTHS, strict=True) for k in range(0, n, GOP)})
    sizes = np.array([len(p) for p in packets])
    others = np.setdiff1d(np.arange(len(packets)), key_frames)
    assert sizes[key_frames].min() > sizes[others].max()


def test_random_reads_and_windows_equal_the_sequential_decode(video_store: Path) -> None:
    sequential = EpisodeStore.open(video_store)
    whole = np.concatenate([sequential.episode(i)["camera0_rgb"] for i in range(len(LENGTHS))])
    assert sequential.video_packets_decoded("camera0_rgb") == sum(LENGTHS)  # each packet once

    rng = np.random.default_rng(3)
    fresh = EpisodeStore.open(video_store)
    for _ in range(5):
        frames = rng.integers(0, len(whole), size=7)  # any order, repeats allowed
        np.testing.assert_array_equal(fresh.read_frames("camera0_rgb", frames), whole[frames])
    start = int(rng.integers(0, len(whole) - 5))
    np.testing.assert_array_equal(fresh.read("camera0_rgb", start, start + 5), whole[start : start + 5])

    # A training window of 2 frames decodes from the nearest key frame: at most GOP packets.
    sampler = WindowSampler(video_store, {"camera0_rgb": [-1, 0]}, ["action"], horizon=3)
    before = sampler.store.video_packets_decoded("camera0_rgb")
    last_frame = LENGTHS[0] - 1  # episode 0, frame 8: a key frame (GOP 4), its window reaches back to 7
    sample = sampler.sample(last_frame)
    assert sampler.store.video_packets_decoded("camera0_rgb") - before <= GOP + 1
    np.testing.assert_array_equal(sample["obs"]["camera0_rgb"], whole[[last_frame - 1, last_frame]])
    # Windows over every sample, in batches: the frames of the sequential decode, edges repeated.
    indices = rng.permutation(len(sampler))
    for batch in np.array_split(indices, 4):
        got = sampler.sample_many(batch)
        _, t, start, _ = sampler.locate(batch)
        expected = whole[np.stack([np.maximum(t - 1, start), t], axis=1)]
        np.testing.assert_array_equal(got["obs"]["camera0_rgb"], expected)


def test_threads_sharing_a_handle_read_the_same_frames(video_store: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    whole = EpisodeStore.open(video_store).read("camera0_rgb", 0, sum(LENGTHS))
    shared = EpisodeStore.open(video_store)
    draws = [np.random.default_rng(seed).integers(0, len(whole), size=6) for seed in range(24)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda frames: shared.read_frames("camera0_rgb", frames), draws))
    for frames, got in zip(draws, results, strict=True):
        np.testing.assert_array_equal(got, whole[frames])


def test_a_walk_through_an_episode_continues_the_decoder(video_store: Path) -> None:
    """Reading frame after frame (a validation loop in order) decodes each packet once."""
    store = EpisodeStore.open(video_store)
    start, stop = int(store.episode_starts[2]), int(store.episode_ends[2])
    for frame in range(start, stop):
        store.read("camera0_rgb", frame, frame + 1)
    assert store.video_packets_decoded("camera0_rgb") == stop - start


@pytest.mark.parametrize("codec", CODECS)
def test_a_failed_transaction_leaves_the_store_byte_identical(tmp_path: Path, codec: str) -> None:
    path = tmp_path / "store.zarr"
    store = EpisodeStore.create(path, _features(), image_codec=codec, image_codec_options={"gop": GOP})
    _append(store, 0, 6)
    before = _files(path)
    with pytest.raises(RuntimeError, match="late failure"):
        with store.transaction(flush_bytes=0):  # every episode written to the files at once
            _append(store, 1, 11)
            _append(store, 2, 3)
            raise RuntimeError("late failure")
    assert _files(path) == before
    # An episode the encoder refuses (not RGB) fails before anything is written, inside a batch too.
    bad = _episode(3, 5)
    bad["camera0_rgb"] = bad["camera0_rgb"].astype(np.float32)
    with pytest.raises(StoreError, match="camera0_rgb"), store.transaction():
        _append(store, 1, 7)
        store.append_episode(bad, env_id="0", object_id="0", source_sha256="sha-bad")
    assert _files(path) == before
    reopened = EpisodeStore.open(path)
    reopened.validate(deep=True)
    assert reopened.n_episodes == 1


@pytest.mark.parametrize("codec", CODECS)
def test_validate_deep_decodes_every_frame_and_names_a_damaged_one(tmp_path: Path, codec: str) -> None:
    path = tmp_path / "store.zarr"
    store = EpisodeStore.create(path, _features(), image_codec=codec, image_codec_options={"gop": GOP})
    _append(store, 0, 6)
    packets = encode_frames(_episode(1, 10)["camera0_rgb"], codec, store.image_codec_options)
    # Frame 6 of episode 1 (global frame 12) replaced by a packet that starts right but continues
    # with noise: its checksum is its own (written so), so only decoding finds it.
    noise = np.random.default_rng(0).integers(0, 256, size=len(packets[6]), dtype=np.uint8).tobytes()
    damaged = [*packets[:6], packets[6][:5] + noise, *packets[7:]]
    store.append_episode(
        {"action": _episode(1, 10)["action"]},
        encoded={"camera0_rgb": damaged},
        env_id="0",
        object_id="0",
        source_sha256="sha-1",
    )
    store.validate()  # the cheap check decodes only the first and last frame
    # Named as frame 12, or 13 where the H.264 decoder takes the damaged packet and fails on the next.
    with pytest.raises(StoreError, match=r"frame 1[23] \(episode 1\) does not decode"):
        store.validate(deep=True)
    with pytest.raises(StoreError, match="data/camera0_rgb"):
        store.read("camera0_rgb", 13, 14)
    np.testing.assert_array_equal(store.read("camera0_rgb", 10, 11).shape, (1, 32, 48, 3))  # other GOPs read


def test_encoded_packets_are_checked_before_anything_is_written(tmp_path: Path) -> None:
    path = tmp_path / "store.zarr"
    store = EpisodeStore.create(path, _features(), image_codec="h264", image_codec_options={"gop": GOP})
    before = _files(path)
    frames = _episode(0, 9)["camera0_rgb"]
    wrong_gop = encode_frames(frames, "h264", {**store.image_codec_options, "gop": 8})
    jpeg = encode_frames(frames, "jpeg", {"level": 90})
    for encoded, message in ((wrong_gop, "frame 4 must be a key frame"), (jpeg, "not an h264 packet")):
        with pytest.raises(StoreError, match=message):
            store.append_episode(
                {"action": _episode(0, 9)["action"]},
                encoded={"camera0_rgb": encoded},
                env_id="0",
                object_id="0",
                source_sha256="sha-0",
            )
    assert _files(path) == before


def test_video_codecs_refuse_what_they_cannot_store(tmp_path: Path) -> None:
    gray = {"depth": FeatureSpec(kind="image", shape=(16, 16, 1), dtype="uint8")}
    with pytest.raises(StoreError, match=r"stores RGB \(H, W, 3\) frames; 'depth'"):
        EpisodeStore.create(tmp_path / "a.zarr", gray, image_codec="h264")
    for options, message in (
        ({"gop": 0}, "gop"),
        ({"crf": 99}, "crf"),
        ({"level": 90}, "unknown h264 options"),
    ):
        with pytest.raises(StoreError, match=message):
            EpisodeStore.create(
                tmp_path / "b.zarr", _features(), image_codec="h264", image_codec_options=options
            )
    assert not (tmp_path / "a.zarr").exists() and not (tmp_path / "b.zarr").exists()


def test_dataloader_workers_decode_without_set_up(video_store: Path) -> None:
    """Two worker processes each open the store and decode; batches equal the in-process ones."""
    dataset = EpisodeDataset(video_store, {"camera0_rgb": [-1, 0]}, ["action"], horizon=2)
    expected = dataset.sampler.sample_many(np.arange(len(dataset)))["obs"]["camera0_rgb"]
    loader = DataLoader(dataset, batch_size=5, num_workers=2, shuffle=False)
    got = torch.cat([batch["obs"]["camera0_rgb"] for batch in loader]).numpy()
    np.testing.assert_array_equal(got, expected)


def _append_forever(path: str, progress) -> None:
    # A forked child appending to an h264 store until it is killed.
    store = EpisodeStore.open(path, mode="a")
    k = store.n_episodes
    while True:
        _append(store, k, 3 + k % 6)
        progress.put(k)
        k += 1


def test_a_writer_killed_mid_append_leaves_whole_decodable_episodes(tmp_path: Path) -> None:
    path = tmp_path / "killed.zarr"
    EpisodeStore.create(path, _features(), image_codec="h264", image_codec_options={"gop": GOP})
    context = multiprocessing.get_context("fork")
    rng = np.random.default_rng(0)
    for _ in range(3):
        progress = context.Queue()
        child = context.Process(target=_append_forever, args=(str(path), progress))
        child.start()
        progress.get(timeout=60)
        time.sleep(float(rng.uniform(0.0, 0.3)))
        os.kill(child.pid, signal.SIGKILL)
        child.join()
        store = EpisodeStore.open(path)
        store.validate(deep=True)
        lengths = np.diff(np.concatenate([[0], store.episode_ends]))
        assert lengths.tolist() == [3 + k % 6 for k in range(store.n_episodes)]
        actions = store.read("action", 0, store.n_frames)
        np.testing.assert_array_equal(actions[:, 0], np.repeat(np.arange(store.n_episodes), lengths))
    store = EpisodeStore.open(path, mode="a")
    n = store.n_episodes
    _append(store, n, 5)  # appendable after the kills: the uncommitted tail is overwritten
    assert _psnr(EpisodeStore.open(path).episode(n)["camera0_rgb"], _episode(n, 5)["camera0_rgb"]) > 30
