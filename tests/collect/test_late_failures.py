"""Every ingester is all or nothing, also when a source fails only while it is written.

A source is planned (read and checked as a whole), then damaged before its episodes are loaded, as
a file on shared storage can change under a running ingest; loading then fails in the write phase.
The ingest must raise an IngestError naming the source and leave an existing store byte for byte as
it was, and leave no store where there was none. One case per source format, on real files.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import h5py
import lerobot_layouts as layouts
import numpy as np
import pytest
import zarr
from demoscale.collect import IngestError, source_format
from demoscale.collect.driver import plan_sources, write_plans
from demoscale.collect.sources import resolve_sources
from numcodecs import Blosc


def _robomimic(root: Path, seed: int, joylo_episode: Callable[..., dict]) -> tuple[Path, Callable[[], None]]:
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True)
    path = root / "demos.hdf5"
    with h5py.File(path, "w") as file:
        file.create_group("data").attrs["env_args"] = json.dumps({"env_name": "Lift", "env_kwargs": {}})
        for i, n in enumerate((6, 7, 5)):
            group = file.create_group(f"data/demo_{i}")
            group.create_dataset("actions", data=rng.uniform(-1, 1, size=(n, 7)))
            group.create_dataset("obs/robot0_eef_pos", data=rng.normal(size=(n, 3)))
            group.create_dataset(
                "obs/agentview_image", data=rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8)
            )

    def damage() -> None:  # the file is cut short: its last demos cannot be read any more
        path.write_bytes(path.read_bytes()[:2048])

    return path, damage


def _replay_buffer(
    root: Path, seed: int, joylo_episode: Callable[..., dict]
) -> tuple[Path, Callable[[], None]]:
    rng = np.random.default_rng(seed)
    path = root / "buffer.zarr"
    lengths = (6, 7, 5)
    n = sum(lengths)
    group = zarr.open_group(str(path), mode="w", zarr_format=2)
    group.create_group("meta").create_array(
        "episode_ends", data=np.cumsum(lengths), chunks=(3,), compressor=None
    )
    compressor = Blosc(cname="zstd", clevel=3)
    images = rng.integers(0, 256, size=(n, 8, 8, 3), dtype=np.uint8)
    group.create_group("data").create_array("img", data=images, chunks=(6, 8, 8, 3), compressor=compressor)
    group["data"].create_array("action", data=rng.normal(size=(n, 2)).astype(np.float32), chunks=(n, 2),
                               compressor=compressor)  # fmt: skip

    def damage() -> None:  # garbage in the image chunk of the last episodes
        (path / "data" / "img" / "2.0.0.0").write_bytes(b"\x02\x01" + bytes(range(200)))

    return path, damage


def _joylo(root: Path, seed: int, joylo_episode: Callable[..., dict]) -> tuple[Path, Callable[[], None]]:
    from demoscale.collect import write_joylo_episode

    rng = np.random.default_rng(seed)
    folder = root / "joylo"
    paths = [
        write_joylo_episode(folder / f"episode_{i}.h5", joylo_episode(rng, n)) for i, n in enumerate((5, 6))
    ]

    def damage() -> None:  # the second recording is cut short
        paths[1].write_bytes(paths[1].read_bytes()[:4096])

    return folder, damage


def _lerobot(root: Path, seed: int, joylo_episode: Callable[..., dict]) -> tuple[Path, Callable[[], None]]:
    episodes = layouts.make_episodes(seed, [6, 7, 5], ("top",))
    path = layouts.write_v30(root / "lerobot", episodes, ("top",), data_files=[[0, 1, 2]],
                             video_files=[[0, 1, 2]], codec="libx264")  # fmt: skip
    video = next((path / "videos").rglob("*.mp4"))

    def damage() -> None:  # the video file is overwritten with garbage of the same size
        video.write_bytes(bytes(len(video.read_bytes())))

    return path, damage


SOURCES = {"robomimic": _robomimic, "replay-buffer": _replay_buffer, "joylo": _joylo, "lerobot": _lerobot}


def _plan(name: str, path: Path):
    adapter = source_format(name)
    sources = resolve_sources(path, adapter.patterns, overrides={"env_id": "1", "object_id": "1"},
                              what=adapter.what)  # fmt: skip
    features, plans = plan_sources(adapter, sources, adapter.options_type())
    return adapter, features, plans, [str(p) for p, _ in sources]


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_a_source_damaged_after_planning_leaves_the_store_as_it_was(
    tmp_path: Path, name: str, snapshot, make_joylo_episode
) -> None:
    codec = "png"
    first, _ = SOURCES[name](tmp_path / "first", 1, make_joylo_episode)
    adapter, features, plans, sources = _plan(name, first)
    store = tmp_path / "store.zarr"
    write_plans(store, features, plans, adapter, sources=sources, image_codec=codec, progress=False)
    before = snapshot(store)

    second, damage = SOURCES[name](tmp_path / "second", 2, make_joylo_episode)
    adapter, features, plans, sources = _plan(name, second)
    damage()
    with pytest.raises(IngestError) as raised:
        write_plans(store, features, plans, adapter, sources=sources, image_codec=codec, progress=False)
    assert str(second) in str(raised.value) or "cannot" in str(raised.value)
    assert snapshot(store) == before
    fresh = tmp_path / "fresh.zarr"
    with pytest.raises(IngestError):
        write_plans(fresh, features, plans, adapter, sources=sources, image_codec=codec, progress=False)
    assert not fresh.exists()
