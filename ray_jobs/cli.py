"""``demoscale sweep``: run a sweep from a YAML file (a thin shell over ``run_sweep``)."""

from __future__ import annotations

import argparse
import sys

DESCRIPTION = """Sweep policy training over environment/object/demo counts on Ray Tune.
One trial = choose a nested subset of the store, train, evaluate on held-out envs/objects.
Rows land in OUTPUT/results.csv|parquet (and rollouts.csv|parquet) as each trial finishes."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="demoscale sweep", description=DESCRIPTION)
    parser.add_argument("--config", required=True, help="sweep YAML (see configs/sweeps/)")
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
    args = build_parser().parse_args(argv)
    from demoscale.ray_jobs import (
        ClusterConnectionError,
        InfeasibleGridError,
        SweepConfigError,
        SweepError,
        run_sweep,
    )
    from demoscale.ray_jobs.config import load_sweep_config

    try:
        config = load_sweep_config(args.config)
        if args.logger:
            config.logger = args.logger
        result = run_sweep(config, address=args.address, storage=args.storage, resume=args.resume)
    except (SweepConfigError, InfeasibleGridError, SweepError, ClusterConnectionError) as err:
        print(f"demoscale sweep: {err}", file=sys.stderr)
        return 2
    print(
        f"{len(result.ran)} trial(s) ran, {len(result.skipped)} already done, {len(result.failed)} failed; "
        f"results: {result.results_csv} ({len(result.results)} rows, {result.wall_time_s:.0f} s)"
    )
    if result.failed:
        print("failed trials (rerun with --resume): " + ", ".join(result.failed), file=sys.stderr)
        return 1
    return 0
