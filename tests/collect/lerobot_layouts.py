"""Small LeRobot datasets in their real layouts (codebase v2.1 and v3.0), written the way LeRobot
writes them: parquet through pyarrow/pandas, one mp4 per episode encoded with PyAV and, for v3.0,
those mp4s joined by copying their packets into files of several episodes (``from_timestamp`` =
the duration of the episodes before). Independent of demoscale's own LeRobot export, so that the
ingest tests do not check one of our writers against our reader alone.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import av
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

HEIGHT, WIDTH = 24, 32
LOW_DIM = {  # LeRobot name -> (shape, dtype)
    "observation.state": ((6,), "float32"),
    "action": ((6,), "float32"),
    "observation.velocity": ((2,), "float64"),
    "next.reward": ((1,), "float32"),
    "next.done": ((1,), "bool"),
}
TASKS = ("pick the red cube", "push the blue mug")


def smooth_frames(rng: np.random.Generator, length: int) -> np.ndarray:
    """Camera-like frames (gradients and a moving bright square), not noise: a video codec keeps them."""
    ys, xs = np.mgrid[0:HEIGHT, 0:WIDTH]
    base = rng.integers(30, 120, size=3)
    frames = np.empty((length, HEIGHT, WIDTH, 3), np.uint8)
    for t in range(length):
        frame = np.stack([base[c] + 2 * xs + (c + 1) * ys + 2 * t for c in range(3)], axis=-1)
        x0 = (2 * t) % (WIDTH - 8)
        frame[6:14, x0 : x0 + 8] = 235
        frames[t] = np.clip(frame, 0, 255)
    return frames


def make_episodes(seed: int, lengths: list[int], cameras: tuple[str, ...]) -> list[dict]:
    """Episodes as {LeRobot name: (T, *shape) values, camera name: (T, H, W, 3) frames, "task": str}."""
    rng = np.random.default_rng(seed)
    episodes = []
    for index, length in enumerate(lengths):
        episode: dict = {"task": TASKS[index % len(TASKS)]}
        for name, (shape, dtype) in LOW_DIM.items():
            if dtype == "bool":
                values = np.zeros((length, *shape), bool)
                values[-1] = True
            else:
                values = rng.normal(size=(length, *shape)).astype(dtype)
            episode[name] = values
        for camera in cameras:
            episode[f"observation.images.{camera}"] = smooth_frames(rng, length)
        episodes.append(episode)
    return episodes


def encode_mp4(path: Path, frames: np.ndarray, fps: int, codec: str) -> Path:
    """One episode's frames as an mp4, frame t shown at t / fps (LeRobot's encode_video_frames)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    options = {"g": "2", "crf": "30"} | ({"preset": "12"} if codec == "libsvtav1" else {})
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=fps, options=options)
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        for image in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        container.mux(stream.encode())
    return path


def duration_s(path: Path) -> float:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return float(stream.duration * stream.time_base)


def concatenate_mp4(paths: list[Path], out: Path) -> None:
    """Join mp4s by copying their packets (ffmpeg's concat demuxer), as LeRobot builds its v3.0 files."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".ffconcat", delete=False) as listing:
        listing.write("ffconcat version 1.0\n" + "".join(f"file '{p.resolve()}'\n" for p in paths))
    with av.open(listing.name, format="concat", options={"safe": "0"}) as source:
        with av.open(str(out), "w", options={"movflags": "faststart"}) as target:
            stream_in = source.streams.video[0]
            stream_out = target.add_stream_from_template(template=stream_in, opaque=True)
            stream_out.time_base = stream_in.time_base
            for packet in source.demux(stream_in):
                if packet.dts is None:
                    continue
                packet.stream = stream_out
                target.mux(packet)
    Path(listing.name).unlink()


def _info(
    version: str,
    fps: int,
    episodes: list[dict],
    cameras: tuple[str, ...],
    codec: str,
    image_cameras: tuple[str, ...],
    **paths,
) -> dict:
    features: dict = {}
    for name, (shape, dtype) in LOW_DIM.items():
        features[name] = {"dtype": dtype, "shape": list(shape), "names": None, "fps": fps}
    features["observation.state"]["names"] = [f"joint_{i}" for i in range(6)]
    for camera in cameras:
        features[f"observation.images.{camera}"] = {
            "dtype": "video",
            "shape": [HEIGHT, WIDTH, 3],
            "names": ["height", "width", "channels"],
            "info": {"video.height": HEIGHT, "video.width": WIDTH, "video.codec": codec, "video.pix_fmt": "yuv420p",
                     "video.is_depth_map": False, "video.fps": fps, "video.channels": 3, "has_audio": False},
        }  # fmt: skip
    for camera in image_cameras:
        features[f"observation.images.{camera}"] = {
            "dtype": "image", "shape": [HEIGHT, WIDTH, 3], "names": ["height", "width", "channels"]
        }  # fmt: skip
    for name, dtype in (("timestamp", "float32"), ("frame_index", "int64"), ("episode_index", "int64"),
                        ("index", "int64"), ("task_index", "int64")):  # fmt: skip
        features[name] = {"dtype": dtype, "shape": [1], "names": None}
    frames = sum(len(e["action"]) for e in episodes)
    return {"codebase_version": version, "robot_type": "so100", "total_episodes": len(episodes),
            "total_frames": frames, "total_tasks": len(TASKS), "chunks_size": 1000, "fps": fps,
            "splits": {"train": f"0:{len(episodes)}"}, **paths, "features": features}  # fmt: skip


def _frames_table(
    episodes: list[dict], indices: list[int], first_index: int, fps: int, fixed_lists: bool
) -> pa.Table:
    """The data parquet rows of some episodes: vectors as lists (fixed-size as datasets 4 writes them,
    or variable lists as older files have), shape-(1,) features as scalars."""
    columns: dict[str, list] = {name: [] for name in (*LOW_DIM, "timestamp", "frame_index", "episode_index",
                                                       "index", "task_index")}  # fmt: skip
    index = first_index
    for episode_index in indices:
        episode = episodes[episode_index]
        length = len(episode["action"])
        for name in LOW_DIM:
            columns[name].append(episode[name])
        columns["timestamp"].append((np.arange(length) / fps).astype(np.float32))
        columns["frame_index"].append(np.arange(length))
        columns["episode_index"].append(np.full(length, episode_index))
        columns["index"].append(np.arange(index, index + length))
        columns["task_index"].append(np.full(length, TASKS.index(episode["task"])))
        index += length
    arrays = {}
    for name, parts in columns.items():
        values = np.concatenate(parts)
        shape = LOW_DIM.get(name, ((1,), None))[0]
        if shape == (1,):
            arrays[name] = pa.array(values.reshape(len(values)))
        elif fixed_lists:
            arrays[name] = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), shape[0])
        else:
            arrays[name] = pa.array(list(values))
    return pa.table(arrays)


def write_v30(
    root: Path,
    episodes: list[dict],
    cameras: tuple[str, ...],
    data_files: list[list[int]],
    video_files: list[list[int]],
    fps: int = 10,
    codec: str = "libsvtav1",
) -> Path:
    """A v3.0 dataset: several episodes per data file and per video file (the two split differently)."""
    meta = root / "meta"
    meta.mkdir(parents=True)
    rows = [
        {"episode_index": i, "tasks": [e["task"]], "length": len(e["action"])} for i, e in enumerate(episodes)
    ]
    index = 0
    for file_index, members in enumerate(data_files):
        table = _frames_table(episodes, members, index, fps, fixed_lists=True)
        path = root / f"data/chunk-000/file-{file_index:03d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)
        for i in members:
            rows[i].update({"data/chunk_index": 0, "data/file_index": file_index, "dataset_from_index": index,
                            "dataset_to_index": index + rows[i]["length"]})  # fmt: skip
            index += rows[i]["length"]
    scratch = Path(tempfile.mkdtemp(dir=root))
    for camera in cameras:
        key = f"observation.images.{camera}"
        for file_index, members in enumerate(video_files):
            parts, start = [], 0.0
            for i in members:
                part = encode_mp4(scratch / f"{camera}_{i}.mp4", episodes[i][key], fps, codec)
                stop = start + duration_s(part)
                rows[i].update({f"videos/{key}/chunk_index": 0, f"videos/{key}/file_index": file_index,
                                f"videos/{key}/from_timestamp": start, f"videos/{key}/to_timestamp": stop})  # fmt: skip
                parts.append(part)
                start = stop
            concatenate_mp4(parts, root / f"videos/{key}/chunk-000/file-{file_index:03d}.mp4")
    for part in scratch.iterdir():
        part.unlink()
    scratch.rmdir()
    for row, episode in zip(rows, episodes, strict=True):  # per-episode statistics, as LeRobot keeps them
        row["stats/action/mean"] = episode["action"].mean(axis=0).tolist()
        row["meta/episodes/chunk_index"], row["meta/episodes/file_index"] = 0, 0
    (meta / "episodes/chunk-000").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), meta / "episodes/chunk-000/file-000.parquet")
    pd.DataFrame({"task_index": range(len(TASKS))}, index=list(TASKS)).to_parquet(meta / "tasks.parquet")
    info = _info("v3.0", fps, episodes, cameras, "av1" if codec == "libsvtav1" else "h264", (),
                 data_path="data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
                 video_path="videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4")  # fmt: skip
    info |= {"data_files_size_in_mb": 100, "video_files_size_in_mb": 200}
    (meta / "info.json").write_text(json.dumps(info, indent=4))
    return root


def _png(image: np.ndarray) -> bytes:
    import imagecodecs

    return imagecodecs.png_encode(image)


def write_v21(
    root: Path,
    episodes: list[dict],
    cameras: tuple[str, ...],
    fps: int = 10,
    codec: str = "libx264",
    image_cameras: tuple[str, ...] = (),
) -> Path:
    """A v2.1 dataset: one parquet and one mp4 per camera for each episode, and the jsonl metadata.
    ``image_cameras`` are LeRobot ``image`` features instead: PNG files in the parquet (a struct of
    ``bytes`` and ``path``, as the datasets Image feature writes it)."""
    meta = root / "meta"
    meta.mkdir(parents=True)
    index = 0
    for episode_index, episode in enumerate(episodes):
        table = _frames_table(episodes, [episode_index], index, fps, fixed_lists=False)
        for camera in image_cameras:
            key = f"observation.images.{camera}"
            images = [{"bytes": _png(image), "path": None} for image in episode[key]]
            table = table.append_column(
                key, pa.array(images, pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
            )
        path = root / f"data/chunk-000/episode_{episode_index:06d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)
        index += len(episode["action"])
        for camera in cameras:
            key = f"observation.images.{camera}"
            encode_mp4(
                root / f"videos/chunk-000/{key}/episode_{episode_index:06d}.mp4", episode[key], fps, codec
            )
    lines = [
        {"episode_index": i, "tasks": [e["task"]], "length": len(e["action"])} for i, e in enumerate(episodes)
    ]
    (meta / "episodes.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    tasks = [{"task_index": i, "task": task} for i, task in enumerate(TASKS)]
    (meta / "tasks.jsonl").write_text("".join(json.dumps(line) + "\n" for line in tasks))
    stats = [{"episode_index": i, "stats": {"action": {"mean": e["action"].mean(axis=0).tolist()}}}
             for i, e in enumerate(episodes)]  # fmt: skip
    (meta / "episodes_stats.jsonl").write_text("".join(json.dumps(line) + "\n" for line in stats))
    info = _info("v2.1", fps, episodes, cameras, "h264" if codec == "libx264" else "av1", image_cameras,
                 data_path="data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
                 video_path="videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4")  # fmt: skip
    info |= {"total_chunks": 1, "total_videos": len(episodes) * len(cameras)}
    (meta / "info.json").write_text(json.dumps(info, indent=4))
    return root


def decoded_video(path: Path) -> np.ndarray:
    """Every frame of an mp4, decoded with PyAV in presentation order."""
    with av.open(str(path)) as container:
        frames = sorted(
            ((frame.pts, frame.to_ndarray(format="rgb24")) for frame in container.decode(video=0)),
            key=lambda item: item[0],
        )
    return np.stack([image for _, image in frames])
