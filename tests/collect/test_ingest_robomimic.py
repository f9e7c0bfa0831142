"""robomimic HDF5 ingestion: obs keys, actions, mask filters as tags, bad input."""

from __future__ import annotations

import json
import shutil

import h5py
import numpy as np
import pytest
from demoscale.collect import IngestError, ingest_robomimic
from demoscale.collect.ingest_cli import main as cli_main
from demoscale.datasets import EpisodeStore


def _write_robomimic(path, lengths, rng, drop_actions_of=None):
    demos = {}
    with h5py.File(path, "w") as file:
        data = file.create_group("data")
        data.attrs["total"] = int(sum(lengths))
        data.attrs["env_args"] = json.dumps(
            {"env_name": "Lift", "type": 1, "env_kwargs": {"control_freq": 20}}
        )
        for i, n in enumerate(lengths):
            demo = {
                "actions": rng.uniform(-1, 1, size=(n, 7)),
                "obs/agentview_image": rng.integers(0, 256, size=(n, 16, 16, 3), dtype=np.uint8),
                "obs/robot0_eef_pos": rng.normal(size=(n, 3)),
                "obs/object": rng.normal(size=(n, 10)),
                "states": rng.normal(size=(n, 32)),
                "rewards": np.zeros(n),
                "dones": np.zeros(n, dtype=np.int64),
            }
            demo["next_obs/robot0_eef_pos"] = demo["obs/robot0_eef_pos"]
            group = data.create_group(f"demo_{i}")
            group.attrs["num_samples"] = n
            for key, value in demo.items():
                if not (key == "actions" and i == drop_actions_of):
                    group.create_dataset(key, data=value)
            demos[f"demo_{i}"] = demo
        mask = file.create_group("mask")
        mask.create_dataset("train", data=np.array([b"demo_0", b"demo_2"]))
        mask.create_dataset("valid", data=np.array([b"demo_1"]))
        mask.create_dataset("all", data=np.array([f"demo_{i}".encode() for i in range(len(lengths))]))
    return demos


def test_robomimic_keys_values_and_tags(tmp_path):
    rng = np.random.default_rng(8)
    demos = _write_robomimic(tmp_path / "lift.hdf5", [7, 9, 5], rng)
    argv = [
        "robomimic",
        str(tmp_path / "lift.hdf5"),
        "--store",
        str(tmp_path / "store"),
        "--image-codec",
        "png",
    ]
    assert cli_main([*argv, "--no-progress"]) == 0
    store = EpisodeStore.open(tmp_path / "store")
    store.validate()
    assert (store.n_episodes, store.n_frames) == (3, 21)
    assert set(store.features) == {"action", "agentview_image", "robot0_eef_pos", "object"}
    assert store.features["agentview_image"].kind == "image" and store.features["action"].dtype == "float64"
    assert store.features["action"].rate_hz == 20.0
    episodes = store.episodes
    assert set(episodes["task"]) == {"Lift"}
    assert [sorted(str(t).split(",")) for t in episodes["tags"]] == [
        ["all", "train"],
        ["all", "valid"],
        ["all", "train"],
    ]
    assert episodes["source"][1].endswith("lift.hdf5#demo_1")
    stored = store.episode(1)
    np.testing.assert_array_equal(stored["action"], demos["demo_1"]["actions"])
    np.testing.assert_array_equal(stored["object"], demos["demo_1"]["obs/object"])
    np.testing.assert_array_equal(stored["agentview_image"], demos["demo_1"]["obs/agentview_image"])
    again = ingest_robomimic(tmp_path / "lift.hdf5", tmp_path / "store", progress=False)
    assert (again.episodes_written, again.episodes_skipped) == (0, 3)


def test_robomimic_missing_key_half_way_writes_nothing(tmp_path, snapshot):
    rng = np.random.default_rng(9)
    _write_robomimic(tmp_path / "good.hdf5", [4], rng)
    ingest_robomimic(tmp_path / "good.hdf5", tmp_path / "store", progress=False)
    before = snapshot(tmp_path / "store")
    _write_robomimic(tmp_path / "bad.hdf5", [6, 6, 6], rng, drop_actions_of=2)
    with pytest.raises(IngestError, match=r"bad.hdf5: key 'data/demo_2/actions', episode demo_2"):
        ingest_robomimic(tmp_path / "bad.hdf5", tmp_path / "store", progress=False)
    assert snapshot(tmp_path / "store") == before
    truncated = tmp_path / "truncated.hdf5"
    shutil.copy(tmp_path / "good.hdf5", truncated)
    truncated.write_bytes(truncated.read_bytes()[:1500])
    with pytest.raises(IngestError, match="truncated.hdf5: not a readable HDF5"):
        ingest_robomimic(truncated, tmp_path / "store", progress=False)
    assert snapshot(tmp_path / "store") == before
