"""Ingest at scale: frames/s against the codec limit, and append cost as the store grows.

Two measurements, side by side in one run, on synthetic camera-like 96x96 frames (gradients, a
moving block, sensor noise), ~50 frames per episode, JPEG store:

1. **Throughput.** A diffusion_policy replay buffer of ``--ingest-episodes`` episodes (raw uint8
   frames, as PushT ships) ingested into a fresh JPEG store with 1 and 2 worker processes, against
   the pure encode limit: imagecodecs' JPEG encoder over the same frames, already in memory, in one
   process; and, to show what the store adds, reading the source's frames (zarr, chunk by chunk)
   and encoding them with no store at all. Reported per worker: ingest frames/s / (workers x encode frames/s), for the whole
   ingest and for its write phase alone (the plan phase reads every frame once more, in this
   process, to hash each episode's content). Rounds alternate the variants; medians are quoted.
2. **Append cost at scale.** ``--episodes`` episodes (default 10,000) appended to one store in
   transactions of ``--batch`` episodes (what ``demoscale ingest --commit-every`` does), frames
   handed over already encoded so that only the store's own work is timed; the seconds per episode
   around 1,000 episodes (the median of the batches ending at or before 1,500) and at the end (the
   median of the last three batches), and their ratio. For context, the
   same episodes appended one by one outside a transaction (each its own commit) for the first
   ``--single`` episodes.

    python benchmarks/ingest.py [--episodes 10000] [--ingest-episodes 400] [--rounds 3] [--json [PATH]]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from report import add_json_option, emit_json

SIZE = 96


def synthetic_frames(rng: np.random.Generator, length: int, size: int = SIZE) -> np.ndarray:
    """Camera-like frames: smooth gradients, a block moving across, a little sensor noise."""
    ys, xs = np.mgrid[0:size, 0:size].astype(np.float32) / size
    shade = rng.uniform(-30, 30, size=3)
    frames = np.empty((length, size, size, 3), np.uint8)
    for t in range(length):
        image = np.stack([120 + 80 * xs, 90 + 60 * ys, 140 - 50 * xs * ys], axis=-1) + shade
        x0 = int((0.1 + 0.6 * t / max(1, length - 1)) * size)
        image[size // 3 : size // 3 + size // 5, x0 : x0 + size // 5] = (200, 60, 40)
        image += rng.normal(0, 3, size=image.shape)
        frames[t] = np.clip(image, 0, 255).astype(np.uint8)
    return frames


def write_replay_buffer(path: Path, episodes: list[np.ndarray], rng: np.random.Generator) -> None:
    """A diffusion_policy replay buffer (Zarr format 2, Blosc) holding ``episodes`` as ``img``."""
    import zarr
    from numcodecs import Blosc

    ends = np.cumsum([len(e) for e in episodes]).astype(np.int64)
    n = int(ends[-1])
    root = zarr.open_group(str(path), mode="w", zarr_format=2)
    compressor = Blosc(cname="zstd", clevel=5, shuffle=Blosc.BITSHUFFLE)  # as PushT's replay buffer
    img = root.create_array("data/img", shape=(n, SIZE, SIZE, 3), chunks=(100, SIZE, SIZE, 3),
                            dtype="uint8", compressors=compressor)  # fmt: skip
    img[:] = np.concatenate(episodes)
    root.create_array("data/state", shape=(n, 5), chunks=(n, 5), dtype="float32", compressors=compressor)[
        :
    ] = rng.normal(size=(n, 5)).astype(np.float32)
    root.create_array("data/action", shape=(n, 2), chunks=(n, 2), dtype="float32", compressors=compressor)[
        :
    ] = rng.normal(size=(n, 2)).astype(np.float32)
    root.create_array("meta/episode_ends", shape=(len(ends),), chunks=(len(ends),), dtype="int64",
                      compressors=None)[:] = ends  # fmt: skip


def encode_rate(frames: np.ndarray) -> float:
    """Frames/s of the store's JPEG encoder (its default options) over frames already in memory."""
    from demoscale.datasets.codecs import codec_options, encode_frame

    options = codec_options("jpeg")
    started = time.perf_counter()
    for frame in frames:
        encode_frame(frame, "jpeg", options)
    return len(frames) / (time.perf_counter() - started)


def read_and_encode_rate(source: Path) -> float:
    """Frames/s of reading the source's frames (zarr, chunk by chunk) and encoding each, no store."""
    import zarr
    from demoscale.datasets.codecs import codec_options, encode_frame

    options = codec_options("jpeg")
    array = zarr.open_group(str(source), mode="r")["data/img"]
    step = int(array.chunks[0])
    started = time.perf_counter()
    for first in range(0, array.shape[0], step):
        for frame in np.asarray(array[first : first + step]):
            encode_frame(frame, "jpeg", options)
    return array.shape[0] / (time.perf_counter() - started)


def ingest_rates(source: Path, workdir: Path, workers: int) -> tuple[float, float]:
    """Frames/s of a whole ingest, and of its write phase alone (load, encode, append, commit)."""
    from demoscale.collect import ingest_replay_buffer

    store = workdir / f"store_w{workers}.zarr"
    shutil.rmtree(store, ignore_errors=True)
    summary = ingest_replay_buffer(source, store, image_codec="jpeg", workers=workers, progress=False)
    shutil.rmtree(store, ignore_errors=True)
    frames = summary.frames_written
    return frames / summary.seconds, frames / (summary.seconds - summary.plan_seconds)


def append_costs(
    workdir: Path, pool: list[tuple[list[bytes], np.ndarray]], n_episodes: int, batch: int
) -> list[tuple[int, float]]:
    """Append ``n_episodes`` pooled episodes in transactions of ``batch``; (episodes after, s per episode)."""
    from demoscale.datasets import EpisodeStore

    store = EpisodeStore.create(workdir / "scale.zarr", features(), image_codec="jpeg")
    costs = []
    appended = 0
    while appended < n_episodes:
        count = min(batch, n_episodes - appended)
        started = time.perf_counter()
        with store.transaction():
            for i in range(appended, appended + count):
                blobs, actions = pool[i % len(pool)]
                append(store, blobs, actions, i)
        appended += count
        costs.append((appended, (time.perf_counter() - started) / count))
    return costs


def single_append_cost(workdir: Path, pool: list[tuple[list[bytes], np.ndarray]], n_episodes: int) -> float:
    """Seconds per episode appended one by one, each its own commit (no transaction)."""
    from demoscale.datasets import EpisodeStore

    store = EpisodeStore.create(workdir / "single.zarr", features(), image_codec="jpeg")
    started = time.perf_counter()
    for i in range(n_episodes):
        blobs, actions = pool[i % len(pool)]
        append(store, blobs, actions, i)
    return (time.perf_counter() - started) / n_episodes


def features() -> dict:
    from demoscale.datasets import FeatureSpec

    return {
        "camera0_rgb": FeatureSpec(kind="image", shape=(SIZE, SIZE, 3), dtype="uint8", rate_hz=10.0),
        "action": FeatureSpec(kind="low_dim", shape=(2,), dtype="float32", rate_hz=10.0),
    }


def append(store, blobs: list[bytes], actions: np.ndarray, index: int) -> None:
    digest = hashlib.sha256(f"synthetic episode {index}".encode()).hexdigest()
    store.append_episode(
        {"action": actions},
        encoded={"camera0_rgb": blobs},
        env_id=str(index % 64),
        object_id=str(index % 16),
        task="bench",
        source=f"synthetic#{index}",
        source_sha256=digest,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=10_000, help="store size for the append-cost part")
    parser.add_argument("--frames", type=int, default=50, help="frames per episode")
    parser.add_argument("--ingest-episodes", type=int, default=400, help="episodes of the throughput source")
    parser.add_argument("--batch", type=int, default=500, help="episodes per transaction (commit)")
    parser.add_argument("--single", type=int, default=200, help="episodes appended one by one, for context")
    parser.add_argument("--rounds", type=int, default=3)
    add_json_option(parser)
    args = parser.parse_args(argv)

    from demoscale.datasets.codecs import codec_options, encode_frame

    rng = np.random.default_rng(0)
    episodes = [synthetic_frames(rng, args.frames) for _ in range(args.ingest_episodes)]
    all_frames = np.concatenate(episodes)
    with tempfile.TemporaryDirectory(prefix="ingest-bench-") as scratch:
        workdir = Path(scratch)
        source = workdir / "source.zarr"
        write_replay_buffer(source, episodes, rng)
        rates: dict[str, list[float]] = {"encode limit, 1 process": [], "read + encode, 1 process": []}
        for workers in (1, 2):
            rates[f"ingest, {workers} worker(s)"] = []
            rates[f"  its write phase, {workers} worker(s)"] = []
        for _ in range(args.rounds):  # alternating, so machine load hits every variant alike
            rates["encode limit, 1 process"].append(encode_rate(all_frames))
            rates["read + encode, 1 process"].append(read_and_encode_rate(source))
            for workers in (1, 2):
                whole, writing = ingest_rates(source, workdir, workers)
                rates[f"ingest, {workers} worker(s)"].append(whole)
                rates[f"  its write phase, {workers} worker(s)"].append(writing)
        shutil.rmtree(source)

        options = codec_options("jpeg")
        pool = [
            (
                [encode_frame(f, "jpeg", options) for f in frames],
                rng.normal(size=(len(frames), 2)).astype(np.float32),
            )
            for frames in episodes[:32]
        ]
        single = single_append_cost(workdir, pool, args.single)
        costs = append_costs(workdir, pool, args.episodes, args.batch)
        store_bytes = sum(f.stat().st_size for f in (workdir / "scale.zarr").rglob("*") if f.is_file())
        store_files = sum(1 for f in (workdir / "scale.zarr").rglob("*") if f.is_file())

    limit = statistics.median(rates["encode limit, 1 process"])
    throughput = []
    for name, runs in rates.items():
        workers = 2 if "2 worker" in name else 1
        median = statistics.median(runs)
        throughput.append({"variant": name, "frames_per_s": median, "per_worker_of_limit": median / (workers * limit),
                           "runs": runs})  # fmt: skip
    # Medians over a few batches around each point: one batch's time is at the mercy of the machine.
    at_1000 = statistics.median(cost for n, cost in costs if n <= max(1500, costs[0][0]))
    last = statistics.median(cost for _, cost in costs[-3:])
    print(f"Throughput: {args.ingest_episodes} episodes x {args.frames} frames, {SIZE}x{SIZE} JPEG, "
          f"median of {args.rounds} rounds ({os.cpu_count()} CPUs)")  # fmt: skip
    print(f"{'variant':<34} {'frames/s':>10} {'per worker / encode limit':>26}")
    for row in throughput:
        print(f"{row['variant']:<34} {row['frames_per_s']:>10.0f} {row['per_worker_of_limit']:>26.2f}")
    print(f"\nAppend cost: {args.episodes} episodes in transactions of {args.batch} (frames pre-encoded)")
    print(f"{'episodes in store':>18} {'ms per episode':>15}")
    for n, cost in costs:
        if n in (args.batch, 1000, args.episodes) or n % max(args.batch, args.episodes // 10) == 0:
            print(f"{n:>18} {1000 * cost:>15.2f}")
    print(
        f"at 1,000: {1000 * at_1000:.2f} ms; at {args.episodes:,}: {1000 * last:.2f} ms; ratio {last / at_1000:.2f}"
    )
    print(f"one by one (each its own commit), first {args.single}: {1000 * single:.2f} ms per episode")
    print(f"store: {store_bytes / 1e6:.0f} MB in {store_files} files")
    emit_json(
        "ingest",
        {
            "frames_per_episode": args.frames, "size": SIZE, "ingest_episodes": args.ingest_episodes,
            "rounds": args.rounds, "throughput": throughput,
            "append": {"episodes": args.episodes, "batch": args.batch, "per_episode_s": costs,
                       "at_1000_s": at_1000, "at_end_s": last, "ratio_end_to_1000": last / at_1000,
                       "single_appends_s": single, "single_appends_n": args.single,
                       "store_bytes": store_bytes, "store_files": store_files},
        },
        args.json,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
