"""``demoscale eval``: roll out a checkpoint (or the scripted expert), or import real-robot scores.

demoscale eval CHECKPOINT|expert [--task TASK] [--split unseen|train] [--envs N] [--objects M]
               [--episodes E] [--workers W] [--out DIR] [--config EVAL.yaml] [--KEY VALUE ...]
               [--print-config]
demoscale eval import-scores FILE.csv --out RESULTS
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field
from typing import Any

from demoscale import DEFAULT_CONFIDENCE


def _add_confidence(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--confidence",
        type=float,
        default=DEFAULT_CONFIDENCE,
        help="level of the score and success-rate intervals (Wilson)",
    )


@dataclass
class EvalConfig:
    """What ``demoscale eval`` runs: the flags, a ``--config`` YAML with these keys, or both (flags win).

    ``task``, ``image_size`` and ``env_options`` left unset come from what the checkpoint's training
    images recorded (camera, size, options); ``cameras`` is ``env_options["cameras"]``."""

    policy: str | None = None
    task: str | None = None
    split: str = "unseen"
    envs: int | None = None
    objects: int = 1
    pairing: str = "grid"
    episodes: int | None = None
    workers: int = 1
    out: str | None = None
    seed: int = 0
    videos: int = 2
    image_size: int | None = None
    cameras: list[str] | None = None
    env_options: dict[str, Any] = field(default_factory=dict)
    batch_size: int = 8
    device: str = "cpu"
    confidence: float = DEFAULT_CONFIDENCE
    env_split: str | None = None
    object_split: str | None = None
    stop_halfwidth: float | None = None
    min_episodes: int | None = None
    stop_scale: str = "score"


def _eval_parser() -> argparse.ArgumentParser:
    from demoscale.conventions import add_config_arguments, make_parser
    from demoscale.eval.tasks import task_names

    parser = make_parser(
        "demoscale eval",
        "Roll out CHECKPOINT (or 'expert') on simulated pairs; writes rollouts.csv, summary.json and a few\n"
        "videos. A checkpoint is evaluated on the task, cameras, image size and options its training\n"
        "data recorded unless they are given; a contradicting camera or size is refused.\n"
        "Every option is also a key of --config YAML; dotted keys override (--env_options.cameras\n"
        "'[scene]'); --print-config shows the resolved evaluation without running it.\n"
        "'demoscale eval import-scores --help' imports real-robot score files.",
    )
    parser.add_argument(
        "policy", nargs="?", help="checkpoint path, or 'expert' for the task's scripted expert"
    )
    parser.add_argument(
        "--task",
        default=None,
        help=f"one of: {', '.join(task_names())} (default: the task the checkpoint's data recorded)",
    )
    parser.add_argument("--split", default="unseen", choices=["unseen", "train"], help="id range")
    parser.add_argument(
        "--env-split",
        dest="env_split",
        default=None,
        choices=["unseen", "train"],
        help="id range of the environments alone (default: --split), e.g. --env-split train "
        "--object-split unseen for unseen objects in training environments",
    )
    parser.add_argument(
        "--object-split",
        dest="object_split",
        default=None,
        choices=["unseen", "train"],
        help="id range of the objects alone (default: --split)",
    )
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
    parser.add_argument(
        "--stop-halfwidth",
        dest="stop_halfwidth",
        type=float,
        default=None,
        help="sequential evaluation: stop once the score interval's half-width is at most this "
        "(--episodes is then the most that run)",
    )
    parser.add_argument(
        "--stop-scale",
        dest="stop_scale",
        default="score",
        choices=["score", "log-gap"],
        help="with --stop-halfwidth: judge the interval on the score or on log(1 - score), the scale "
        "the scaling laws are fitted on (a low score is then known well enough sooner)",
    )
    parser.add_argument(
        "--min-episodes",
        dest="min_episodes",
        type=int,
        default=None,
        help="with --stop-halfwidth: rollouts before stopping is considered (default: one per pair)",
    )
    parser.add_argument("--workers", type=int, default=1, help="processes")
    parser.add_argument("--out", default=None, help="output directory (rollouts.csv, summary.json, videos/)")
    parser.add_argument("--seed", type=int, default=0, help="evaluation seed")
    parser.add_argument("--videos", type=int, default=2, help="number of rollouts to save as videos")
    parser.add_argument(
        "--image-size",
        "--image_size",
        dest="image_size",
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
        "--env_option",
        dest="env_option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an extra keyword for the task's environments (repeatable; VALUE is read as YAML), e.g. "
        "--env-option replay_path=pusht_cchi_v7_replay.zarr for PushT training ids that start from "
        "the recorded states",
    )
    parser.add_argument(
        "--batch-size",
        "--batch_size",
        dest="batch_size",
        type=int,
        default=8,
        help="environments stepped in lockstep",
    )
    parser.add_argument("--device", default="cpu", help="torch device of the policy")
    _add_confidence(parser)
    add_config_arguments(parser, "YAML with any of the options above as keys (snake_case)")
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


def _explicit_flags(parser: argparse.ArgumentParser, argv: list[str]) -> dict[str, Any]:
    """The options given on the command line (not their defaults): they win over a config file."""
    saved = {action: action.default for action in parser._actions}
    try:
        for action in parser._actions:
            action.default = argparse.SUPPRESS
        given, _ = parser.parse_known_args(argv)
    finally:
        for action, default in saved.items():
            action.default = default
    return vars(given)


def resolve_eval_config(argv: list[str]) -> tuple[EvalConfig, bool]:
    """(the evaluation to run, whether to only print it): dataclass defaults < ``--config`` YAML <
    flags given < dotted overrides. Raises ``ConfigError`` / ``ValueError`` for bad input."""
    from demoscale.conventions import (
        apply_overrides,
        dataclass_from_dict,
        parse_with_overrides,
        read_yaml,
        split_overrides,
    )

    parser = _eval_parser()
    args, overrides = parse_with_overrides(parser, argv)
    values: dict[str, Any] = read_yaml(args.config, "eval config") if args.config else {}
    where = args.config or "the command line"
    given = _explicit_flags(parser, split_overrides(argv)[0])
    for name in ("config", "set", "print_config"):
        given.pop(name, None)
    extra = parse_env_options(given.pop("env_option", []))
    values.update(given)
    if extra:
        values["env_options"] = {**(values.get("env_options") or {}), **extra}
    config = dataclass_from_dict(EvalConfig, apply_overrides(values, overrides, where), where)
    if config.cameras:
        config.env_options = {**config.env_options, "cameras": list(config.cameras)}
    return config, args.print_config


def _resolved_with_checkpoint(config: EvalConfig) -> EvalConfig:
    """``config`` with what the checkpoint recorded filled in (task, image size, environment options),
    as :func:`demoscale.eval.evaluate` will fill them: what ``--print-config`` shows."""
    import dataclasses

    from demoscale.eval.rollout import apply_capture, recorded_capture
    from demoscale.policies import load_policy

    recorded = recorded_capture(load_policy(config.policy))
    task, size, options = apply_capture(
        recorded, config.task, config.image_size, config.env_options, config.policy
    )
    cameras = options.get("cameras")
    return dataclasses.replace(
        config, task=task, image_size=size, env_options=options, cameras=list(cameras) if cameras else None
    )


def _scores_parser() -> argparse.ArgumentParser:
    from demoscale.conventions import make_parser

    parser = make_parser(
        "demoscale eval import-scores",
        "Turn a real-robot score CSV (columns in eval/README.md) into results.csv + rollouts.csv.",
    )
    parser.add_argument("file", help="CSV with one row per real-robot rollout")
    parser.add_argument("--out", required=True, help="output directory")
    _add_confidence(parser)
    return parser


def main(argv: list[str]) -> int:
    from demoscale.conventions import EXIT_OK, ConfigError, config_yaml, error

    if argv and argv[0] == "import-scores":
        args = _scores_parser().parse_args(argv[1:])
        from demoscale.eval.scores import ScoreFileError, import_scores

        try:
            results, rollouts = import_scores(args.file, args.out, confidence=args.confidence)
        except ScoreFileError as err:
            return error("eval import-scores", err)
        print(f"{len(results)} run(s), {len(rollouts)} rollout(s) -> {args.out}/results.csv, rollouts.csv")
        print(
            results[["trial_id", "n_envs", "n_objects", "score", "success_rate", "n_rollouts"]].to_string(
                index=False
            )
        )
        return EXIT_OK

    try:
        config, print_only = resolve_eval_config(argv)
    except (ConfigError, ValueError) as err:
        return error("eval", err)
    from demoscale.eval.ids import IdRangeError
    from demoscale.eval.rollout import SpecMismatchError, evaluate
    from demoscale.eval.tasks import UnknownTaskError, get_task

    if not config.policy:
        return error("eval", "no policy: give a checkpoint path or 'expert' (or 'policy' in --config)")
    if config.policy != "expert" and not os.path.exists(config.policy):
        return error("eval", f"checkpoint {config.policy} does not exist (or pass 'expert')")
    try:
        if config.policy == "expert" and config.task is None:
            raise ValueError("the expert needs --task")
        if print_only:
            resolved = config if config.policy == "expert" else _resolved_with_checkpoint(config)
            print(config_yaml(resolved), end="")
            return EXIT_OK
        result = evaluate(
            config.policy,
            config.task,
            split=config.split,
            n_envs=config.envs,
            n_objects=config.objects,
            episodes=config.episodes,
            pairing=config.pairing,
            workers=config.workers,
            out_dir=config.out,
            seed=config.seed,
            video_episodes=config.videos if config.out else 0,
            image_size=config.image_size,
            env_options=config.env_options or None,
            batch_size=config.batch_size,
            device=config.device,
            confidence=config.confidence,
            env_split=config.env_split,
            object_split=config.object_split,
            stop_halfwidth=config.stop_halfwidth,
            min_episodes=config.min_episodes,
            stop_scale=config.stop_scale,
        )
    except (UnknownTaskError, IdRangeError, SpecMismatchError, ValueError) as err:
        return error("eval", err)
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
    if config.out:
        print(f"wrote {config.out}/rollouts.csv, summary.json" + (", videos/" if config.videos else ""))
    else:
        print(json.dumps({k: v for k, v in s.items() if k not in ("env_ids", "object_ids")}))
    return 0
