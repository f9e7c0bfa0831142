"""A store written as a LeRobot v3.0 dataset: the layout file by file, the round trip store -> LeRobot
-> store (low-dim bit for bit, frames within the video codec's loss), the command, and, where the
``lerobot`` package is importable, LeRobot's own ``LeRobotDataset`` reading the export."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import lerobot_layouts as layouts
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from demoscale.collect import export_lerobot, ingest_lerobot
from demoscale.collect.lerobot import torchcodec_problem
from demoscale.collect.lerobot_export import ExportError, psnr
from demoscale.datasets import EpisodeStore, FeatureSpec

LENGTHS = [10, 12, 9, 11, 10, 8]
# The PSNR (dB) of frames after one trip through the codec at its default quality, over the test's
# camera-like 32x24 frames: measured h264 (crf 23) 38.9, av1 (crf 30) 41.6. The floors leave room for
# other encoder builds.
PSNR_FLOOR = {"h264": 36.0, "av1": 36.0}


def _demoscale(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "demoscale", *args], capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """A store as demoscale's own ingesters make them: UMI-style keys, ids, tasks, outcomes; lossless
    images, so the round trip measures the video codec alone."""
    rate = 10.0
    features = {
        "camera0_rgb": FeatureSpec(kind="image", shape=(24, 32, 3), dtype="uint8", rate_hz=rate, units="rgb"),
        "robot0_eef_pos": FeatureSpec(kind="low_dim", shape=(3,), dtype="float32", rate_hz=rate, units="m"),
        "robot0_gripper_width": FeatureSpec(kind="low_dim", shape=(1,), dtype="float32", rate_hz=rate),
        "action": FeatureSpec(kind="low_dim", shape=(7,), dtype="float64", rate_hz=rate),
        "step": FeatureSpec(kind="low_dim", shape=(1,), dtype="int64", rate_hz=rate),
    }
    path = tmp_path_factory.mktemp("export") / "store.zarr"
    created = EpisodeStore.create(path, features, image_codec="png")
    rng = np.random.default_rng(3)
    with created.transaction():
        for index, length in enumerate(LENGTHS):
            created.append_episode(
                {
                    "camera0_rgb": layouts.smooth_frames(rng, length),
                    "robot0_eef_pos": rng.normal(size=(length, 3)).astype(np.float32),
                    "robot0_gripper_width": rng.uniform(0, 0.08, size=(length, 1)).astype(np.float32),
                    "action": rng.normal(size=(length, 7)),
                    "step": np.arange(length).reshape(length, 1),
                },
                env_id=str(1 + index % 3),
                object_id=str(10 + index % 2),
                task=("pick_place", "push")[index % 2],
                operator="alice" if index < 3 else "",
                source=f"test#{index}",
                source_sha256=f"{index:064x}",
                success=(True, False, None)[index % 3],
            )
    return path


def test_export_writes_the_v30_layout(store, tmp_path) -> None:
    out = tmp_path / "lerobot"
    summary = export_lerobot(store, out, progress=False, video_file_size_mb=0.002, data_file_size_mb=0.001)
    assert summary.episodes == 6 and summary.frames == sum(LENGTHS) and summary.video_keys == ["camera0_rgb"]
    info = json.loads((out / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == 10 and info["total_episodes"] == 6
    assert info["total_frames"] == sum(LENGTHS) and info["total_tasks"] == 2
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    assert info["video_path"] == "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    video = info["features"]["camera0_rgb"]
    assert video["dtype"] == "video" and video["shape"] == [24, 32, 3]
    assert video["names"] == ["height", "width", "channels"]
    assert video["info"]["video.codec"] == "h264" and video["info"]["video.pix_fmt"] == "yuv420p"
    assert info["features"]["action"] == {"dtype": "float64", "shape": [7], "names": None, "fps": 10}
    assert info["features"]["step"]["shape"] == [1] and info["features"]["index"]["dtype"] == "int64"
    tasks = pd.read_parquet(out / "meta/tasks.parquet")
    assert list(tasks.index) == ["pick_place", "push"] and list(tasks["task_index"]) == [0, 1]
    episodes = pq.read_table(out / "meta/episodes/chunk-000/file-000.parquet").to_pandas()
    assert list(episodes["episode_index"]) == list(range(6)) and list(episodes["length"]) == LENGTHS
    assert list(episodes["env_id"]) == ["1", "2", "3", "1", "2", "3"]
    assert list(episodes["object_id"]) == ["10", "11"] * 3
    assert [list(t) for t in episodes["tasks"]] == [["pick_place"], ["push"]] * 3
    assert list(episodes["success"]) == [True, False, None, True, False, None]
    assert list(episodes["dataset_to_index"]) == list(np.cumsum(LENGTHS))
    # Videos: several episodes per file, each after the one before it.
    files = episodes.groupby("videos/camera0_rgb/file_index")
    assert files.ngroups >= 2 and max(len(group) for _, group in files) >= 2
    for file_index, group in files:
        starts = group["videos/camera0_rgb/from_timestamp"].to_numpy()
        stops = group["videos/camera0_rgb/to_timestamp"].to_numpy()
        np.testing.assert_allclose(stops - starts, group["length"].to_numpy() / 10)
        assert starts[0] == 0 and np.allclose(starts[1:], stops[:-1])
        decoded = layouts.decoded_video(out / f"videos/camera0_rgb/chunk-000/file-{file_index:03d}.mp4")
        assert len(decoded) == group["length"].sum()
    # Data: several files; vectors as fixed-size lists, shape (1,) as scalars, indices across files.
    data_files = sorted((out / "data").glob("chunk-000/file-*.parquet"))
    assert len(data_files) >= 2
    frames = pa.concat_tables([pq.read_table(f) for f in data_files])
    assert frames.schema.field("robot0_eef_pos").type == pa.list_(pa.float32(), 3)
    assert frames.schema.field("robot0_gripper_width").type == pa.float32()
    assert frames.schema.field("timestamp").type == pa.float32()
    assert frames.column("index").to_pylist() == list(range(sum(LENGTHS)))
    assert frames.column("frame_index").to_pylist()[:11] == [*range(10), 0]
    opened = EpisodeStore.open(store)
    stats = json.loads((out / "meta/stats.json").read_text())
    np.testing.assert_allclose(
        stats["action"]["mean"], opened.read("action", 0, opened.n_frames).mean(axis=0)
    )
    assert stats["action"]["count"] == [sum(LENGTHS)] and np.shape(stats["camera0_rgb"]["mean"]) == (3, 1, 1)


@pytest.mark.parametrize("codec", ["h264", "av1"])
def test_round_trip_low_dim_exact_and_frames_within_psnr(store, tmp_path, codec) -> None:
    out, back = tmp_path / "lerobot", tmp_path / "back.zarr"
    export_lerobot(store, out, video_codec=codec, progress=False)
    summary = ingest_lerobot(out, back, image_codec="png", progress=False)
    assert summary.episodes_written == 6
    original, returned = EpisodeStore.open(store), EpisodeStore.open(back)
    assert list(returned.features) == list(original.features)
    for key, spec in original.features.items():
        again = returned.features[key]
        assert (again.kind, again.shape, again.dtype, again.rate_hz) == (
            spec.kind,
            spec.shape,
            spec.dtype,
            spec.rate_hz,
        )
        assert again.source == {"format": "lerobot", "key": key}
    columns = ["env_id", "object_id", "task", "operator", "success", "length"]
    pd.testing.assert_frame_equal(returned.episodes[columns], original.episodes[columns])
    for key, spec in original.features.items():
        have, want = returned.read(key, 0, returned.n_frames), original.read(key, 0, original.n_frames)
        if spec.kind == "low_dim":
            assert have.dtype == want.dtype and have.tobytes() == want.tobytes(), key
        else:
            quality = psnr(want, have)
            print(f"{codec}: PSNR of {key} after the round trip: {quality:.1f} dB")
            assert quality >= PSNR_FLOOR[codec]
    # And back out again: the ingested store exports under the same LeRobot names.
    export_lerobot(back, tmp_path / "again", video_codec=codec, progress=False)
    assert set(json.loads((tmp_path / "again/meta/info.json").read_text())["features"]) == set(
        json.loads((out / "meta/info.json").read_text())["features"]
    )


def test_export_command_and_its_errors(store, tmp_path) -> None:
    out = tmp_path / "lerobot"
    run = _demoscale("store", "export", str(store), str(out), "--format", "lerobot", "--features", "camera0_rgb",
                     "action", "--episodes", "4", "1", "--name", "camera0_rgb=observation.images.wrist",
                     "--no-progress")  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("wrote a LeRobot v3.0 dataset: 2 episodes (22 frames)")
    info = json.loads((out / "meta/info.json").read_text())
    assert (
        set(info["features"]) >= {"observation.images.wrist", "action"}
        and "robot0_eef_pos" not in info["features"]
    )
    episodes = pq.read_table(out / "meta/episodes/chunk-000/file-000.parquet").to_pandas()
    assert list(episodes["env_id"]) == ["2", "2"] and list(episodes["length"]) == [
        10,
        12,
    ]  # store episodes 4, 1
    again = _demoscale("store", "export", str(store), str(out), "--no-progress")
    assert (
        again.returncode == 2
        and again.stderr.startswith("demoscale store export: error: ")
        and "exists" in again.stderr
    )
    missing = _demoscale(
        "store", "export", str(tmp_path / "absent.zarr"), str(tmp_path / "x"), "--no-progress"
    )
    assert missing.returncode == 2 and "Traceback" not in missing.stderr and not (tmp_path / "x").exists()
    unknown = _demoscale(
        "store", "export", "--store", str(store), str(tmp_path / "y"), "--features", "camera9"
    )
    assert unknown.returncode == 2 and "no key(s) ['camera9']" in unknown.stderr
    assert not any(p.name.startswith(".y.partial") for p in tmp_path.iterdir())
    helped = _demoscale("store", "--help")
    assert helped.returncode == 0 and "demoscale store export" in helped.stdout


def test_what_lerobot_cannot_hold_is_refused(tmp_path) -> None:
    features = {
        "depth": FeatureSpec(kind="image", shape=(8, 8, 1), dtype="uint8", rate_hz=10.0),
        "pose": FeatureSpec(kind="low_dim", shape=(4, 4), dtype="float32", rate_hz=10.0),
        "torque": FeatureSpec(kind="low_dim", shape=(2,), dtype="float32", rate_hz=7.5),
    }
    made = EpisodeStore.create(tmp_path / "s.zarr", features, image_codec="png")
    made.append_episode(
        {"depth": np.zeros((3, 8, 8, 1), np.uint8), "pose": np.zeros((3, 4, 4), np.float32),
         "torque": np.zeros((3, 2), np.float32)},
        env_id="1", object_id="1", source="t", source_sha256="0" * 64,
    )  # fmt: skip
    with pytest.raises(
        ExportError, match=r"key 'depth': images of shape \(8, 8, 1\) cannot be LeRobot video"
    ):
        export_lerobot(tmp_path / "s.zarr", tmp_path / "out", progress=False)
    with pytest.raises(ExportError, match=r"key 'pose': low_dim of shape \(4, 4\)"):
        export_lerobot(tmp_path / "s.zarr", tmp_path / "out", features=["pose"], progress=False)
    with pytest.raises(ExportError, match=r"whole number of frames per second, got 7.5"):
        export_lerobot(tmp_path / "s.zarr", tmp_path / "out", features=["torque"], progress=False)
    assert not (tmp_path / "out").exists()


LOAD_WITH_LEROBOT = """
import json, sys
import numpy as np
from lerobot.datasets.lerobot_dataset import LeRobotDataset

root = sys.argv[1]
dataset = LeRobotDataset("demoscale/export", root=root, video_backend="torchcodec")
items = []
for index in (0, 9, 10, 33, len(dataset) - 1):
    item = dataset[index]
    items.append({
        "episode": int(item["episode_index"]), "frame": int(item["frame_index"]), "task": item["task"],
        "robot0_eef_pos": item["robot0_eef_pos"].numpy().tolist(), "action": item["action"].numpy().tolist(),
        "action_dtype": str(item["action"].numpy().dtype),
        "camera0_rgb": (item["camera0_rgb"].numpy().transpose(1, 2, 0) * 255).round().astype(int).tolist(),
    })
windowed = LeRobotDataset("demoscale/export", root=root, video_backend="torchcodec",
                          delta_timestamps={"camera0_rgb": [-0.1, 0.0], "action": [0.0, 0.1, 0.2]})
item = windowed[12]
print(json.dumps({"length": len(dataset), "episodes": dataset.num_episodes, "fps": dataset.fps, "items": items,
                  "window": [list(item["camera0_rgb"].shape), list(item["action"].shape)]}))
"""


@pytest.mark.skipif(
    importlib.util.find_spec("lerobot") is None, reason="the lerobot package is not importable"
)
@pytest.mark.skipif(
    torchcodec_problem() is not None, reason=f"LeRobot decodes with torchcodec: {torchcodec_problem()}"
)
def test_lerobot_itself_loads_the_export(store, tmp_path) -> None:
    """Runs where the ``lerobot`` package (whose LeRobotDataset reads codebase v3.0) can be imported,
    e.g. installed with its light dependencies into a folder on PYTHONPATH beside this environment.
    In its own process, started outside the checkout (whose ``datasets/`` folder would shadow the
    ``datasets`` package LeRobot imports)."""
    out = tmp_path / "lerobot"
    export_lerobot(store, out, progress=False, video_file_size_mb=0.002)
    run = subprocess.run([sys.executable, "-c", LOAD_WITH_LEROBOT, str(out)], capture_output=True, text=True,
                         timeout=600, cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    loaded = json.loads(run.stdout.strip().splitlines()[-1])
    assert (loaded["length"], loaded["episodes"], loaded["fps"]) == (sum(LENGTHS), 6, 10)
    assert loaded["window"] == [[2, 3, 24, 32], [3, 7]]
    opened = EpisodeStore.open(store)
    starts = np.concatenate([[0], np.cumsum(LENGTHS)])
    for item in loaded["items"]:
        at = starts[item["episode"]] + item["frame"]
        assert item["task"] == ("pick_place", "push")[item["episode"] % 2]
        # LeRobot hands float64 columns over as float32 tensors; the values are ours, exactly.
        np.testing.assert_array_equal(
            np.float32(item["robot0_eef_pos"]), opened.read("robot0_eef_pos", at, at + 1)[0]
        )
        assert item["action_dtype"] == "float32"
        np.testing.assert_array_equal(
            np.float32(item["action"]), opened.read("action", at, at + 1)[0].astype(np.float32)
        )
        image = np.asarray(item["camera0_rgb"], np.uint8)
        assert psnr(opened.read("camera0_rgb", at, at + 1)[0], image) >= PSNR_FLOOR["h264"] - 3
