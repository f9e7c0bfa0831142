"""``demoscale store export STORE OUT --format lerobot``: an episode store as a LeRobot v3.0 dataset.

A thin shell over ``demoscale.collect.export_lerobot`` (``collect/lerobot_export.py``). It lives in
``collect`` because the store package imports none of ours; the dispatcher routes the two words
``store export`` here.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

FORMATS = ("lerobot",)


def _name_pair(text: str) -> tuple[str, str]:
    key, sep, name = text.partition("=")
    if not sep or not key or not name:
        raise argparse.ArgumentTypeError(f"expected STORE_KEY=LEROBOT_NAME, got {text!r}")
    return key, name


def build_parser() -> argparse.ArgumentParser:
    from demoscale.collect.lerobot_export import (
        DATA_FILE_SIZE_MB,
        DEFAULT_GOP,
        VIDEO_CODECS,
        VIDEO_FILE_SIZE_MB,
    )
    from demoscale.conventions import make_parser

    parser = make_parser(
        "demoscale store export",
        "Write an episode store in another format: a LeRobot v3.0 dataset (parquet + mp4; layout in "
        "collect/lerobot_export.py). Low-dim values are written exactly, image keys as video.",
    )
    parser.add_argument("first", metavar="STORE", help="the store (with --store: OUT)")
    parser.add_argument("second", nargs="?", metavar="OUT", help="the dataset directory to write")
    parser.add_argument("--store", default=None, help="the store, instead of the positional STORE")
    parser.add_argument("--format", choices=FORMATS, default="lerobot", help="what to write")
    parser.add_argument("--features", nargs="+", metavar="KEY", help="export only these store keys")
    parser.add_argument(
        "--episodes", nargs="+", type=int, metavar="INDEX", help="export only these episodes (store indices)"
    )
    parser.add_argument(
        "--name",
        action="append",
        type=_name_pair,
        default=[],
        metavar="KEY=NAME",
        help="the LeRobot name of a store key (repeatable); default: the name it was ingested from, else the key",
    )
    parser.add_argument("--video-codec", choices=sorted(VIDEO_CODECS), default="h264", help="video codec")
    parser.add_argument(
        "--crf", type=int, default=None, help="video quality, lower is better (default: h264 23, av1 30)"
    )
    parser.add_argument("--gop", type=int, default=DEFAULT_GOP, help="frames from one key frame to the next")
    parser.add_argument(
        "--fps", type=float, default=None, help="frame rate, where the store's keys record none"
    )
    parser.add_argument("--robot-type", default=None, help="robot_type of info.json")
    parser.add_argument(
        "--data-file-size-mb",
        type=float,
        default=DATA_FILE_SIZE_MB,
        help="data parquet files roll over past this size",
    )
    parser.add_argument(
        "--video-file-size-mb",
        type=float,
        default=VIDEO_FILE_SIZE_MB,
        help="mp4 files roll over past this size",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    return parser


def main(argv: list[str]) -> int:
    """Entry point of ``demoscale store export``; 2 for what cannot be exported (the store, a key, OUT
    existing), 1 when writing failed."""
    from demoscale.collect.lerobot_export import ExportError, export_lerobot
    from demoscale.conventions import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, error

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.store is not None:
        if args.second is not None:
            parser.error("two stores given: the positional STORE and --store")
        store, out = args.store, args.first
    elif args.second is not None:
        store, out = args.first, args.second
    else:
        parser.error("give STORE and OUT (the dataset directory to write)")
    try:
        summary = export_lerobot(
            store,
            out,
            features=args.features,
            episodes=args.episodes,
            names=dict(args.name),
            video_codec=args.video_codec,
            crf=args.crf,
            gop=args.gop,
            fps=args.fps,
            robot_type=args.robot_type,
            data_file_size_mb=args.data_file_size_mb,
            video_file_size_mb=args.video_file_size_mb,
            overwrite=args.overwrite,
            progress=not args.no_progress,
        )
    except ExportError as problem:
        return error("store export", problem, EXIT_USAGE)
    except OSError as problem:  # the disk, or an encoder that failed: good input, the run failed
        return error("store export", f"writing failed: {problem}", EXIT_FAILURE)
    print(json.dumps(asdict(summary), indent=2) if args.json else summary.describe())
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
