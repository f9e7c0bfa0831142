"""What an episode store is made of: its format constants, errors, feature specs and array layout.

The layout (described in full in ``datasets/README.md``) is built here by :func:`build_layout`, and
:func:`check_episode` checks data offered to the store against the features before anything is
written. Nothing here opens or changes an existing store: that is :mod:`demoscale.datasets.store`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
import zarr
from demoscale.datasets import codecs, video
from zarr.core.dtype import VariableLengthBytes, VariableLengthUTF8

FORMAT_NAME = "demoscale.episode_store"
FORMAT_VERSION = 1
FEATURE_KINDS = ("image", "low_dim", "point_cloud")
STRING_COLUMNS = ("env_id", "object_id", "task", "operator", "source", "source_sha256", "tags")
META_COLUMNS = (*STRING_COLUMNS, "length", "success")
SUCCESS_UNKNOWN = -1

# What the elements of a video image array are, for readers without this package (datasets/video.py).
VIDEO_FRAME_BYTES = (
    "one packet per frame ({codec}: {bitstream}); each episode is its own stream, with a key frame "
    "carrying the stream headers at its first frame and every gop-th frame after it; no B-frames"
)
_BITSTREAMS = {"h264": "an H.264 access unit, Annex B", "av1": "an AV1 temporal unit of OBUs"}

# Chunking targets: low-dim chunks of ~1 MiB, meta columns of 4096 episodes, image shards of 1000 frames.
CHUNK_BYTES = 1 << 20
META_CHUNK = 4096
DEFAULT_IMAGE_SHARD_FRAMES = 1000


class StoreError(Exception):
    """Any problem with an episode store or with data offered to it."""


class StoreLockTimeout(StoreError):
    """Another process held the store's writer lock for longer than the caller would wait."""


@dataclass(frozen=True)
class FeatureSpec:
    """What one time-major key holds per frame.

    ``kind`` is ``"image"`` (uint8 HxW, HxWx1, HxWx3 or HxWx4, stored compressed per frame),
    ``"low_dim"`` (a small numeric vector) or ``"point_cloud"`` (N points x channels).
    ``source`` (optional, JSON-ready) says what produced the key, e.g. for a simulated camera
    ``{"task": "reach", "camera": "scene", "image_size": 64, "env_options": {"cameras": ["scene"]}}``;
    None where unknown (stores written before it existed, data that did not record it).
    """

    kind: Literal["image", "low_dim", "point_cloud"]
    shape: tuple[int, ...]
    dtype: str = "float32"
    rate_hz: float | None = None
    units: str = ""
    frame: str = ""
    source: Mapping[str, Any] | None = field(default=None, compare=True, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype).name)
        if self.kind not in FEATURE_KINDS:
            raise StoreError(f"unknown feature kind {self.kind!r}; choose one of {', '.join(FEATURE_KINDS)}")
        if self.kind == "image":
            if self.dtype != "uint8":
                raise StoreError(f"image features must be uint8, got {self.dtype}")
            if not (len(self.shape) == 2 or (len(self.shape) == 3 and self.shape[2] in (1, 3, 4))):
                raise StoreError(f"image shape must be (H, W) or (H, W, 1|3|4), got {self.shape}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (stored in the root group attributes)."""
        out = asdict(self)
        out["shape"] = list(self.shape)
        if out["source"] is None:  # unknown: left out, so such stores read as before
            del out["source"]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FeatureSpec:
        """Inverse of :meth:`to_dict`."""
        return cls(**{**data, "shape": tuple(data["shape"])})


def as_feature_specs(features: Mapping[str, FeatureSpec | Mapping[str, Any]]) -> dict[str, FeatureSpec]:
    """Feature specs given as specs or as their dicts, as specs."""
    return {k: (v if isinstance(v, FeatureSpec) else FeatureSpec.from_dict(v)) for k, v in features.items()}


def layout_differences(have: Mapping[str, FeatureSpec], wanted: Mapping[str, FeatureSpec]) -> list[str]:
    """How two feature sets differ in what appending depends on: the keys and each key's kind, shape
    and dtype (rates, units and frames are descriptions). Empty when episodes of one fit the other."""
    differences = []
    for key in sorted(set(have) | set(wanted)):
        mine, theirs = have.get(key), wanted.get(key)
        if mine is None or theirs is None:
            differences.append(f"{key}: store {mine}, given {theirs}")
        elif (mine.kind, mine.shape, mine.dtype) != (theirs.kind, theirs.shape, theirs.dtype):
            differences.append(f"{key}: store {mine}, given {theirs}")
        elif mine.source and theirs.source and mine.source != theirs.source:
            # Both recorded what produced the key, differently (another camera, size or options).
            differences.append(f"{key}: store recorded {mine.source}, given {theirs.source}")
    return differences


def id_order(value: Any) -> tuple[int, int, str]:
    """Sort key of env/object ids as people count them: numeric ids as numbers ("2" before "10"),
    then the other ids as text."""
    text = str(value)
    return (0, int(text), "") if text.lstrip("-").isdigit() else (1, 0, text)


def frame_nbytes(spec: FeatureSpec) -> int:
    return int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize


def checked_compressors() -> list[Any]:
    """zstd with its content checksum: every numeric and string chunk of a store carries one."""
    from zarr.codecs import ZstdCodec

    return [ZstdCodec(level=0, checksum=True)]


def build_layout(
    root: zarr.Group,
    features: Mapping[str, FeatureSpec],
    codec: str,
    options: dict[str, Any],
    image_shard_frames: int,
) -> None:
    """Create the empty arrays and, last, the root attributes of a new store in ``root``."""
    from zarr.codecs import Crc32cCodec, VLenBytesCodec

    # Checksums everywhere, so that damage is found when read instead of decoded into plausible
    # values (a JPEG with garbage in the middle often still decodes): a crc32c per image frame, and
    # zstd's own content checksum in every numeric and string chunk.
    checked = checked_compressors()
    data = root.create_group("data")
    meta = root.create_group("meta")
    for key, spec in features.items():
        if spec.kind == "image":
            attributes = {"codec": codec, "codec_options": options, "frame_shape": list(spec.shape)}
            if codecs.is_video(codec):
                attributes["frame_bytes"] = VIDEO_FRAME_BYTES.format(
                    codec=codec, bitstream=_BITSTREAMS[codec]
                )
            data.create_array(
                key,
                shape=(0,),
                chunks=(1,),
                shards=(int(image_shard_frames),),
                dtype=VariableLengthBytes(),
                serializer=VLenBytesCodec(),
                compressors=[Crc32cCodec()],
                attributes=attributes,
            )
        else:
            frame_bytes = max(1, frame_nbytes(spec))
            frames_per_chunk = max(1, CHUNK_BYTES // frame_bytes)
            shards = None
            if frames_per_chunk < 64:
                # Large frames (point clouds): 1 frame per inner chunk, many frames per file.
                shards = (max(1, (16 * CHUNK_BYTES) // frame_bytes), *spec.shape)
                frames_per_chunk = 1
            data.create_array(
                key,
                shape=(0, *spec.shape),
                chunks=(frames_per_chunk, *spec.shape),
                shards=shards,
                dtype=spec.dtype,
                fill_value=0,
                compressors=checked,
            )
    # Fill 0 marks an entry whose chunk was never written: never a valid (positive) episode end.
    meta.create_array(
        "episode_ends", shape=(0,), chunks=(META_CHUNK,), dtype="int64", fill_value=0, compressors=checked
    )
    for column in STRING_COLUMNS:
        meta.create_array(
            column, shape=(0,), chunks=(META_CHUNK,), dtype=VariableLengthUTF8(), compressors=checked
        )
    meta.create_array(
        "length", shape=(0,), chunks=(META_CHUNK,), dtype="int64", fill_value=0, compressors=checked
    )
    meta.create_array(
        "success",
        shape=(0,),
        chunks=(META_CHUNK,),
        dtype="int8",
        fill_value=SUCCESS_UNKNOWN,
        compressors=checked,
    )
    root.attrs.update(
        {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "features": {k: v.to_dict() for k, v in features.items()},
            "image_codec": codec,
            "image_codec_options": options,
            "success_encoding": "int8: 1 success, 0 failure, -1 unknown",
            "tags_encoding": "comma-separated",
            # Every chunk is written, even one equal to the fill value, so a missing chunk file is
            # damage (validate checks); stores without this attribute may omit all-fill chunks.
            "all_chunks_written": True,
        }
    )


def check_episode(
    features: Mapping[str, FeatureSpec],
    data: Mapping[str, Any],
    encoded: Mapping[str, Sequence[bytes]],
    codec_of: Callable[[str], tuple[str, Mapping[str, Any]]],
    where: str,
) -> tuple[int, dict[str, np.ndarray]]:
    """Check one episode offered for appending; return its length and its arrays in the spec's dtypes.

    ``encoded`` holds image keys given as already-encoded frames; ``codec_of(key)`` is the store's
    codec of an image key and its options. Raises StoreError naming ``where``, the key and, for
    NaNs, the frame.
    """
    unknown = sorted((set(data) | set(encoded)) - set(features))
    if unknown:
        raise StoreError(f"{where}: keys not in the store's features: {unknown} (features: {list(features)})")
    missing = [k for k in features if k not in data and k not in encoded]
    if missing:
        raise StoreError(f"{where}: missing keys {missing}")
    for key in encoded:
        if features[key].kind != "image":
            raise StoreError(f"{where}: encoded frames given for {key!r}, which is not an image key")
    lengths = {k: len(encoded[k]) if k in encoded else len(np.asarray(data[k])) for k in features}
    distinct = set(lengths.values())
    if len(distinct) != 1:
        raise StoreError(f"{where}: keys have different lengths: {lengths}")
    length = distinct.pop()
    if length == 0:
        raise StoreError(f"{where}: empty episode (0 frames)")
    arrays: dict[str, np.ndarray] = {}
    for key, spec in features.items():
        if key in encoded:
            _check_encoded_frames(key, spec, encoded[key], *codec_of(key), where)
            continue
        value = np.asarray(data[key])
        if value.shape[1:] != spec.shape:
            raise StoreError(f"{where}: {key!r} has frame shape {value.shape[1:]}, spec is {spec.shape}")
        target = np.dtype(spec.dtype)
        if spec.kind == "image":
            if value.dtype != np.uint8:
                raise StoreError(f"{where}: image {key!r} must be uint8, got {value.dtype}")
        elif value.dtype != target and not np.can_cast(value.dtype, target, casting="same_kind"):
            raise StoreError(f"{where}: {key!r} has dtype {value.dtype}, cannot store as {spec.dtype}")
        if spec.kind == "low_dim" and value.dtype.kind in "fc":
            bad = ~np.isfinite(value)
            if bad.any():
                frame_index = int(np.argwhere(bad)[0][0])
                raise StoreError(f"{where}: {key!r} has NaN or inf values (first at frame {frame_index})")
        arrays[key] = value if spec.kind == "image" else value.astype(target, copy=False)
    return length, arrays


def _check_encoded_frames(
    key: str, spec: FeatureSpec, frames: Sequence[bytes], codec: str, options: Mapping[str, Any], where: str
) -> None:
    """Every frame is bytes of the store's codec, and the first decodes to the spec's shape (a caller
    handing over encoded frames checks the others, as the ingesters do). Video packets also have
    their key frames where the store's gop puts them."""
    for t, frame in enumerate(frames):
        if not isinstance(frame, bytes | bytearray | memoryview | np.bytes_):
            raise StoreError(f"{where}: encoded frame {t} of {key!r} is {type(frame).__name__}, not bytes")
    if codecs.is_video(codec):
        try:
            video.check_packets([bytes(f) for f in frames], codec, options, spec.shape)
        except ValueError as error:
            raise StoreError(f"{where}: encoded frames of {key!r}: {error}") from None
        return
    for t, frame in enumerate(frames):
        if not codecs.has_magic(bytes(frame), codec):
            raise StoreError(
                f"{where}: encoded frame {t} of {key!r} is not {codec} (the store's codec for this key)"
            )
    try:
        first = codecs.decode_frame(bytes(frames[0]), codec)
    except Exception as error:
        raise StoreError(f"{where}: encoded frame 0 of {key!r} does not decode ({error})") from None
    if int(np.prod(first.shape)) != int(np.prod(spec.shape)) or first.shape[:2] != spec.shape[:2]:
        raise StoreError(f"{where}: encoded frames of {key!r} decode to {first.shape}, spec is {spec.shape}")
