"""LeRobot datasets recorded by the ``lerobot`` package's own writer (not by our test layouts)
ingest value-exactly; their video frames match an independent decode of LeRobot's mp4 files.

Codebase v3.0 runs where ``lerobot`` is importable (0.4.x is the last release for Python 3.11; with
``pip install --no-deps lerobot==0.4.4 datasets accelerate`` it imports beside this environment).
Codebase v2.1 is written by lerobot 0.3.x, which cannot share an environment with 0.4: install it
into a folder (``pip install --no-deps --target DIR lerobot==0.3.3``) and name that folder in
``DEMOSCALE_LEROBOT_V21_PATH``. The recording runs in its own process started outside the checkout,
whose ``datasets/`` folder would shadow the ``datasets`` package LeRobot imports.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from demoscale.collect import IngestError, ingest_lerobot
from demoscale.datasets import EpisodeStore
from lerobot_layouts import decoded_video

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("lerobot") is None, reason="the lerobot package is not importable"
)
V21_PATH = os.environ.get("DEMOSCALE_LEROBOT_V21_PATH")

LENGTHS = [12, 7, 15]
TASKS = ["pick the red cube", "push the blue mug", "pick the red cube"]

RECORD_WITH_LEROBOT = """
import inspect, json, sys
import numpy as np
from lerobot.datasets.lerobot_dataset import LeRobotDataset

root, lengths, tasks = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
features = {
    "observation.state": {"dtype": "float32", "shape": (6,), "names": [f"joint_{i}" for i in range(6)]},
    "action": {"dtype": "float32", "shape": (2,), "names": ["x", "y"]},
    "observation.images.top": {"dtype": "video", "shape": (48, 64, 3), "names": ["height", "width", "channels"]},
}
dataset = LeRobotDataset.create("others/recorded", fps=10, features=features, root=root, use_videos=True)
rng = np.random.default_rng(7)
recorded = []
for length, task in zip(lengths, tasks):
    state = rng.normal(size=(length, 6)).astype(np.float32)
    action = rng.normal(size=(length, 2)).astype(np.float32)
    x = np.linspace(0, 1, 64)[None, :, None]
    y = np.linspace(0, 1, 48)[:, None, None]
    for t in range(length):
        phase = t / length
        image = (255 * np.concatenate([x * (1 - phase) + 0 * y, y * phase + 0 * x, 0.5 + 0 * x * y], -1))
        frame = {"observation.state": state[t], "action": action[t],
                 "observation.images.top": image.astype(np.uint8)}
        if "task" in inspect.signature(dataset.add_frame).parameters:  # lerobot 0.3 (codebase v2.1)
            dataset.add_frame(frame, task=task)
        else:
            dataset.add_frame({**frame, "task": task})
    dataset.save_episode()
    recorded.append({"state": state.tolist(), "action": action.tolist()})
if hasattr(dataset, "finalize"):
    dataset.finalize()
print(json.dumps(recorded))
"""


@pytest.fixture(
    scope="module",
    params=[
        "v3.0",
        pytest.param(
            "v2.1",
            marks=pytest.mark.skipif(
                V21_PATH is None, reason="no lerobot 0.3.x folder in DEMOSCALE_LEROBOT_V21_PATH"
            ),
        ),
    ],
)
def recorded(request, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict], str]:
    version = request.param
    folder = tmp_path_factory.mktemp(f"recorded_by_lerobot_{version}")
    root = folder / "dataset"
    env = dict(os.environ)
    if version == "v2.1":
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [V21_PATH, env.get("PYTHONPATH")]))
    run = subprocess.run(
        [sys.executable, "-c", RECORD_WITH_LEROBOT, str(root), json.dumps(LENGTHS), json.dumps(TASKS)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=folder,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return root, json.loads(run.stdout.strip().splitlines()[-1]), version


def test_a_dataset_lerobot_recorded_ingests_value_exactly(recorded, tmp_path) -> None:
    root, episodes, version = recorded
    info = json.loads((root / "meta" / "info.json").read_text())
    assert info["codebase_version"] == version
    summary = ingest_lerobot(root, tmp_path / "store.zarr", image_codec="png", progress=False)
    assert (summary.episodes_written, summary.frames_written) == (len(LENGTHS), sum(LENGTHS))
    store = EpisodeStore.open(tmp_path / "store.zarr")
    store.validate(deep=True)
    assert list(store.episodes["length"]) == LENGTHS
    assert list(store.episodes["task"]) == TASKS
    for index, episode in enumerate(episodes):
        values = store.episode(index)
        np.testing.assert_array_equal(values["observation.state"], np.float32(episode["state"]))
        np.testing.assert_array_equal(values["action"], np.float32(episode["action"]))
    # Frames: exactly an independent decode of LeRobot's video file(s), in episode order.
    # (v3.0: videos/<key>/chunk-*/file-*.mp4, many episodes a file; v2.1: videos/chunk-*/<key>/episode_*.mp4)
    videos = sorted(p for p in (root / "videos").rglob("*.mp4") if "observation.images.top" in p.parts)
    assert videos
    decoded = np.concatenate([decoded_video(path) for path in videos])
    stored = np.concatenate([store.episode(i)["observation.images.top"] for i in range(len(LENGTHS))])
    assert stored.shape == (sum(LENGTHS), 48, 64, 3)
    np.testing.assert_array_equal(stored, decoded)
    again = ingest_lerobot(root, tmp_path / "store.zarr", progress=False)
    assert again.episodes_written == 0 and again.episodes_skipped == len(LENGTHS)


def test_a_recorded_copy_without_videos_is_named_and_ingests_its_low_dim_features(recorded, tmp_path) -> None:
    root, episodes, _ = recorded
    copy = tmp_path / "no_videos"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("videos"))
    with pytest.raises(IngestError, match=r"observation\.images\.top.*missing video file"):
        ingest_lerobot(copy, tmp_path / "refused.zarr", progress=False)
    assert not (tmp_path / "refused.zarr").exists()
    ingest_lerobot(copy, tmp_path / "low_dim.zarr", features=["observation.state", "action"], progress=False)
    store = EpisodeStore.open(tmp_path / "low_dim.zarr")
    assert set(store.features) == {"observation.state", "action"}
    for index, episode in enumerate(episodes):
        np.testing.assert_array_equal(store.episode(index)["action"], np.float32(episode["action"]))
