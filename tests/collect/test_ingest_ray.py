"""Ingest on Ray: Ray tasks load and encode the episodes, this process commits them in order.

A real private local Ray of 2 CPUs (started and stopped by these tests or by the ingest itself,
never another one), real UMI zips: the store equals the one a plain ingest writes, and a failure
is the same error and leaves the store as it was.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from demoscale.collect import IngestError, ingest_umi
from demoscale.datasets import EpisodeStore
from demoscale.datasets.video import is_keyframe


def _contents(path: Path) -> dict:
    """Everything a reader of the store sees: metadata rows, codec, every value and stored frame."""
    store = EpisodeStore.open(path)
    contents = {
        "episodes": store.episodes.to_json(orient="records"),
        "features": {k: v.to_dict() for k, v in store.features.items()},
        "codec": (store.image_codec, store.image_codec_options),
    }
    for key, spec in store.features.items():
        if spec.kind == "image":
            contents[key] = store.read_encoded(key, 0, store.n_frames)
        else:
            contents[key] = store.read(key, 0, store.n_frames).tobytes()
    return contents


def _files(path: Path) -> dict[str, bytes] | None:
    if not path.exists():
        return None
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def umi_zip(tmp_path_factory, make_umi_episode, umi_zip_fixture) -> Path:
    rng = np.random.default_rng(11)
    episodes = [make_umi_episode(rng, n) for n in (9, 12, 7, 10, 11)]
    return umi_zip_fixture(tmp_path_factory.mktemp("umi") / "cups/env_2/object_5/dataset.zarr.zip", episodes)


@pytest.fixture(scope="module")
def damaged_zip(tmp_path_factory, umi_zip) -> Path:
    """The same zip with frame 45 (the last episode) cut short: found only when it is decoded."""
    target = tmp_path_factory.mktemp("damaged") / "dataset.zarr.zip"
    with zipfile.ZipFile(umi_zip) as old, zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as new:
        for name in old.namelist():
            content = old.read(name)
            new.writestr(name, content[:60] if name == "data/camera0_rgb/45.0.0.0" else content)
    return target


@pytest.fixture(scope="module")
def local_ray():
    """A private local Ray of 2 CPUs for this module; ingests with address='local' use it."""
    from demoscale.collect.ray_cluster import ray_session

    with ray_session("local", num_cpus=2) as session:
        yield session


def test_the_command_on_a_local_ray_writes_the_store_a_plain_ingest_writes(tmp_path, umi_zip) -> None:
    """`--address local --workers 2` starts its own Ray of 2 CPUs, and stops it."""
    plain = tmp_path / "plain.zarr"
    ingest_umi(umi_zip, plain, image_codec="jpeg", progress=False)
    on_ray = tmp_path / "ray.zarr"
    command = [sys.executable, "-m", "demoscale", "ingest", "umi", str(umi_zip), "--store", str(on_ray)]
    command += ["--image-codec", "jpeg", "--address", "local", "--workers", "2", "--no-progress", "--json"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert (summary["episodes_written"], summary["frames_written"]) == (5, 49)
    EpisodeStore.open(on_ray).validate(deep=True)
    assert _contents(on_ray) == _contents(plain)
    assert EpisodeStore.open(on_ray).episodes["env_id"].tolist() == ["2"] * 5  # ids from the layout


@pytest.mark.parametrize("codec", ["h264", "jpegxl"])
def test_ray_tasks_encode_the_same_bytes_as_a_plain_ingest(tmp_path, umi_zip, local_ray, codec) -> None:
    """Video encoded in the tasks (a stream per episode), or JPEG-XL frames copied by them."""
    plain, on_ray = tmp_path / "plain.zarr", tmp_path / "ray.zarr"
    ingest_umi(umi_zip, plain, image_codec=codec, progress=False)
    summary = ingest_umi(umi_zip, on_ray, image_codec=codec, address="local", workers=2, progress=False)
    assert summary.episodes_written == 5 and summary.episode_indices == [0, 1, 2, 3, 4]
    ours, theirs = _contents(on_ray), _contents(plain)
    if codec == "h264":
        # x264 repeats its bytes almost always, not always (a rare run differs in one group of
        # pictures): the same packets' layout, and frames that decode to the same images within
        # the codec's noise, are what a reader relies on.
        ray_packets, plain_packets = ours.pop("camera0_rgb"), theirs.pop("camera0_rgb")
        assert [is_keyframe(p, "h264") for p in ray_packets] == [
            is_keyframe(p, "h264") for p in plain_packets
        ]
        store_ray, store_plain = EpisodeStore.open(on_ray), EpisodeStore.open(plain)
        a = store_ray.read("camera0_rgb", 0, store_ray.n_frames).astype(np.int16)
        b = store_plain.read("camera0_rgb", 0, store_plain.n_frames).astype(np.int16)
        assert np.abs(a - b).mean() < 1.0
    assert ours == theirs
    EpisodeStore.open(on_ray).validate(deep=True)
    # Again: every episode is already there, so nothing is loaded on Ray and nothing changes.
    before = _files(on_ray)
    again = ingest_umi(umi_zip, on_ray, address="local", workers=2, progress=False)
    assert (again.episodes_written, again.episodes_skipped) == (0, 5)
    assert _files(on_ray) == before


def test_episodes_hashed_in_ray_tasks_equal_a_plain_ingest(tmp_path, local_ray) -> None:
    """A replay buffer into a new store: its plan leaves the hashes out, the tasks hash what they
    load, and the store (hashes included) equals a plain ingest's; a rerun skips every episode."""
    import zarr
    from demoscale.collect import ingest_replay_buffer
    from numcodecs import Blosc

    rng = np.random.default_rng(12)
    buffer = tmp_path / "buffer.zarr"
    root = zarr.open_group(str(buffer), mode="w", zarr_format=2)
    root.create_array("meta/episode_ends", data=np.array([6, 13, 21]), chunks=(3,))
    blosc = Blosc(cname="zstd", clevel=3, shuffle=Blosc.BITSHUFFLE)
    images = rng.integers(0, 256, size=(21, 12, 12, 3), dtype=np.uint8)
    root.create_array("data/img", data=images, chunks=(5, 12, 12, 3), compressors=blosc)
    root.create_array("data/action", data=rng.normal(size=(21, 2)).astype(np.float32), chunks=(21, 2))
    plain, on_ray = tmp_path / "plain.zarr", tmp_path / "ray.zarr"
    ingest_replay_buffer(buffer, plain, progress=False)
    summary = ingest_replay_buffer(buffer, on_ray, address="local", workers=2, progress=False)
    assert summary.episodes_written == 3
    assert _contents(on_ray) == _contents(plain)
    digests = list(EpisodeStore.open(on_ray).episodes["source_sha256"])
    assert digests == list(EpisodeStore.open(plain).episodes["source_sha256"])
    assert all(re.fullmatch("xxh3_128:[0-9a-f]{32}", digest) for digest in digests)
    again = ingest_replay_buffer(buffer, on_ray, address="local", workers=2, progress=False)
    assert (again.episodes_written, again.episodes_skipped) == (0, 3)


def test_a_failure_in_a_ray_task_is_the_plain_error_and_changes_nothing(
    tmp_path, umi_zip, damaged_zip, local_ray
) -> None:
    store = tmp_path / "store.zarr"
    ingest_umi(umi_zip, store, image_codec="jpeg", max_episodes=2, progress=False)
    before = _files(store)
    errors = []
    for address in (None, "local"):
        with pytest.raises(IngestError) as failure:
            ingest_umi(damaged_zip, store, address=address, workers=2, progress=False)
        errors.append(str(failure.value))
        assert _files(store) == before  # the batch rolled back, byte for byte
    assert errors[0] == errors[1]
    assert "camera0_rgb" in errors[1] and "episode 4" in errors[1]
    fresh = tmp_path / "fresh.zarr"
    with pytest.raises(IngestError):
        ingest_umi(damaged_zip, fresh, image_codec="h264", address="local", workers=2, progress=False)
    assert not fresh.exists()


def test_an_unreachable_cluster_fails_fast_naming_it(tmp_path, umi_zip) -> None:
    with socket.socket() as probe:  # a port nothing listens on once the probe closes
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.perf_counter()
    command = [sys.executable, "-m", "demoscale", "ingest", "umi", str(umi_zip), "--no-progress"]
    command += ["--store", str(tmp_path / "s.zarr"), "--address", f"127.0.0.1:{port}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 1
    assert f"127.0.0.1:{port}" in result.stderr and "Traceback" not in result.stderr
    assert time.perf_counter() - started < 60
    assert not (tmp_path / "s.zarr").exists()
