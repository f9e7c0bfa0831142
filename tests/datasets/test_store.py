"""The episode store on real Zarr directories: round trips, appends, bad input, stats, validation."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import imagecodecs
import numpy as np
import pytest
from demoscale.datasets import EpisodeStore, FeatureSpec, StoreError


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


@pytest.mark.parametrize("codec", ["jpeg", "png", "jpegxl"])
def test_round_trip_every_kind_and_codec(tmp_path: Path, kit, codec: str) -> None:
    features = kit.features()
    features["gray"] = FeatureSpec(kind="image", shape=(16, 24), dtype="uint8")
    features["mask"] = FeatureSpec(kind="point_cloud", shape=(64,), dtype="bool")
    store = EpisodeStore.create(tmp_path / "s.zarr", features, image_codec=codec)
    episodes = []
    for i, length in enumerate([7, 3]):
        episode = kit.make_episode(i, length)
        episode["gray"] = kit.smooth_frames(length, (16, 24), i + 5)
        episode["mask"] = np.arange(length * 64).reshape(length, 64) % 3 == 0
        episodes.append(episode)
        assert (
            store.append_episode(episode, env_id="e", object_id=str(i), source_sha256=kit.digest(str(i))) == i
        )

    reopened = EpisodeStore.open(tmp_path / "s.zarr")
    assert reopened.n_episodes == 2 and reopened.n_frames == 10
    assert reopened.episode_ends.tolist() == [7, 10]
    assert reopened.features == features
    for i, episode in enumerate(episodes):
        got = reopened.episode(i)
        for key in ("robot0_eef_pos", "action", "pointcloud_xyz", "mask"):
            np.testing.assert_array_equal(got[key], episode[key])
            assert got[key].dtype == np.dtype(features[key].dtype)
        for key in ("camera0_rgb", "gray"):
            assert got[key].shape == episode[key].shape and got[key].dtype == np.uint8
            if codec == "png":
                np.testing.assert_array_equal(got[key], episode[key])
            else:
                assert _psnr(got[key], episode[key]) > 30
    # read and read_frames agree with the episodes, in any order, with repeats.
    all_pos = np.concatenate([e["robot0_eef_pos"] for e in episodes])
    np.testing.assert_array_equal(reopened.read("robot0_eef_pos", 2, 9), all_pos[2:9])
    np.testing.assert_array_equal(reopened.read_frames("robot0_eef_pos", [9, 0, 9, 4]), all_pos[[9, 0, 9, 4]])
    frames = reopened.read_frames("camera0_rgb", [8, 1, 8])
    np.testing.assert_array_equal(frames[0], frames[2])
    np.testing.assert_array_equal(frames[1], reopened.read("camera0_rgb", 1, 2)[0])
    reopened.validate()


def test_episodes_table_and_metadata(small_store: EpisodeStore) -> None:
    table = EpisodeStore.open(small_store.location).episodes
    assert list(table.columns) == [
        "episode_index", "start", "end", "length", "env_id", "object_id", "task",
        "operator", "source", "source_sha256", "success", "tags",
    ]  # fmt: skip
    assert table["length"].tolist() == [5, 6, 7, 8, 9, 10]
    assert table["start"].tolist() == [0, 5, 11, 18, 26, 35]
    assert table["env_id"].tolist() == ["0", "1", "2", "0", "1", "2"]
    assert table["success"].tolist() == [False, True, False, True, False, True]
    assert table["tags"].tolist()[:2] == ["train,hard", "train"]


def test_unknown_success_is_missing(tmp_path: Path, kit) -> None:
    store = EpisodeStore.create(tmp_path / "s.zarr", kit.features())
    store.append_episode(kit.make_episode(0, 4), env_id="a", object_id="b", source_sha256="x", success=None)
    assert EpisodeStore.open(tmp_path / "s.zarr").episodes["success"].isna().tolist() == [True]


def test_append_after_reopen_and_open_or_create(tmp_path: Path, kit) -> None:
    path = tmp_path / "s.zarr"
    store = EpisodeStore.open_or_create(path, kit.features())
    kit.append(store, 0, 4, "e0", "o0")
    store = EpisodeStore.open_or_create(path, kit.features())
    assert kit.append(store, 1, 6, "e1", "o0") == 1
    reopened = EpisodeStore.open(path)
    assert reopened.episode_ends.tolist() == [4, 10]
    np.testing.assert_array_equal(reopened.episode(1)["action"], kit.make_episode(1, 6)["action"])
    other = kit.features()
    other["extra"] = FeatureSpec(kind="low_dim", shape=(1,))
    with pytest.raises(StoreError, match="different features"):
        EpisodeStore.open_or_create(path, other)


def test_read_only_store_refuses_append(small_store: EpisodeStore, kit) -> None:
    reader = EpisodeStore.open(small_store.location)
    with pytest.raises(StoreError, match="read-only"):
        kit.append(reader, 99, 3, "e", "o")


def test_duplicate_source_is_skipped(small_store: EpisodeStore, kit, caplog) -> None:
    before = kit.snapshot(Path(small_store.location))
    with caplog.at_level("WARNING"):
        assert kit.append(small_store, 2, 7, "0", "10") is None
    assert "already in the store" in caplog.text
    assert kit.snapshot(Path(small_store.location)) == before
    assert EpisodeStore.open(small_store.location).n_episodes == 6


def _bad_inputs(kit):
    good = kit.make_episode(50, 6)
    short = dict(good, action=good["action"][:5])
    wrong_shape = dict(good, robot0_eef_pos=np.zeros((6, 4), np.float32))
    empty = {k: v[:0] for k, v in good.items()}
    nan = dict(good, action=good["action"].copy())
    nan["action"][3, 1] = np.nan
    inf = dict(good, robot0_eef_pos=good["robot0_eef_pos"].copy())
    inf["robot0_eef_pos"][0, 0] = np.inf
    float_image = dict(good, camera0_rgb=good["camera0_rgb"].astype(np.float32))
    missing = {k: v for k, v in good.items() if k != "action"}
    extra = dict(good, unknown=np.zeros((6, 1)))
    png_bytes = [imagecodecs.png_encode(f) for f in good["camera0_rgb"]]
    return {
        "lengths": (short, {}, "different lengths"),
        "shape": (wrong_shape, {}, r"'robot0_eef_pos' has frame shape \(4,\)"),
        "empty": (empty, {}, "empty episode"),
        "nan": (nan, {}, r"'action' has NaN or inf values \(first at frame 3\)"),
        "inf": (inf, {}, "'robot0_eef_pos' has NaN or inf"),
        "image dtype": (float_image, {}, "must be uint8"),
        "missing key": (missing, {}, r"missing keys \['action'\]"),
        "extra key": (extra, {}, "not in the store's features"),
        "wrong encoded codec": (good, {"camera0_rgb": png_bytes}, "is not jpeg"),
        "encoded length": (good, {"camera0_rgb": png_bytes[:3]}, "different lengths"),
    }


def test_bad_input_raises_and_leaves_store_unchanged(small_store: EpisodeStore, kit) -> None:
    path = Path(small_store.location)
    before = kit.snapshot(path)
    for name, (data, encoded, message) in _bad_inputs(kit).items():
        with pytest.raises(StoreError, match=message) as error:
            small_store.append_episode(
                data,
                env_id="0",
                object_id="10",
                source="bad/source.h5",
                source_sha256=kit.digest(name),
                encoded=encoded,
            )
        assert "bad/source.h5" in str(error.value), name
        assert kit.snapshot(path) == before, f"store changed by rejected input: {name}"
    EpisodeStore.open(path).validate()


def test_unknown_codec_creates_nothing(tmp_path: Path, kit) -> None:
    with pytest.raises(StoreError, match="unknown image codec 'webp'"):
        EpisodeStore.create(tmp_path / "s.zarr", kit.features(), image_codec="webp")
    assert not (tmp_path / "s.zarr").exists()


def test_create_refuses_existing_store(small_store: EpisodeStore, kit) -> None:
    with pytest.raises(StoreError, match="already exists"):
        EpisodeStore.create(small_store.location, kit.features())


def test_missing_episode_ends_is_a_clear_error(small_store: EpisodeStore, kit) -> None:
    # Lost under an open handle: validate and append say so, and the append writes nothing.
    shutil.rmtree(Path(small_store.location) / "meta" / "episode_ends")
    before = kit.snapshot(Path(small_store.location))
    with pytest.raises(StoreError, match="meta/episode_ends missing"):
        small_store.validate()
    with pytest.raises(StoreError, match="missing array meta/episode_ends"):
        kit.append(small_store, 20, 4, "0", "10")
    assert kit.snapshot(Path(small_store.location)) == before
    with pytest.raises(StoreError, match="meta/episode_ends"):
        EpisodeStore.open(small_store.location)


def test_not_a_store(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no such store"):
        EpisodeStore.open(tmp_path / "absent.zarr")
    (tmp_path / "empty").mkdir()
    with pytest.raises(StoreError, match="cannot open"):
        EpisodeStore.open(tmp_path / "empty")


def test_encoded_frames_are_copied_as_is(tmp_path: Path, kit) -> None:
    store = EpisodeStore.create(tmp_path / "s.zarr", kit.features(), image_codec="jpegxl")
    episode = kit.make_episode(3, 5)
    jxl = [imagecodecs.jpegxl_encode(f, level=99) for f in episode["camera0_rgb"]]
    data = {k: v for k, v in episode.items() if k != "camera0_rgb"}
    store.append_episode(data, env_id="e", object_id="o", source_sha256="h", encoded={"camera0_rgb": jxl})
    reopened = EpisodeStore.open(tmp_path / "s.zarr")
    assert reopened.read_encoded("camera0_rgb", 0, 5) == jxl
    decoded = reopened.read("camera0_rgb", 0, 5)
    np.testing.assert_array_equal(decoded, np.stack([imagecodecs.jpegxl_decode(b) for b in jxl]))


def test_zip_and_fsspec_urls_are_readable(small_store: EpisodeStore, tmp_path: Path) -> None:
    root = Path(small_store.location)
    zip_path = tmp_path / "small.zarr.zip"
    with zipfile.ZipFile(zip_path, "w", compression=zipfile.ZIP_STORED) as archive:
        for path in sorted(root.rglob("*")):
            if path.is_file():
                archive.write(path, path.relative_to(root).as_posix())
    expected = small_store.episode(4)
    for location in (str(zip_path), f"file://{root}"):
        store = EpisodeStore.open(location)
        assert store.n_episodes == 6
        got = store.episode(4)
        for key in expected:
            np.testing.assert_array_equal(got[key], expected[key])
        store.validate()


def test_stats_match_numpy(small_store: EpisodeStore, kit) -> None:
    all_pos = np.concatenate([kit.make_episode(i, 5 + i)["robot0_eef_pos"] for i in range(6)]).astype(
        np.float64
    )
    stats = small_store.stats("robot0_eef_pos")
    np.testing.assert_allclose(stats["min"], all_pos.min(0))
    np.testing.assert_allclose(stats["max"], all_pos.max(0))
    np.testing.assert_allclose(stats["mean"], all_pos.mean(0), rtol=1e-12)
    np.testing.assert_allclose(stats["std"], all_pos.std(0), rtol=1e-12)
    np.testing.assert_allclose(stats["p01"], np.percentile(all_pos, 1, axis=0))
    np.testing.assert_allclose(stats["p99"], np.percentile(all_pos, 99, axis=0))
    assert int(stats["count"]) == len(all_pos)
    # Cached in the store, and invalidated by an append.
    assert kit.raw_group(small_store.location).attrs["stats"]["robot0_eef_pos"]["n_frames"] == 45
    EpisodeStore.open(small_store.location).stats("action")  # a reader of a writable directory caches too
    assert kit.raw_group(small_store.location).attrs["stats"]["action"]["n_frames"] == 45
    kit.append(small_store, 6, 4, "3", "10")
    assert int(EpisodeStore.open(small_store.location, mode="a").stats("robot0_eef_pos")["count"]) == 49
    with pytest.raises(StoreError, match="image"):
        small_store.stats("camera0_rgb")


def test_streaming_stats_over_many_blocks(tmp_path: Path, monkeypatch) -> None:
    from demoscale.datasets import statistics

    # Small blocks and the histogram path: the streaming code is what runs on large stores.
    monkeypatch.setattr(statistics, "STATS_BLOCK_FRAMES", 256)
    monkeypatch.setattr(statistics, "EXACT_PERCENTILE_MAX_VALUES", 10)
    features = {"x": FeatureSpec(kind="low_dim", shape=(2,), dtype="float64")}
    store = EpisodeStore.create(tmp_path / "s.zarr", features)
    rng = np.random.default_rng(1)
    values = np.stack([rng.normal(5, 2, 3000), rng.exponential(1, 3000)], axis=1)
    for i in range(3):
        store.append_episode(
            {"x": values[i * 1000 : (i + 1) * 1000]}, env_id="e", object_id=str(i), source_sha256=str(i)
        )
    stats = store.stats("x")
    np.testing.assert_allclose(stats["mean"], values.mean(0), rtol=1e-10)
    np.testing.assert_allclose(stats["std"], values.std(0), rtol=1e-10)
    # A histogram percentile lies between the order statistics around its rank, give or take a bin.
    width = (values.max(0) - values.min(0)) / statistics.HISTOGRAM_BINS
    ordered = np.sort(values, axis=0)
    for name, q in (("p01", 0.01), ("p99", 0.99)):
        rank = q * (len(values) - 1)
        low, high = ordered[int(np.floor(rank))], ordered[int(np.ceil(rank))]
        assert np.all(stats[name] >= low - width) and np.all(stats[name] <= high + width), name


def test_validate_reports_broken_invariants(small_store: EpisodeStore, kit) -> None:
    small_store.validate()
    root = kit.raw_group(small_store.location)
    length = root["meta/length"]
    length[2] = 99
    with pytest.raises(StoreError, match=r"episode 2: meta/length is 99, episode_ends give 7"):
        EpisodeStore.open(small_store.location).validate()
    length[2] = 7
    root["data/action"].resize((30, 4))  # data shorter than the committed frames
    with pytest.raises(StoreError):
        EpisodeStore.open(small_store.location).validate()


def test_uncommitted_tail_is_ignored(small_store: EpisodeStore, kit) -> None:
    # A writer killed after writing data but before episode_ends leaves longer data arrays.
    root = kit.raw_group(small_store.location)
    for key in ("action", "robot0_eef_pos"):
        array = root[f"data/{key}"]
        array.resize((array.shape[0] + 5, *array.shape[1:]))
    ends = root["meta/episode_ends"]
    ends.resize((7,))  # resized, value never written: fill 0 is not a valid end
    reopened = EpisodeStore.open(small_store.location, mode="a")
    assert reopened.n_episodes == 6 and reopened.n_frames == 45
    reopened.validate()
    assert kit.append(reopened, 6, 3, "0", "11") == 6
    final = EpisodeStore.open(small_store.location)
    final.validate()
    assert final.episode_ends.tolist()[-1] == 48
    np.testing.assert_array_equal(final.episode(6)["action"], kit.make_episode(6, 3)["action"])


def test_direct_shard_reads_match_zarr_and_survive_rewrites(small_store: EpisodeStore, kit) -> None:
    from demoscale.datasets.shards import LocalShardReader

    location = small_store.location
    via_zarr = [bytes(b) for b in kit.raw_group(location)["data/camera0_rgb"][0:45]]
    direct = LocalShardReader.for_array(location, "camera0_rgb", kit.raw_group(location)["data/camera0_rgb"])
    assert direct is not None  # the layout the store writes is the one read directly
    assert direct.read(np.arange(45)) == via_zarr
    reader = EpisodeStore.open(location)
    assert reader.read_encoded("camera0_rgb", 0, 45) == via_zarr
    # An append rewrites the (partly filled) shard file; the cached shard index must not go stale.
    kit.append(small_store, 6, 9, "0", "10")
    assert direct.read(np.arange(45)) == via_zarr
    assert direct.read(np.arange(45, 54)) == [
        bytes(b) for b in kit.raw_group(location)["data/camera0_rgb"][45:54]
    ]
    assert reader.read_encoded("camera0_rgb", 0, 45) == via_zarr
    np.testing.assert_array_equal(
        reader.read_frames("camera0_rgb", [44, 3]), small_store.read_frames("camera0_rgb", [44, 3])
    )


def test_fsspec_memory_url_write_and_read(kit) -> None:
    url = f"memory://store-{kit.digest('memory')[:12]}.zarr"
    store = EpisodeStore.open_or_create(url, kit.features())
    kit.append(store, 0, 4, "e", "o")
    again = EpisodeStore.open_or_create(url, kit.features())
    assert again.n_episodes == 1
    kit.append(again, 1, 3, "e", "o")
    reader = EpisodeStore.open(url)
    assert reader.episode_ends.tolist() == [4, 7]
    np.testing.assert_array_equal(reader.episode(1)["action"], kit.make_episode(1, 3)["action"])
    reader.validate()


def test_derived_arrays_are_written_read_and_go_stale(small_store: EpisodeStore, kit) -> None:
    values = np.arange(45, dtype=np.int64)[::-1].copy()
    small_store.write_derived("reversed_index", values, {"made_by": "test"})
    reader = EpisodeStore.open(small_store.location)
    derived = reader.read_derived("reversed_index")
    np.testing.assert_array_equal(derived.values, values)
    assert derived.attrs == {"made_by": "test"}
    assert reader.read_derived("absent") is None
    reader.validate(deep=True)  # a derived array is not a feature: validate leaves it alone
    # Episodes appended after it was computed make it stale: it reads as absent, and a new one
    # computed for the old frame count is refused.
    kit.append(small_store, 6, 4, "0", "10")
    assert EpisodeStore.open(small_store.location).read_derived("reversed_index") is None
    with pytest.raises(StoreError, match="45 rows but the store has 49 committed frames"):
        small_store.write_derived("reversed_index", values)
    small_store.write_derived("reversed_index", np.zeros((49, 2), np.float32))  # replaces it
    assert EpisodeStore.open(small_store.location).read_derived("reversed_index").values.shape == (49, 2)


def test_derived_arrays_refuse_feature_keys_and_readers(small_store: EpisodeStore, kit) -> None:
    with pytest.raises(StoreError, match="cannot be a derived array"):
        small_store.write_derived("action", np.zeros(45))
    with pytest.raises(StoreError, match="is a feature"):
        small_store.read_derived("action")
    with pytest.raises(StoreError, match="read-only"):
        EpisodeStore.open(small_store.location).write_derived("x", np.zeros(45))


def test_unfinished_derived_array_reads_as_absent(small_store: EpisodeStore, kit) -> None:
    small_store.write_derived("labels", np.ones(45, np.int64))
    # What a writer killed between creating the array and writing its values leaves behind.
    array = kit.raw_group(small_store.location)["data/labels"]
    array.attrs["derived_from_n_frames"] = None
    assert EpisodeStore.open(small_store.location).read_derived("labels") is None
