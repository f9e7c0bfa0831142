"""``demoscale collect sim``: scripted demonstrations in simulation, in raw source formats."""

from __future__ import annotations

import argparse
import json
import sys

from demoscale.eval.ids import IdRangeError
from demoscale.eval.tasks import UnknownTaskError, task_names


def build_parser() -> argparse.ArgumentParser:
    from demoscale.conventions import HelpFormatter

    parser = argparse.ArgumentParser(
        prog="demoscale collect", description=__doc__, formatter_class=HelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser(
        "sim",
        formatter_class=HelpFormatter,
        help="collect scripted expert demos (only successful ones unless --keep-failed)",
        description="Writes <out>/<task>/env_<i>/object_<j>/ in the task family's raw format "
        "(UMI dataset.zarr.zip for tabletop tasks); bring them into a store with 'demoscale ingest'.",
    )
    sim.add_argument("--task", required=True, help=f"one of: {', '.join(task_names())}")
    sim.add_argument(
        "--envs", type=int, required=True, help="number of environments (first ids of the split)"
    )
    sim.add_argument("--objects", type=int, required=True, help="number of objects per environment")
    sim.add_argument("--demos-per-pair", type=int, required=True)
    sim.add_argument("--out", required=True, help="output directory")
    sim.add_argument("--workers", type=int, default=1, help="processes")
    sim.add_argument("--split", default="train", choices=["train", "unseen"], help="id range")
    sim.add_argument("--seed", type=int, default=0, help="collection seed")
    sim.add_argument("--image-size", type=int, default=96, help="square image size of the cameras")
    sim.add_argument("--cameras", nargs="+", default=None, help="tabletop cameras, e.g. wrist or scene")
    sim.add_argument(
        "--pairing",
        default="grid",
        choices=["grid", "unique"],
        help="grid: every env x object; unique: object k only in environment k (needs --envs == --objects)",
    )
    sim.add_argument("--keep-failed", action="store_true", help="keep failed expert episodes too")
    sim.add_argument(
        "--action-noise",
        type=float,
        nargs="+",
        default=[0.0],
        metavar="STD",
        help="standard deviation (action units; one value, or one per action dimension) of Gaussian "
        "noise added to every executed expert command, DART-style (the JoyLo label stays its command)",
    )
    sim.add_argument(
        "--noise-phases",
        nargs="+",
        default=None,
        metavar="PHASE",
        help="inject the action noise only while the expert is in these phases (whole-body experts: "
        "drive, reach, gripper, hold, tuck); default: every step",
    )
    sim.add_argument(
        "--expert-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting of the task's expert (repeatable), e.g. the whole-body experts' standoff_range, "
        "lateral_range, yaw_range: half-widths (m, m, rad) of where the base stops at the shelf",
    )
    sim.add_argument("--json", action="store_true", help="print the summary as JSON")
    return parser


def parse_expert_options(items: list[str]) -> dict[str, float]:
    """``KEY=VALUE`` strings -> {key: float(value)}; ValueError naming a malformed item."""
    options: dict[str, float] = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            if not (sep and key.strip()):
                raise ValueError
            options[key.strip()] = float(value)
        except ValueError:
            raise ValueError(
                f"--expert-option {item!r}: expected KEY=NUMBER, e.g. lateral_range=0.1"
            ) from None
    return options


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from demoscale.eval.collect_sim import collect_sim, summary_lines

    options = {"cameras": args.cameras} if args.cameras else None
    try:
        expert_options = parse_expert_options(args.expert_option)
        result = collect_sim(
            args.task,
            args.envs,
            args.objects,
            args.demos_per_pair,
            args.out,
            workers=args.workers,
            split=args.split,
            seed=args.seed,
            image_size=args.image_size,
            keep_failed=args.keep_failed,
            env_options=options,
            pairing=args.pairing,
            action_noise=args.action_noise[0] if len(args.action_noise) == 1 else args.action_noise,
            noise_phases=args.noise_phases,
            expert_options=expert_options,
        )
    except (UnknownTaskError, IdRangeError, ValueError) as error:
        print(f"demoscale collect sim: error: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(
            json.dumps(
                {
                    "task": result.task,
                    "demos": result.n_demos,
                    "pairs": len(result.pairs),
                    "expert_success_rate": result.expert_success_rate,
                    "out": result.out_dir,
                }
            )
        )
    else:
        print("\n".join(summary_lines(result)))
    return 0
