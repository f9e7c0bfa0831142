"""A store through LeRobot v3.0 and back: frame quality (PSNR) per video codec, and the speed of each way.

The frames are a real photograph (matplotlib's sample ``grace_hopper.jpg``) seen by a slowly panning
and zooming camera, ``--size`` pixels square, ``--frames`` per episode; the store keeps them
losslessly (PNG), so the PSNR measured is the video codec's alone: store -> ``export_lerobot`` (H.264
crf 23 or AV1 crf 30, yuv420p, a key frame every 2 frames) -> ``ingest_lerobot`` -> store. Low-dim
keys are checked to come back bit for bit. Also reported: export and ingest frames/s and the mp4
bytes per frame.

    python benchmarks/lerobot_roundtrip.py [--episodes 4] [--frames 50] [--size 96] [--json [PATH]]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from report import add_json_option, emit_json


def panning_frames(photo: np.ndarray, length: int, size: int, seed: int) -> np.ndarray:
    """Crops of ``photo`` along a slow pan and zoom, resized to ``size`` (a camera moving over a scene)."""
    import cv2

    rng = np.random.default_rng(seed)
    height, width = photo.shape[:2]
    start = rng.uniform(0.0, 0.3, size=2)
    frames = np.empty((length, size, size, 3), np.uint8)
    for t in range(length):
        crop = int(min(height, width) * (0.6 - 0.15 * t / max(1, length - 1)))
        y0 = int((height - crop) * (start[0] + 0.4 * t / max(1, length - 1)))
        x0 = int((width - crop) * (start[1] + 0.4 * t / max(1, length - 1)))
        frames[t] = cv2.resize(
            photo[y0 : y0 + crop, x0 : x0 + crop], (size, size), interpolation=cv2.INTER_AREA
        )
    return frames


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--frames", type=int, default=50, help="frames per episode")
    parser.add_argument("--size", type=int, default=96, help="frame height and width, pixels")
    add_json_option(parser)
    args = parser.parse_args(argv)

    import imageio.v3 as iio
    import matplotlib.cbook
    from demoscale.collect import export_lerobot, ingest_lerobot
    from demoscale.collect.lerobot_export import psnr
    from demoscale.datasets import EpisodeStore, FeatureSpec

    photo = iio.imread(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False))[..., :3]
    rng = np.random.default_rng(0)
    results = {}
    with tempfile.TemporaryDirectory(prefix="lerobot-bench-") as scratch:
        work = Path(scratch)
        features = {
            "camera0_rgb": FeatureSpec(
                kind="image", shape=(args.size, args.size, 3), dtype="uint8", rate_hz=10.0
            ),
            "action": FeatureSpec(kind="low_dim", shape=(7,), dtype="float32", rate_hz=10.0),
        }
        store = EpisodeStore.create(work / "store.zarr", features, image_codec="png")
        with store.transaction():
            for index in range(args.episodes):
                store.append_episode(
                    {"camera0_rgb": panning_frames(photo, args.frames, args.size, index),
                     "action": rng.normal(size=(args.frames, 7)).astype(np.float32)},
                    env_id=str(index), object_id="0", source=f"bench#{index}", source_sha256=f"{index:064x}",
                )  # fmt: skip
        frames = store.n_frames
        original = store.read("camera0_rgb", 0, frames)
        for codec in ("h264", "av1"):
            out = work / f"lerobot_{codec}"
            started = time.perf_counter()
            export_lerobot(store, out, video_codec=codec, progress=False)
            exported = time.perf_counter() - started
            started = time.perf_counter()
            ingest_lerobot(out, work / f"back_{codec}.zarr", image_codec="png", progress=False)
            ingested = time.perf_counter() - started
            back = EpisodeStore.open(work / f"back_{codec}.zarr")
            assert back.read("action", 0, frames).tobytes() == store.read("action", 0, frames).tobytes()
            video_bytes = sum(p.stat().st_size for p in (out / "videos").rglob("*.mp4"))
            results[codec] = {
                "psnr_db": round(psnr(original, back.read("camera0_rgb", 0, frames)), 2),
                "export_frames_per_s": round(frames / exported, 1),
                "ingest_frames_per_s": round(frames / ingested, 1),
                "video_bytes_per_frame": round(video_bytes / frames, 1),
            }
    print(
        f"{args.episodes} episodes x {args.frames} frames of {args.size}x{args.size} RGB; low-dim bit for bit"
    )
    print(f"{'codec':<6} {'PSNR dB':>8} {'export fr/s':>12} {'ingest fr/s':>12} {'mp4 B/frame':>12}")
    for codec, row in results.items():
        print(f"{codec:<6} {row['psnr_db']:>8.2f} {row['export_frames_per_s']:>12.1f} "
              f"{row['ingest_frames_per_s']:>12.1f} {row['video_bytes_per_frame']:>12.1f}")  # fmt: skip
    emit_json("lerobot_roundtrip", {"episodes": args.episodes, "frames": args.frames, "size": args.size,
                                    "codecs": results}, args.json)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
