"""Video decoding for raw UMI sessions: torchcodec vs PyAV vs OpenCV on the same H.264 files.

Synthetic videos are written with PyAV (libx264, yuv420p, 60 fps, a key frame every second,
moving gradients plus noise so the encoder has real work: GoPro footage is never flat) at each
``--sizes`` entry. Each decoder then reads frames ``[--start, --end)`` (default 60:600: a 10 s
video without its first second) as the session reader does with it: OpenCV and PyAV decode
sequentially from the start of the file, torchcodec indexes the frames exactly and seeks to the
key frame before the range. Two forms:

- ``decode``: RGB frames at the video's size (what the decoder costs);
- ``reader``: ``demoscale.collect.umi_session.read_video_frames`` with that decoder (decode,
  centre-crop to a square, area-resize to ``--resolution``), what ingestion pays per frame.

Reported per decoder and size: frames/s of wall time and CPU time per delivered frame (the
process's CPU time, all threads, so a decoder that spreads over cores is not flattered), the
median of ``--repeats`` runs, the decoders taking turns within each repeat. Every decoder uses
``--threads`` FFmpeg threads (default 1, as the reader does: ingestion runs one decoder per
worker process, ``--workers N``, so per-process CPU per frame is what counts). Decoders that do
not import here are listed as unavailable, with the reason.

Prints a table and writes the numbers as JSON (``benchmarks/report.py``: ``--json [PATH]``).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from report import add_json_option, emit_json


def write_video(path: Path, width: int, height: int, frames: int, fps: int = 60) -> Path:
    """An H.264 mp4 of ``frames`` frames: a gradient that drifts every frame, plus sensor-like noise."""
    import av

    rng = np.random.default_rng(0)
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        # A key frame every second, as GoPro footage has: a range can be reached by seeking.
        stream.options = {"preset": "veryfast", "crf": "23", "g": str(fps)}
        for t in range(frames):
            image = np.empty((height, width, 3), np.float32)
            image[..., 0] = 128 + 100 * np.sin((xs + 4 * t) / 40.0)
            image[..., 1] = 128 + 100 * np.cos((ys - 3 * t) / 30.0)
            image[..., 2] = (xs + ys + 5 * t) % 256
            image += rng.normal(0, 6, image.shape)
            frame = av.VideoFrame.from_ndarray(np.clip(image, 0, 255).astype(np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def decode_rgb(decoder: str, path: Path, start: int, end: int, threads: int) -> int:
    """Decode frames [start, end) to RGB arrays with one decoder; returns how many were delivered."""
    if decoder == "opencv":
        import cv2

        capture = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG, [cv2.CAP_PROP_N_THREADS, threads])
        count = 0
        try:
            for index in range(end):
                ok, frame = capture.read()
                if not ok:
                    break
                if index >= start:
                    cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)
                    count += 1
        finally:
            capture.release()
        return count
    if decoder == "pyav":
        import av

        count = 0
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            stream.thread_type, stream.thread_count = "AUTO", threads
            for index, frame in enumerate(container.decode(stream)):
                if index >= end:
                    break
                if index >= start:
                    frame.to_ndarray(format="rgb24")
                    count += 1
        return count
    if decoder == "torchcodec":
        from demoscale.collect.umi_session import torchcodec_batch
        from torchcodec.decoders import VideoDecoder

        video = VideoDecoder(str(path), dimension_order="NHWC", num_ffmpeg_threads=threads)
        batch = torchcodec_batch(video.metadata.width, video.metadata.height)  # as the reader asks
        count = 0
        for first in range(start, end, batch):
            count += int(video.get_frames_in_range(first, min(first + batch, end)).data.shape[0])
        return count
    raise ValueError(decoder)


def timed(run: Callable[[], int]) -> tuple[float, float]:
    """(frames/s of wall time, CPU ms per frame) of one run."""
    wall, process = time.perf_counter(), time.process_time()
    frames = run()
    wall, process = time.perf_counter() - wall, time.process_time() - process
    return frames / wall, 1000 * process / frames


def measure(runs: dict[str, Callable[[], int]], repeats: int) -> dict[str, dict[str, float]]:
    """Per run: median frames/s and CPU ms per frame. The runs alternate within each repeat (after
    one warm-up each), so that a change of the machine's load falls on all of them alike."""
    for run in runs.values():
        run()
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            samples[name].append(timed(run))
    return {
        name: {
            "frames_per_s": statistics.median(rate for rate, _ in values),
            "cpu_ms_per_frame": statistics.median(cpu for _, cpu in values),
        }
        for name, values in samples.items()
    }


def _reader_frames(video: Path, args: argparse.Namespace, decoder: str) -> int:
    from demoscale.collect.umi_session import read_video_frames

    return len(read_video_frames(video, args.start, args.end, args.resolution, decoder=decoder))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", nargs="+", default=["640x480", "1280x720"], help="WIDTHxHEIGHT")
    parser.add_argument("--frames", type=int, default=600, help="frames per synthetic video")
    parser.add_argument("--start", type=int, default=60, help="first frame of the range read")
    parser.add_argument("--end", type=int, default=600, help="end (exclusive) of the range read")
    parser.add_argument("--resolution", type=int, default=224, help="the reader's output size")
    parser.add_argument("--threads", type=int, default=1, help="FFmpeg threads of every decoder")
    parser.add_argument("--repeats", type=int, default=5)
    add_json_option(parser)
    args = parser.parse_args(argv)

    from demoscale.collect.umi_session import VIDEO_DECODERS, video_decoder_problems

    problems = video_decoder_problems()
    available = [name for name in VIDEO_DECODERS if problems.get(name) is None]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            width, height = (int(v) for v in size.split("x"))
            video = write_video(Path(tmp) / f"{size}.mp4", width, height, args.frames)
            runs: dict[str, Callable[[], int]] = {}
            for name in available:
                runs[f"{name}/decode"] = functools.partial(
                    decode_rgb, name, video, args.start, args.end, args.threads
                )
                runs[f"{name}/reader"] = functools.partial(_reader_frames, video, args, name)
            for run, numbers in measure(runs, args.repeats).items():
                name, form = run.split("/")
                results.setdefault(size, {}).setdefault(name, {})[form] = numbers

    print(f"frames {args.start}:{args.end} of {args.frames}, H.264, {args.threads} FFmpeg thread(s)")
    print(f"{'size':<10}{'decoder':<12}{'decode f/s':>12}{'CPU ms/f':>10}{'reader f/s':>12}{'CPU ms/f':>10}")
    for size, by_decoder in results.items():
        for name, numbers in by_decoder.items():
            d, r = numbers["decode"], numbers["reader"]
            print(
                f"{size:<10}{name:<12}{d['frames_per_s']:>12.0f}{d['cpu_ms_per_frame']:>10.2f}"
                f"{r['frames_per_s']:>12.0f}{r['cpu_ms_per_frame']:>10.2f}"
            )
    for name, problem in problems.items():
        if problem is not None:
            print(f"{name}: unavailable ({problem})")
    emit_json(
        "video_decode",
        {
            "config": {k: v for k, v in vars(args).items() if k != "json"},
            "results": results,
            "unavailable": {name: problem for name, problem in problems.items() if problem is not None},
        },
        args.json,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
