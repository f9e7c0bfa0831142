"""The session reader's video decoders (torchcodec, PyAV, OpenCV) give the same frames and the same
error for a video shorter than its plan; the decode benchmark runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from demoscale.collect import IngestError
from demoscale.collect.umi_session import VIDEO_DECODERS, read_video_frames, video_decoder_problems

REPO_ROOT = Path(__file__).resolve().parents[2]
FRAMES = 30


def _write_h264(path: Path) -> Path:
    """30 frames of 96x64 H.264 (PyAV), key frame every 10: the red level encodes the frame index."""
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = 96, 64, "yuv420p"
        stream.options = {"g": "10", "crf": "10"}
        for t in range(FRAMES):
            image = np.zeros((64, 96, 3), np.uint8)
            image[..., 0] = 20 + 7 * t
            image[..., 1] = np.linspace(0, 200, 96, dtype=np.uint8)[None]
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write_h264(tmp_path_factory.mktemp("videos") / "raw_video.mp4")


def _usable(name: str) -> None:
    problem = video_decoder_problems()[name]
    if problem is not None:
        pytest.skip(f"{name} {problem}")


@pytest.mark.parametrize("decoder", VIDEO_DECODERS)
def test_every_decoder_reads_the_same_frames_of_the_range(video: Path, decoder: str) -> None:
    _usable(decoder)
    frames = read_video_frames(video, 12, 27, 32, decoder=decoder)
    assert frames.shape == (15, 32, 32, 3) and frames.dtype == np.uint8
    # The red level says which video frame each one is: the range is exact (torchcodec seeks to the
    # key frame at 10, the others decode from the start).
    red = frames[..., 0].astype(float).mean(axis=(1, 2))
    np.testing.assert_array_equal(
        np.abs(red[:, None] - (20 + 7 * np.arange(FRAMES))[None]).argmin(1), range(12, 27)
    )
    reference = read_video_frames(video, 12, 27, 32, decoder="pyav" if decoder != "pyav" else "opencv")
    assert np.abs(frames.astype(float) - reference).mean() < 3.0  # colour conversions differ a little


@pytest.mark.parametrize("decoder", VIDEO_DECODERS)
def test_a_video_shorter_than_the_range_is_the_same_error_for_every_decoder(
    video: Path, decoder: str
) -> None:
    _usable(decoder)
    with pytest.raises(
        IngestError, match=rf"{video}: video ends at frame {FRAMES}, the plan needs frames 20:40"
    ):
        read_video_frames(video, 20, 40, 32, decoder=decoder)


def test_auto_takes_the_first_decoder_that_works(video: Path, tmp_path: Path) -> None:
    usable = [name for name in VIDEO_DECODERS if video_decoder_problems()[name] is None]
    assert usable, video_decoder_problems()
    np.testing.assert_array_equal(
        read_video_frames(video, 3, 9, 16), read_video_frames(video, 3, 9, 16, decoder=usable[0])
    )
    not_a_video = tmp_path / "raw_video.mp4"
    not_a_video.write_bytes(b"\x00" * 4096)
    with pytest.raises(IngestError, match="no video decoder could read it"):
        read_video_frames(not_a_video, 0, 4, 16)
    with pytest.raises(ValueError, match="unknown video decoder 'decord'"):
        read_video_frames(video, 0, 4, 16, decoder="decord")


def test_the_decode_benchmark_runs(tmp_path: Path) -> None:
    out = tmp_path / "video_decode.json"
    command = [sys.executable, "benchmarks/video_decode.py", "--sizes", "96x64", "--frames", "40"]
    command += ["--start", "5", "--end", "40", "--repeats", "1", "--json", str(out)]
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["benchmark"] == "video_decode"
    for name, numbers in report["results"]["96x64"].items():
        assert name in VIDEO_DECODERS and numbers["decode"]["frames_per_s"] > 0
        assert numbers["reader"]["cpu_ms_per_frame"] > 0
    assert "decoder" in result.stdout  # the table
