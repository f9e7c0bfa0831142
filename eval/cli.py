"""``demoscale eval``: roll out a checkpoint (or the scripted expert), or import real-robot scores.

demoscale eval CHECKPOINT|expert --task TASK [--split unseen|train] --envs N --objects M
               --episodes E [--workers W] --out DIR
demoscale eval import-scores FILE.csv --out RESULTS
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from demoscale import DEFAULT_CONFIDENCE


def _add_confidence(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--confidence",
        type=float,
        default=DEFAULT_CONFIDENCE,
        help=f"level of the score and success-rate intervals (Wilson; default {DEFAULT_CONFIDENCE:g})",
    )


def _eval_parser() -> argparse.ArgumentParser:
    from demoscale.eval.tasks import task_names

    parser = argparse.ArgumentParser(
        prog="demoscale eval",
        description="Roll out CHECKPOINT (or 'expert') on simulated pairs; writes rollouts.csv, summary.json "
        "and a few videos. 'demoscale eval import-scores --help' imports real-robot score files.",
    )
    parser.add_argument("policy", help="checkpoint path, or 'expert' for the task's scripted expert")
    parser.add_argument(
        "--task",
        default=None,
        help=f"one of: {', '.join(task_names())} (default: the task the checkpoint's data recorded)",
    )
    parser.add_argument("--split", default="unseen", choices=["unseen", "train"])
    parser.add_argument(
        "--envs",
        type=int,
        default=None,
        help="environments (first ids of the split; default: the task's, 10 for most, 50 for pusht)",
    )
    parser.add_argument("--objects", type=int, default=1, help="objects per environment")
    parser.add_argument(
        "--pairing",
        default="grid",
        choices=["grid", "unique"],
        help="grid: every env x object; unique: object k only in environment k (as 'collect sim "
        "--pairing unique' collected them; needs --envs == --objects)",
    )
    parser.add_argument(
        "--episodes",
        type=int,
        default=None,
        help="total rollouts, round-robin over the pairs (default: one per pair)",
    )
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--out", default=None, help="output directory (rollouts.csv, summary.json, videos/)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--videos", type=int, default=2, help="number of rollouts to save as videos")
    parser.add_argument(
        "--image-size",
        type=int,
        default=None,
        help="default: the size the checkpoint's images were recorded at (else its feature shape)",
    )
    parser.add_argument(
        "--cameras",
        nargs="+",
        default=None,
        help="tabletop cameras, e.g. wrist or scene (default: those the checkpoint's data recorded; "
        "another camera is refused)",
    )
    parser.add_argument(
        "--env-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an extra keyword for the task's environments (repeatable; VALUE is read as YAML), e.g. "
        "--env-option replay_path=pusht_cchi_v7_replay.zarr for PushT training ids that start from "
        "the recorded states",
    )
    parser.add_argument("--batch-size", type=int, default=8, help="environments stepped in lockstep")
    parser.add_argument("--device", default="cpu")
    _add_confidence(parser)
    return parser


def parse_env_options(items: list[str]) -> dict:
    """``["key=value", ...]`` -> {key: YAML-parsed value}."""
    import yaml

    options = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--env-option takes KEY=VALUE, got {item!r}")
        options[key.strip()] = yaml.safe_load(value)
    return options


def _scores_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="demoscale eval import-scores",
        description="Turn a real-robot score CSV (columns in eval/README.md) into results.csv + rollouts.csv.",
    )
    parser.add_argument("file", help="CSV with one row per real-robot rollout")
    parser.add_argument("--out", required=True, help="output directory")
    _add_confidence(parser)
    return parser


def main(argv: list[str]) -> int:
    if argv and argv[0] == "import-scores":
        args = _scores_parser().parse_args(argv[1:])
        from demoscale.eval.scores import ScoreFileError, import_scores

        try:
            results, rollouts = import_scores(args.file, args.out, confidence=args.confidence)
        except ScoreFileError as error:
            print(f"demoscale eval import-scores: {error}", file=sys.stderr)
            return 2
        print(f"{len(results)} run(s), {len(rollouts)} rollout(s) -> {args.out}/results.csv, rollouts.csv")
        print(
            results[["trial_id", "n_envs", "n_objects", "score", "success_rate", "n_rollouts"]].to_string(
                index=False
            )
        )
        return 0

    args = _eval_parser().parse_args(argv)
    from demoscale.eval.ids import IdRangeError
    from demoscale.eval.rollout import SpecMismatchError, evaluate
    from demoscale.eval.tasks import UnknownTaskError, get_task

    if args.policy != "expert" and not os.path.exists(args.policy):
        print(f"demoscale eval: checkpoint {args.policy} does not exist (or pass 'expert')", file=sys.stderr)
        return 2
    try:
        env_options = parse_env_options(args.env_option)
    except ValueError as error:
        print(f"demoscale eval: {error}", file=sys.stderr)
        return 2
    if args.cameras:
        env_options["cameras"] = args.cameras
    try:
        if args.policy == "expert" and args.task is None:
            raise ValueError("the expert needs --task")
        result = evaluate(
            args.policy,
            args.task,
            split=args.split,
            n_envs=args.envs,
            n_objects=args.objects,
            episodes=args.episodes,
            pairing=args.pairing,
            workers=args.workers,
            out_dir=args.out,
            seed=args.seed,
            video_episodes=args.videos if args.out else 0,
            image_size=args.image_size,
            env_options=env_options or None,
            batch_size=args.batch_size,
            device=args.device,
            confidence=args.confidence,
        )
    except (UnknownTaskError, IdRangeError, SpecMismatchError, ValueError) as error:
        print(f"demoscale eval: {error}", file=sys.stderr)
        return 2
    s = result.summary
    print(
        f"{s['task']} ({s['split']}): score {s['score']:.3f} [{s['score_ci_low']:.3f}, {s['score_ci_high']:.3f}], "
        f"success {s['success_rate']:.3f} [{s['success_ci_low']:.3f}, {s['success_ci_high']:.3f}] "
        f"over {s['n_rollouts']} rollouts ({s['confidence']:.0%} Wilson intervals)"
    )
    for name in get_task(s["task"]).metrics:
        print(
            f"  mean {name}: {s[f'mean_{name}']:.3f} "
            f"[{s[f'mean_{name}_ci_low']:.3f}, {s[f'mean_{name}_ci_high']:.3f}]"
        )
    if args.out:
        print(f"wrote {args.out}/rollouts.csv, summary.json" + (", videos/" if args.videos else ""))
    else:
        print(json.dumps({k: v for k, v in s.items() if k not in ("env_ids", "object_ids")}))
    return 0
