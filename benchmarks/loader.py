"""Training-window loading speed: our sampler vs a UMI-style reader vs the pure JPEG decode limit.

All three read the same synthetic 224x224 RGB frames (smooth moving gradients, so compressed sizes
are realistic) and produce windows of 2 image frames + 16 actions, pinned to one core, in one run:
  (a) ``WindowSampler.sample_many`` over our store (JPEG, sharded variable-length bytes), batch 64;
  (b) a UMI-style reader: a Zarr format-2 array with one JPEG-XL frame per chunk (imagecodecs
      numcodecs codec, registered), read frame by frame; low-dim actions held in memory;
  (c) imagecodecs JPEG decode of the same JPEG bytes already in memory (no storage at all).
Each is measured in alternating rounds; medians are reported. A child process then samples batches
from the store and reports its peak RSS, to show memory stays far below the decoded store size.

    .venv/bin/python benchmarks/loader.py [--json [PATH]] [--frames 2400] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import imagecodecs
import numpy as np
from report import add_json_option, emit_json

SHAPE = (224, 224, 3)
HORIZON = 16
OFFSETS = [-1, 0]
BATCH = 64


def synthetic_frames(n_distinct: int) -> np.ndarray:
    """Smooth gradients that move and change colour over time (not noise)."""
    h, w, _ = SHAPE
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    frames = np.empty((n_distinct, *SHAPE), dtype=np.uint8)
    for t in range(n_distinct):
        phase = 0.07 * t
        planes = [
            128
            + 90 * np.sin(0.035 * x * (1 + 0.2 * c) + 0.02 * y + phase * (c + 1))
            + 30 * np.cos(0.05 * np.hypot(x - 112 - 40 * np.sin(phase), y - 112))
            for c in range(3)
        ]
        frames[t] = np.stack(planes, axis=-1).clip(0, 255).astype(np.uint8)
    return frames


def build_stores(root: Path, n_frames: int, n_distinct: int, episode_length: int) -> dict:
    """Our store (JPEG) and a UMI-style format-2 JPEG-XL store holding the same frames."""
    import zarr
    from demoscale.datasets import EpisodeStore, FeatureSpec
    from imagecodecs.numcodecs import Jpegxl

    distinct = synthetic_frames(n_distinct)
    jpeg = [imagecodecs.jpeg_encode(f, level=90) for f in distinct]
    jxl_codec = Jpegxl(level=99, lossless=False, numthreads=1)
    jxl = [jxl_codec.encode(f) for f in distinct]
    rng = np.random.default_rng(0)
    actions = rng.normal(size=(n_frames, 10)).cumsum(axis=0).astype(np.float32)

    features = {
        "camera0_rgb": FeatureSpec(kind="image", shape=SHAPE, dtype="uint8", rate_hz=10.0),
        "action": FeatureSpec(kind="low_dim", shape=(10,), dtype="float32", rate_hz=10.0),
    }
    ours = EpisodeStore.create(root / "ours.zarr", features, image_codec="jpeg")
    for e, start in enumerate(range(0, n_frames, episode_length)):
        stop = min(n_frames, start + episode_length)
        ours.append_episode(
            {"action": actions[start:stop]},
            encoded={"camera0_rgb": [jpeg[t % n_distinct] for t in range(start, stop)]},
            env_id=str(e % 4),
            object_id=str(e),
            source_sha256=f"bench-{e}",
        )

    # UMI layout: data/ arrays + meta/episode_ends, format 2, chunks of one frame, JPEG-XL compressor.
    umi = zarr.open_group(root / "umi.zarr", mode="w", zarr_format=2)
    umi.create_array(
        "data/camera0_rgb", shape=(n_frames, *SHAPE), chunks=(1, *SHAPE), dtype="uint8", compressors=jxl_codec
    )
    umi.create_array("data/action", data=actions, chunks=(episode_length, 10), compressors=None)
    umi.create_array("meta/episode_ends", data=ours.episode_ends, compressors=None)
    # Chunk files of a format-2 array are the compressor's output; write the encoded frames as such
    # (the same bytes the codec would produce) instead of re-encoding every repeated frame.
    camera_dir = root / "umi.zarr" / "data" / "camera0_rgb"
    for t in range(n_frames):
        (camera_dir / f"{t}.0.0.0").write_bytes(jxl[t % n_distinct])
    return {
        "ours_path": str(root / "ours.zarr"),
        "umi_path": str(root / "umi.zarr"),
        "jpeg": jpeg,
        "ours_mb": _size_mb(root / "ours.zarr"),
        "umi_mb": _size_mb(root / "umi.zarr"),
        "ours_files": sum(1 for p in (root / "ours.zarr").rglob("*") if p.is_file()),
        "umi_files": sum(1 for p in (root / "umi.zarr").rglob("*") if p.is_file()),
    }


def _size_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


def window_indices(n_samples: int, n_frames: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n_frames, n_samples)


def run_ours(path: str, indices: np.ndarray) -> float:
    from demoscale.datasets import WindowSampler

    sampler = WindowSampler(path, {"camera0_rgb": OFFSETS}, ["action"], HORIZON)
    sampler.sample_many(indices[:BATCH])  # open the store, warm the metadata
    start = time.perf_counter()
    for i in range(0, len(indices), BATCH):
        batch = sampler.sample_many(indices[i : i + BATCH])
        assert batch["obs"]["camera0_rgb"].shape[1:] == (len(OFFSETS), *SHAPE)
    return len(indices) / (time.perf_counter() - start)


def run_umi_style(path: str, indices: np.ndarray) -> float:
    import imagecodecs.numcodecs
    import zarr

    imagecodecs.numcodecs.register_codecs(verbose=False)
    group = zarr.open_group(path, mode="r")
    camera = group["data/camera0_rgb"]
    actions = group["data/action"][:]  # low-dim in memory, as UMI's replay buffer does
    ends = group["meta/episode_ends"][:]
    starts = np.concatenate([[0], ends[:-1]])
    camera[0]
    start_time = time.perf_counter()
    for t in indices:
        e = int(np.searchsorted(ends, t, side="right"))
        first, last = int(starts[e]), int(ends[e]) - 1
        frames = np.stack([camera[min(max(t + o, first), last)] for o in OFFSETS])
        window = actions[np.minimum(np.arange(t, t + HORIZON), last)]
        assert frames.shape == (len(OFFSETS), *SHAPE) and window.shape == (HORIZON, 10)
    return len(indices) / (time.perf_counter() - start_time)


def run_decode_limit(jpeg: list[bytes], indices: np.ndarray) -> float:
    out = np.empty((len(OFFSETS), *SHAPE), dtype=np.uint8)
    start = time.perf_counter()
    for t in indices:
        for j, o in enumerate(OFFSETS):
            imagecodecs.jpeg_decode(jpeg[(int(t) + o) % len(jpeg)], out=out[j])
    return len(indices) / (time.perf_counter() - start)


def rss_child(path: str, n_batches: int) -> None:
    """Child process: report peak RSS before and after sampling ``n_batches`` batches."""
    from demoscale.datasets import WindowSampler

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # after imports, before any read
    sampler = WindowSampler(path, {"camera0_rgb": OFFSETS}, ["action"], HORIZON)
    indices = window_indices(n_batches * BATCH, len(sampler), 3)
    for i in range(n_batches):
        sampler.sample_many(indices[i * BATCH : (i + 1) * BATCH])
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"peak_rss_after_imports_mb": before, "peak_rss_mb": after}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_json_option(parser)
    parser.add_argument("--frames", type=int, default=2400, help="frames in each store")
    parser.add_argument("--distinct", type=int, default=240, help="distinct images (cycled over the frames)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating measurement rounds")
    parser.add_argument(
        "--samples", type=int, default=640, help="windows per round for ours and the decode limit"
    )
    parser.add_argument(
        "--umi-samples", type=int, default=96, help="windows per round for the UMI-style reader"
    )
    parser.add_argument("--rss-child", metavar="STORE", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rss_child:
        rss_child(args.rss_child, 40)
        return 0

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core for every variant
    with tempfile.TemporaryDirectory(prefix="loader-bench-") as tmp:
        built = time.perf_counter()
        stores = build_stores(Path(tmp), args.frames, args.distinct, episode_length=200)
        built = time.perf_counter() - built
        ours, umi, limit = [], [], []
        for r in range(args.rounds):
            indices = window_indices(args.samples, args.frames, r)
            ours.append(run_ours(stores["ours_path"], indices))
            umi.append(run_umi_style(stores["umi_path"], indices[: args.umi_samples]))
            limit.append(run_decode_limit(stores["jpeg"], indices))
        child = subprocess.run(
            [sys.executable, __file__, "--rss-child", stores["ours_path"]],
            capture_output=True,
            text=True,
            check=True,
        )
        rss = json.loads(child.stdout.strip().splitlines()[-1])
    decoded_store_mb = args.frames * int(np.prod(SHAPE)) / 1e6
    result = {
        "frames": args.frames,
        "distinct_images": args.distinct,
        "frame_shape": list(SHAPE),
        "window": {"image_offsets": OFFSETS, "action_horizon": HORIZON, "batch": BATCH},
        "build_s": round(built, 1),
        "ours_samples_per_s": statistics.median(ours),
        "umi_style_samples_per_s": statistics.median(umi),
        "decode_limit_samples_per_s": statistics.median(limit),
        "ratio_vs_umi_style": statistics.median(ours) / statistics.median(umi),
        "fraction_of_decode_limit": statistics.median(ours) / statistics.median(limit),
        "rounds": {"ours": ours, "umi_style": umi, "decode_limit": limit},
        "store_mb": {"ours_jpeg_q90": stores["ours_mb"], "umi_style_jpegxl_lossy_q99": stores["umi_mb"]},
        "store_files": {"ours": stores["ours_files"], "umi_style": stores["umi_files"]},
        "sampler_rss_mb": {
            **rss,
            "decoded_store_mb": decoded_store_mb,
            "decoded_batch_mb": BATCH * len(OFFSETS) * int(np.prod(SHAPE)) / 1e6,
        },
    }
    print(
        f"{args.frames} frames {SHAPE[0]}x{SHAPE[1]} RGB ({args.distinct} distinct), windows of 2 frames + 16 actions, one core"
    )
    print(f"{'reader':<38} {'samples/s (median)':>20}")
    print(f"{'ours (WindowSampler, JPEG, sharded)':<38} {result['ours_samples_per_s']:>20.0f}")
    print(f"{'UMI-style (zarr v2, JPEG-XL per chunk)':<38} {result['umi_style_samples_per_s']:>20.0f}")
    print(f"{'JPEG decode limit (bytes in memory)':<38} {result['decode_limit_samples_per_s']:>20.0f}")
    print(f"ratio_vs_umi_style        {result['ratio_vs_umi_style']:.2f}   (target >= 3)")
    print(f"fraction_of_decode_limit  {result['fraction_of_decode_limit']:.2f}   (target >= 0.7)")
    print(
        f"store size MB: ours {stores['ours_mb']:.1f} in {stores['ours_files']} files; "
        f"UMI-style {stores['umi_mb']:.1f} in {stores['umi_files']} files"
    )
    print(
        f"sampler peak RSS {rss['peak_rss_mb']:.0f} MB (after imports {rss['peak_rss_after_imports_mb']:.0f} MB); "
        f"decoded store {decoded_store_mb:.0f} MB, decoded batch {result['sampler_rss_mb']['decoded_batch_mb']:.0f} MB"
    )
    emit_json("loader", result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
