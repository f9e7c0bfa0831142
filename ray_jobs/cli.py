"""``demoscale sweep``: run a sweep from a YAML file (a thin shell over ``run_sweep``)."""

from __future__ import annotations

import sys

from demoscale.conventions import (
    EXIT_FAILURE,
    EXIT_OK,
    add_config_arguments,
    add_store_argument,
    config_yaml,
    error,
    make_parser,
    parse_with_overrides,
)

DESCRIPTION = """Sweep policy training over environment/object/demo counts on Ray Tune.
One trial = choose a nested subset of the store, train, evaluate on held-out envs/objects.
Rows land in OUTPUT/results.csv|parquet (and rollouts.csv|parquet) as each trial finishes.

Any key of the sweep file can be overridden: --budget.steps 200, --grid.seed '[0, 1, 2]',
--set eval.episodes=20; --print-config shows the result without running it."""


def build_parser():
    parser = make_parser("demoscale sweep", DESCRIPTION)
    add_config_arguments(parser, "sweep YAML (see configs/sweeps/); required")
    add_store_argument(parser, "episode store (overrides the file's 'store')")
    parser.add_argument(
        "--address",
        default=None,
        help="'local' (default: a private Ray instance), 'auto', HOST:PORT or ray://HOST:PORT of a cluster",
    )
    parser.add_argument("--storage", default=None, help="output folder or fsspec URL (overrides 'output')")
    parser.add_argument("--resume", action="store_true", help="run only trials without a row in results.csv")
    parser.add_argument(
        "--logger",
        default=None,
        choices=["csv", "tensorboard", "wandb", "mlflow"],
        help="experiment tracking of every trial (group = sweep name, run = trial id; overrides 'logger')",
    )
    return parser


def main(argv: list[str]) -> int:
    parser = build_parser()
    args, overrides = parse_with_overrides(parser, argv)
    if not args.config:
        parser.error("--config is required (a sweep YAML, see configs/sweeps/)")
    from demoscale.ray_jobs import (
        ClusterConnectionError,
        InfeasibleGridError,
        SweepConfigError,
        SweepError,
        run_sweep,
    )
    from demoscale.ray_jobs.config import load_sweep_config

    if args.store:
        overrides["store"] = args.store
    if args.logger:
        overrides["logger"] = args.logger
    if args.storage:
        overrides["output"] = args.storage
    try:
        config = load_sweep_config(args.config, overrides)
    except SweepConfigError as err:
        return error("sweep", err)
    if args.print_config:
        print(config_yaml(config), end="")
        return EXIT_OK
    try:
        result = run_sweep(config, address=args.address, storage=args.storage, resume=args.resume)
    except (SweepConfigError, InfeasibleGridError, SweepError, ClusterConnectionError) as err:
        return error("sweep", err)
    if result.recovered:
        print(f"recovered the rows of {len(result.recovered)} finished trial(s) from their folders")
    print(
        f"{len(result.ran)} trial(s) ran, {len(result.skipped)} already done, {len(result.failed)} failed; "
        f"results: {result.results_csv} ({len(result.results)} rows, {result.wall_time_s:.0f} s)"
    )
    if result.failed:
        print("failed trials (rerun with --resume): " + ", ".join(result.failed), file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK
