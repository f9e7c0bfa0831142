"""Ingest as an adversarial user runs it: two writers, damaged and hostile files, kill -9, late failures.

Every test runs the real command (`python -m demoscale ingest ...`) in real processes on real files.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import zarr
from demoscale.collect.zarr_source import register_image_codecs
from demoscale.datasets import EpisodeStore


def _ingest(*args: str, wait: bool = True, **kwargs):
    command = [sys.executable, "-m", "demoscale", "ingest", *args, "--no-progress"]
    if not wait:
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
    return subprocess.run(command, capture_output=True, text=True, timeout=600, **kwargs)


def _rewrite_zip(source: Path, target: Path, edits: dict[str, bytes | None]) -> Path:
    """A copy of a zip with some members replaced (bytes) or left out (None)."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as new:
        for name in old.namelist():
            content = edits.get(name, old.read(name))
            if content is not None:
                new.writestr(name, content)
    return target


def _zip_arrays(path: Path) -> tuple[dict[str, np.ndarray], np.ndarray]:
    register_image_codecs()
    root = zarr.open_group(zarr.storage.ZipStore(path, mode="r"), mode="r", zarr_format=2)
    return {key: root[f"data/{key}"][:] for key in root["data"].array_keys()}, root["meta/episode_ends"][:]


def _files(store: Path) -> dict[str, bytes] | None:
    if not store.exists():
        return None
    return {p.relative_to(store).as_posix(): p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def sources(tmp_path_factory, make_umi_episode, umi_zip_fixture):
    """Two UMI zips of 16 episodes, the last 4 of the first equal to the first 4 of the second, and a
    seed zip of 2 other episodes."""
    rng = np.random.default_rng(17)
    episodes = [make_umi_episode(rng, int(n)) for n in rng.integers(8, 14, size=30)]
    root = tmp_path_factory.mktemp("sources")
    first = umi_zip_fixture(root / "a" / "dataset.zarr.zip", episodes[:16])
    second = umi_zip_fixture(root / "b" / "dataset.zarr.zip", episodes[12:28])
    seed = umi_zip_fixture(root / "seed" / "dataset.zarr.zip", episodes[28:])
    return first, second, seed, episodes


def _check_store_holds(store: Path, episodes: list[dict[str, np.ndarray]]) -> None:
    """Every episode exactly once, each with its own data, and the store deep-valid."""
    opened = EpisodeStore.open(store)
    opened.validate(deep=True)
    assert opened.n_episodes == len(episodes)
    stored = sorted(
        (opened.episode(i) for i in range(opened.n_episodes)), key=lambda e: float(e["robot0_eef_pos"][0, 0])
    )
    expected = sorted(episodes, key=lambda e: float(e["robot0_eef_pos"][0, 0]))
    for have, want in zip(stored, expected, strict=True):
        for key in ("robot0_eef_pos", "robot0_eef_rot_axis_angle", "robot0_gripper_width"):
            np.testing.assert_array_equal(have[key], want[key].reshape(have[key].shape))
        assert np.abs(have["camera0_rgb"].astype(int) - want["camera0_rgb"]).mean() < 6  # lossy JPEG-XL


@pytest.mark.parametrize("seeded", [True, False], ids=["existing-store", "new-store"])
def test_two_ingests_into_one_store_write_every_episode_once(tmp_path, sources, seeded) -> None:
    first, second, seed, episodes = sources
    store = tmp_path / "store.zarr"
    if seeded:
        assert _ingest("umi", str(seed), "--store", str(store), "--image-codec", "jpegxl").returncode == 0
    processes = [_ingest("umi", str(src), "--store", str(store), wait=False) for src in (first, second)]
    outputs = [process.communicate(timeout=600) for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs
    _check_store_holds(store, episodes if seeded else episodes[:28])
    written = [int(out.split("wrote ")[1].split()[0]) for out, _ in outputs]
    assert sum(written) == 28  # what the two processes report adds up to what the store holds


def test_ingest_waits_for_another_writer_and_times_out_clearly(tmp_path, sources, lock_holder) -> None:
    first, second, _, _ = sources
    store = tmp_path / "busy.zarr"
    assert _ingest("umi", str(first), "--store", str(store)).returncode == 0
    before = _files(store)
    with lock_holder(store) as holder:
        timed_out = _ingest("umi", str(second), "--store", str(store), "--lock-timeout", "1")
        assert timed_out.returncode == 1
        assert (
            f"another writer (pid {holder.pid}" in timed_out.stderr and "--lock-timeout" in timed_out.stderr
        )
        assert "Traceback" not in timed_out.stderr
        assert _files(store) == before
        waiting = _ingest("umi", str(second), "--store", str(store), wait=False)
        deadline = time.monotonic() + 120
        message = ""
        while "waiting" not in message and time.monotonic() < deadline:
            message += os.read(waiting.stderr.fileno(), 4096).decode()
        assert f"another writer holds the store (pid {holder.pid}" in message and "waiting" in message
        holder.release()
        out, err = waiting.communicate(timeout=600)
        assert waiting.returncode == 0, err
        assert "wrote 12 episodes" in out and "skipped 4" in out


@pytest.fixture(scope="module")
def healthy_zip(tmp_path_factory, make_umi_episode, umi_zip_fixture):
    rng = np.random.default_rng(5)
    return umi_zip_fixture(
        tmp_path_factory.mktemp("healthy") / "dataset.zarr.zip", [make_umi_episode(rng, 10) for _ in range(4)]
    )


def test_missing_low_dim_chunk_is_refused(tmp_path, healthy_zip) -> None:
    damaged = _rewrite_zip(healthy_zip, tmp_path / "dataset.zarr.zip", {"data/robot0_eef_pos/2.0": None})
    result = _ingest("umi", str(damaged), "--store", str(tmp_path / "store.zarr"))
    assert result.returncode == 2
    assert "key 'robot0_eef_pos': chunk data/robot0_eef_pos/2.0 (episode 2, frames 20:30) is missing" in (
        result.stderr
    )
    assert not (tmp_path / "store.zarr").exists()


@pytest.mark.parametrize("codec", ["jpegxl", "jpeg"])
def test_corrupt_late_frame_leaves_the_store_as_it_was(tmp_path, sources, healthy_zip, codec) -> None:
    """Found only while writing (frame 35 of 40 does not decode): exit 1, the store byte-identical."""
    store = tmp_path / "store.zarr"
    assert _ingest("umi", str(sources[0]), "--store", str(store), "--image-codec", codec).returncode == 0
    before = _files(store)
    frame = (zipfile.ZipFile(healthy_zip).read("data/camera0_rgb/35.0.0.0"))[:60]  # a cut JPEG-XL file
    damaged = _rewrite_zip(healthy_zip, tmp_path / "dataset.zarr.zip", {"data/camera0_rgb/35.0.0.0": frame})
    result = _ingest("umi", str(damaged), "--store", str(store))
    assert result.returncode == 2
    assert (
        "camera0_rgb" in result.stderr and "episode 3" in result.stderr and "Traceback" not in result.stderr
    )
    assert _files(store) == before
    # Into a store that did not exist: no store is left behind.
    result = _ingest("umi", str(damaged), "--store", str(tmp_path / "fresh.zarr"), "--image-codec", codec)
    assert result.returncode == 2 and not (tmp_path / "fresh.zarr").exists()


def test_commit_every_keeps_the_batches_before_a_late_failure_and_a_rerun_skips_them(
    tmp_path, healthy_zip
) -> None:
    """--commit-every 2: episode 3 fails while writing; the batch of episodes 0-1 stays committed, the
    failing batch is rolled back, and the rerun on the repaired source writes only what is missing."""
    store = tmp_path / "store.zarr"
    frame = (zipfile.ZipFile(healthy_zip).read("data/camera0_rgb/35.0.0.0"))[:60]
    damaged = _rewrite_zip(healthy_zip, tmp_path / "dataset.zarr.zip", {"data/camera0_rgb/35.0.0.0": frame})
    result = _ingest("umi", str(damaged), "--store", str(store), "--commit-every", "2")
    assert result.returncode == 2 and "episode 3" in result.stderr
    kept = EpisodeStore.open(store)
    kept.validate(deep=True)
    assert kept.n_episodes == 2 and list(kept.episodes["length"]) == [10, 10]
    result = _ingest("umi", str(healthy_zip), "--store", str(store), "--commit-every", "2")
    assert result.returncode == 0 and "wrote 2 episodes" in result.stdout and "skipped 2" in result.stdout
    arrays, _ = _zip_arrays(healthy_zip)
    whole = EpisodeStore.open(store)
    whole.validate(deep=True)
    np.testing.assert_array_equal(whole.read("robot0_eef_pos", 0, 40), arrays["robot0_eef_pos"])
    assert _ingest("umi", str(healthy_zip), "--store", str(store), "--commit-every", "0").returncode == 2


def _session(root: Path, truncate_second: bool) -> Path:
    """A raw UMI session: 3 planned episodes, the last from a second video (MJPG in an AVI
    container, under the usual name). Truncated, that video still reports its 24 frames in the
    header, so the plan checks pass, and decoding ends at frame 5: a failure found only while writing."""
    import cv2

    rng = np.random.default_rng(4)
    videos = {"demo_a": 24, "demo_b": 24}
    for name, count in videos.items():
        path = root / "demos" / name / "raw_video.avi"  # OpenCV picks the container by the extension
        path.parent.mkdir(parents=True)
        writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 60.0, (64, 48))
        for t in range(count):
            writer.write(np.full((48, 64, 3), 10 * t, np.uint8))
        writer.release()
        path.rename(path.with_suffix(".mp4"))
    if truncate_second:
        video = root / "demos" / "demo_b" / "raw_video.mp4"
        video.write_bytes(video.read_bytes()[: int(video.stat().st_size * 0.6)])
    plan = []
    for name, start, end in (("demo_a", 0, 10), ("demo_a", 10, 20), ("demo_b", 8, 20)):
        pose = rng.normal(size=(end - start, 6))
        gripper = {"tcp_pose": pose, "gripper_width": rng.uniform(0, 0.08, end - start)}
        gripper.update(demo_start_pose=pose[0], demo_end_pose=pose[-1])
        plan.append(
            {
                "episode_timestamps": np.arange(end - start) / 60.0,
                "grippers": [gripper],
                "cameras": [{"video_path": f"{name}/raw_video.mp4", "video_start_end": (start, end)}],
            }
        )
    (root / "dataset_plan.pkl").write_bytes(pickle.dumps(plan))
    return root


def test_video_shorter_than_its_plan_leaves_the_store_as_it_was(tmp_path, sources) -> None:
    store = tmp_path / "store.zarr"
    assert _ingest("umi", str(sources[2]), "--store", str(store), "--image-codec", "png").returncode == 0
    before = _files(store)
    session = _session(tmp_path / "short", truncate_second=True)
    for target in (store, tmp_path / "fresh.zarr"):
        result = _ingest(
            "umi-session", str(session), "--store", str(target), "--resolution", "32", "--workers", "2"
        )
        assert result.returncode == 2
        assert "video ends at frame" in result.stderr and "Traceback" not in result.stderr
    assert _files(store) == before and not (tmp_path / "fresh.zarr").exists()
    # The same session with a whole video goes in (the plan itself was fine).
    whole = _session(tmp_path / "whole", truncate_second=False)
    result = _ingest("umi-session", str(whole), "--store", str(tmp_path / "fresh.zarr"), "--resolution", "32")
    assert result.returncode == 0 and "wrote 3 episodes" in result.stdout


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads process parents from /proc")
def test_killed_ingest_takes_its_workers_with_it(tmp_path, make_umi_episode, umi_zip_fixture) -> None:
    rng = np.random.default_rng(3)
    big = umi_zip_fixture(
        tmp_path / "big" / "dataset.zarr.zip", [make_umi_episode(rng, 120, size=64) for _ in range(8)]
    )
    ingest = _ingest("umi", str(big), "--store", str(tmp_path / "store.zarr"), "--workers", "2", wait=False)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while len(workers) < 2 and time.monotonic() < deadline and ingest.poll() is None:
            workers = _children(ingest.pid)
            time.sleep(0.1)
        assert len(workers) >= 2, "the ingest never started its workers"
        os.kill(ingest.pid, signal.SIGKILL)
        ingest.wait()
        # A hang guard, not a speed limit: orphans would live on forever.
        deadline = time.monotonic() + 60
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in workers if _alive(pid)], "decode workers outlived the killed ingest"
    finally:
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


class _Payload:
    """Unpickling this runs ``open(marker, "w")``: what a hostile plan could do with any code."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_hostile_session_plan_is_refused_without_running_it(tmp_path) -> None:
    session = tmp_path / "session"
    (session / "demos").mkdir(parents=True)
    marker = tmp_path / "pwned"
    plan = [
        {"episode_timestamps": np.arange(3) / 60.0, "grippers": [], "cameras": [], "x": _Payload(str(marker))}
    ]
    (session / "dataset_plan.pkl").write_bytes(pickle.dumps(plan))
    result = _ingest("umi-session", str(session), "--store", str(tmp_path / "store.zarr"))
    assert result.returncode == 2
    assert "names io.open" in result.stderr and "--trust-pickle" in result.stderr
    assert "Traceback" not in result.stderr
    assert not marker.exists() and not (tmp_path / "store.zarr").exists()


def test_zero_step_robomimic_demo_is_a_message(tmp_path) -> None:
    import h5py

    path = tmp_path / "demo.hdf5"
    with h5py.File(path, "w") as file:
        for index, steps in enumerate((5, 0)):
            group = file.create_group(f"data/demo_{index}")
            group.create_dataset("actions", data=np.zeros((steps, 7)))
            group.create_dataset("obs/robot0_eef_pos", data=np.zeros((steps, 3)))
    result = _ingest("robomimic", str(path), "--store", str(tmp_path / "store.zarr"))
    assert result.returncode == 2
    assert "episode demo_1: 0 steps" in result.stderr and "Traceback" not in result.stderr
