"""UMI ``dataset.zarr.zip``: writer, reader/validator and ingestion into an episode store.

The source layout (a Zarr format-2 group inside an uncompressed zip) is::

    meta/episode_ends                 (n_episodes,) int64, cumulative exclusive ends, no compressor
    data/robot{i}_eef_pos             (T, 3) float32, metres
    data/robot{i}_eef_rot_axis_angle  (T, 3) float32, axis-angle radians
    data/robot{i}_gripper_width       (T, 1) float32, metres
    data/robot{i}_demo_start_pose     (T, 6) float64, the episode's first pose on every step
    data/robot{i}_demo_end_pose       (T, 6) float64, the episode's last pose on every step
    data/camera{i}_rgb                (T, H, W, 3) uint8, one frame per chunk, JPEG-XL
                                      (numcodecs id ``imagecodecs_jpegxl``)

``i`` is 0 for single-arm data and 0, 1 for bimanual data.

In-memory episode layout taken by :func:`write_umi_zip` (one dict per episode, all episodes with
the same keys, every array time-major with the same length ``T``):

- ``robot{i}_eef_pos``: (T, 3) float, metres;
- ``robot{i}_eef_rot_axis_angle``: (T, 3) float, axis-angle radians;
- ``robot{i}_gripper_width``: (T,) or (T, 1) float, metres;
- ``camera{i}_rgb``: (T, H, W, 3) uint8 RGB;
- optional ``robot{i}_demo_start_pose`` / ``robot{i}_demo_end_pose``: (T, 6); when absent they are
  derived from the episode's first / last ``[eef_pos, eef_rot_axis_angle]``.

Ingestion derives ``action`` = concat over robots of (eef_pos, eef_rot_axis_angle, gripper_width)
of the *next* frame (the last frame repeats itself): the pose the robot is commanded to reach next.
"""

from __future__ import annotations

import os
import re
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

JPEGXL_CODEC_ID = "imagecodecs_jpegxl"
_ROBOT_LOW_DIM = ("eef_pos", "eef_rot_axis_angle", "gripper_width")
_ROBOT_KEY = re.compile(
    r"^robot(\d+)_(eef_pos|eef_rot_axis_angle|gripper_width|demo_start_pose|demo_end_pose)$"
)
_CAMERA_KEY = re.compile(r"^camera(\d+)_rgb$")


def register_image_codecs() -> None:
    """Register imagecodecs' numcodecs codecs (JPEG-XL among them) in this process."""
    from imagecodecs.numcodecs import register_codecs

    register_codecs()


def _complete_episode(episode: Mapping[str, np.ndarray], index: int) -> dict[str, np.ndarray]:
    """Check one in-memory episode and fill in the demo start/end poses where they are absent."""
    unknown = [k for k in episode if not (_ROBOT_KEY.match(k) or _CAMERA_KEY.match(k))]
    if unknown:
        raise ValueError(f"episode {index}: keys {unknown} are not UMI keys (robot<i>_..., camera<i>_rgb)")
    lengths = {key: len(value) for key, value in episode.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"episode {index}: arrays have different lengths {lengths}")
    robots = sorted({int(m.group(1)) for k in episode if (m := _ROBOT_KEY.match(k))})
    out: dict[str, np.ndarray] = {}
    for key, value in episode.items():
        value = np.asarray(value)
        if _CAMERA_KEY.match(key):
            if value.dtype != np.uint8 or value.ndim != 4 or value.shape[-1] != 3:
                raise ValueError(
                    f"episode {index}: {key} must be (T, H, W, 3) uint8, got {value.dtype} {value.shape}"
                )
        out[key] = value
    for robot in robots:
        for part in _ROBOT_LOW_DIM:
            key = f"robot{robot}_{part}"
            if key not in out:
                raise ValueError(f"episode {index}: missing {key}")
        out[f"robot{robot}_gripper_width"] = (
            out[f"robot{robot}_gripper_width"].reshape(-1, 1).astype(np.float32)
        )
        out[f"robot{robot}_eef_pos"] = out[f"robot{robot}_eef_pos"].astype(np.float32)
        out[f"robot{robot}_eef_rot_axis_angle"] = out[f"robot{robot}_eef_rot_axis_angle"].astype(np.float32)
        pose = np.concatenate(
            [episode[f"robot{robot}_eef_pos"], episode[f"robot{robot}_eef_rot_axis_angle"]], axis=1
        )
        pose = pose.astype(np.float64)
        for key, row in (
            (f"robot{robot}_demo_start_pose", pose[0]),
            (f"robot{robot}_demo_end_pose", pose[-1]),
        ):
            out[key] = (
                np.asarray(episode[key], np.float64) if key in episode else np.repeat(row[None], len(pose), 0)
            )
    return out


def write_umi_zip(
    path: str | os.PathLike,
    episodes: Sequence[Mapping[str, np.ndarray]],
    jpegxl_level: int = 99,
    jpegxl_lossless: bool = False,
    rate_hz: float | None = None,
) -> Path:
    """Write ``episodes`` (layout in the module docstring) as a UMI ``dataset.zarr.zip``.

    The zip holds a Zarr format-2 group, entries stored without zip compression; images go one
    frame per chunk through imagecodecs' JPEG-XL numcodecs codec at ``jpegxl_level`` (lossy unless
    ``jpegxl_lossless``); low-dim arrays are uncompressed, chunked by the first episode's length.
    ``rate_hz``, when given, is recorded in the root attributes (UMI itself records no rate).
    """
    import zarr
    from imagecodecs.numcodecs import Jpegxl

    if not episodes:
        raise ValueError("write_umi_zip needs at least one episode")
    register_image_codecs()
    completed = [_complete_episode(episode, i) for i, episode in enumerate(episodes)]
    keys = sorted(completed[0])
    for i, episode in enumerate(completed):
        if sorted(episode) != keys:
            raise ValueError(f"episode {i} has keys {sorted(episode)}, episode 0 has {keys}")
    lengths = np.array([len(episode[keys[0]]) for episode in completed], dtype=np.int64)
    episode_ends = np.cumsum(lengths).astype(np.int64)
    total = int(episode_ends[-1])

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # zarr's zip store rewrites metadata entries (duplicate zip members); build the group in a
    # scratch directory and pack it into the zip afterwards, every member stored uncompressed.
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".umi-zip-") as scratch:
        root = zarr.open_group(zarr.storage.LocalStore(scratch), mode="w", zarr_format=2)
        if rate_hz is not None:
            root.attrs["rate_hz"] = float(rate_hz)
        meta = root.create_group("meta")
        data = root.create_group("data")
        meta.create_array(
            "episode_ends",
            shape=episode_ends.shape,
            dtype="int64",
            chunks=episode_ends.shape,
            compressor=None,
        )[:] = episode_ends
        for key in keys:
            first = completed[0][key]
            full = np.concatenate([episode[key] for episode in completed], axis=0)
            if _CAMERA_KEY.match(key):
                chunks = (1, *first.shape[1:])
                compressor = Jpegxl(level=jpegxl_level, lossless=jpegxl_lossless)
            else:
                chunks = (max(1, min(len(first), total)), *first.shape[1:])
                compressor = None
            array = data.create_array(
                key, shape=full.shape, dtype=full.dtype, chunks=chunks, compressor=compressor
            )
            array[:] = full
        partial = path.with_name(path.name + ".partial")
        with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
            for file in sorted(Path(scratch).rglob("*")):
                if file.is_file():
                    archive.write(file, file.relative_to(scratch).as_posix())
        os.replace(partial, path)
    return path
