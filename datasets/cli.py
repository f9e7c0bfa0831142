"""``demoscale store``: inspect, validate, repair and label episode stores (a thin shell over EpisodeStore)."""

from __future__ import annotations

import sys

from demoscale.datasets.repair import repair_store
from demoscale.datasets.store import EpisodeStore, StoreError, dumps_info


def _print_info(info: dict) -> None:
    print(f"store      {info['location']}  ({info['format']} v{info['version']})")
    print(f"episodes   {info['n_episodes']}   frames {info['n_frames']}")
    print(
        f"envs       {len(info['envs'])}: {', '.join(info['envs'][:20])}{' ...' if len(info['envs']) > 20 else ''}"
    )
    objects = info["objects"]
    print(f"objects    {len(objects)}: {', '.join(objects[:20])}{' ...' if len(objects) > 20 else ''}")
    per_pair = info["episodes_per_pair"]
    if per_pair:
        print(f"pairs      {info['n_pairs']}   episodes per pair {per_pair['min']}..{per_pair['max']}")
    print(f"tasks      {', '.join(t or '-' for t in info['tasks'])}")
    if info["success_rate"] is not None:
        print(f"success    {info['success_rate']:.3f} (episodes with a known outcome)")
    if info["uncommitted_frames"]:
        print(f"note       {info['uncommitted_frames']} uncommitted frames after the last episode (ignored)")
    print(f"images     codec {info['image_codec']}")
    print()
    print(f"{'key':<28} {'kind':<12} {'shape':<16} {'dtype':<8} {'rate_hz':>8}  units / frame")
    for key, spec in info["features"].items():
        shape = "x".join(str(s) for s in spec["shape"])
        rate = "" if spec["rate_hz"] is None else f"{spec['rate_hz']:g}"
        units = " / ".join(u for u in (spec["units"], spec["frame"]) if u)
        print(f"{key:<28} {spec['kind']:<12} {shape:<16} {spec['dtype']:<8} {rate:>8}  {units}")
    recorded = {key: spec["source"] for key, spec in info["features"].items() if spec.get("source")}
    if recorded:
        print()
        for key, source in recorded.items():
            described = ", ".join(f"{name} {value}" for name, value in source.items())
            print(f"{key:<28} recorded by: {described}")


def main(argv: list[str] | None = None) -> int:
    from demoscale.conventions import (
        EXIT_FAILURE,
        EXIT_OK,
        EXIT_USAGE,
        add_store_argument,
        error,
        make_parser,
        resolve_store,
    )

    parser = make_parser(
        "demoscale store",
        __doc__,
        epilog="also: demoscale store export STORE OUT --format lerobot  (write a LeRobot v3.0 dataset; "
        "demoscale store export --help)",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    where = "store location: directory, .zip or fsspec URL"
    info = commands.add_parser(
        "info",
        help="summarise a store (episodes, frames, envs, objects, features)",
        formatter_class=parser.formatter_class,
    )
    add_store_argument(info, where, positional_alias=True)
    info.add_argument("--json", action="store_true", help="print JSON instead of a table")
    validate = commands.add_parser(
        "validate",
        help="check every invariant of a store, and that every chunk file is present and whole",
        formatter_class=parser.formatter_class,
    )
    add_store_argument(validate, where, positional_alias=True)
    validate.add_argument(
        "--deep",
        action="store_true",
        help="also read every value: decode every frame, decompress every chunk",
    )
    validate.add_argument("--no-progress", action="store_true", help="no progress bar for --deep")
    repair = commands.add_parser(
        "repair",
        help="clean up after a killed writer or creator (uncommitted data, unfinished creation)",
        formatter_class=parser.formatter_class,
    )
    add_store_argument(repair, where, positional_alias=True)
    label = commands.add_parser(
        "label-waypoints",
        help="label waypoints and cache next_waypoint_index",
        formatter_class=parser.formatter_class,
    )
    add_store_argument(label, where, positional_alias=True)
    label.add_argument("--threshold", type=float, required=True, help="reconstruction error threshold")
    label.add_argument("--overwrite", action="store_true", help="replace a cache made with other parameters")
    args = parser.parse_args(argv)
    subparser = {"info": info, "validate": validate, "repair": repair, "label-waypoints": label}[args.command]
    location = resolve_store(subparser, args)
    if args.command == "repair":  # before opening: a store that needs repair may not open
        try:
            actions = repair_store(location)
        except StoreError as err:
            return error("store repair", err, EXIT_FAILURE)
        for action in actions:
            print(f"repaired: {action}")
        if not actions:
            print(f"ok: {location}: nothing to repair")
        return EXIT_OK

    # Exit codes (demoscale.conventions): a store that cannot be opened is an input error (2); a
    # store that opens but fails validation is the command's answer, a failure (1).
    try:
        store = EpisodeStore.open(location)
    except StoreError as err:
        # validate's answer for a store too broken to open is "invalid" (1), like any other finding.
        return error(f"store {args.command}", err, EXIT_FAILURE if args.command == "validate" else EXIT_USAGE)
    try:
        if args.command == "info":
            summary = store.info()
            if args.json:
                print(dumps_info(summary))
            else:
                _print_info(summary)
        elif args.command == "validate":
            store.validate(deep=args.deep, progress=args.deep and not args.no_progress)
            depth = ", every value read" if args.deep else ""
            print(f"ok: {location}: {store.n_episodes} episodes, {store.n_frames} frames{depth}")
        elif args.command == "label-waypoints":
            from demoscale.datasets.waypoints import WaypointError, label_store_waypoints

            try:
                labels = label_store_waypoints(location, args.threshold, overwrite=args.overwrite)
            except WaypointError as err:
                return error("store label-waypoints", err)
            print(f"labelled {len(labels)} frames of {location}")
    except StoreError as err:
        return error(f"store {args.command}", err, EXIT_FAILURE)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
