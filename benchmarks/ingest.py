"""Ingest throughput: a UMI dataset.zarr.zip into an episode store, against pure JPEG-XL decoding.

Writes a synthetic UMI zip (JPEG-XL frames, as UMI writes them), then measures, side by side in one
run, frames/s of:
- decoding every frame's JPEG-XL bytes with imagecodecs (the floor of any transcoding ingest);
- ``ingest_umi`` into a JPEG store (decode + re-encode) with 1 and 2 worker processes;
- ``ingest_umi`` into a JPEG-XL store (frames copied as they are) with 1 worker.
Each is repeated and the median reported, with its ratio to the decode rate.

    python benchmarks/ingest.py [--episodes 6 --frames 40 --size 224 --repeats 3] [--json [PATH]]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np
from report import add_json_option, emit_json


def synthetic_episode(rng: np.random.Generator, length: int, size: int) -> dict[str, np.ndarray]:
    """Camera-like frames (gradients, a moving block, sensor noise) and a smooth trajectory."""
    ys, xs = np.mgrid[0:size, 0:size].astype(np.float32) / size
    frames = np.empty((length, size, size, 3), np.uint8)
    for t in range(length):
        image = np.stack([120 + 80 * xs, 90 + 60 * ys, 140 - 50 * xs * ys], axis=-1)
        x0 = int((0.1 + 0.6 * t / max(1, length - 1)) * size)
        image[size // 3 : size // 3 + size // 5, x0 : x0 + size // 5] = (200, 60, 40)
        image += rng.normal(0, 3, size=image.shape)
        frames[t] = np.clip(image, 0, 255).astype(np.uint8)
    path = np.cumsum(rng.normal(0, 0.005, size=(length, 3)), axis=0).astype(np.float32)
    return {
        "robot0_eef_pos": path,
        "robot0_eef_rot_axis_angle": (path[:, ::-1] * 2).astype(np.float32),
        "robot0_gripper_width": np.linspace(0.08, 0.02, length, dtype=np.float32)[:, None],
        "camera0_rgb": frames,
    }


def decode_rate(zip_path: Path, n_frames: int) -> float:
    """Frames/s of imagecodecs' JPEG-XL decoder over the zip's frame bytes (read beforehand)."""
    import imagecodecs

    with zipfile.ZipFile(zip_path) as archive:
        blobs = [archive.read(f"data/camera0_rgb/{t}.0.0.0") for t in range(n_frames)]
    started = time.perf_counter()
    for blob in blobs:
        imagecodecs.jpegxl_decode(blob)
    return n_frames / (time.perf_counter() - started)


def ingest_rate(zip_path: Path, workdir: Path, codec: str, workers: int) -> float:
    from demoscale.collect import ingest_umi

    store = workdir / f"store_{codec}_{workers}"
    shutil.rmtree(store, ignore_errors=True)
    summary = ingest_umi(
        zip_path, store, env_id="0", object_id="0", image_codec=codec, workers=workers, progress=False
    )
    shutil.rmtree(store, ignore_errors=True)
    return summary.frames_written / summary.seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=6)
    parser.add_argument("--frames", type=int, default=40, help="frames per episode")
    parser.add_argument("--size", type=int, default=224, help="image side (UMI: 224)")
    parser.add_argument("--repeats", type=int, default=3)
    add_json_option(parser)
    args = parser.parse_args(argv)

    from demoscale.collect import write_umi_zip

    rng = np.random.default_rng(0)
    n_frames = args.episodes * args.frames
    variants = [
        ("jpeg store, 1 worker", "jpeg", 1),
        ("jpeg store, 2 workers", "jpeg", 2),
        ("jpegxl copy, 1 worker", "jpegxl", 1),
    ]
    results: dict[str, list[float]] = {"jpegxl decode only": []}
    results.update({name: [] for name, _, _ in variants})
    with tempfile.TemporaryDirectory(prefix="ingest-bench-") as scratch:
        workdir = Path(scratch)
        episodes = [synthetic_episode(rng, args.frames, args.size) for _ in range(args.episodes)]
        zip_path = write_umi_zip(workdir / "dataset.zarr.zip", episodes)
        for _ in range(args.repeats):  # interleaved, so that machine load hits every variant alike
            results["jpegxl decode only"].append(decode_rate(zip_path, n_frames))
            for name, codec, workers in variants:
                results[name].append(ingest_rate(zip_path, workdir, codec, workers))

    decode = statistics.median(results["jpegxl decode only"])
    rows = [
        {
            "variant": name,
            "frames_per_s": statistics.median(rates),
            "ratio_to_decode": statistics.median(rates) / decode,
            "runs": rates,
        }
        for name, rates in results.items()
    ]
    print(
        f"UMI zip -> store: {args.episodes} episodes x {args.frames} frames, {args.size}x{args.size}, "
        f"median of {args.repeats}"
    )
    print(f"{'variant':<26} {'frames/s':>10} {'x decode':>9}")
    for row in rows:
        print(f"{row['variant']:<26} {row['frames_per_s']:>10.0f} {row['ratio_to_decode']:>9.2f}")
    emit_json(
        "ingest",
        {"episodes": args.episodes, "frames_per_episode": args.frames, "size": args.size, "repeats": args.repeats,
         "results": rows},
        args.json,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
