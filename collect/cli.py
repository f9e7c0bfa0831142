"""``demoscale ingest <format> SRC --store DST``: a thin shell over ``demoscale.collect.ingest_*``."""

from __future__ import annotations

import argparse
import functools
import json
import sys
from dataclasses import asdict

from demoscale.collect.ingest import IngestError, IngestLockTimeout


def _common(parser: argparse.ArgumentParser, ids: bool = True, manifest: bool = False) -> None:
    parser.add_argument("--store", required=True, help="destination episode store (created if absent)")
    if ids:
        parser.add_argument(
            "--env-id", help="environment id of every episode (overrides the directory layout)"
        )
        parser.add_argument("--object-id", help="object id of every episode (overrides the directory layout)")
        parser.add_argument("--task", help="task name of every episode")
        parser.add_argument("--operator", help="who collected the demonstrations")
    if manifest:
        parser.add_argument(
            "--manifest", help="CSV with columns source, env_id, object_id, task, operator (per-file ids)"
        )
    parser.add_argument(
        "--image-codec",
        choices=["jpeg", "png", "jpegxl"],
        help="image codec of a new store (default: jpeg; png for replay buffers)",
    )
    parser.add_argument("--workers", type=int, default=1, help="processes for decoding/encoding (default 1)")
    parser.add_argument(
        "--lock-timeout",
        type=float,
        default=None,
        help="seconds to wait while another process writes to the store (default 600)",
    )
    parser.add_argument("--dry-run", action="store_true", help="validate and report; do not touch the store")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def build_parser() -> argparse.ArgumentParser:
    from demoscale.conventions import HelpFormatter

    parser = argparse.ArgumentParser(
        prog="demoscale ingest",
        description="Ingest demonstrations into an episode store.",
        formatter_class=HelpFormatter,
    )
    formats = parser.add_subparsers(dest="format", required=True, metavar="FORMAT")
    # Every format's options show their defaults too.
    formats.add_parser = functools.partial(formats.add_parser, formatter_class=HelpFormatter)

    umi = formats.add_parser("umi", help="UMI dataset.zarr.zip files or a <task>/env_<i>/object_<j>/ tree")
    umi.add_argument("src", help="a dataset.zarr.zip or a directory searched for *.zarr.zip")
    umi.add_argument(
        "--rate-hz", type=float, help="frame rate (default: the zip's rate_hz attribute, else 60)"
    )
    _common(umi, manifest=True)

    session = formats.add_parser(
        "umi-session", help="a raw UMI session: dataset_plan.pkl + demos/*/raw_video.mp4"
    )
    session.add_argument("src", help="the session directory")
    session.add_argument("--resolution", type=int, default=224, help="square image size (default 224)")
    session.add_argument("--rate-hz", type=float, help="frame rate (default: from the plan's timestamps)")
    session.add_argument(
        "--trust-pickle",
        action="store_true",
        help="unpickle a plan that needs more than plain containers and numpy arrays; "
        "this runs whatever code the pickle names: only for sessions you made or trust",
    )
    _common(session)

    joylo = formats.add_parser("joylo", help="JoyLo per-episode HDF5 files or a merged BRS file")
    joylo.add_argument("src", help="an .h5/.hdf5 file or a directory searched for them")
    _common(joylo, manifest=True)

    robomimic = formats.add_parser("robomimic", help="a robomimic HDF5 file")
    robomimic.add_argument("src", help="the .hdf5 file")
    robomimic.add_argument(
        "--rate-hz", type=float, help="control rate (default: the file's control_freq, else 20)"
    )
    _common(robomimic)

    replay = formats.add_parser("replay-buffer", help="a diffusion_policy replay buffer (.zarr or .zarr.zip)")
    replay.add_argument("src", help="the replay buffer directory or zip")
    replay.add_argument("--rate-hz", type=float, default=10.0, help="frame rate (default 10)")
    replay.add_argument("--max-episodes", type=int, help="ingest only the first N episodes")
    _common(replay)
    replay.set_defaults(image_codec="png")  # lossless: stored frames equal the source's
    return parser


def run(args: argparse.Namespace):
    """Call the ingester the parsed arguments ask for; returns its IngestSummary."""
    common = {
        "image_codec": args.image_codec,
        "workers": args.workers,
        "dry_run": args.dry_run,
        "progress": not args.no_progress,
        "lock_timeout": args.lock_timeout,
    }
    ids = {"env_id": args.env_id, "object_id": args.object_id, "task": args.task, "operator": args.operator}
    if args.format == "umi":
        from demoscale.collect.umi import ingest_umi

        return ingest_umi(args.src, args.store, manifest=args.manifest, rate_hz=args.rate_hz, **ids, **common)
    if args.format == "umi-session":
        from demoscale.collect.umi_session import ingest_umi_session

        return ingest_umi_session(
            args.src,
            args.store,
            resolution=args.resolution,
            rate_hz=args.rate_hz,
            trust_pickle=args.trust_pickle,
            **ids,
            **common,
        )
    if args.format == "joylo":
        from demoscale.collect.joylo import ingest_joylo

        return ingest_joylo(args.src, args.store, manifest=args.manifest, **ids, **common)
    if args.format == "robomimic":
        from demoscale.collect.robomimic import ingest_robomimic

        return ingest_robomimic(args.src, args.store, rate_hz=args.rate_hz, **ids, **common)
    from demoscale.collect.replay_buffer import ingest_replay_buffer

    return ingest_replay_buffer(
        args.src, args.store, rate_hz=args.rate_hz, max_episodes=args.max_episodes, **ids, **common
    )


def main(argv: list[str]) -> int:
    """Entry point of ``demoscale ingest``; returns the exit status (2 on bad input, as every command)."""
    args = build_parser().parse_args(argv)
    if args.workers < 1:
        print("demoscale ingest: --workers must be at least 1", file=sys.stderr)
        return 2
    try:
        summary = run(args)
    except IngestLockTimeout as error:  # the input is fine; another writer kept the store too long
        print(f"demoscale ingest: error: {error}", file=sys.stderr)
        return 1
    except IngestError as error:  # the sources (or the store) given cannot be ingested: an input error
        print(f"demoscale ingest: error: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({**asdict(summary), "frames_per_second": summary.frames_per_second}, indent=2))
    else:
        print(summary.describe())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
