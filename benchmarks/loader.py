"""Training-window loading speed: our sampler vs a UMI-style reader vs the pure JPEG decode limit,
and per-frame JPEG against video (h264, av1) in our store: size against samples/s.

All read the same synthetic 224x224 RGB frames (smooth moving gradients, so compressed sizes are
realistic; ``--noise`` adds camera-like sensor noise) and produce windows of 2 image frames + 16
actions, pinned to one core, in one run:
  (a) ``WindowSampler.sample_many`` over our store (JPEG, sharded variable-length bytes), batch 64;
  (b) a UMI-style reader: a Zarr format-2 array with one JPEG-XL frame per chunk (imagecodecs
      numcodecs codec, registered), read frame by frame; low-dim actions held in memory;
  (c) imagecodecs JPEG decode of the same JPEG bytes already in memory (no storage at all);
  (d) ``WindowSampler.sample_many`` over the same episodes in video stores (``--video``, default
      h264 with a key frame every 8 and every 16 frames, and av1 every 8): each random frame is
      decoded from its key frame on. Also the windows in order (a validation loop, where the
      decoder continues from frame to frame), for JPEG and each video store.
Each is measured in alternating rounds; medians are reported. A child process then samples batches
from the store and reports its peak RSS, to show memory stays far below the decoded store size.

    .venv/bin/python benchmarks/loader.py [--json [PATH]] [--frames 2400] [--rounds 3] [--noise 3]
        [--video h264:8 h264:16 av1:8]
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


def synthetic_frames(n_distinct: int, noise: float = 0.0) -> np.ndarray:
    """Smooth gradients that move and change colour over time, plus Gaussian sensor noise of std
    ``noise`` (0: none; real cameras have some, and video codecs spend their bits on it)."""
    rng = np.random.default_rng(0)
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
        image = np.stack(planes, axis=-1)
        if noise > 0:
            image = image + rng.normal(0, noise, size=image.shape)
        frames[t] = image.clip(0, 255).astype(np.uint8)
    return frames


def build_stores(
    root: Path, n_frames: int, n_distinct: int, episode_length: int, noise: float, videos: list[str]
) -> dict:
    """Our store (JPEG), a UMI-style format-2 JPEG-XL store and our video stores (``codec:gop``)
    holding the same frames."""
    import zarr
    from demoscale.datasets import EpisodeStore, FeatureSpec
    from imagecodecs.numcodecs import Jpegxl

    distinct = synthetic_frames(n_distinct, noise)
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

    # The video stores encode every episode themselves (a stream per episode), from the same frames.
    video_stores = {}
    for variant in videos:
        codec, gop, *crf = variant.split(":")
        options = {"gop": int(gop), **({"crf": int(crf[0])} if crf else {})}
        path = root / f"video_{variant.replace(':', '_')}.zarr"
        store = EpisodeStore.create(path, features, image_codec=codec, image_codec_options=options)
        started = time.perf_counter()
        with store.transaction():
            for e, start in enumerate(range(0, n_frames, episode_length)):
                stop = min(n_frames, start + episode_length)
                store.append_episode(
                    {
                        "camera0_rgb": distinct[np.arange(start, stop) % n_distinct],
                        "action": actions[start:stop],
                    },
                    env_id=str(e % 4),
                    object_id=str(e),
                    source_sha256=f"bench-{e}",
                )
        encode_s = time.perf_counter() - started
        squared_error = 0.0  # episode by episode: the whole store decoded at once is hundreds of MB
        for e in range(store.n_episodes):
            first, last = int(store.episode_starts[e]), int(store.episode_ends[e])
            decoded = store.read("camera0_rgb", first, last).astype(np.float32)
            squared_error += float(((decoded - distinct[np.arange(first, last) % n_distinct]) ** 2).sum())
        mse = squared_error / (n_frames * int(np.prod(SHAPE)))
        video_stores[variant] = {
            "path": str(path),
            "mb": _size_mb(path),
            "files": sum(1 for p in path.rglob("*") if p.is_file()),
            "encode_frames_per_s": n_frames / encode_s,
            "psnr_db": float(10 * np.log10(255.0**2 / mse)),
        }
    jpeg_mse = np.mean(
        [
            np.mean((imagecodecs.jpeg_decode(b).astype(np.float32) - f) ** 2)
            for b, f in zip(jpeg, distinct, strict=True)
        ]
    )
    return {
        "ours_path": str(root / "ours.zarr"),
        "umi_path": str(root / "umi.zarr"),
        "jpeg": jpeg,
        "ours_mb": _size_mb(root / "ours.zarr"),
        "umi_mb": _size_mb(root / "umi.zarr"),
        "ours_files": sum(1 for p in (root / "ours.zarr").rglob("*") if p.is_file()),
        "umi_files": sum(1 for p in (root / "umi.zarr").rglob("*") if p.is_file()),
        "jpeg_psnr_db": float(10 * np.log10(255.0**2 / jpeg_mse)),
        "video": video_stores,
    }


def _variant_name(variant: str) -> str:
    """``h264:8:18`` -> ``h264 gop 8 crf 18``."""
    codec, gop, *crf = variant.split(":")
    return f"{codec} gop {gop}" + (f" crf {crf[0]}" if crf else "")


def _size_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


def window_indices(n_samples: int, n_frames: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n_frames, n_samples)


def run_ours(path: str, indices: np.ndarray, packets: list[float] | None = None) -> float:
    """Samples/s of our sampler over ``indices`` in batches; appends the video packets decoded per
    sample to ``packets`` when given."""
    from demoscale.datasets import WindowSampler

    sampler = WindowSampler(path, {"camera0_rgb": OFFSETS}, ["action"], HORIZON)
    sampler.sample_many(indices[:BATCH])  # open the store, warm the metadata
    decoded_before = sampler.store.video_packets_decoded("camera0_rgb")
    start = time.perf_counter()
    for i in range(0, len(indices), BATCH):
        batch = sampler.sample_many(indices[i : i + BATCH])
        assert batch["obs"]["camera0_rgb"].shape[1:] == (len(OFFSETS), *SHAPE)
    rate = len(indices) / (time.perf_counter() - start)
    if packets is not None:
        packets.append((sampler.store.video_packets_decoded("camera0_rgb") - decoded_before) / len(indices))
    return rate


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


def _peak_rss_mb() -> float:
    """This process's peak RSS. VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent
    across exec, so a child started by a big benchmark process would report the parent's peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_child(path: str, n_batches: int) -> None:
    """Child process: report peak RSS before and after sampling ``n_batches`` batches."""
    from demoscale.datasets import WindowSampler

    before = _peak_rss_mb()  # after imports, before any read
    sampler = WindowSampler(path, {"camera0_rgb": OFFSETS}, ["action"], HORIZON)
    indices = window_indices(n_batches * BATCH, len(sampler), 3)
    for i in range(n_batches):
        sampler.sample_many(indices[i * BATCH : (i + 1) * BATCH])
    after = _peak_rss_mb()
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
    parser.add_argument(
        "--noise", type=float, default=0.0, help="std of Gaussian sensor noise added to the frames (0: none)"
    )
    parser.add_argument(
        "--video",
        nargs="*",
        default=["h264:8", "h264:16", "av1:8"],
        metavar="CODEC:GOP[:CRF]",
        help="video stores to compare with JPEG (codec, key-frame interval, optionally the crf); none: skip",
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
        stores = build_stores(
            Path(tmp), args.frames, args.distinct, episode_length=200, noise=args.noise, videos=args.video
        )
        built = time.perf_counter() - built
        ours, umi, limit = [], [], []
        in_order: dict[str, list[float]] = {"jpeg": [], **{v: [] for v in args.video}}
        video_rates: dict[str, list[float]] = {v: [] for v in args.video}
        video_packets: dict[str, list[float]] = {v: [] for v in args.video}
        for r in range(args.rounds):
            indices = window_indices(args.samples, args.frames, r)
            # Windows in order: a validation loop over consecutive samples from a random start.
            first = int(np.random.default_rng(100 + r).integers(0, args.frames - args.samples))
            ordered = np.arange(first, first + args.samples)
            ours.append(run_ours(stores["ours_path"], indices))
            umi.append(run_umi_style(stores["umi_path"], indices[: args.umi_samples]))
            limit.append(run_decode_limit(stores["jpeg"], indices))
            in_order["jpeg"].append(run_ours(stores["ours_path"], ordered))
            for variant in args.video:
                path = stores["video"][variant]["path"]
                video_rates[variant].append(run_ours(path, indices, video_packets[variant]))
                in_order[variant].append(run_ours(path, ordered))
        rss_of = {"jpeg": stores["ours_path"]}
        if args.video:
            rss_of[args.video[0]] = stores["video"][args.video[0]]["path"]
        rss_by_store = {}
        for name, path in rss_of.items():
            child = subprocess.run(
                [sys.executable, __file__, "--rss-child", path], capture_output=True, text=True, check=True
            )
            rss_by_store[name] = json.loads(child.stdout.strip().splitlines()[-1])
        rss = rss_by_store["jpeg"]
    decoded_store_mb = args.frames * int(np.prod(SHAPE)) / 1e6
    jpeg_rate = statistics.median(ours)
    codecs_compared = [
        {
            "store": "jpeg q90 (per frame)",
            "mb": stores["ours_mb"],
            "files": stores["ours_files"],
            "psnr_db": stores["jpeg_psnr_db"],
            "samples_per_s": jpeg_rate,
            "in_order_samples_per_s": statistics.median(in_order["jpeg"]),
            "packets_per_sample": None,
        }
    ]
    for variant in args.video:
        built_video = stores["video"][variant]
        codecs_compared.append(
            {
                "store": _variant_name(variant),
                "mb": built_video["mb"],
                "files": built_video["files"],
                "psnr_db": built_video["psnr_db"],
                "encode_frames_per_s": built_video["encode_frames_per_s"],
                "samples_per_s": statistics.median(video_rates[variant]),
                "in_order_samples_per_s": statistics.median(in_order[variant]),
                "packets_per_sample": statistics.median(video_packets[variant]),
                "rounds": video_rates[variant],
            }
        )
    result = {
        "frames": args.frames,
        "distinct_images": args.distinct,
        "frame_shape": list(SHAPE),
        "noise_std": args.noise,
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
        "codecs": codecs_compared,
        "sampler_rss_mb": {
            **rss,
            "decoded_store_mb": decoded_store_mb,
            "decoded_batch_mb": BATCH * len(OFFSETS) * int(np.prod(SHAPE)) / 1e6,
            "by_store": rss_by_store,
        },
    }
    print(
        f"{args.frames} frames {SHAPE[0]}x{SHAPE[1]} RGB ({args.distinct} distinct, noise std {args.noise:g}), "
        "windows of 2 frames + 16 actions, one core"
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
    if args.video:
        print(
            f"\nper-frame JPEG vs video, the same {args.frames} frames in episodes of 200 (medians of {args.rounds} rounds)"
        )
        print(
            f"{'store':<22} {'MB':>6} {'PSNR dB':>8} {'random samples/s':>17} {'x JPEG':>7} "
            f"{'in order':>9} {'packets/sample':>15}"
        )
        for row in codecs_compared:
            packets = "" if row["packets_per_sample"] is None else f"{row['packets_per_sample']:.1f}"
            print(
                f"{row['store']:<22} {row['mb']:>6.1f} {row['psnr_db']:>8.1f} {row['samples_per_s']:>17.0f} "
                f"{row['samples_per_s'] / jpeg_rate:>7.2f} {row['in_order_samples_per_s']:>9.0f} {packets:>15}"
            )
        for name, measured in rss_by_store.items():
            if name != "jpeg":
                print(
                    f"sampler peak RSS over the {name} store: {measured['peak_rss_mb']:.0f} MB "
                    f"(after imports {measured['peak_rss_after_imports_mb']:.0f} MB)"
                )
    emit_json("loader", result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
