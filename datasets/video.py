"""Image keys stored as video: one compressed packet per frame, decoded from the nearest key frame.

A video image key keeps the layout of every image key (``datasets/README.md``): one element per
frame in a sharded variable-length-bytes array. Element ``t`` is the encoded packet of frame ``t``:
an H.264 access unit in Annex B form (``h264``, PyAV's libx264) or an AV1 temporal unit of OBUs
(``av1``, PyAV's libsvtav1). Each episode is a stream of its own, encoded when it is appended:

- its first frame is a key frame, and so is every ``gop``-th frame after it; each key frame carries
  the stream's headers (H.264 SPS/PPS, the AV1 sequence header), so decoding can start at any key
  frame with no other state: frame ``t`` of an episode starting at ``s`` needs the packets from
  ``s + gop * ((t - s) // gop)`` to ``t``, at most ``gop`` of them;
- no frame refers to a later one (no B-frames, low-delay prediction): packets are in display order
  and each yields its frame as soon as it is decoded.

Episodes never share a stream, so appends, transactions and rollbacks work frame by frame exactly as
for JPEG frames, and joining an episode's elements gives a playable raw stream (``.h264`` / ``.obu``).

Decoding uses PyAV's codec contexts on the packets directly (no container to open or probe), one
decoder per process and key, one FFmpeg thread each: DataLoader and Ray workers are the parallelism.
Only the frames asked for are converted to RGB, with OpenCV (BT.601, limited range, as the encoder's
conversion): about a third of the time of FFmpeg's own conversion, which cost more than decoding.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np


@dataclass(frozen=True)
class VideoCodec:
    """How the store writes and reads one video codec with PyAV."""

    encoder: str
    decoders: tuple[str, ...]  # first one PyAV has is used
    magic: tuple[bytes, ...]  # how a packet starts
    crf_range: tuple[int, int]


VIDEO_CODECS: dict[str, VideoCodec] = {
    # Annex B start code before the first NAL unit.
    "h264": VideoCodec("libx264", ("h264",), (b"\x00\x00\x00\x01", b"\x00\x00\x01"), (0, 51)),
    # A temporal unit opens with a temporal-delimiter OBU (type 2, size 0).
    "av1": VideoCodec("libsvtav1", ("libdav1d", "av1"), (b"\x12\x00",), (0, 63)),
}

# crf is each encoder's quality (lower is better); gop the key-frame interval, which bounds the
# packets decoded for one random frame (at most gop, (gop + 1) / 2 on average) and costs size (a key
# frame is several times a predicted frame): benchmarks/loader.py measures both. preset: x264's
# speed preset, SVT-AV1's (0 slowest .. 13 fastest).
DEFAULT_VIDEO_OPTIONS: dict[str, dict[str, Any]] = {
    "h264": {"crf": 23, "gop": 8, "preset": "veryfast"},
    "av1": {"crf": 30, "gop": 8, "preset": 8},
}
_X264_PRESETS = (
    "ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow", "placebo",
)  # fmt: skip

# Decoded frames each key's reader keeps, in bytes: repeated frames (overlapping windows, a sampler
# walking an episode in order) are served without decoding their group of pictures again.
DEFAULT_FRAME_CACHE_BYTES = 16 << 20

# The encoders see a fixed rate: it only scales the rate control's notion of time, and a fixed one
# keeps the bytes of a frame independent of the key's recorded rate.
_ENCODER_RATE = 30


def check_video_options(codec: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options of ``codec`` as stored (ints and strings); ValueError for anything else."""
    unknown = sorted(set(options) - set(DEFAULT_VIDEO_OPTIONS[codec]))
    if unknown:
        raise ValueError(
            f"unknown {codec} options {unknown}; known: {', '.join(DEFAULT_VIDEO_OPTIONS[codec])}"
        )
    merged = {**DEFAULT_VIDEO_OPTIONS[codec], **options}
    low, high = VIDEO_CODECS[codec].crf_range
    for name in ("crf", "gop"):
        if isinstance(merged[name], bool) or not isinstance(merged[name], int | np.integer):
            raise ValueError(f"{codec} option {name} must be an integer, got {merged[name]!r}")
    if not low <= merged["crf"] <= high:
        raise ValueError(f"{codec} crf must be in {low}..{high}, got {merged['crf']}")
    if not 1 <= merged["gop"] <= 1000:
        raise ValueError(f"{codec} gop (key-frame interval) must be in 1..1000, got {merged['gop']}")
    preset = merged["preset"]
    if codec == "h264" and preset not in _X264_PRESETS:
        raise ValueError(f"h264 preset must be one of {', '.join(_X264_PRESETS)}, got {preset!r}")
    if codec == "av1" and (isinstance(preset, bool) or not isinstance(preset, int) or not 0 <= preset <= 13):
        raise ValueError(f"av1 preset must be an integer in 0..13, got {preset!r}")
    return {"crf": int(merged["crf"]), "gop": int(merged["gop"]), "preset": preset}


def codec_problem(codec: str) -> str | None:
    """Why PyAV here cannot write or read ``codec`` (None: it can)."""
    import av

    available = av.codecs_available
    spec = VIDEO_CODECS[codec]
    if spec.encoder not in available:
        return f"PyAV {av.__version__} here has no {spec.encoder} encoder"
    if not any(name in available for name in spec.decoders):
        return f"PyAV {av.__version__} here has no {' or '.join(spec.decoders)} decoder"
    return None


def _padded(height: int, width: int) -> tuple[int, int]:
    """4:2:0 needs even sizes: odd frames are padded by repeating their last row/column."""
    return height + height % 2, width + width % 2


def _encoder_options(codec: str, options: Mapping[str, Any]) -> dict[str, str]:
    gop = int(options["gop"])
    if codec == "h264":
        # Key frames exactly every gop frames (no scene-cut ones), IDR with its SPS/PPS each time,
        # no B-frames, one thread: the bytes repeat run to run on one machine (almost always: one
        # run in some hundreds differed in one group of pictures), and x264's assembly differs by CPU.
        return {
            "preset": str(options["preset"]),
            "crf": str(options["crf"]),
            "forced-idr": "1",
            "x264-params": f"keyint={gop}:min-keyint={gop}:scenecut=0:bframes=0:repeat-headers=1:threads=1",
        }
    # SVT-AV1: low-delay prediction (no frame refers to a later one), key frames every gop frames.
    return {
        "preset": str(options["preset"]),
        "crf": str(options["crf"]),
        "svtav1-params": f"pred-struct=1:keyint={gop}:scd=0:lp=1",
    }


def encode_episode(frames: np.ndarray, codec: str, options: Mapping[str, Any]) -> list[bytes]:
    """One episode's RGB frames (T, H, W, 3) uint8 as one packet per frame (see the module text).

    Raises ValueError for frames of another shape and RuntimeError when the encoder does not keep to
    the layout (a packet missing, or no key frame where one must be): random access depends on it.
    """
    import av

    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[3] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"{codec} stores uint8 RGB frames (T, H, W, 3), got {frames.dtype} {frames.shape}")
    if codec == "av1":
        # SVT-AV1 prints its configuration to stderr unless told to report errors only.
        os.environ.setdefault("SVT_LOG", "1")
    height, width = frames.shape[1:3]
    padded = _padded(height, width)
    gop = int(options["gop"])
    context = av.CodecContext.create(VIDEO_CODECS[codec].encoder, "w")
    context.width, context.height = padded[1], padded[0]
    context.pix_fmt = "yuv420p"
    context.time_base = Fraction(1, _ENCODER_RATE)
    context.framerate = Fraction(_ENCODER_RATE)
    context.thread_count = 1
    context.options = _encoder_options(codec, options)
    packets: list[Any] = []
    for index, frame in enumerate(frames):
        if padded != (height, width):
            frame = np.pad(frame, ((0, padded[0] - height), (0, padded[1] - width), (0, 0)), mode="edge")
        # Converted here, on one thread: left to the encoder, swscale slices the frame over every
        # core, and its output then differs now and again between runs (seen in Ray workers).
        picture = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24").reformat(
            format="yuv420p", threads=1
        )
        picture.pts = index
        if index % gop == 0:
            picture.pict_type = av.video.frame.PictureType.I
        packets.extend(context.encode(picture))
    packets.extend(context.encode(None))
    if len(packets) != len(frames):
        raise RuntimeError(f"{codec} encoder made {len(packets)} packets for {len(frames)} frames")
    for index, packet in enumerate(packets):
        if index % gop == 0 and not packet.is_keyframe:
            raise RuntimeError(f"{codec} encoder made no key frame at frame {index} (gop {gop})")
    return [bytes(packet) for packet in packets]


def _h264_nal_types(packet: bytes) -> set[int]:
    types = set()
    position = packet.find(b"\x00\x00\x01")
    while position >= 0 and position + 3 < len(packet):
        types.add(packet[position + 3] & 0x1F)
        position = packet.find(b"\x00\x00\x01", position + 3)
    return types


def _leb128(data: bytes, position: int) -> tuple[int, int]:
    value = 0
    for i in range(8):
        if position + i >= len(data):
            raise ValueError("truncated OBU size")
        byte = data[position + i]
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return value, position + i + 1
    raise ValueError("OBU size longer than 8 bytes")


def _av1_is_keyframe(packet: bytes) -> bool:
    """A sequence header and a shown key frame's header among the temporal unit's OBUs."""
    position, has_sequence_header = 0, False
    while position < len(packet):
        header = packet[position]
        obu_type, extension, has_size = (header >> 3) & 0xF, (header >> 2) & 1, (header >> 1) & 1
        position += 1 + extension
        if has_size:
            size, position = _leb128(packet, position)
        else:
            size = len(packet) - position
        if obu_type == 1:
            has_sequence_header = True
        elif obu_type in (3, 6) and position < len(packet):  # frame header, frame
            first = packet[position]
            show_existing_frame, frame_type = first >> 7, (first >> 5) & 3
            return has_sequence_header and not show_existing_frame and frame_type == 0
        position += size
    return False


def is_keyframe(packet: bytes, codec: str) -> bool:
    """Whether ``packet`` starts a group of pictures that decodes on its own (headers included)."""
    if codec == "h264":
        return {5, 7, 8} <= _h264_nal_types(packet)  # IDR slice, SPS, PPS
    try:
        return _av1_is_keyframe(packet)
    except ValueError:
        return False


def check_packets(
    packets: Sequence[bytes], codec: str, options: Mapping[str, Any], shape: tuple[int, ...]
) -> None:
    """Already-encoded packets of one episode fit the layout: each of the codec, a key frame at every
    gop-th frame, and the first decoding to ``shape``. Raises ValueError saying which frame does not."""
    magic = VIDEO_CODECS[codec].magic
    gop = int(options["gop"])
    for index, packet in enumerate(packets):
        if not any(bytes(packet[: len(m)]) == m for m in magic):
            raise ValueError(f"frame {index} is not an {codec} packet")
        if index % gop == 0 and not is_keyframe(bytes(packet), codec):
            raise ValueError(f"frame {index} must be a key frame (gop {gop}) with the stream's headers")
    decoder = PacketDecoder(codec, shape)
    decoder.decode_into([bytes(packets[0])], [0], np.empty((1, *shape), np.uint8))


class PacketError(ValueError):
    """A packet that does not decode; ``position`` is its place in the run that was decoded."""

    def __init__(self, position: int, reason: str) -> None:
        super().__init__(f"packet {position} of the run: {reason}")
        self.position = position
        self.reason = reason


class PacketDecoder:
    """Decodes runs of one key's packets, each run from a key frame or from where the last one ended.

    Holds one PyAV codec context (one thread: the process is the unit of parallelism). A context that
    failed is dropped, so the next run starts clean.
    """

    def __init__(self, codec: str, shape: tuple[int, ...]) -> None:
        self.codec = codec
        self.shape = tuple(shape)
        self._context: Any = None

    def _new_context(self) -> Any:
        import av

        available = av.codecs_available
        name = next(name for name in VIDEO_CODECS[self.codec].decoders if name in available)
        context = av.CodecContext.create(name, "r")
        context.thread_count = 1  # frame threads would also delay each frame by a packet
        return context

    def reset(self) -> None:
        """Forget the decoder's state: the next run must start at a key frame."""
        self._context = None

    def decode_into(self, packets: Sequence[bytes], keep: Sequence[int], out: np.ndarray) -> None:
        """Decode ``packets`` in order; frame ``keep[i]`` (position in ``packets``) goes to ``out[i]``.

        Raises :class:`PacketError` when a packet does not decode to exactly one frame of the key's
        size.
        """
        import av
        import cv2

        if self._context is None:
            self._context = self._new_context()
        height, width = self.shape[:2]
        wanted = {position: i for i, position in enumerate(keep)}
        for position, packet in enumerate(packets):
            try:
                frames = self._context.decode(av.Packet(bytes(packet)))
            except Exception as error:  # PyAV raises FFmpeg's errors as several types
                self._context = None
                raise PacketError(position, f"{type(error).__name__}: {error}") from None
            if len(frames) != 1 or (frames[0].height, frames[0].width) != _padded(height, width):
                self._context = None
                got = f"{frames[0].height}x{frames[0].width}" if len(frames) == 1 else f"{len(frames)} frames"
                raise PacketError(position, f"decoded to {got}, not one {height}x{width} frame")
            if position in wanted:
                if frames[0].format.name == "yuv420p":  # what the store's encoders write
                    planes = frames[0].to_ndarray()  # as I420: Y, then U and V, stacked
                    rgb = cv2.cvtColor(planes, cv2.COLOR_YUV2RGB_I420)
                else:
                    rgb = frames[0].to_ndarray(format="rgb24")
                out[wanted[position]] = rgb[:height, :width]


class VideoKeyReader:
    """Decoded frames of one video image key, decoding each frame from the nearest key frame before it.

    Frames asked for together are grouped by their group of pictures (GOP) and each GOP is decoded
    once, up to the last frame wanted in it. The decoder remembers where it stopped, so a later read
    further into the same GOP (a sampler walking an episode) continues from there; recently decoded
    frames are kept up to ``cache_bytes``. Committed frames never change, so nothing goes stale.
    Threads sharing a store handle take turns (one decoder state); processes each have their own.
    """

    def __init__(
        self,
        codec: str,
        options: Mapping[str, Any],
        shape: tuple[int, ...],
        cache_bytes: int = DEFAULT_FRAME_CACHE_BYTES,
    ) -> None:
        self.gop = int(options["gop"])
        self.shape = tuple(shape)
        self.decoder = PacketDecoder(codec, self.shape)
        frame_bytes = max(1, int(np.prod(self.shape)))
        self.cache_frames = max(0, int(cache_bytes) // frame_bytes)
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self._position: tuple[int, int] | None = None  # (GOP start, next frame) the decoder stands at
        self.decoded_packets = 0  # a counter for tests and benchmarks: the work actually done
        self._lock = threading.Lock()

    def gop_starts(
        self, frames: np.ndarray, episode_starts: np.ndarray, episode_ends: np.ndarray
    ) -> np.ndarray:
        """The key frame each of ``frames`` (global indices) is decoded from."""
        episode = np.searchsorted(episode_ends, frames, side="right")
        start = episode_starts[episode]
        return start + (frames - start) // self.gop * self.gop

    def read(
        self,
        frames: np.ndarray,
        episode_starts: np.ndarray,
        episode_ends: np.ndarray,
        read_packets: Callable[[np.ndarray], Sequence[bytes]],
    ) -> np.ndarray:
        """Decoded frames at sorted unique global indices ``frames``; ``read_packets(indices)`` returns
        the stored packets of sorted global frame indices. Raises ValueError naming the frame that
        does not decode."""
        with self._lock:
            return self._read(frames, episode_starts, episode_ends, read_packets)

    def _read(
        self,
        frames: np.ndarray,
        episode_starts: np.ndarray,
        episode_ends: np.ndarray,
        read_packets: Callable[[np.ndarray], Sequence[bytes]],
    ) -> np.ndarray:
        out = np.empty((len(frames), *self.shape), dtype=np.uint8)
        missing = []
        for i, frame in enumerate(frames.tolist()):
            cached = self._cache.get(frame)
            if cached is None:
                missing.append(i)
            else:
                self._cache.move_to_end(frame)
                out[i] = cached
        if not missing:
            return out
        todo = np.asarray(missing)
        starts = self.gop_starts(frames[todo], episode_starts, episode_ends)
        # One run per GOP: (GOP start, first packet to feed, positions in ``out``). Only the first
        # run may continue where the decoder stopped: after it, the decoder stands elsewhere.
        runs = []
        for gop_start in np.unique(starts).tolist():
            positions = todo[starts == gop_start]
            begin = gop_start
            stood = self._position
            if not runs and stood is not None and stood[0] == gop_start and stood[1] <= frames[positions[0]]:
                begin = stood[1]
            runs.append((gop_start, begin, positions))
        # All packets in one read: one call, however many GOPs (the store's reads cost per call).
        ranges = [np.arange(begin, int(frames[positions[-1]]) + 1) for _, begin, positions in runs]
        packets = read_packets(np.concatenate(ranges))
        offset = 0
        for (gop_start, begin, positions), indices in zip(runs, ranges, strict=True):
            run = packets[offset : offset + len(indices)]
            offset += len(indices)
            keep = [int(frames[p]) - begin for p in positions]
            decoded = np.empty((len(positions), *self.shape), dtype=np.uint8)
            try:
                self.decoder.decode_into(run, keep, decoded)
            except PacketError as error:
                self._position = None
                raise ValueError(
                    f"frame {begin + error.position} does not decode from the key frame at {gop_start}: "
                    f"{error.reason} (the damage is in its packet or in one since that key frame)"
                ) from None
            self.decoded_packets += len(run)
            self._position = (gop_start, begin + len(run))
            out[positions] = decoded
            for position, image in zip(positions.tolist(), decoded, strict=True):
                self._remember(int(frames[position]), image)
        return out

    def _remember(self, frame: int, image: np.ndarray) -> None:
        if self.cache_frames == 0:
            return
        self._cache[frame] = image
        self._cache.move_to_end(frame)
        while len(self._cache) > self.cache_frames:
            self._cache.popitem(last=False)
