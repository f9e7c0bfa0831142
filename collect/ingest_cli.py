"""``demoscale ingest <format> SRC --store DST``: one subcommand per registered source format.

The subcommands are made from the registry (``collect/formats.py``): each format's ``options_type``
fields become its own flags, and every format gets the common ones. A thin shell over
``demoscale.collect.ingest``.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
import typing
from dataclasses import MISSING, Field, asdict, fields

from demoscale.collect.driver import ingest
from demoscale.collect.formats import FORMATS, source_format
from demoscale.collect.source_format import IngestError, IngestLockTimeout, SourceFormat


def _add_option(parser: argparse.ArgumentParser, option: Field, annotation: typing.Any) -> None:
    """A flag for one field of a format's options dataclass (``rate_hz`` -> ``--rate-hz``)."""
    flag = "--" + option.name.replace("_", "-")
    default = None if option.default is MISSING else option.default
    help_ = option.metadata.get("help")
    if annotation is bool:
        parser.add_argument(flag, dest=option.name, action="store_true", default=default, help=help_)
        return
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):  # ``float | None``
        annotation = next(arg for arg in typing.get_args(annotation) if arg is not type(None))
    if typing.get_origin(annotation) is tuple:  # ``tuple[str, ...]``: one or more values
        item = typing.get_args(annotation)[0]
        parser.add_argument(flag, dest=option.name, type=item, nargs="+", default=default, help=help_)
        return
    parser.add_argument(flag, dest=option.name, type=annotation, default=default, help=help_)


def _codec_option(text: str) -> tuple[str, int | str]:
    """``KEY=VALUE`` of ``--image-codec-option``; whole numbers become ints (``gop=16``)."""
    key, equals, value = text.partition("=")
    if not equals or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, int(value) if value.lstrip("-").isdigit() else value


def _add_common(parser: argparse.ArgumentParser, adapter: SourceFormat) -> None:
    from demoscale.datasets.codecs import IMAGE_CODECS

    parser.add_argument("--store", required=True, help="destination episode store (created if absent)")
    parser.add_argument("--env-id", help="environment id of every episode (overrides the directory layout)")
    parser.add_argument("--object-id", help="object id of every episode (overrides the directory layout)")
    parser.add_argument("--task", help="task name of every episode")
    parser.add_argument("--operator", help="who collected the demonstrations")
    parser.add_argument(
        "--manifest", help="CSV with columns source, env_id, object_id, task, operator (per-file ids)"
    )
    parser.add_argument("--max-episodes", type=int, help="ingest only the first N episodes")
    parser.add_argument(
        "--image-codec",
        choices=IMAGE_CODECS,
        help=f"image codec of a new store (default: {adapter.default_image_codec}); h264 and av1 store "
        "each episode as a video",
    )
    parser.add_argument(
        "--image-codec-option",
        type=_codec_option,
        action="append",
        metavar="KEY=VALUE",
        help="an encoder option of a new store's image codec, e.g. gop=16 or crf=20 (h264, av1), "
        "level=95 (jpeg); repeat for several",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="processes for decoding/encoding (default 1); with --address, the Ray CPUs to use "
        "(default: the cluster's)",
    )
    parser.add_argument(
        "--address",
        help="load and encode the episodes as Ray tasks: 'local' (a private local Ray of --workers CPUs), "
        "'auto' or HOST:PORT (a running cluster); this process still writes the store",
    )
    parser.add_argument(
        "--lock-timeout",
        type=float,
        default=None,
        help="seconds to wait while another process writes to the store (default 600)",
    )
    parser.add_argument(
        "--commit-every",
        type=int,
        default=None,
        metavar="N",
        help="commit every N episodes (a failed or killed run keeps its committed batches and a rerun "
        "skips them); default: the whole run is one all-or-nothing commit",
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
    for name in FORMATS:
        adapter = source_format(name)
        # Every format's options show their defaults too.
        subcommand = formats.add_parser(name, help=adapter.summary, formatter_class=HelpFormatter)
        subcommand.add_argument("src", help=adapter.src_help)
        annotations = typing.get_type_hints(adapter.options_type)
        for option in fields(adapter.options_type):
            _add_option(subcommand, option, annotations[option.name])
        _add_common(subcommand, adapter)
    return parser


def run(args: argparse.Namespace):
    """Call the driver for the parsed arguments; returns its IngestSummary."""
    adapter = source_format(args.format)
    values = {option.name: getattr(args, option.name) for option in fields(adapter.options_type)}
    # Several values of one flag arrive as a list; the options dataclass is frozen and keeps tuples.
    options = adapter.options_type(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})
    common = (
        "env_id", "object_id", "task", "operator", "manifest", "max_episodes", "image_codec", "workers",
        "address", "commit_every",
    )  # fmt: skip
    return ingest(
        adapter,
        args.src,
        args.store,
        options,
        **{name: getattr(args, name) for name in common},
        image_codec_options=dict(args.image_codec_option) if args.image_codec_option else None,
        dry_run=args.dry_run,
        progress=not args.no_progress,
        lock_timeout=args.lock_timeout,
    )


def main(argv: list[str]) -> int:
    """Entry point of ``demoscale ingest``; returns the exit status (2 on bad input, as every command;
    1 when the run failed with good input, e.g. the store stayed locked)."""
    args = build_parser().parse_args(argv)
    if args.workers < 1:
        print("demoscale ingest: --workers must be at least 1", file=sys.stderr)
        return 2
    if args.commit_every is not None and args.commit_every < 1:
        print("demoscale ingest: --commit-every must be at least 1", file=sys.stderr)
        return 2
    from demoscale.collect.ray_cluster import ClusterConnectionError

    try:
        summary = run(args)
    except (IngestLockTimeout, ClusterConnectionError) as error:  # the input is fine; the store stayed
        # locked too long, or the cluster cannot be reached
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
