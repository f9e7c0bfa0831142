"""UMI dataset.zarr.zip ingestion: values, byte copies, ids from the layout, re-ingest, bad input."""

from __future__ import annotations

import csv
import json
import os
import shutil
import zipfile

import numpy as np
import pytest
import zarr
from demoscale.collect import IngestError, ingest_umi, write_umi_zip
from demoscale.collect.ingest_cli import main as cli_main
from demoscale.collect.zarr_source import register_image_codecs
from demoscale.datasets import EpisodeStore


def _source_arrays(path):
    register_image_codecs()
    root = zarr.open_group(zarr.storage.ZipStore(path, mode="r"), mode="r", zarr_format=2)
    ends = root["meta/episode_ends"][:]
    return {key: root[f"data/{key}"][:] for key in root["data"].array_keys()}, ends


@pytest.fixture(scope="module")
def umi_tree(tmp_path_factory, make_umi_episode, umi_zip_fixture):
    """<task>/env_<i>/object_<j>/dataset.zarr.zip: two pairs, 3 + 2 episodes, single arm (read-only)."""
    rng = np.random.default_rng(1)
    root = tmp_path_factory.mktemp("umi") / "raw"
    first = umi_zip_fixture(
        root / "cup_arrangement/env_3/object_17/session_a/dataset.zarr.zip",
        [make_umi_episode(rng, n) for n in (12, 9, 15)],
    )
    second = umi_zip_fixture(
        root / "cup_arrangement/env_4/object_2/dataset.zarr.zip", [make_umi_episode(rng, n) for n in (10, 11)]
    )
    return root, first, second


@pytest.fixture(scope="module")
def nan_zip(tmp_path_factory, make_umi_episode, umi_zip_fixture):
    """Three episodes; the last has a NaN: the source fails half-way through."""
    rng = np.random.default_rng(2)
    episodes = [make_umi_episode(rng, n) for n in (6, 7, 8)]
    episodes[2]["robot0_eef_rot_axis_angle"][3, 1] = np.nan
    return umi_zip_fixture(tmp_path_factory.mktemp("nan") / "dataset.zarr.zip", episodes)


@pytest.fixture(scope="module")
def second_only_store(tmp_path_factory, umi_tree):
    """A store holding the second zip's episodes; tests copy it."""
    store = tmp_path_factory.mktemp("baseline") / "store"
    ingest_umi(umi_tree[2], store, progress=False)
    return store


def test_ingest_copies_jpegxl_bytes_and_keeps_values(tmp_path, umi_tree):
    root, first, second = umi_tree
    summary = ingest_umi(root, tmp_path / "store", image_codec="jpegxl", progress=False)
    assert (summary.episodes_written, summary.frames_written, summary.episodes_skipped) == (5, 57, 0)

    store = EpisodeStore.open(tmp_path / "store")
    store.validate()
    assert store.n_episodes == 5 and store.n_frames == 57
    episodes = store.episodes
    assert list(episodes["env_id"]) == ["3", "3", "3", "4", "4"]
    assert list(episodes["object_id"]) == ["17", "17", "17", "2", "2"]
    assert set(episodes["task"]) == {"cup_arrangement"}
    assert episodes["source"][1] == f"{first.resolve()}#episode=1"

    arrays, ends = _source_arrays(first)
    with zipfile.ZipFile(first) as archive:
        for episode, (start, end) in enumerate(zip([0, *ends[:-1]], ends, strict=True)):
            stored = store.episode(episode)
            for key in (
                "robot0_eef_pos",
                "robot0_eef_rot_axis_angle",
                "robot0_gripper_width",
                "robot0_demo_start_pose",
            ):
                assert stored[key].dtype == arrays[key].dtype
                np.testing.assert_array_equal(stored[key], arrays[key][start:end])
            # Frames are the zip's chunk bytes, copied as they are.
            offset = int(store.episode_starts[episode])
            copied = store.read_encoded("camera0_rgb", offset, offset + end - start)
            assert copied == [archive.read(f"data/camera0_rgb/{t}.0.0.0") for t in range(start, end)]
            np.testing.assert_array_equal(stored["camera0_rgb"], arrays["camera0_rgb"][start:end])
            pose = np.concatenate(
                [
                    arrays["robot0_eef_pos"],
                    arrays["robot0_eef_rot_axis_angle"],
                    arrays["robot0_gripper_width"],
                ],
                axis=1,
            )[start:end]
            np.testing.assert_array_equal(stored["action"][:-1], pose[1:])  # next-frame pose
            np.testing.assert_array_equal(stored["action"][-1], pose[-1])


def test_transcodes_to_jpeg_within_tolerance_with_two_workers(tmp_path, rng, make_umi_episode):
    episodes = [make_umi_episode(rng, n, robots=2) for n in (5, 7)]
    path = write_umi_zip(tmp_path / "bimanual.zarr.zip", episodes)  # our own writer, round trip
    summary = ingest_umi(
        path, tmp_path / "store", env_id="0", object_id="1", task="handover", workers=2, progress=False
    )
    assert summary.episodes_written == 2
    store = EpisodeStore.open(tmp_path / "store")
    store.validate()
    assert store.features["action"].shape == (14,)
    arrays, _ = _source_arrays(path)
    stored = store.episode(1)
    for camera in ("camera0_rgb", "camera1_rgb"):
        error = np.abs(stored[camera].astype(int) - arrays[camera][5:].astype(int))
        assert error.mean() < 4.0
    np.testing.assert_array_equal(stored["robot1_eef_pos"], episodes[1]["robot1_eef_pos"])
    np.testing.assert_array_equal(stored["action"][:-1, 7:10], episodes[1]["robot1_eef_pos"][1:])


def test_manifest_flags_and_per_episode_reingest(tmp_path, umi_tree, second_only_store):
    root, first, second = umi_tree
    store = tmp_path / "store"
    shutil.copytree(second_only_store, store)  # already holds the second zip's 2 episodes
    manifest = tmp_path / "manifest.csv"
    with open(manifest, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["source", "env_id", "object_id", "task", "operator"])
        writer.writerow([os.path.relpath(first, tmp_path), "kitchen_9", "mug_1", "", "alice"])
    summary = ingest_umi(root, store, manifest=manifest, operator="bob", progress=False)
    # The second zip's episodes are in the store (same content): only the first zip's are written.
    assert (summary.episodes_skipped, summary.frames_skipped, summary.episodes_written) == (2, 21, 3)
    episodes = EpisodeStore.open(store).episodes
    assert list(episodes["env_id"]) == ["4"] * 2 + ["kitchen_9"] * 3
    assert list(episodes["object_id"]) == ["2"] * 2 + ["mug_1"] * 3
    assert list(episodes["operator"])[2:] == ["bob"] * 3  # the flag wins over the manifest
    assert set(episodes["task"]) == {"cup_arrangement"}  # the manifest's empty task keeps the layout's
    again = ingest_umi(root, store, progress=False)
    assert (again.episodes_skipped, again.episodes_written) == (5, 0)
    assert EpisodeStore.open(store).n_episodes == 5


def test_dry_run_reports_and_touches_nothing(tmp_path, umi_tree):
    root, _, _ = umi_tree
    summary = ingest_umi(root, tmp_path / "store", dry_run=True, progress=False)
    assert summary.dry_run and (summary.episodes_written, summary.frames_written) == (5, 57)
    assert not (tmp_path / "store").exists()


def test_cli_ingests_and_exits_nonzero_on_bad_input(tmp_path, umi_tree, capsys):
    root, first, _ = umi_tree
    assert (
        cli_main(["umi", str(first), "--store", str(tmp_path / "store"), "--env-id", "5", "--no-progress"])
        == 0
    )
    assert "wrote 3 episodes" in capsys.readouterr().out
    bad = tmp_path / "bad.zarr.zip"
    bad.write_bytes(b"not a zip at all")
    assert cli_main(["umi", str(bad), "--store", str(tmp_path / "store"), "--no-progress"]) != 0
    assert "bad.zarr.zip" in capsys.readouterr().err


# ------------------------------------------------------------------ bad input leaves the store as it was


def _rewrite_zip(source, target, edit):
    """Copy a zip member by member; ``edit(name, data)`` returns new bytes or None to drop the member."""
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w", compression=zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = edit(info.filename, src.read(info.filename))
            if data is not None:
                dst.writestr(info.filename, data)
    return target


def _edit_zarray(member, change):
    def edit(name, data):
        if name == member:
            meta = json.loads(data)
            change(meta)
            return json.dumps(meta).encode()
        return data

    return edit


BAD_CASES = {
    "truncated": (lambda good, tmp, _: _truncate(good, tmp / "truncated.zarr.zip"), "not a readable zip"),
    "not a zip": (lambda good, tmp, _: _write(tmp / "text.zarr.zip", b"hello" * 100), "not a readable zip"),
    "no episode_ends": (
        lambda good, tmp, _: _rewrite_zip(
            good, tmp / "noends.zarr.zip", lambda n, d: None if n.startswith("meta/episode_ends") else d
        ),
        "meta/episode_ends",
    ),
    "unknown codec": (
        lambda good, tmp, _: _rewrite_zip(
            good,
            tmp / "codec.zarr.zip",
            _edit_zarray(
                "data/camera0_rgb/.zarray", lambda m: m["compressor"].update(id="imagecodecs_nosuchcodec")
            ),
        ),
        "imagecodecs_nosuchcodec",
    ),
    "length mismatch": (
        lambda good, tmp, _: _rewrite_zip(
            good,
            tmp / "length.zarr.zip",
            _edit_zarray(
                "data/robot0_gripper_width/.zarray", lambda m: m.update(shape=[m["shape"][0] - 2, 1])
            ),
        ),
        "robot0_gripper_width",
    ),
    "nan half-way": (
        lambda good, tmp, nan_zip: _write(tmp / "nan.zarr.zip", nan_zip.read_bytes()),
        "robot0_eef_rot_axis_angle', episode 2",
    ),
}


def _truncate(source, target):
    data = source.read_bytes()
    target.write_bytes(data[: len(data) // 2])
    return target


def _write(path, data):
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("case", "with_good_sibling"),
    [(case, False) for case in BAD_CASES] + [("truncated", True), ("nan half-way", True)],
)
def test_bad_input_raises_and_leaves_store_unchanged(
    tmp_path, umi_tree, nan_zip, second_only_store, snapshot, case, with_good_sibling
):
    root, first, second = umi_tree
    store = tmp_path / "store"
    shutil.copytree(second_only_store, store)
    before = snapshot(store)
    make_bad, message = BAD_CASES[case]
    bad_dir = tmp_path / "bad_sources"
    bad_dir.mkdir()
    bad = make_bad(first, bad_dir, nan_zip)
    if with_good_sibling:
        # A directory whose first source is fine and whose second is bad: nothing of either is written.
        good_copy = bad_dir / "a_good" / "dataset.zarr.zip"
        good_copy.parent.mkdir()
        good_copy.write_bytes(first.read_bytes())
        source = bad_dir
    else:
        source = bad
    with pytest.raises(IngestError, match=message) as raised:
        ingest_umi(source, store, progress=False)
    assert str(bad.name) in str(raised.value)
    assert snapshot(store) == before


def test_bad_input_never_creates_a_store(tmp_path, nan_zip):
    with pytest.raises(IngestError, match="episode 2"):
        ingest_umi(nan_zip, tmp_path / "fresh_store", progress=False)
    assert not (tmp_path / "fresh_store").exists()


def test_source_with_other_features_is_refused(tmp_path, second_only_store, rng, make_umi_episode, snapshot):
    store = tmp_path / "store"
    shutil.copytree(second_only_store, store)
    before = snapshot(store)
    bimanual = write_umi_zip(tmp_path / "bimanual.zarr.zip", [make_umi_episode(rng, 4, robots=2)])
    for dry_run in (True, False):
        with pytest.raises(IngestError, match="different features"):
            ingest_umi(bimanual, store, dry_run=dry_run, progress=False)
    assert snapshot(store) == before
