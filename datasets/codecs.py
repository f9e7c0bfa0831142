"""Image codecs of the episode store: per-frame images (imagecodecs) and video (PyAV).

With a per-frame codec each image frame is stored as the encoded bytes of one image (a JPEG, PNG or
JPEG-XL file in memory), so any process can decode it with imagecodecs alone: nothing has to be
registered with zarr. With a video codec (``h264``, ``av1``) each frame is one packet of its
episode's stream, decoded from the nearest key frame (``datasets/video.py``); such frames are
encoded an episode at a time (:func:`encode_frames`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import imagecodecs
import numpy as np
from demoscale.datasets.video import DEFAULT_VIDEO_OPTIONS, VIDEO_CODECS, check_video_options, encode_episode

FRAME_CODECS = ("jpeg", "png", "jpegxl")
IMAGE_CODECS = (*FRAME_CODECS, *VIDEO_CODECS)

# Defaults chosen for size/speed on robot camera frames: JPEG q90 is ~10x smaller than raw at
# 96x96 and decodes at ~19k frames/s; JPEG-XL defaults to lossless in imagecodecs, so ask for lossy.
DEFAULT_CODEC_OPTIONS: dict[str, dict[str, Any]] = {
    "jpeg": {"level": 90},
    "png": {"level": 6},
    "jpegxl": {"level": 90, "lossless": False},
    **DEFAULT_VIDEO_OPTIONS,
}

# Leading bytes of each format, used to check already-encoded frames before they are copied.
_MAGIC: dict[str, tuple[bytes, ...]] = {
    "jpeg": (b"\xff\xd8\xff",),
    "png": (b"\x89PNG\r\n\x1a\n",),
    "jpegxl": (b"\xff\x0a", b"\x00\x00\x00\x0cJXL \r\n\x87\n"),
}

_ENCODERS: dict[str, Callable[..., bytes]] = {
    "jpeg": imagecodecs.jpeg_encode,
    "png": imagecodecs.png_encode,
    "jpegxl": imagecodecs.jpegxl_encode,
}
_DECODERS: dict[str, Callable[..., np.ndarray]] = {
    "jpeg": imagecodecs.jpeg_decode,
    "png": imagecodecs.png_decode,
    "jpegxl": imagecodecs.jpegxl_decode,
}


def check_codec(codec: str) -> str:
    """Return ``codec`` if it is a known image codec, else raise ``ValueError`` listing the known ones."""
    if codec not in IMAGE_CODECS:
        raise ValueError(f"unknown image codec {codec!r}; choose one of {', '.join(IMAGE_CODECS)}")
    return codec


def is_video(codec: str) -> bool:
    """Whether ``codec`` stores frames as packets of a video stream (encoded per episode)."""
    return codec in VIDEO_CODECS


def codec_options(codec: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """The default encoder options of ``codec`` updated with ``options`` (checked for video codecs)."""
    if is_video(check_codec(codec)):
        return check_video_options(codec, options or {})
    merged = dict(DEFAULT_CODEC_OPTIONS[codec])
    merged.update(options or {})
    return merged


def encode_frames(frames: np.ndarray, codec: str, options: dict[str, Any]) -> list[bytes]:
    """One episode's frames of an image key as the bytes the store keeps, one element per frame."""
    if is_video(codec):
        return encode_episode(frames, codec, options)
    return [encode_frame(frame, codec, options) for frame in frames]


def encode_frame(frame: np.ndarray, codec: str, options: dict[str, Any]) -> bytes:
    """Encode one uint8 image (H, W), (H, W, 1), (H, W, 3) or (H, W, 4) to bytes (per-frame codecs)."""
    if is_video(codec):
        raise ValueError(f"{codec} frames are encoded an episode at a time: use encode_frames")
    if frame.ndim == 3 and frame.shape[2] == 1:
        frame = frame[:, :, 0]
    return bytes(_ENCODERS[codec](np.ascontiguousarray(frame), **options))


def has_magic(data: bytes, codec: str) -> bool:
    """Whether ``data`` starts like a file (a packet, for video codecs) of ``codec``."""
    magics = VIDEO_CODECS[codec].magic if is_video(codec) else _MAGIC[codec]
    return any(bytes(data[: len(magic)]) == magic for magic in magics)


def decode_frame(data: bytes, codec: str, out: np.ndarray | None = None) -> np.ndarray:
    """Decode one frame of a per-frame codec; writes into ``out`` (shape of the feature) when given
    and returns it. (Video frames depend on the frames before them: the store decodes those.)"""
    if is_video(codec):
        raise ValueError(f"{codec} frames decode from their key frame on, not one by one")
    if out is None:
        return _DECODERS[codec](data)
    target = out[:, :, 0] if out.ndim == 3 and out.shape[2] == 1 else out
    if codec == "jpeg":
        # libjpeg-turbo decodes straight into the caller's buffer: no intermediate copy.
        _DECODERS[codec](data, out=target)
    else:
        target[...] = _DECODERS[codec](data).reshape(target.shape)
    return out
