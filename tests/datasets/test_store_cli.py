"""``demoscale store info/validate`` on real stores, through the command dispatcher."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from demoscale.__main__ import main as demoscale_main
from demoscale.datasets import EpisodeStore


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


def test_missing_store_is_an_error(tmp_path: Path, capsys) -> None:
    assert demoscale_main(["store", "info", str(tmp_path / "absent.zarr")]) == 1
    assert "no such store" in capsys.readouterr().err


def test_label_waypoints_subcommand(small_store: EpisodeStore, capsys) -> None:
    assert demoscale_main(["store", "label-waypoints", small_store.location, "--threshold", "0.05"]) == 0
    assert capsys.readouterr().out.startswith(f"labelled 45 frames of {small_store.location}")
    assert EpisodeStore.open(small_store.location).read_derived("next_waypoint_index") is not None
    assert demoscale_main(["store", "validate", small_store.location]) == 0  # derived arrays are allowed
    assert demoscale_main(["store", "label-waypoints", small_store.location, "--threshold", "0.1"]) == 1
    assert "--overwrite" in capsys.readouterr().err
