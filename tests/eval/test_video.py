"""Rollout videos: H.264 mp4 with a caption band that shows the step, the stages and success."""

from __future__ import annotations

import numpy as np
import pytest
from demoscale.eval.video import CAPTION_ROWS, FrameCaption, write_video

av = pytest.importorskip("av")


def test_video_is_h264_scaled_up_with_a_caption_that_turns_green_on_success(tmp_path) -> None:
    frames = [np.full((64, 128, 3), 30 * k, np.uint8) for k in range(6)]
    captions = [FrameCaption(k, stages=(k >= 2, k >= 4, k >= 5), success=k >= 5) for k in range(6)]
    path = write_video(tmp_path / "rollout_0.mp4", frames, fps=10.0, captions=captions)
    assert path == tmp_path / "rollout_0.mp4"
    assert not list(tmp_path.glob("*.partial*"))
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == "h264" and stream.codec_context.pix_fmt == "yuv420p"
        decoded = [frame.to_ndarray(format="rgb24") for frame in container.decode(stream)]
    assert len(decoded) == 6
    height, width = decoded[0].shape[:2]
    assert height >= 240 and height % 2 == 0 and width % 2 == 0  # 64 rows scaled x4, plus the band
    band_first, band_last = decoded[0][: CAPTION_ROWS - 4, -10:], decoded[-1][: CAPTION_ROWS - 4, -10:]
    assert band_last[..., 1].mean() > band_last[..., 0].mean() + 60  # green once it succeeded
    assert abs(int(band_first[..., 1].mean()) - int(band_first[..., 0].mean())) < 15  # grey before
    # The caption's text is drawn: the band is not one flat colour.
    assert decoded[0][:CAPTION_ROWS].std() > 5


def test_video_needs_frames_and_one_caption_per_frame(tmp_path) -> None:
    with pytest.raises(ValueError, match="no frames"):
        write_video(tmp_path / "a.mp4", [], fps=10.0)
    with pytest.raises(ValueError, match="2 frames but 1 captions"):
        write_video(tmp_path / "a.mp4", [np.zeros((8, 8, 3), np.uint8)] * 2, 10.0, [FrameCaption(0)])
