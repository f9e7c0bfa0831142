"""``demoscale store info/validate`` on real stores, through the command dispatcher."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from demoscale.__main__ import main as demoscale_main
from demoscale.datasets import EpisodeStore, FeatureSpec


def test_info_json_and_table(small_store: EpisodeStore, capsys) -> None:
    assert demoscale_main(["store", "info", small_store.location, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["n_episodes"] == 6 and info["n_frames"] == 45
    assert info["envs"] == ["0", "1", "2"] and info["objects"] == ["10", "11"]
    assert info["features"]["camera0_rgb"]["kind"] == "image"
    assert info["features"]["robot0_eef_pos"]["shape"] == [3]
    assert demoscale_main(["store", "info", small_store.location]) == 0
    table = capsys.readouterr().out
    assert "episodes   6   frames 45" in table and "robot0_eef_pos" in table and "point_cloud" in table


def test_validate_ok_and_failure(small_store: EpisodeStore, kit, capsys) -> None:
    assert demoscale_main(["store", "validate", small_store.location]) == 0
    assert capsys.readouterr().out.startswith(f"ok: {small_store.location}: 6 episodes, 45 frames")
    kit.raw_group(small_store.location)["meta/length"][3] = 2
    assert demoscale_main(["store", "validate", small_store.location]) == 1
    assert "episode 3: meta/length is 2" in capsys.readouterr().err
    shutil.rmtree(Path(small_store.location) / "meta" / "episode_ends")
    assert demoscale_main(["store", "validate", small_store.location]) == 1
    assert "meta/episode_ends" in capsys.readouterr().err


def test_missing_store_is_an_input_error(tmp_path: Path, capsys) -> None:
    assert demoscale_main(["store", "info", str(tmp_path / "absent.zarr")]) == 2
    assert "no such store" in capsys.readouterr().err


def test_label_waypoints_subcommand(small_store: EpisodeStore, capsys) -> None:
    assert demoscale_main(["store", "label-waypoints", small_store.location, "--threshold", "0.05"]) == 0
    assert capsys.readouterr().out.startswith(f"labelled 45 frames of {small_store.location}")
    assert EpisodeStore.open(small_store.location).read_derived("next_waypoint_index") is not None
    assert demoscale_main(["store", "validate", small_store.location]) == 0  # derived arrays are allowed
    assert demoscale_main(["store", "label-waypoints", small_store.location, "--threshold", "0.1"]) == 2
    assert "--overwrite" in capsys.readouterr().err


def test_the_store_is_named_by_store_everywhere_and_positionally_as_before(small_store, capsys) -> None:
    for argv in (["--store", small_store.location], [small_store.location]):
        assert demoscale_main(["store", "validate", *argv]) == 0
        assert capsys.readouterr().out.startswith("ok: ")
    with pytest.raises(SystemExit) as exit_info:
        demoscale_main(["store", "info", small_store.location, "--store", "/elsewhere.zarr"])
    assert exit_info.value.code == 2 and "two stores given" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        demoscale_main(["store", "info"])
    assert exit_info.value.code == 2 and "--store" in capsys.readouterr().err


def test_info_sorts_ids_as_numbers_and_shows_recorded_sources(tmp_path: Path, kit, capsys) -> None:
    features = kit.features()
    features["camera0_rgb"] = FeatureSpec(
        **{**features["camera0_rgb"].to_dict(), "source": {"camera": "scene"}}
    )
    store = EpisodeStore.create(tmp_path / "ids.zarr", features)
    for episode, env in enumerate(["10", "2", "1", "b", "a"]):
        kit.append(store, episode, 5, env_id=env, object_id=str(100 - episode))
    assert demoscale_main(["store", "info", "--store", store.location, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["envs"] == ["1", "2", "10", "a", "b"]
    assert info["objects"] == ["96", "97", "98", "99", "100"]
    assert demoscale_main(["store", "info", store.location]) == 0
    table = capsys.readouterr().out
    assert "envs       5: 1, 2, 10, a, b" in table
    assert "recorded by: camera scene" in table


def test_store_info_into_a_closed_pipe_ends_quietly(small_store: EpisodeStore) -> None:
    """`demoscale store info S | head -0`: the reader is gone before anything is written."""
    process = subprocess.Popen(
        [sys.executable, "-m", "demoscale", "store", "info", small_store.location],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    process.stdout.close()  # what `head` does once it has read what it wants
    stderr = process.stderr.read().decode()
    assert process.wait() == 0, stderr
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr and "Exception ignored" not in stderr
