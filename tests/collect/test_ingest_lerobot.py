"""LeRobot datasets (v2.1 and v3.0) into a store: real parquet and mp4 files in LeRobot's layouts
(``lerobot_layouts.py``), ingested through the function and the command line, values checked exactly."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import lerobot_layouts as layouts
import numpy as np
import pytest
from demoscale.collect import IngestError
from demoscale.collect.lerobot import ingest_lerobot, torchcodec_problem
from demoscale.datasets import EpisodeStore, select_subset, subset_capacity

CAMERAS = ("top", "wrist")
LENGTHS = [10, 12, 9, 11, 10]
DATA_FILES = [[0, 1, 2], [3, 4]]  # episodes per data parquet
VIDEO_FILES = [[0, 1], [2, 3, 4]]  # episodes per mp4 (split unlike the data files)


def _demoscale(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "demoscale", *args], capture_output=True, text=True, timeout=300
    )


def _files(store: Path) -> dict[str, bytes] | None:
    if not store.exists():
        return None
    return {p.relative_to(store).as_posix(): p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def v30(tmp_path_factory) -> tuple[Path, list[dict]]:
    episodes = layouts.make_episodes(0, LENGTHS, CAMERAS)
    root = tmp_path_factory.mktemp("lerobot") / "v30"
    return layouts.write_v30(root, episodes, CAMERAS, DATA_FILES, VIDEO_FILES), episodes


def _check_low_dim(store: EpisodeStore, episodes: list[dict]) -> None:
    """Every low-dim feature bit for bit as the parquet holds it (dtype included)."""
    for index, episode in enumerate(episodes):
        stored = store.episode(index)
        for name in layouts.LOW_DIM:
            want = episode[name].reshape(stored[name].shape)
            assert stored[name].dtype == want.dtype, name
            assert stored[name].tobytes() == want.tobytes(), (name, index)


def test_v30_values_exact_and_video_frames_located(v30, tmp_path) -> None:
    root, episodes = v30
    summary = ingest_lerobot(root, tmp_path / "store.zarr", image_codec="png", progress=False)
    assert summary.episodes_written == 5 and summary.frames_written == sum(LENGTHS)
    assert any(note.startswith("video decoded with ") for note in summary.notes), summary.notes
    store = EpisodeStore.open(tmp_path / "store.zarr")
    store.validate(deep=True)
    spec = store.features
    assert set(spec) == {*layouts.LOW_DIM, "observation.images.top", "observation.images.wrist"}
    assert spec["observation.state"].shape == (6,) and spec["observation.state"].dtype == "float32"
    assert spec["observation.velocity"].dtype == "float64" and spec["next.done"].dtype == "bool"
    assert spec["next.reward"].shape == (1,) and spec["observation.state"].rate_hz == 10.0
    assert spec["observation.state"].source == {
        "format": "lerobot", "key": "observation.state", "names": [f"joint_{i}" for i in range(6)]
    }  # fmt: skip
    assert spec["observation.images.top"].kind == "image" and spec["observation.images.top"].shape == (
        24,
        32,
        3,
    )
    assert list(store.episodes["task"]) == [e["task"] for e in episodes]
    assert list(store.episodes["length"]) == LENGTHS
    assert set(store.episodes["env_id"]) == {"0"} and set(store.episodes["object_id"]) == {"0"}
    _check_low_dim(store, episodes)
    # The video frames are exactly those of an independent decode of each mp4, episode by episode in
    # file order: the right part of each many-episode file was found.
    for camera in CAMERAS:
        key = f"observation.images.{camera}"
        for file_index, members in enumerate(VIDEO_FILES):
            decoded = layouts.decoded_video(root / f"videos/{key}/chunk-000/file-{file_index:03d}.mp4")
            assert len(decoded) == sum(LENGTHS[i] for i in members)
            offset = 0
            for index in members:
                frames = store.episode(index)[key]
                np.testing.assert_array_equal(frames, decoded[offset : offset + LENGTHS[index]])
                assert np.abs(frames.astype(int) - episodes[index][key]).mean() < 6  # and like the source
                offset += LENGTHS[index]
    again = ingest_lerobot(root, tmp_path / "store.zarr", progress=False)
    assert again.episodes_written == 0 and again.episodes_skipped == 5  # content hashes


def test_v21_through_the_command_line(tmp_path) -> None:
    episodes = layouts.make_episodes(1, [8, 9, 10], ("top", "side"))
    root = layouts.write_v21(tmp_path / "v21", episodes, ("top",), image_cameras=("side",))
    store = tmp_path / "store.zarr"
    run = _demoscale("ingest", "lerobot", str(root), "--store", str(store), "--object-from", "task",
                     "--env-id", "3", "--image-codec", "png", "--no-progress")  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "wrote 3 episodes (27 frames)" in run.stdout and "note: video decoded with " in run.stdout
    opened = EpisodeStore.open(store)
    assert list(opened.episodes["env_id"]) == ["3", "3", "3"]
    assert list(opened.episodes["object_id"]) == [e["task"] for e in episodes]  # --object-from task
    assert list(opened.episodes["task"]) == [e["task"] for e in episodes]
    _check_low_dim(opened, episodes)
    for index in range(3):
        decoded = layouts.decoded_video(
            root / f"videos/chunk-000/observation.images.top/episode_{index:06d}.mp4"
        )
        np.testing.assert_array_equal(opened.episode(index)["observation.images.top"], decoded)
        # An `image` feature: the PNG files of the parquet, exactly.
        np.testing.assert_array_equal(
            opened.episode(index)["observation.images.side"], episodes[index]["observation.images.side"]
        )
    assert opened.features["observation.images.side"].kind == "image"


def _short_video(root: Path) -> None:
    """Rewrite the wrist camera's second file with episode 4 one frame short."""
    episodes = layouts.make_episodes(5, LENGTHS, CAMERAS)
    key = "observation.images.wrist"
    parts = []
    for index in VIDEO_FILES[1]:
        frames = episodes[index][key][:-1] if index == 4 else episodes[index][key]
        parts.append(layouts.encode_mp4(root / f"part_{index}.mp4", frames, 10, "libx264"))
    layouts.concatenate_mp4(parts, root / f"videos/{key}/chunk-000/file-001.mp4")
    for part in parts:
        part.unlink()


def _set_version(root: Path) -> None:
    info = json.loads((root / "meta/info.json").read_text())
    (root / "meta/info.json").write_text(json.dumps({**info, "codebase_version": "v4.0"}))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


BAD_INPUTS = {
    # case: (how to damage a copy of the dataset, what the error must say)
    "missing video": (
        lambda root: (root / "videos/observation.images.top/chunk-000/file-001.mp4").unlink(),
        r"videos/observation.images.top/chunk-000/file-001.mp4: missing video file of key "
        r"'observation.images.top', episode 2 .*--features",
    ),
    "video frames disagree with the parquet": (
        _short_video,
        r"file-001.mp4: key 'observation.images.wrist', episode 4: the video holds 9 frames for the "
        r"episode, its data parquet 10 rows",
    ),
    "unknown codebase_version": (_set_version, r"meta/info.json: codebase_version 'v4.0' is not supported"),
    "corrupt data parquet": (
        lambda root: _truncate(root / "data/chunk-000/file-001.parquet"),
        r"data/chunk-000/file-001.parquet: not a readable parquet file",
    ),
    "corrupt mp4": (
        lambda root: (root / "videos/observation.images.wrist/chunk-000/file-000.mp4").write_bytes(
            b"\0" * 4096
        ),
        r"file-000.mp4: not a readable video .*key 'observation.images.wrist', episode 0",
    ),
    "truncated mp4": (  # its index (at the start) is whole: the frames of the lost half are missing
        lambda root: _truncate(root / "videos/observation.images.wrist/chunk-000/file-000.mp4"),
        r"file-000.mp4: key 'observation.images.wrist', episode 0: the video holds \d+ frames for the "
        r"episode, its data parquet 10 rows",
    ),
    "episode metadata disagrees with the rows": (
        lambda root: (root / "data/chunk-000/file-000.parquet").write_bytes(
            (root / "data/chunk-000/file-001.parquet").read_bytes()
        ),
        r"file-000.parquet, episode 0: 0 rows, the episode metadata says length 10",
    ),
}


@pytest.fixture(scope="module")
def filled_store(v30, tmp_path_factory) -> Path:
    """A store already holding the episodes of ``v30`` (the damaged copies hold other content)."""
    store = tmp_path_factory.mktemp("filled") / "store.zarr"
    ingest_lerobot(v30[0], store, progress=False)
    return store


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_names_file_and_episode_and_leaves_the_store(case, filled_store, tmp_path) -> None:
    damage, message = BAD_INPUTS[case]
    root = layouts.write_v30(
        tmp_path / "bad", layouts.make_episodes(5, LENGTHS, CAMERAS), CAMERAS, DATA_FILES, VIDEO_FILES
    )
    damage(root)
    before = _files(filled_store)
    with pytest.raises(IngestError, match=message):
        ingest_lerobot(root, filled_store, progress=False)
    assert _files(filled_store) == before
    with pytest.raises(IngestError, match=message):
        ingest_lerobot(root, tmp_path / "new.zarr", progress=False)
    assert not (tmp_path / "new.zarr").exists()


def test_a_copy_without_videos_ingests_its_low_dim_features(v30, tmp_path) -> None:
    """Public datasets are often copied without their videos: the command names the missing mp4 and
    --features without the video keys ingests the rest."""
    root, episodes = v30
    copy = tmp_path / "no_videos"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("videos"))
    store = tmp_path / "store.zarr"
    refused = _demoscale("ingest", "lerobot", str(copy), "--store", str(store), "--no-progress")
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.startswith("demoscale ingest: error: ") and "Traceback" not in refused.stderr
    assert "videos/observation.images.top/chunk-000/file-000.mp4: missing video file" in refused.stderr
    assert "--features" in refused.stderr and not store.exists()
    run = _demoscale("ingest", "lerobot", str(copy), "--features", *layouts.LOW_DIM, "--store", str(store),
                     "--no-progress")  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "video decoded" not in run.stdout
    opened = EpisodeStore.open(store)
    assert set(opened.features) == set(layouts.LOW_DIM)
    _check_low_dim(opened, episodes)


def test_option_errors_name_what_exists(v30, tmp_path) -> None:
    root, _ = v30
    with pytest.raises(IngestError, match=r"no feature\(s\) \['camera'\]; features: observation.state, "):
        ingest_lerobot(root, tmp_path / "s.zarr", features=["camera"], progress=False)
    with pytest.raises(IngestError, match=r"no per-episode column 'scene' for env_id .*length"):
        ingest_lerobot(root, tmp_path / "s.zarr", env_from="scene", progress=False)
    with pytest.raises(IngestError, match=r"unknown video decoder 'ffmpeg'"):
        ingest_lerobot(root, tmp_path / "s.zarr", video_decoder="ffmpeg", progress=False)
    assert not (tmp_path / "s.zarr").exists()


def test_ids_from_an_id_map_and_tasks_then_info_and_subsets(tmp_path) -> None:
    """Tasks mapped to objects, episodes to environments: `store info` and the subset functions see a
    LeRobot dataset as any other store."""
    lengths = [9, 10, 11, 10, 9, 10, 11, 12]
    episodes = layouts.make_episodes(2, lengths, ("top",))
    root = layouts.write_v30(
        tmp_path / "v30", episodes, ("top",), [list(range(8))], [list(range(8))], codec="libx264"
    )
    id_map = tmp_path / "ids.csv"
    id_map.write_text("episode_index,env_id\n" + "".join(f"{i},{1 + i // 4}\n" for i in range(8)))
    store = tmp_path / "store.zarr"
    run = _demoscale("ingest", "lerobot", str(root), "--store", str(store), "--id-map", str(id_map),
                     "--object-from", "task_index", "--operator", "alice", "--no-progress")  # fmt: skip
    assert run.returncode == 0, run.stderr
    info = _demoscale("store", "info", str(store), "--json")
    assert info.returncode == 0, info.stderr
    described = json.loads(info.stdout)
    assert described["envs"] == ["1", "2"] and described["objects"] == ["0", "1"]
    assert described["n_pairs"] == 4 and described["episodes_per_pair"] == {"min": 2, "max": 2}
    assert sorted(described["tasks"]) == sorted(layouts.TASKS)
    table = EpisodeStore.open(store).episodes
    assert set(table["operator"]) == {"alice"}
    assert subset_capacity(table) == {"n_envs": 2, "n_objects_per_env": 2, "n_pairs": 4, "demos_per_pair": 2}
    subset = select_subset(table, n_envs=2, n_objects_per_env=2, demos_per_pair=1, seed=0)
    assert len(subset.episode_indices) == 4 and len(subset.pairs) == 4
    chosen = table.iloc[list(subset.episode_indices)]
    assert {(e, o) for e, o in zip(chosen["env_id"], chosen["object_id"], strict=True)} == {
        ("1", "0"), ("1", "1"), ("2", "0"), ("2", "1")
    }  # fmt: skip
    text = _demoscale("store", "info", str(store))
    assert text.returncode == 0 and "observation.images.top" in text.stdout and "lerobot" in text.stdout


@pytest.mark.skipif(torchcodec_problem() is not None, reason=f"{torchcodec_problem()}")
def test_torchcodec_decodes_the_frames_pyav_decodes(v30, tmp_path) -> None:
    root, _ = v30
    by_pyav = ingest_lerobot(
        root, tmp_path / "pyav.zarr", image_codec="png", video_decoder="pyav", progress=False
    )
    by_torchcodec = ingest_lerobot(root, tmp_path / "tc.zarr", image_codec="png", video_decoder="torchcodec",
                                   progress=False)  # fmt: skip
    assert by_torchcodec.notes[0].startswith("video decoded with torchcodec") and "PyAV" in by_pyav.notes[0]
    one, other = EpisodeStore.open(tmp_path / "pyav.zarr"), EpisodeStore.open(tmp_path / "tc.zarr")
    for key in one.features:
        np.testing.assert_array_equal(one.read(key, 0, one.n_frames), other.read(key, 0, other.n_frames))
