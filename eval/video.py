"""Rollout videos people can open: H.264 mp4 (browsers, trackers) with a success/stage overlay.

Frames are scaled up (nearest neighbour) so that a 64 px camera is watchable and the caption
readable, then a caption band is drawn above each frame: the step, each stage reached so far, and
SUCCESS in green once the task succeeds. Encoding goes through PyAV's libx264 (``yuv420p``, the
``faststart`` layout so playback starts before the download ends); without PyAV an animated GIF
is written instead, and the returned path says which.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MIN_HEIGHT = 240  # scale small frames up to at least this many rows
CAPTION_ROWS = 28


@dataclass(frozen=True)
class FrameCaption:
    """What the overlay of one frame says."""

    step: int
    stages: tuple[bool, ...] = ()
    success: bool = False


def _even(value: int) -> int:
    return value + (value % 2)


def overlay(frame: np.ndarray, caption: FrameCaption, scale: int = 1) -> np.ndarray:
    """``frame`` scaled by ``scale`` with a caption band on top (uint8 RGB, even sides for H.264)."""
    import cv2

    image = np.repeat(np.repeat(np.asarray(frame, np.uint8), scale, axis=0), scale, axis=1)
    height, width = image.shape[:2]
    canvas = np.zeros((_even(height + CAPTION_ROWS), _even(width), 3), np.uint8)
    canvas[CAPTION_ROWS : CAPTION_ROWS + height, :width] = image
    colour = (40, 160, 60) if caption.success else (50, 50, 50)
    canvas[:CAPTION_ROWS] = colour
    stages = "".join("#" if done else "-" for done in caption.stages)
    reached = sum(caption.stages)
    text = f"step {caption.step}"
    if caption.stages:
        text += f"  stages {reached}/{len(caption.stages)} [{stages}]"
    text += "  SUCCESS" if caption.success else ""
    font_scale = max(0.35, min(0.6, width / 700))
    cv2.putText(
        canvas,
        text,
        (6, CAPTION_ROWS - 9),
        cv2.FONT_HERSHEY_SIMPLEX,
        font_scale,
        (255, 255, 255),
        1,
        cv2.LINE_AA,
    )
    return canvas


def write_video(
    path: str | os.PathLike,
    frames: Sequence[np.ndarray],
    fps: float,
    captions: Sequence[FrameCaption] | None = None,
) -> Path:
    """Write ``frames`` (uint8 HxWx3 RGB) as an H.264 mp4 at ``path`` with the captions drawn on.

    Returns the path written: ``path`` itself, or the same name with ``.gif`` where PyAV is missing.
    """
    if not frames:
        raise ValueError(f"{path}: no frames to write")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    scale = max(1, math.ceil(MIN_HEIGHT / frames[0].shape[0]))
    captions = list(captions) if captions is not None else [FrameCaption(i) for i in range(len(frames))]
    if len(captions) != len(frames):
        raise ValueError(f"{path}: {len(frames)} frames but {len(captions)} captions")
    drawn = [overlay(frame, caption, scale) for frame, caption in zip(frames, captions, strict=True)]
    try:
        import av
    except ImportError:
        import imageio.v2 as imageio

        gif = path.with_suffix(".gif")
        imageio.mimsave(gif, drawn, duration=1 / fps)
        return gif
    from fractions import Fraction

    partial = path.with_name(path.name + ".partial.mp4")
    with av.open(str(partial), mode="w", options={"movflags": "faststart"}) as container:
        stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1000))
        stream.width, stream.height = drawn[0].shape[1], drawn[0].shape[0]
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": "23", "preset": "veryfast"}
        for image in drawn:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        container.mux(stream.encode())
    os.replace(partial, path)
    return path
