"""Ingest at scale: frames/s against the codec limit, and append cost as the store grows.

Two measurements, side by side in one run, on synthetic camera-like 96x96 frames (gradients, a
moving block, sensor noise), ~50 frames per episode, JPEG store:

1. **Throughput.** A diffusion_policy replay buffer of ``--ingest-episodes`` episodes (raw uint8
   frames; ``--source-codecs``: Blosc-zstd with bit-shuffle, as PushT ships, Blosc-lz4,
   diffusion_policy's default compressor, and uncompressed) ingested into a fresh JPEG store with
   one worker (the committing process itself), two worker processes and on Ray (2 CPUs), against the pure
   encode limit: imagecodecs' JPEG encoder over the same frames, already in memory, in one process.
   Beside it, the parts of an ingest's work alone: reading the source with the ingest's reader, the
   content hash (sha256, and xxh3-128, what an ingest records), and reading + encoding with no
   store. Reported per worker: ingest frames/s / (workers x encode frames/s), for the whole ingest
   and for its write phase alone (into a new store the plan phase reads no frames: the workers hash
   what they load), and the CPU the committing process used (cores). Blosc decompresses with one
   thread in every variant (as in the ingest's workers), so that one worker is one core. Rounds
   alternate the variants; medians are quoted.
2. **Append cost at scale.** ``--episodes`` episodes (default 10,000) appended to one store in
   transactions of ``--batch`` episodes (what ``demoscale ingest --commit-every`` does), frames
   handed over already encoded so that only the store's own work is timed; the seconds per episode
   around 1,000 episodes (the median of the batches ending at or before 1,500) and at the end (the
   median of the last three batches). Then the comparison the target is checked on: transactions
   of ``--side-batch`` episodes appended alternately to a store of 1,000 episodes and to the grown
   one, ``--side-rounds`` rounds, the ratio of their medians (the machine's load falls on both). For
   context, the same episodes appended one by one outside a transaction (each its own commit) for
   the first ``--single`` episodes.
3. **On Ray, and per core for UMI.** The throughput source is also ingested with ``address="local"``
   (a private Ray of 2 CPUs, started and stopped by the ingest, so its start-up is in the time).
   Then a UMI ``dataset.zarr.zip`` of ``--umi-episodes`` episodes of ``--umi-frames`` 224x224 frames
   (JPEG-XL, as UMI writes them) is ingested into a store of each ``--umi-codecs`` codec, in the
   committing process (one worker: its CPU time is all the work) and with Ray (2 CPUs); per
   episode, the plan phase (this process: reading and hashing every source frame), the load +
   encode work one core does (the write phase minus the committer's share) and the committer's own
   append (the same encoded episodes appended again in one transaction) give the projection for
   ``--project-episodes`` episodes of ``--project-frames`` frames on 8 and 64 cores:
   plan + max(load / cores, commit) + Ray start-up.

    python benchmarks/ingest.py [--episodes 10000] [--ingest-episodes 400] [--rounds 3] [--json [PATH]]
        [--source-codecs zstd lz4] [--parts throughput append umi] [--umi-episodes 12] [--umi-frames 100]
        [--umi-codecs jpegxl jpeg h264]
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


SOURCE_CODECS = ("zstd", "lz4", "none")


def write_replay_buffer(
    path: Path, episodes: list[np.ndarray], rng: np.random.Generator, source_codec: str = "zstd"
) -> None:
    """A diffusion_policy replay buffer (Zarr format 2, Blosc) holding ``episodes`` as ``img``:
    ``zstd`` is Blosc-zstd with bit-shuffle, as PushT's replay buffer ships (diffusion_policy's
    "disk" compressor), ``lz4`` Blosc-lz4 without shuffle, diffusion_policy's default compressor,
    ``none`` the raw frames (reading is a copy: what is left is the ingest's own work)."""
    import zarr
    from numcodecs import Blosc

    if source_codec not in SOURCE_CODECS:
        raise ValueError(f"source codec {source_codec!r}: expected one of {SOURCE_CODECS}")

    ends = np.cumsum([len(e) for e in episodes]).astype(np.int64)
    n = int(ends[-1])
    root = zarr.open_group(str(path), mode="w", zarr_format=2)
    if source_codec == "zstd":
        compressor = Blosc(cname="zstd", clevel=5, shuffle=Blosc.BITSHUFFLE)
    elif source_codec == "lz4":
        compressor = Blosc(cname="lz4", clevel=5, shuffle=Blosc.NOSHUFFLE)
    else:
        compressor = None
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


def read_rate(source: Path, encode: bool) -> float:
    """Frames/s of reading the source's frames episode by episode with the ingest's own reader
    (whole chunks, decompressed once), and encoding each frame when ``encode``; no store."""
    from demoscale.collect.zarr_source import ChunkedFrames, RawGroup, episode_group
    from demoscale.datasets.codecs import codec_options, encode_frame

    options = codec_options("jpeg")
    with episode_group(source) as (_, info, root):
        started = time.perf_counter()
        reader = ChunkedFrames(root["data/img"], RawGroup(source), "data/img")
        for episode in range(info.n_episodes):
            frames = reader.read(*info.bounds(episode))
            if encode:
                for frame in frames:
                    encode_frame(frame, "jpeg", options)
        return int(info.episode_ends[-1]) / (time.perf_counter() - started)


def hash_rate(episodes: list[np.ndarray], algorithm: str) -> float:
    """Frames/s of the content hash ``algorithm`` over each episode's frames, as an ingest records it."""
    from demoscale.collect.source_format import content_hash

    started = time.perf_counter()
    for frames in episodes:
        content_hash({"img": frames}, algorithm)
    return sum(len(frames) for frames in episodes) / (time.perf_counter() - started)


def ingest_rates(
    source: Path, workdir: Path, workers: int, address: str | None = None
) -> tuple[float, float, float]:
    """Frames/s of a whole ingest and of its write phase alone (load, encode, append, commit), and
    the CPU this process (the committer) used, in cores over the ingest's wall time."""
    from demoscale.collect import ingest_replay_buffer

    store = workdir / f"store_w{workers}.zarr"
    shutil.rmtree(store, ignore_errors=True)
    cpu = time.process_time()
    summary = ingest_replay_buffer(
        source, store, image_codec="jpeg", workers=workers, address=address, progress=False
    )
    cpu = time.process_time() - cpu
    shutil.rmtree(store, ignore_errors=True)
    frames = summary.frames_written
    return frames / summary.seconds, frames / (summary.seconds - summary.plan_seconds), cpu / summary.seconds


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


def side_by_side_costs(
    workdir: Path,
    big: Path,
    pool: list[tuple[list[bytes], np.ndarray]],
    small_size: int,
    batch: int,
    rounds: int,
) -> tuple[list[float], list[float]]:
    """Seconds per episode of a ``batch``-episode transaction appended to a store of ``small_size``
    episodes and to the grown store at ``big``, alternately for ``rounds`` rounds (each store grows by
    ``batch`` a round), so that the machine's load falls on both alike."""
    from demoscale.datasets import EpisodeStore

    small = EpisodeStore.create(workdir / "small.zarr", features(), image_codec="jpeg")
    for first in range(0, small_size, 500):
        with small.transaction():
            for i in range(first, min(small_size, first + 500)):
                append(small, *pool[i % len(pool)], i)
    large = EpisodeStore.open(big, mode="a")
    costs: dict[str, list[float]] = {"small": [], "large": []}
    offset = {"small": small_size, "large": large.n_episodes}
    for _ in range(rounds):
        for name, store in (("small", small), ("large", large)):
            started = time.perf_counter()
            with store.transaction():
                for i in range(offset[name], offset[name] + batch):
                    append(store, *pool[i % len(pool)], i)
            costs[name].append((time.perf_counter() - started) / batch)
            offset[name] += batch
    return costs["small"], costs["large"]


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


def umi_episodes(rng: np.random.Generator, n_episodes: int, frames: int) -> list[dict[str, np.ndarray]]:
    """Single-arm UMI episodes: 224x224 camera-like frames and random-walk poses."""
    episodes = []
    for _ in range(n_episodes):
        episodes.append(
            {
                "camera0_rgb": synthetic_frames(rng, frames, size=224),
                "robot0_eef_pos": rng.normal(size=(frames, 3)).cumsum(axis=0).astype(np.float32),
                "robot0_eef_rot_axis_angle": rng.normal(size=(frames, 3)).astype(np.float32),
                "robot0_gripper_width": rng.uniform(0, 0.08, size=(frames, 1)).astype(np.float32),
            }
        )
    return episodes


def committer_costs(store_path: Path, workdir: Path) -> tuple[float, float]:
    """(CPU s, wall s) the committer spends per episode alone: the store's episodes appended again,
    image frames already encoded (what a worker hands over), in one transaction into a new store.
    The slope between a transaction of one episode and one of all of them, so the transaction's
    fixed cost (lock, journal, commit) is left out: it is paid once per ingest."""
    from demoscale.datasets import EpisodeStore

    store = EpisodeStore.open(store_path)
    images = [key for key, spec in store.features.items() if spec.kind == "image"]
    episodes = []
    for index, row in store.episodes.iterrows():
        arrays = {k: store.read(k, row["start"], row["end"]) for k in store.features if k not in images}
        encoded = {k: store.read_encoded(k, row["start"], row["end"]) for k in images}
        episodes.append((arrays, encoded, row["source_sha256"], index))

    def transaction_cost(count: int) -> tuple[float, float]:
        target = workdir / "committer.zarr"
        shutil.rmtree(target, ignore_errors=True)
        copy = EpisodeStore.create(
            target,
            store.features,
            image_codec=store.image_codec,
            image_codec_options=store.image_codec_options,
        )
        cpu, wall = time.process_time(), time.perf_counter()
        with copy.transaction():
            for arrays, encoded, digest, index in episodes[:count]:
                copy.append_episode(
                    arrays, encoded=encoded, env_id="0", object_id=str(index), source_sha256=digest
                )
        cost = time.process_time() - cpu, time.perf_counter() - wall
        shutil.rmtree(target, ignore_errors=True)
        return cost

    transaction_cost(1)  # warm-up: the first transaction of a process pays for first calls
    single = [transaction_cost(1) for _ in range(3)]
    whole = transaction_cost(len(episodes))
    extra = max(1, len(episodes) - 1)
    return tuple(max(0.0, (whole[i] - statistics.median(cost[i] for cost in single)) / extra) for i in (0, 1))  # type: ignore[return-value]


def ray_start_seconds(cpus: int = 2) -> float:
    """Wall seconds to start a private local Ray, run one task on it and stop it again."""
    import ray
    from demoscale.collect.ray_cluster import ray_session

    started = time.perf_counter()
    with ray_session("local", num_cpus=cpus):
        ray.get(ray.remote(lambda: None).remote())
    return time.perf_counter() - started


def umi_part(workdir: Path, args: argparse.Namespace) -> dict:
    """Per-episode plan, per-core load + encode and committer costs of UMI ingests; projections.

    Per-core costs are CPU time (``time.process_time`` of an in-process ingest): on a machine
    shared with other jobs a process gets only part of a core, and wall time would charge the
    other jobs' share to the ingest.
    """
    from demoscale.collect import ingest_umi, write_umi_zip

    rng = np.random.default_rng(7)
    source = write_umi_zip(
        workdir / "umi" / "dataset.zarr.zip", umi_episodes(rng, args.umi_episodes, args.umi_frames)
    )
    n = args.umi_episodes
    ingest_umi(source, workdir / "warm.zarr", dry_run=True, progress=False)  # imports, file caches
    ray_start = [ray_start_seconds() for _ in range(2)]
    rows = []
    for codec in args.umi_codecs:
        measured: dict[str, list[float]] = {name: [] for name in (
            "plan_cpu", "plan_wall", "load_cpu", "load_wall", "commit_cpu", "commit_wall", "ray_write", "ray_whole",
            "in_process_whole",
        )}  # fmt: skip
        for _ in range(args.umi_rounds):
            store = workdir / f"umi_{codec}.zarr"
            shutil.rmtree(store, ignore_errors=True)
            cpu = time.process_time()
            planned = ingest_umi(source, store, image_codec=codec, dry_run=True, progress=False)
            plan_cpu = time.process_time() - cpu
            cpu = time.process_time()
            one = ingest_umi(source, store, image_codec=codec, progress=False)
            write_cpu = time.process_time() - cpu - plan_cpu
            commit_cpu, commit_wall = committer_costs(store, workdir)
            shutil.rmtree(store, ignore_errors=True)
            on_ray = ingest_umi(source, store, image_codec=codec, address="local", workers=2, progress=False)
            shutil.rmtree(store, ignore_errors=True)
            measured["plan_cpu"].append(plan_cpu / n)
            measured["plan_wall"].append(planned.plan_seconds / n)
            measured["load_cpu"].append(write_cpu / n - commit_cpu)
            measured["load_wall"].append((one.seconds - one.plan_seconds) / n - commit_wall)
            measured["commit_cpu"].append(commit_cpu)
            measured["commit_wall"].append(commit_wall)
            measured["ray_write"].append(on_ray.seconds - on_ray.plan_seconds)
            measured["ray_whole"].append(on_ray.seconds)
            measured["in_process_whole"].append(one.seconds)
        median = {name: statistics.median(values) for name, values in measured.items()}
        scale = args.project_frames / args.umi_frames  # the costs grow with the frames of an episode
        row = {
            "codec": codec,
            **{
                f"{name}_s_per_episode": value
                for name, value in median.items()
                if name[-4:] in ("_cpu", "wall")
            },
            "in_process_whole_s": median["in_process_whole"],
            "ray_2_cpus_write_phase_s": median["ray_write"],
            "ray_2_cpus_whole_s": median["ray_whole"],
            # What the model says for the 2-CPU Ray run here, from the wall-time costs and a measured
            # start-up (the machine's other jobs in both).
            "model_2_cpus_write_phase_s": statistics.median(ray_start)
            + n * max(median["load_wall"] / 2, median["commit_wall"]),
            "projection": {},
        }
        for cores in (8, 64):
            planning = args.project_episodes * median["plan_cpu"] * scale
            workers = args.project_episodes * median["load_cpu"] * scale / cores
            committer = args.project_episodes * median["commit_cpu"] * scale
            row["projection"][cores] = {
                "plan_h": planning / 3600,
                "load_encode_h": workers / 3600,
                "commit_h": committer / 3600,
                "total_h": (planning + max(workers, committer) + statistics.median(ray_start)) / 3600,
                "bound_by": "the committer" if committer > workers else "the workers",
            }
        rows.append(row)
    return {
        "episodes": n,
        "frames": args.umi_frames,
        "rounds": args.umi_rounds,
        "project_episodes": args.project_episodes,
        "project_frames": args.project_frames,
        "ray_start_s": ray_start,
        "codecs": rows,
    }


def print_umi(result: dict) -> None:
    n, frames = result["episodes"], result["frames"]
    print(
        f"\nUMI zip, {n} episodes x {frames} frames 224x224 (JPEG-XL), medians of {result['rounds']} rounds; "
        f"ms per episode, CPU (wall); a local Ray's start + stop: {statistics.median(result['ray_start_s']):.1f} s"
    )
    print(f"{'store codec':<12} {'plan':>14} {'load+encode/core':>18} {'commit':>14} {'Ray 2 CPUs write s':>19} "
          f"{'model s':>8}")  # fmt: skip
    for row in result["codecs"]:
        cells = [
            f"{1000 * row[f'{name}_cpu_s_per_episode']:.1f} ({1000 * row[f'{name}_wall_s_per_episode']:.1f})"
            for name in ("plan", "load", "commit")
        ]
        print(
            f"{row['codec']:<12} {cells[0]:>14} {cells[1]:>18} {cells[2]:>14} "
            f"{row['ray_2_cpus_write_phase_s']:>19.1f} {row['model_2_cpus_write_phase_s']:>8.1f}"
        )
    print(
        f"projection, {result['project_episodes']:,} episodes x {result['project_frames']} frames, per-core CPU "
        "costs (plan + max(load+encode / cores, commit) + Ray start-up), hours:"
    )
    for row in result["codecs"]:
        for cores, projected in row["projection"].items():
            print(
                f"  {row['codec']:<8} {cores:>3} cores: {projected['total_h']:6.2f} h  (plan {projected['plan_h']:.2f}, "
                f"load+encode {projected['load_encode_h']:.2f}, commit {projected['commit_h']:.2f}; "
                f"bound by {projected['bound_by']})"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=10_000, help="store size for the append-cost part")
    parser.add_argument("--frames", type=int, default=50, help="frames per episode")
    parser.add_argument("--ingest-episodes", type=int, default=400, help="episodes of the throughput source")
    parser.add_argument("--batch", type=int, default=500, help="episodes per transaction (commit)")
    parser.add_argument("--single", type=int, default=200, help="episodes appended one by one, for context")
    parser.add_argument(
        "--side-batch", type=int, default=100, help="episodes per transaction of the side-by-side comparison"
    )
    parser.add_argument("--side-rounds", type=int, default=7, help="alternating rounds of that comparison")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--source-codecs", nargs="+", choices=SOURCE_CODECS, default=list(SOURCE_CODECS),
        help="compressors of the throughput part's replay-buffer sources",
    )  # fmt: skip
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=["throughput", "append", "umi"],
        default=["throughput", "append", "umi"],
        help="which measurements to run",
    )
    parser.add_argument("--umi-episodes", type=int, default=12, help="episodes of the UMI source")
    parser.add_argument("--umi-frames", type=int, default=100, help="frames per UMI episode")
    parser.add_argument("--umi-codecs", nargs="+", default=["jpegxl", "jpeg", "h264"], help="store codecs")
    parser.add_argument("--umi-rounds", type=int, default=3)
    parser.add_argument("--project-episodes", type=int, default=40_000, help="episodes of the projection")
    parser.add_argument(
        "--project-frames", type=int, default=300, help="frames per episode of the projection"
    )
    add_json_option(parser)
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    episodes = [synthetic_frames(rng, args.frames) for _ in range(args.ingest_episodes)]
    all_frames = np.concatenate(episodes)
    result: dict = {"frames_per_episode": args.frames, "size": SIZE, "ingest_episodes": args.ingest_episodes,
                    "rounds": args.rounds}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="ingest-bench-") as scratch:
        workdir = Path(scratch)
        if "throughput" in args.parts:
            result["throughput"] = throughput_part(workdir, episodes, all_frames, rng, args)
        if "append" in args.parts:
            result["append"] = append_part(workdir, episodes, rng, args)
        if "umi" in args.parts:
            result["umi"] = umi_part(workdir, args)
            print_umi(result["umi"])
    emit_json("ingest", result, args.json)
    return 0


def throughput_part(
    workdir: Path, episodes: list[np.ndarray], all_frames: np.ndarray, rng: np.random.Generator, args
) -> list[dict]:
    """Ingest frames/s (1 worker: this process, 2 worker processes, Ray with 2 CPUs) of each source codec
    against the encode limit, and the parts of the work alone; variants alternate within a round."""
    from numcodecs import blosc

    blosc.set_nthreads(1)  # one worker, one core (the ingest's workers do the same)
    sources = {}
    for codec in args.source_codecs:
        sources[codec] = workdir / f"source_{codec}.zarr"
        write_replay_buffer(sources[codec], episodes, rng, codec)
    variants = [(1, None), (2, None), (2, "local")]
    names = {(1, None): "1 worker (the committing process)", (2, None): "2 worker processes",
             (2, "local"): "Ray, 2 workers"}  # fmt: skip
    rates: dict[tuple[str, str, int], list[float]] = {}
    committer: dict[tuple[str, str, int], list[float]] = {}

    def add(name: str, source: str, workers: int, value: float) -> None:
        rates.setdefault((name, source, workers), []).append(value)

    for _ in range(args.rounds):  # alternating, so machine load hits every variant alike
        add("encode limit", "", 1, encode_rate(all_frames))
        for algorithm in ("sha256", "xxh3_128"):
            add(f"content hash alone ({algorithm})", "", 1, hash_rate(episodes, algorithm))
        for codec, source in sources.items():
            add("source read alone", codec, 1, read_rate(source, encode=False))
            add("read + encode, no store, no hash", codec, 1, read_rate(source, encode=True))
            for workers, address in variants:
                whole, writing, cpu = ingest_rates(source, workdir, workers, address)
                name = f"ingest, {names[workers, address]}"
                add(name, codec, workers, whole)
                add(f"  its write phase, {names[workers, address]}", codec, workers, writing)
                committer.setdefault((name, codec, workers), []).append(cpu)
    for source in sources.values():
        shutil.rmtree(source)
    limit = statistics.median(rates[("encode limit", "", 1)])
    throughput = []
    for (name, codec, workers), runs in rates.items():
        median = statistics.median(runs)
        row = {"variant": name, "source": codec, "workers": workers, "frames_per_s": median,
               "per_worker_of_limit": median / (workers * limit), "runs": runs}  # fmt: skip
        if (name, codec, workers) in committer and workers > 1:
            row["committer_cores"] = statistics.median(committer[name, codec, workers])
        throughput.append(row)
    print(f"Throughput: {args.ingest_episodes} episodes x {args.frames} frames, {SIZE}x{SIZE} JPEG store, "
          f"median of {args.rounds} rounds ({os.cpu_count()} CPUs; Ray's start-up is inside its time). "
          "Sources: replay buffers, Blosc-zstd with bit-shuffle (as PushT ships), Blosc-lz4 "
          "(diffusion_policy's default), none (raw frames)")  # fmt: skip
    print(
        f"{'variant':<42} {'source':>6} {'frames/s':>10} {'per worker / encode limit':>26} {'committer (cores)':>18}"
    )
    for row in throughput:
        cores = f"{row['committer_cores']:.2f}" if "committer_cores" in row else ""
        print(f"{row['variant']:<42} {row['source']:>6} {row['frames_per_s']:>10.0f} "
              f"{row['per_worker_of_limit']:>26.2f} {cores:>18}")  # fmt: skip
    return throughput


def append_part(workdir: Path, episodes: list[np.ndarray], rng: np.random.Generator, args) -> dict:
    """Seconds per appended episode as the store grows (pre-encoded frames, batched transactions)."""
    from demoscale.datasets.codecs import codec_options, encode_frame

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
    small, large = side_by_side_costs(
        workdir, workdir / "scale.zarr", pool, 1000, args.side_batch, args.side_rounds
    )
    # Medians over a few batches around each point: one batch's time is at the mercy of the machine.
    at_1000 = statistics.median(cost for n, cost in costs if n <= max(1500, costs[0][0]))
    last = statistics.median(cost for _, cost in costs[-3:])
    print(f"\nAppend cost: {args.episodes} episodes in transactions of {args.batch} (frames pre-encoded)")
    print(f"{'episodes in store':>18} {'ms per episode':>15}")
    for n, cost in costs:
        if n in (args.batch, 1000, args.episodes) or n % max(args.batch, args.episodes // 10) == 0:
            print(f"{n:>18} {1000 * cost:>15.2f}")
    print(
        f"at 1,000: {1000 * at_1000:.2f} ms; at {args.episodes:,}: {1000 * last:.2f} ms; ratio {last / at_1000:.2f}"
    )
    print(
        f"side by side, {args.side_rounds} alternating transactions of {args.side_batch}: "
        f"{1000 * statistics.median(small):.2f} ms per episode at 1,000, "
        f"{1000 * statistics.median(large):.2f} ms at {args.episodes:,}; "
        f"ratio {statistics.median(large) / statistics.median(small):.2f} (medians)"
    )
    print(f"one by one (each its own commit), first {args.single}: {1000 * single:.2f} ms per episode")
    print(f"store: {store_bytes / 1e6:.0f} MB in {store_files} files")
    return {"episodes": args.episodes, "batch": args.batch, "per_episode_s": costs,
            "at_1000_s": at_1000, "at_end_s": last, "ratio_end_to_1000": last / at_1000,
            "side_by_side": {"batch": args.side_batch, "rounds": args.side_rounds,
                             "at_1000_s": small, "at_end_s": large,
                             "ratio": statistics.median(large) / statistics.median(small)},
            "single_appends_s": single, "single_appends_n": args.single,
            "store_bytes": store_bytes, "store_files": store_files}  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
