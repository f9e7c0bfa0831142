"""Raw UMI sessions: plan pickle + mp4 videos decoded, cropped, resized; bad plans."""

from __future__ import annotations

import pickle

import cv2
import numpy as np
import pytest
from demoscale.collect import IngestError, ingest_umi_session
from demoscale.collect.ingest_cli import main as cli_main
from demoscale.datasets import EpisodeStore

HEIGHT, WIDTH, RESOLUTION = 48, 64, 32


def _frames(n, seed):
    """Smooth frames that survive video compression; the blue level encodes the frame index."""
    ys, xs = np.mgrid[0:HEIGHT, 0:WIDTH]
    frames = np.empty((n, HEIGHT, WIDTH, 3), np.uint8)
    for t in range(n):
        frames[t, ..., 0] = 40 + xs * 2 + seed * 20
        frames[t, ..., 1] = 60 + ys * 3
        frames[t, ..., 2] = 15 + 10 * t
    return frames


def _write_video(path, frames_rgb):
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 60.0, (WIDTH, HEIGHT))
    for frame in frames_rgb:
        writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
    writer.release()


def _expected(frames_rgb):
    left = (WIDTH - HEIGHT) // 2
    return np.stack(
        [
            cv2.resize(f[:, left : left + HEIGHT], (RESOLUTION, RESOLUTION), interpolation=cv2.INTER_AREA)
            for f in frames_rgb
        ]
    )


def _gripper(rng, n):
    pose = rng.normal(size=(n, 6))
    return {
        "tcp_pose": pose,
        "gripper_width": rng.uniform(0, 0.08, size=n),
        "demo_start_pose": pose[0],
        "demo_end_pose": pose[-1],
    }


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """A session under <task>/env_2/object_9/: two videos, three planned episodes."""
    rng = np.random.default_rng(10)
    root = tmp_path_factory.mktemp("session") / "fold_towel" / "env_2" / "object_9" / "session_1"
    videos = {
        "demo_C1_2024.01.01_10.00.00.000000": _frames(24, 0),
        "demo_C1_2024.01.01_10.05.00.000000": _frames(16, 1),
    }
    for name, frames in videos.items():
        _write_video(root / "demos" / name / "raw_video.mp4", frames)
    names = list(videos)
    ranges = [(names[0], 2, 12), (names[0], 12, 23), (names[1], 0, 14)]
    plan = []
    for name, start, end in ranges:
        n = end - start
        plan.append(
            {
                "episode_timestamps": np.arange(n) / 60.0,
                "grippers": [_gripper(rng, n)],
                "cameras": [{"video_path": f"{name}/raw_video.mp4", "video_start_end": (start, end)}],
            }
        )
    with open(root / "dataset_plan.pkl", "wb") as handle:
        pickle.dump(plan, handle)
    return root, plan, videos, ranges


def test_session_is_decoded_cropped_and_resized(tmp_path, session):
    root, plan, videos, ranges = session
    summary = ingest_umi_session(root, tmp_path / "store", resolution=RESOLUTION, progress=False)
    assert (summary.episodes_written, summary.frames_written) == (3, 35)
    store = EpisodeStore.open(tmp_path / "store")
    store.validate()
    assert store.features["camera0_rgb"].shape == (RESOLUTION, RESOLUTION, 3)
    assert store.features["camera0_rgb"].rate_hz == 60.0
    episodes = store.episodes
    assert (set(episodes["env_id"]), set(episodes["object_id"]), set(episodes["task"])) == (
        {"2"},
        {"9"},
        {"fold_towel"},
    )
    for index, (name, start, end) in enumerate(ranges):
        stored = store.episode(index)
        expected = _expected(videos[name][start:end])
        assert np.abs(stored["camera0_rgb"].astype(float) - expected).mean() < 8.0  # mp4v + JPEG
        pose = plan[index]["grippers"][0]["tcp_pose"]
        np.testing.assert_array_equal(stored["robot0_eef_pos"], pose[:, :3].astype(np.float32))
        np.testing.assert_array_equal(stored["robot0_demo_end_pose"], np.repeat(pose[-1:], end - start, 0))
        np.testing.assert_array_equal(stored["action"][:-1, :3], pose[1:, :3].astype(np.float32))
        # The blue level says which video frame each stored frame is: the ranges must be exact.
        blue = stored["camera0_rgb"][..., 2].mean(axis=(1, 2))
        nearest = np.abs(blue[:, None] - (15 + 10 * np.arange(24))[None]).argmin(axis=1)
        np.testing.assert_array_equal(nearest, np.arange(start, end))
    again = ingest_umi_session(root, tmp_path / "store", resolution=RESOLUTION, progress=False)
    assert (again.episodes_written, again.episodes_skipped) == (0, 3)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda plan: plan[2]["cameras"][0].update(video_start_end=(0, 30)), r"episode 2: 30 frames but 14"),
        (
            lambda plan: (
                plan[2]["cameras"][0].update(video_start_end=(10, 24)),
                None,
            ),
            r"episode 2: frames 10:24 outside the video's 16 frames",
        ),
        (lambda plan: plan[1]["grippers"][0]["tcp_pose"].__setitem__((3, 4), np.nan), r"episode 1: NaN"),
        (lambda plan: plan[2]["cameras"][0].update(video_path="missing/raw_video.mp4"), "is missing"),
    ],
)
def test_bad_plan_writes_nothing(tmp_path, session, snapshot, edit, message):
    root, plan, videos, ranges = session
    bad_session = tmp_path / "bad_session"
    bad_session.mkdir()
    (bad_session / "demos").symlink_to(root / "demos")
    bad_plan = pickle.loads(pickle.dumps(plan))
    edit(bad_plan)
    with open(bad_session / "dataset_plan.pkl", "wb") as handle:
        pickle.dump(bad_plan, handle)
    with pytest.raises(IngestError, match=message):
        ingest_umi_session(bad_session, tmp_path / "store", resolution=RESOLUTION, env_id="1", progress=False)
    assert snapshot(tmp_path / "store") is None


def test_truncated_plan_fails_in_the_cli(tmp_path, session, capsys):
    root, *_ = session
    bad_session = tmp_path / "bad_session"
    (bad_session / "demos").mkdir(parents=True)
    (bad_session / "dataset_plan.pkl").write_bytes((root / "dataset_plan.pkl").read_bytes()[:50])
    assert (
        cli_main(["umi-session", str(bad_session), "--store", str(tmp_path / "store"), "--no-progress"]) == 2
    )
    assert "dataset_plan.pkl: cannot be unpickled" in capsys.readouterr().err
    assert not (tmp_path / "store").exists()
