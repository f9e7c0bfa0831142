"""A source format added in this file alone (one adapter + one registry entry) gets everything the
driver gives the built-in ones: the CLI subcommand and its flags, ids from the directory layout,
validation before writing, skipping what the store holds, workers, dry runs and max_episodes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from demoscale.collect import FORMATS, IngestError, ingest
from demoscale.collect.ingest_cli import main as cli_main
from demoscale.collect.source_format import (
    ContentHash,
    EpisodePlan,
    LoadedEpisode,
    SourceFormat,
    SourcePlan,
    check_finite,
    option,
)
from demoscale.collect.sources import SourceIds
from demoscale.datasets import EpisodeStore, FeatureSpec


@dataclass(frozen=True)
class NpzOptions:
    rate_hz: float = option(5.0, "frame rate (default 5)")


@dataclass(frozen=True)
class NpzEpisode:
    path: str


class NpzFormat(SourceFormat):
    """One ``.npz`` file per episode holding ``action`` (T, 2) and ``image`` (T, 8, 8, 3)."""

    name = "npz"
    summary = "one .npz per episode"
    src_help = "an .npz file or a directory searched for them"
    patterns = ("*.npz",)
    what = "episode .npz file"
    options_type = NpzOptions
    default_image_codec = "png"

    def plan(
        self, path: Path, ids: SourceIds, options: NpzOptions, limit: int | None, progress: bool
    ) -> SourcePlan:
        arrays = self.load(NpzEpisode(str(path)), want_encoded=False)[0]
        check_finite(arrays["action"], str(path), "action")
        features = {
            "action": FeatureSpec(kind="low_dim", shape=(2,), rate_hz=options.rate_hz),
            "image": FeatureSpec(kind="image", shape=(8, 8, 3), dtype="uint8", rate_hz=options.rate_hz),
        }
        digest = ContentHash().arrays(arrays).hexdigest()
        return SourcePlan(
            features, [EpisodePlan(str(path), digest, len(arrays["action"]), NpzEpisode(str(path)), ids)]
        )

    def load(self, episode: NpzEpisode, want_encoded: bool) -> LoadedEpisode:
        with np.load(episode.path) as data:
            return {"action": data["action"], "image": data["image"]}, None


NPZ = NpzFormat()


@pytest.fixture
def npz_format(monkeypatch):
    monkeypatch.setitem(FORMATS, "npz", NPZ)


def _write(path: Path, length: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    action = rng.normal(size=(length, 2)).astype(np.float32)
    np.savez(path, action=action, image=rng.integers(0, 256, (length, 8, 8, 3), dtype=np.uint8))
    return path


def test_a_new_format_ingests_through_the_driver(tmp_path: Path, npz_format) -> None:
    sources = [
        _write(tmp_path / "raw" / "wipe" / f"env_{i}" / "object_3" / f"ep{i}.npz", 4 + i, i) for i in range(3)
    ]
    store = tmp_path / "store.zarr"
    summary = ingest("npz", tmp_path / "raw", store, workers=2, progress=False)
    assert (summary.episodes_written, summary.frames_written) == (3, 15)
    stored = EpisodeStore.open(store)
    stored.validate(deep=True)
    assert stored.image_codec == "png" and stored.features["action"].rate_hz == 5.0
    assert stored.episodes["env_id"].tolist() == ["0", "1", "2"]
    assert set(stored.episodes["object_id"]) == {"3"} and set(stored.episodes["task"]) == {"wipe"}
    with np.load(sources[2]) as data:
        np.testing.assert_array_equal(stored.episode(2)["image"], data["image"])
    again = ingest("npz", tmp_path / "raw", store, progress=False)
    assert (again.episodes_written, again.episodes_skipped) == (0, 3)


def test_a_new_format_gets_its_cli_subcommand_and_flags(tmp_path: Path, npz_format, capsys) -> None:
    for i in range(3):
        _write(tmp_path / "raw" / f"ep{i}.npz", 3, i)
    store = tmp_path / "store.zarr"
    argv = ["npz", str(tmp_path / "raw"), "--store", str(store), "--rate-hz", "12", "--env-id", "7"]
    assert cli_main([*argv, "--dry-run", "--json", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["episodes_written"] == 3
    assert not store.exists()
    assert cli_main([*argv, "--max-episodes", "2", "--no-progress"]) == 0
    assert "wrote 2 episodes" in capsys.readouterr().out
    stored = EpisodeStore.open(store)
    assert stored.n_episodes == 2 and stored.features["action"].rate_hz == 12.0
    assert set(stored.episodes["env_id"]) == {"7"}


def test_a_new_format_is_validated_before_anything_is_written(tmp_path: Path, npz_format) -> None:
    _write(tmp_path / "raw" / "a.npz", 3, 0)
    bad = tmp_path / "raw" / "b.npz"
    with np.load(_write(bad, 3, 1)) as data:
        action, image = data["action"].copy(), data["image"]
    action[1, 0] = np.nan
    np.savez(bad, action=action, image=image)
    with pytest.raises(IngestError, match=r"b.npz: key 'action': NaN or infinite value at frame 1"):
        ingest("npz", tmp_path / "raw", tmp_path / "store.zarr", progress=False)
    assert not (tmp_path / "store.zarr").exists()
