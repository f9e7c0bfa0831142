"""Reading the stored frames of one image key: its codec, the encoded bytes, the decoded images.

An :class:`~demoscale.datasets.store.EpisodeStore` keeps one :class:`ImageKeyFrames` per image key
it has read. Encoded bytes come straight from the shard files where the store is local and has the
layout this package writes (``shards.LocalShardReader``), else through zarr. A per-frame codec
(JPEG, JPEG-XL, PNG) decodes each frame alone; a video codec decodes from the key frame before a
frame on (``video.VideoKeyReader``, made again in each process: a forked DataLoader worker must not
share its parent's decoder state).

Everything here reads committed frames the store hands it; which frames are committed, and every
write, stay with the store.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import zarr
from demoscale.datasets import codecs, video
from demoscale.datasets.schema import FeatureSpec, StoreError
from demoscale.datasets.shards import LocalShardReader

__all__ = ["ImageKeyFrames", "reading_errors"]


@contextmanager
def reading_errors(location: str, key: str, frames: np.ndarray | slice) -> Iterator[None]:
    """Turn zarr's errors for damaged chunks (checksums, truncated files) into a StoreError naming
    the key and frames."""
    try:
        yield
    except StoreError:
        raise
    except Exception as error:
        if isinstance(frames, slice):
            span = f"{frames.start}:{frames.stop}"
        else:
            span = f"{int(frames[0])}..{int(frames[-1])}" if len(frames) else "-"
        raise StoreError(
            f"{location}: data/{key} frames {span} cannot be read (damaged chunk? "
            f"`demoscale store validate --deep` locates it): {type(error).__name__}: {error}"
        ) from None


class ImageKeyFrames:
    """The frames of image key ``key`` of the store at ``location``.

    ``array`` returns the key's zarr array as the store currently holds it (the store reopens
    arrays after appends); ``default_codec`` and ``default_options`` are the store's, for stores
    older than per-key codec attributes.
    """

    def __init__(
        self,
        location: str,
        key: str,
        spec: FeatureSpec,
        array: Callable[[], zarr.Array],
        default_codec: str,
        default_options: Mapping[str, Any],
    ) -> None:
        self.location = location
        self.key = key
        self.spec = spec
        self._array = array
        attrs = array().attrs
        self.codec: str = attrs.get("codec", default_codec)
        self.options: dict[str, Any] = dict(attrs.get("codec_options", default_options))
        self._shards: LocalShardReader | None = LocalShardReader.for_array(location, key, array())
        self._video: tuple[int, video.VideoKeyReader] | None = None

    @property
    def is_video(self) -> bool:
        return codecs.is_video(self.codec)

    def encoded(self, frames: np.ndarray) -> np.ndarray:
        """Encoded bytes of ``frames`` (sorted unique global indices) as an object array."""
        if self._shards is not None:
            found = self._shards.read(frames)
            if found is not None:
                out = np.empty(len(found), dtype=object)
                out[:] = found
                return out
        array = self._array()
        with reading_errors(self.location, self.key, frames):
            if len(frames) == frames[-1] - frames[0] + 1:
                return array[int(frames[0]) : int(frames[-1]) + 1]
            return array.get_orthogonal_selection(frames)

    def decoded(self, frames: np.ndarray, episode_starts: np.ndarray, episode_ends: np.ndarray) -> np.ndarray:
        """Decoded images (uint8, the feature's shape) of ``frames`` (sorted unique global indices);
        a video key needs the committed episodes' bounds (each episode is its own stream)."""
        if self.is_video:
            try:
                return self._video_reader().read(frames, episode_starts, episode_ends, self.encoded)
            except ValueError as error:
                raise StoreError(
                    f"{self.location}: data/{self.key} {error} "
                    "(`demoscale store validate --deep` checks every frame)"
                ) from None
        return self.decode(self.encoded(frames))

    def decode(self, encoded: np.ndarray) -> np.ndarray:
        """Decode frames of a per-frame codec, given their encoded bytes (any order)."""
        out = np.empty((len(encoded), *self.spec.shape), dtype=np.uint8)
        for i, data in enumerate(encoded):
            try:
                codecs.decode_frame(data, self.codec, out=out[i])
            except Exception as error:
                raise StoreError(f"{self.location}: cannot decode frame of {self.key!r} ({error})") from None
        return out

    @property
    def packets_decoded(self) -> int:
        """Packets this process's video decoder has decoded (0 for per-frame codecs)."""
        held = self._video
        return held[1].decoded_packets if held is not None and held[0] == os.getpid() else 0

    def _video_reader(self) -> video.VideoKeyReader:
        held = self._video
        if held is None or held[0] != os.getpid():
            held = (os.getpid(), video.VideoKeyReader(self.codec, self.options, self.spec.shape))
            self._video = held
        return held[1]
