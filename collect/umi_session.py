"""Raw UMI sessions: ingestion straight from ``dataset_plan.pkl`` and the GoPro videos.

Session layout::

    <session>/dataset_plan.pkl                 list of episodes (below)
    <session>/demos/demo_<serial>_<time>/raw_video.mp4 (+ imu_data.json, camera_trajectory.csv, ...)

Each plan episode is a dict with ``episode_timestamps`` (N,), ``grippers`` (one dict per robot with
``tcp_pose`` (N, 6) = position + axis-angle, ``gripper_width`` (N,), ``demo_start_pose`` (6,),
``demo_end_pose`` (6,)) and ``cameras`` (one dict per camera with ``video_path``, relative to
``demos/`` or to the session, and ``video_start_end`` = the [start, end) frame range).

Frames are decoded with the fastest decoder that works here (torchcodec, else OpenCV, else PyAV:
``VIDEO_DECODERS``), centre-cropped to a square and resized (area interpolation) to
``resolution`` x ``resolution``; the stored keys are those of the zip path (``camera{i}_rgb``,
``robot{i}_*`` and the next-frame ``action``).

The plan is a pickle (that is how UMI's pipeline writes it), and unpickling can run any code the
file names. So it is read with a restricted unpickler that builds only plain containers, strings,
numbers, paths and numpy arrays and scalars, which is all a UMI plan holds; a plan that names
anything else is refused with a message, and only ``trust_pickle=True`` (``--trust-pickle``) reads it
with the full unpickler: use that only for sessions you made or trust.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import os
import pickle
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from demoscale.collect.driver import IngestSummary, ingest
from demoscale.collect.source_format import (
    ContentHash,
    EpisodePlan,
    IngestError,
    LoadedEpisode,
    SourceFormat,
    SourcePlan,
    option,
    validating,
)
from demoscale.collect.sources import SourceIds
from demoscale.collect.umi import next_pose_action, umi_features

PLAN_NAME = "dataset_plan.pkl"

# What a UMI plan is made of, and nothing that can run code: numpy's array, scalar and dtype
# reconstructors (under their numpy 1 and numpy 2 module names), and a few harmless builtins.
_PLAN_GLOBALS = {
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("_codecs", "encode"),
    ("collections", "OrderedDict"),
    ("pathlib", "Path"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
}


class UntrustedPickleError(pickle.UnpicklingError):
    """A plan pickle that names a global outside the plan allow-list (it could run code)."""


class _PlanUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _PLAN_GLOBALS:
            return super().find_class(module, name)
        raise UntrustedPickleError(f"{module}.{name}")


def load_plan(path: str | os.PathLike, trust_pickle: bool = False) -> Any:
    """Unpickle a session plan: restricted to plain data and numpy arrays unless ``trust_pickle``."""
    with open(path, "rb") as handle:
        if trust_pickle:
            return pickle.load(handle)
        return _PlanUnpickler(handle).load()


def _video_path(session: Path, video_path: str) -> Path:
    candidate = Path(video_path)
    if candidate.is_absolute():
        return candidate
    for base in (session / "demos", session):
        if (base / candidate).is_file():
            return base / candidate
    return session / "demos" / candidate


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _frame_count(path: Path) -> int:
    import cv2

    capture = cv2.VideoCapture(str(path))
    try:
        if not capture.isOpened():
            raise IngestError(f"{path}: OpenCV cannot open the video")
        return int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
    finally:
        capture.release()


# Decoders in order of preference, least CPU per frame first as measured on the same H.264 videos
# (benchmarks/video_decode.py, numbers in collect/README.md); each later one is the fallback of the
# ones before it, where they do not import or cannot open a file. OpenCV and PyAV were within noise
# of each other; OpenCV comes first as the lower of the two in most runs.
VIDEO_DECODERS = ("torchcodec", "opencv", "pyav")
# torchcodec hands out a range's frames in one tensor; they are asked for in batches of about this
# many bytes. A whole episode at once would be gigabytes for a 2.7K GoPro video, and even 32
# frames of 1280x720 cost 4.2 ms of CPU per frame against 2.4 ms in batches of 2-4 (fresh large
# buffers are slow to fill; benchmarks/video_decode.py).
TORCHCODEC_BATCH_BYTES = 8 << 20


def torchcodec_batch(width: int, height: int) -> int:
    """Frames per torchcodec call for RGB frames of this size (at least one)."""
    return max(1, TORCHCODEC_BATCH_BYTES // max(1, 3 * int(width) * int(height)))


# One FFmpeg thread per decoder: ingestion decodes episodes in parallel processes (``workers``), and
# decoder threads on top of them would only compete for the same cores.
DECODE_THREADS = 1


@functools.cache
def video_decoder_problems() -> dict[str, str | None]:
    """Per decoder, why it cannot decode here (None: it can). torchcodec needs FFmpeg's shared
    libraries (4 to 8) on the system and a torch it was built for; PyAV and OpenCV bring their own."""
    problems: dict[str, str | None] = {}
    for name, module in (("torchcodec", "torchcodec.decoders"), ("pyav", "av"), ("opencv", "cv2")):
        if importlib.util.find_spec(module.split(".")[0]) is None:
            problems[name] = "not installed"
            continue
        try:
            importlib.import_module(module)  # torchcodec loads torch and FFmpeg's libraries here
        except Exception as error:
            lines = str(error).strip().splitlines()
            problems[name] = f"does not load ({type(error).__name__}: {lines[0] if lines else ''})"
        else:
            problems[name] = None
    return problems


def _decoders(decoder: str) -> list[str]:
    """The decoders to try, in order, for ``decoder`` (``auto`` or one name)."""
    if decoder == "auto":
        usable = [name for name in VIDEO_DECODERS if video_decoder_problems()[name] is None]
        if not usable:
            raise IngestError(f"no video decoder works here: {video_decoder_problems()}")
        return usable
    if decoder not in VIDEO_DECODERS:
        raise ValueError(
            f"unknown video decoder {decoder!r}; choose auto or one of {', '.join(VIDEO_DECODERS)}"
        )
    problem = video_decoder_problems()[decoder]
    if problem is not None:
        raise IngestError(f"video decoder {decoder} {problem}")
    return [decoder]


def _too_short(path: str | os.PathLike, index: int, start: int, end: int) -> IngestError:
    return IngestError(f"{path}: video ends at frame {index}, the plan needs frames {start}:{end}")


def _rgb_frames_torchcodec(path: str | os.PathLike, start: int, end: int) -> Iterator[np.ndarray]:
    from torchcodec.decoders import VideoDecoder

    # "exact" indexes every frame from the packets first, so frame i is the i-th decoded frame, as
    # in a sequential read; the range is then reached by seeking to the key frame before it.
    video = VideoDecoder(
        str(path), dimension_order="NHWC", seek_mode="exact", num_ffmpeg_threads=DECODE_THREADS
    )
    available = int(video.metadata.num_frames or 0)
    if available < end:
        raise _too_short(path, available, start, end)
    batch = torchcodec_batch(video.metadata.width or 1, video.metadata.height or 1)
    for first in range(start, end, batch):
        yield from video.get_frames_in_range(first, min(first + batch, end)).data.numpy()


def _rgb_frames_pyav(path: str | os.PathLike, start: int, end: int) -> Iterator[np.ndarray]:
    import av

    index = 0
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.thread_count = DECODE_THREADS
        frames = container.decode(stream)
        while index < end:
            try:
                frame = next(frames)
            except StopIteration:
                break
            except av.FFmpegError as error:  # a damaged tail: the video ends where decoding stops
                raise IngestError(f"{_too_short(path, index, start, end)} ({error})") from None
            if index >= start:
                yield frame.to_ndarray(format="rgb24", threads=1)  # one swscale thread: repeatable
            index += 1
    if index < end:
        raise _too_short(path, index, start, end)


def _rgb_frames_opencv(path: str | os.PathLike, start: int, end: int) -> Iterator[np.ndarray]:
    import cv2

    capture = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG, [cv2.CAP_PROP_N_THREADS, DECODE_THREADS])
    if not capture.isOpened():
        raise OSError(f"{path}: OpenCV cannot open the video")
    try:
        # Read sequentially from the start: seeking by frame index is not exact for every codec.
        for index in range(end):
            ok, frame = capture.read()
            if not ok:
                raise _too_short(path, index, start, end)
            if index >= start:
                yield cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)
    finally:
        capture.release()


_RGB_FRAMES = {"torchcodec": _rgb_frames_torchcodec, "pyav": _rgb_frames_pyav, "opencv": _rgb_frames_opencv}


def read_video_frames(
    path: str | os.PathLike, start: int, end: int, resolution: int, decoder: str = "auto"
) -> np.ndarray:
    """Frames [start, end) of a video as (N, resolution, resolution, 3) uint8 RGB, centre-cropped
    to a square and area-resized.

    ``decoder``: ``auto`` (the first of :data:`VIDEO_DECODERS` that works here; one that cannot
    open the file hands it to the next) or a name. A video with fewer frames than the range needs
    is an :class:`IngestError` (``video ends at frame N``) whichever decoder reads it.
    """
    import cv2

    failures = []
    for name in _decoders(decoder):
        frames = np.empty((end - start, resolution, resolution, 3), np.uint8)
        try:
            for position, frame in enumerate(_RGB_FRAMES[name](path, start, end)):
                height, width = frame.shape[:2]
                side = min(height, width)
                top, left = (height - side) // 2, (width - side) // 2
                square = frame[top : top + side, left : left + side]
                frames[position] = cv2.resize(square, (resolution, resolution), interpolation=cv2.INTER_AREA)
            return frames
        except IngestError:
            raise
        except Exception as error:  # this decoder cannot read the file: the next one tries
            failures.append(f"{name}: {type(error).__name__}: {error}")
    raise IngestError(f"{path}: no video decoder could read it ({'; '.join(failures)})")


def _low_dim(episode: Mapping, where: str, index: int) -> dict[str, np.ndarray]:
    """The robot arrays of one plan episode, checked."""
    try:
        grippers = list(episode["grippers"])
        timestamps = np.asarray(episode["episode_timestamps"])
    except (KeyError, TypeError) as error:
        raise IngestError(f"{where}: episode {index}: missing {error} in the plan") from error
    length = len(timestamps)
    if length == 0 or not grippers:
        raise IngestError(f"{where}: episode {index}: no timestamps or no grippers")
    arrays: dict[str, np.ndarray] = {}
    for robot, gripper in enumerate(grippers):
        try:
            pose = np.asarray(gripper["tcp_pose"], np.float64)
            width = np.asarray(gripper["gripper_width"], np.float64).reshape(-1, 1)
            start_pose = np.asarray(gripper["demo_start_pose"], np.float64).reshape(6)
            end_pose = np.asarray(gripper["demo_end_pose"], np.float64).reshape(6)
        except (KeyError, ValueError, TypeError) as error:
            raise IngestError(f"{where}: key 'grippers[{robot}]', episode {index}: {error}") from error
        if pose.shape != (length, 6) or len(width) != length:
            raise IngestError(
                f"{where}: key 'grippers[{robot}].tcp_pose', episode {index}: shapes {pose.shape} / {width.shape} "
                f"do not match {length} timestamps"
            )
        arrays[f"robot{robot}_eef_pos"] = pose[:, :3].astype(np.float32)
        arrays[f"robot{robot}_eef_rot_axis_angle"] = pose[:, 3:].astype(np.float32)
        arrays[f"robot{robot}_gripper_width"] = width.astype(np.float32)
        arrays[f"robot{robot}_demo_start_pose"] = np.repeat(start_pose[None], length, axis=0)
        arrays[f"robot{robot}_demo_end_pose"] = np.repeat(end_pose[None], length, axis=0)
    for key, values in arrays.items():
        finite = np.isfinite(values).all(axis=1)
        if not finite.all():
            frame = int(np.flatnonzero(~finite)[0])
            raise IngestError(
                f"{where}: key {key!r}, episode {index}: NaN or infinite value at frame {frame}"
            )
    return arrays


@dataclass(frozen=True)
class UmiSessionOptions:
    resolution: int = option(224, "square image size (default 224)")
    rate_hz: float | None = option(None, "frame rate (default: from the plan's timestamps)")
    trust_pickle: bool = option(
        False,
        "unpickle a plan that needs more than plain containers and numpy arrays; "
        "this runs whatever code the pickle names: only for sessions you made or trust",
    )


@dataclass(frozen=True)
class SessionEpisode:
    """One planned session episode: its plan entry and the frame range of each camera's video."""

    plan: str
    trust_pickle: bool
    index: int
    cameras: tuple[tuple[str, int, int], ...]  # (video, start, end) per camera
    resolution: int


class UmiSessionFormat(SourceFormat):
    """Raw UMI sessions (the :class:`~demoscale.collect.source_format.SourceFormat` contract)."""

    name = "umi-session"
    summary = "a raw UMI session: dataset_plan.pkl + demos/*/raw_video.mp4"
    src_help = "the session directory (or a directory of sessions, or a dataset_plan.pkl)"
    patterns = (PLAN_NAME,)
    what = f"UMI session ({PLAN_NAME})"
    options_type = UmiSessionOptions

    def plan(
        self, path: Path, ids: SourceIds, options: UmiSessionOptions, limit: int | None, progress: bool
    ) -> SourcePlan:
        """Validate a whole session plan: every episode's arrays and every video's frame range."""
        plan_path = Path(path).resolve()
        session = plan_path.parent
        where = str(plan_path)
        videos = _Videos(session)
        plans, layout, rate_hz = [], None, options.rate_hz
        episodes = _read_plan(plan_path, options.trust_pickle)[:limit]
        for index, episode in enumerate(validating(episodes, session, progress)):
            arrays = _low_dim(episode, where, index)
            length = len(arrays["robot0_eef_pos"])
            cameras = tuple(
                videos.frame_range(entry, where, index, camera, length)
                for camera, entry in enumerate(episode.get("cameras") or [])
            )
            robots = sorted({int(key[5 : key.index("_")]) for key in arrays})
            if layout is not None and (tuple(robots), len(cameras)) != layout:
                raise IngestError(
                    f"{where}: episode {index} has {(tuple(robots), len(cameras))} robots/cameras, episode 0 {layout}"
                )
            layout = (tuple(robots), len(cameras))
            if rate_hz is None:
                steps = np.diff(np.asarray(episode["episode_timestamps"], np.float64))
                if len(steps) and np.median(steps) > 0:
                    rate_hz = round(float(1.0 / np.median(steps)), 2)
            digest = ContentHash().arrays(arrays)
            for video, start, end in cameras:
                digest.raw(
                    "video", f"{videos.sha256[Path(video)]}:{start}:{end}:{options.resolution}".encode()
                )
            load_args = SessionEpisode(where, options.trust_pickle, index, cameras, options.resolution)
            plans.append(
                EpisodePlan(f"{plan_path}#episode={index}", digest.hexdigest(), length, load_args, ids)
            )
        robots, n_cameras = layout
        cameras = {i: (options.resolution, options.resolution) for i in range(n_cameras)}
        return SourcePlan(umi_features(robots, cameras, rate_hz or 60.0), plans)

    def load(self, episode: SessionEpisode, want_encoded: bool) -> LoadedEpisode:
        """The episode's arrays: its video frames decoded and resized, and the next-frame action."""
        key = f"{os.getpid()}:{episode.plan}"
        if key not in _PLANS:
            _PLANS[key] = load_plan(episode.plan, episode.trust_pickle)
        arrays = _low_dim(_PLANS[key][episode.index], episode.plan, episode.index)
        for camera, (video, start, end) in enumerate(episode.cameras):
            arrays[f"camera{camera}_rgb"] = read_video_frames(video, start, end, episode.resolution)
        robots = sorted({int(k[5 : k.index("_")]) for k in arrays if k.startswith("robot")})
        arrays["action"] = next_pose_action(arrays, robots)
        return arrays, None


UMI_SESSION = UmiSessionFormat()
# Plans unpickled in this process (per process id: a forked worker reads its own).
_PLANS: dict[str, list] = {}


def _read_plan(plan_path: Path, trust_pickle: bool) -> list:
    """The session plan's episodes; IngestError for a missing, hostile, damaged or empty plan."""
    if not plan_path.is_file():
        raise IngestError(f"{plan_path.parent}: no {PLAN_NAME}: not a UMI session")
    try:
        plan = load_plan(plan_path, trust_pickle)
    except UntrustedPickleError as error:
        raise IngestError(
            f"{plan_path}: the pickle names {error}, which is not plain data or a numpy array; unpickling "
            "it could run code. Refused. If you made this session or trust it, pass --trust-pickle "
            "(trust_pickle=True)"
        ) from None
    except Exception as error:
        raise IngestError(f"{plan_path}: cannot be unpickled (truncated or corrupt?): {error}") from error
    if not isinstance(plan, list | tuple) or not plan:
        raise IngestError(f"{plan_path}: expected a non-empty list of episodes, got {type(plan).__name__}")
    return list(plan)


class _Videos:
    """The session's videos: found, counted and hashed once each."""

    def __init__(self, session: Path) -> None:
        self.session = session
        self.frames: dict[Path, int] = {}
        self.sha256: dict[Path, str] = {}

    def frame_range(
        self, entry: Mapping, where: str, index: int, camera: int, length: int
    ) -> tuple[str, int, int]:
        """(video, start, end) of one camera of plan episode ``index``, checked against the video."""
        try:
            video = _video_path(self.session, str(entry["video_path"])).resolve()
            start, end = (int(v) for v in entry["video_start_end"])
        except (KeyError, TypeError, ValueError) as error:
            raise IngestError(f"{where}: key 'cameras[{camera}]', episode {index}: {error}") from error
        if not video.is_file():
            raise IngestError(f"{where}: key 'cameras[{camera}]', episode {index}: video {video} is missing")
        if end - start != length:
            raise IngestError(
                f"{where}: key 'cameras[{camera}].video_start_end', episode {index}: {end - start} frames "
                f"but {length} timestamps"
            )
        if video not in self.frames:
            self.frames[video] = _frame_count(video)
            self.sha256[video] = _file_sha256(video)
        if start < 0 or end > self.frames[video]:
            raise IngestError(
                f"{where}: key 'cameras[{camera}].video_start_end', episode {index}: frames {start}:{end} "
                f"outside the video's {self.frames[video]} frames ({video})"
            )
        return str(video), start, end


def ingest_umi_session(
    src: str | os.PathLike,
    store: str | os.PathLike,
    *,
    resolution: int = 224,
    rate_hz: float | None = None,
    trust_pickle: bool = False,
    **common: Any,
) -> IngestSummary:
    """Ingest a raw UMI session directory (``dataset_plan.pkl`` + ``demos/*/raw_video.mp4``).

    Same keys as :func:`~demoscale.collect.ingest_umi`; frames are decoded (in ``workers``
    processes), centre-cropped and resized to ``resolution``. env/object/task come from a
    ``<task>/env_<i>/object_<j>/`` layout above the session unless given. ``rate_hz`` defaults to
    the plan's timestamps. The whole plan and every video's frame range are checked first.
    The plan pickle is read with a restricted unpickler (plain data and numpy arrays only) unless
    ``trust_pickle`` (see the module docstring). ``common`` are the driver's keywords
    (:func:`demoscale.collect.ingest`).
    """
    options = UmiSessionOptions(resolution=resolution, rate_hz=rate_hz, trust_pickle=trust_pickle)
    return ingest(UMI_SESSION, src, store, options, **common)
