"""Reading Zarr format-2 sources chunk by chunk: the direct member path against zarr's own reads."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest
import zarr
from demoscale.collect.source_format import IngestError
from demoscale.collect.zarr_source import cached_frames
from numcodecs import Blosc, Delta, Zlib

# Episodes of 7, 30, 1 and 23 frames over chunks of 10: some inside one chunk, some across three,
# and a last chunk only partly filled.
ENDS = np.cumsum([7, 30, 1, 23])


def _write(path, values, *, chunks, compressor, filters=None, order="C"):
    root = zarr.open_group(str(path), mode="w", zarr_format=2)
    root.create_array("meta/episode_ends", data=ENDS.astype(np.int64), chunks=(len(ENDS),))
    array = root.create_array(
        "data/x",
        shape=values.shape,
        chunks=chunks,
        dtype=values.dtype,
        compressors=compressor,
        filters=filters,
        order=order,
    )
    array[:] = values


def _episodes(path):
    reader = cached_frames(path, "x")
    starts = np.concatenate([[0], ENDS[:-1]])
    return reader, [reader.read(int(s), int(e)).copy() for s, e in zip(starts, ENDS, strict=True)]


def _frames(dtype) -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.integers(0, 255, size=(int(ENDS[-1]), 6, 5, 3)).astype(dtype)


@pytest.mark.parametrize(
    "dtype, compressor",
    [
        ("uint8", Blosc(cname="zstd", clevel=5, shuffle=Blosc.BITSHUFFLE)),  # as PushT's buffer
        ("<f4", Blosc(cname="lz4", clevel=3, shuffle=Blosc.SHUFFLE)),
        (">f8", Zlib(level=1)),  # big-endian: values come back in native order
        ("uint8", None),  # uncompressed chunks
    ],
)
def test_direct_chunk_reads_equal_zarr(tmp_path, dtype, compressor):
    values = _frames(dtype)
    _write(tmp_path / "src.zarr", values, chunks=(10, 6, 5, 3), compressor=compressor)
    reader, episodes = _episodes(tmp_path / "src.zarr")
    assert reader._direct is not None
    np.testing.assert_array_equal(np.concatenate(episodes), values)
    assert np.concatenate(episodes).dtype.isnative


def test_direct_chunk_reads_from_a_zip(tmp_path):
    values = _frames("uint8")
    _write(tmp_path / "src.zarr", values, chunks=(10, 6, 5, 3), compressor=Blosc(cname="zstd"))
    with zipfile.ZipFile(tmp_path / "src.zarr.zip", "w", zipfile.ZIP_STORED) as archive:
        for file in sorted((tmp_path / "src.zarr").rglob("*")):
            if file.is_file():
                archive.write(file, file.relative_to(tmp_path / "src.zarr").as_posix())
    reader, episodes = _episodes(tmp_path / "src.zarr.zip")
    assert reader._direct is not None
    np.testing.assert_array_equal(np.concatenate(episodes), values)


@pytest.mark.parametrize(
    "layout",
    [
        {"chunks": (10, 3, 5, 3)},  # chunks split a frame: zarr assembles them
        {"chunks": (10, 6, 5, 3), "filters": [Delta(dtype="uint8")]},
        {"chunks": (10, 6, 5, 3), "order": "F"},
    ],
    ids=["split-frame", "filters", "fortran-order"],
)
def test_layouts_the_direct_path_does_not_take_are_read_by_zarr(tmp_path, layout):
    values = _frames("uint8")
    _write(tmp_path / "src.zarr", values, compressor=Blosc(cname="zstd"), **layout)
    reader, episodes = _episodes(tmp_path / "src.zarr")
    assert reader._direct is None
    np.testing.assert_array_equal(np.concatenate(episodes), values)


def test_a_corrupt_chunk_is_named(tmp_path):
    values = _frames("uint8")
    _write(tmp_path / "src.zarr", values, chunks=(10, 6, 5, 3), compressor=Blosc(cname="zstd"))
    (tmp_path / "src.zarr" / "data" / "x" / "2.0.0.0").write_bytes(b"not blosc at all")
    reader = cached_frames(tmp_path / "src.zarr", "x")
    reader.read(0, 7)
    with pytest.raises(IngestError, match=r"data/x/2\.0\.0\.0"):
        reader.read(7, 37)
