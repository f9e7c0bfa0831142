"""One checkpoint, rolled out with different execution settings: how many actions of each predicted
chunk are executed before the policy is asked again (``n_action_steps``), how many control steps
pass between an observation and the first action of its chunk (``inference_delay``, a robot that
keeps moving while the policy computes), how many denoising steps it takes from how much starting
noise (``noise_scale``, a diffusion policy's sampling temperature), and whether the chunks are
temporally ensembled (ACT: a chunk every step, the overlapping predictions averaged) or chosen
among several samples by their coherence with the previous chunk (``chunk_samples``, Bidirectional
Decoding's backward coherence), on one or more sets of initial states (evaluation seeds).

    python benchmarks/execution_horizon.py CHECKPOINT --task pusht --n-action-steps 8 4 --seeds 0 1 2
    python benchmarks/execution_horizon.py CHECKPOINT --n-action-steps 4 --inference-delays 0 2 4
    python benchmarks/execution_horizon.py CHECKPOINT --n-action-steps 8 --temporal-ensembles off 0 0.1
    python benchmarks/execution_horizon.py CHECKPOINT --n-action-steps 8 --noise-scales 1 0.5 0
    python benchmarks/execution_horizon.py CHECKPOINT --n-action-steps 8 --chunk-samples 1 16
    python benchmarks/execution_horizon.py CKPT_A CKPT_B CKPT_C --noise-scales 0.5   # an ensemble
    python benchmarks/execution_horizon.py ... --record docs/results/NAME --policy "what it is"

Several checkpoints are rolled out as one ensemble (``load_ensemble``: diffusion trainings of one
recipe averaging their predictions at every denoising step).

Training is untouched: these are inference settings of the saved policy (``load_policy``'s
``num_inference_steps``, ``Policy.n_action_steps``, ``Policy.inference_delay``,
``Policy.temporal_ensemble``, ``Policy.noise_scale``, ``Policy.chunk_samples``,
``Policy.coherence_decay``). A table on screen, JSON to
``benchmarks/results/execution_horizon.json`` (``--json PATH`` to choose). ``--record DIR`` also
writes a results record: every rollout (``rollouts.csv``), ``summary.json`` whose ``headline`` rows
pool each setting's seeds (Wilson interval for success, the evaluator's for the other metrics),
``README.md`` and ``figure.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from itertools import product
from pathlib import Path
from typing import Any

from report import add_env_option, add_json_option, add_record_options, add_rollout_options, emit_json

ROOT = Path(__file__).resolve().parents[1]


def _ensemble(value: str) -> float | None:
    """A ``--temporal-ensembles`` value: ``off`` or the ensembler's decay."""
    if value == "off":
        return None
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'off' or a decay (a number), got {value!r}") from None


def _short_label(pooled: dict[str, Any]) -> str:
    """A figure's bar label: the execution, the denoising steps and the noise scale, on short lines."""
    if pooled["temporal_ensemble"] is not None:
        first = f"ensembled\ndecay {pooled['temporal_ensemble']:g}"
    else:
        first = f"{pooled['n_action_steps']} executed\ndelay {pooled['inference_delay']}"
    noise = "" if pooled["noise_scale"] is None else f"\nnoise x{pooled['noise_scale']:g}"
    best = "" if pooled["chunk_samples"] == 1 else f"\nbest of {pooled['chunk_samples']}"
    return f"{first}{best}\n{pooled['inference_steps']} denoising steps{noise}"


def _execution(
    n_action_steps: int, delay: int, ensemble: float | None, chunk_samples: int = 1, decay: float = 0.5
) -> str:
    """How the chunks are executed, for tables and labels."""
    if ensemble is not None:
        return f"ensembled every step (decay {ensemble:g})"
    chosen = "" if chunk_samples == 1 else f", the most coherent of {chunk_samples} (decay {decay:g})"
    return f"{n_action_steps} actions executed per chunk, delay {delay}{chosen}"


def write_record(
    out: Path, args: argparse.Namespace, rows: list[dict[str, Any]], rollouts: Any, minutes: float
) -> None:
    """The results record of one run (see the module note)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch
    from demoscale.eval.rollout import mean_interval, wilson_interval

    out.mkdir(parents=True, exist_ok=True)
    rollouts.to_csv(out / "rollouts.csv", index=False)
    metrics = [m for m in ("max_coverage", "score") if m in rollouts.columns]
    headline, pooled = [], []
    settings = ["n_action_steps", "inference_delay", "temporal_ensemble", "chunk_samples", "inference_steps", "noise_scale"]  # fmt: skip
    for (n_action, delay, ensemble, samples, n_inference, noise), group in rollouts.groupby(settings, sort=False):  # fmt: skip
        successes, n = int(group["success"].sum()), len(group)
        low, high = wilson_interval(successes, n)
        ensemble = None if ensemble == "off" else float(ensemble)
        noise = None if noise == "n/a" else float(noise)
        execution = _execution(int(n_action), int(delay), ensemble, int(samples), args.coherence_decay)
        sampling = f"{n_inference} denoising steps" + ("" if noise is None else f", noise scale {noise:g}")
        entry = {"n_action_steps": int(n_action), "inference_delay": int(delay), "temporal_ensemble": ensemble,
                 "chunk_samples": int(samples), "coherence_decay": args.coherence_decay,
                 "inference_steps": int(n_inference), "noise_scale": noise, "execution": execution, "n_rollouts": n,
                 "seeds": sorted(int(s) for s in group["eval_seed"].unique()),
                 "success_rate": successes / n, "success_ci": [low, high]}  # fmt: skip
        base = {"task": args.task, "policy": f"{args.policy}; {execution}, {sampling}",
                "split": args.split, "n_rollouts": n, "train_minutes": args.train_minutes}  # fmt: skip
        headline.append(
            {**base, "metric": "success_rate", "value": successes / n, "ci_low": low, "ci_high": high}
        )
        for metric in metrics:
            values = group[metric].to_numpy(float)
            m_low, m_high = mean_interval(values)
            name = "mean_max_coverage" if metric == "max_coverage" else metric
            entry[name], entry[f"{name}_ci"] = float(values.mean()), [m_low, m_high]
            headline.append({**base, "metric": name, "value": float(values.mean()), "ci_low": m_low, "ci_high": m_high})  # fmt: skip
        pooled.append(entry)
    command = shlex.join(["python", "benchmarks/execution_horizon.py", *sys.argv[1:]])
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    summary = {
        "name": out.name, "task": args.task, "checkpoint": " ".join(args.checkpoint), "command": command, "commit": commit,
        "machine": {"cpus": os.cpu_count(), "torch": torch.__version__, "torch_threads": args.threads},
        "eval_minutes": round(minutes, 2), "train_minutes": args.train_minutes, "per_seed": rows,
        "pooled": pooled, "headline": headline,
    }  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=float) + "\n")

    # Success, and beside it the task's mean max coverage (PushT) or else its staged score.
    panels = [("success rate", "success_rate")]
    panels += (
        [("mean max coverage", "mean_max_coverage")]
        if "mean_max_coverage" in pooled[0]
        else [("score", "score")]
    )
    fig, axes = plt.subplots(
        1, len(panels), figsize=(max(10, 2.2 * len(pooled) * len(panels)), 4.5), squeeze=False
    )
    labels = [_short_label(p) for p in pooled]
    for ax, (name, key) in zip(axes[0], panels, strict=True):
        values = [p[key] for p in pooled]
        cis = [p["success_ci" if key == "success_rate" else f"{key}_ci"] for p in pooled]
        errors = [[v - c[0] for v, c in zip(values, cis, strict=True)], [c[1] - v for v, c in zip(values, cis, strict=True)]]  # fmt: skip
        ax.bar(labels, values, yerr=errors, capsize=4, color="#4c72b0")
        ax.set_ylim(0, 1)
        ax.set_title(f"{name} (90% interval, {pooled[0]['n_rollouts']} rollouts each)")
        ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(out / "figure.png", dpi=110)
    plt.close(fig)

    lines = [f"# {out.name}", "", args.policy + ": one checkpoint rolled out with different execution settings.", "",
             "```bash", command, "```", "",
             f"Commit `{commit}`; {summary['machine']['cpus']} CPUs, {args.threads} torch thread(s); evaluation "
             f"{minutes:.1f} min (no training: checkpoint `{' '.join(args.checkpoint)}`).", "", "![figure](figure.png)", "",
             "| execution | denoising steps | noise scale | rollouts (seeds) | success | mean max coverage |",
             "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for p in pooled:
        coverage = p.get("mean_max_coverage")
        cell = f"{coverage:.3f} [{p['mean_max_coverage_ci'][0]:.3f}, {p['mean_max_coverage_ci'][1]:.3f}]" if coverage is not None else ""  # fmt: skip
        noise = "" if p["noise_scale"] is None else f"{p['noise_scale']:g}"
        lines.append(f"| {p['execution']} | {p['inference_steps']} | {noise} | {p['n_rollouts']} ({', '.join(map(str, p['seeds']))}) "
                     f"| {p['success_rate']:.2f} [{p['success_ci'][0]:.2f}, {p['success_ci'][1]:.2f}] | {cell} |")  # fmt: skip
    lines += ["", "Per seed:", "", "| " + " | ".join(rows[0]) + " |", "|" + " --- |" * len(rows[0])]
    lines += ["| " + " | ".join(str(v) for v in row.values()) + " |" for row in rows]
    (out / "README.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out}/summary.json, rollouts.csv, README.md, figure.png")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "checkpoint",
        nargs="+",
        help="a checkpoint, or several diffusion checkpoints denoising as one ensemble",
    )
    parser.add_argument("--task", default=None, help="default: the task the checkpoint's data recorded")
    parser.add_argument("--n-action-steps", type=int, nargs="+", default=[8, 4])
    parser.add_argument(
        "--inference-delays", type=int, nargs="+", default=[0],
        help="control steps between an observation and the first action of its chunk (0: none)",
    )  # fmt: skip
    parser.add_argument(
        "--temporal-ensembles", type=_ensemble, nargs="+", default=[None], metavar="DECAY",
        help="'off' (execute chunks) or a decay: a chunk every step, overlapping predictions averaged "
        "with weights exp(-decay * age), 0 the plain mean (ignores --n-action-steps; no delay)",
    )  # fmt: skip
    parser.add_argument(
        "--chunk-samples", type=int, nargs="+", default=[1], metavar="K",
        help="candidate chunks per replan, the one most coherent with the previous chunk kept (1: none)",
    )  # fmt: skip
    parser.add_argument(
        "--coherence-decay", type=float, default=0.5,
        help="weight decay ** i of the i-th step shared with the previous chunk (with --chunk-samples)",
    )  # fmt: skip
    parser.add_argument("--inference-steps", type=int, nargs="+", default=[None])
    parser.add_argument(
        "--noise-scales", type=float, nargs="+", default=[None], metavar="SCALE",
        help="a diffusion policy's starting-noise scale (default: the checkpoint's; 1 the training "
        "noise, below 1 a lower sampling temperature, 0 deterministic)",
    )  # fmt: skip
    add_rollout_options(parser)
    parser.add_argument(
        "--cameras", nargs="+", default=None, help="tabletop cameras (default: those the data recorded)"
    )
    add_env_option(parser)
    parser.add_argument("--threads", type=int, default=2)
    add_record_options(parser)
    add_json_option(parser)
    args = parser.parse_args(argv)

    import pandas as pd
    import torch
    from demoscale.eval import evaluate
    from demoscale.policies import load_policy
    from demoscale.policies.base import check_chunk_samples, check_chunk_selection, check_execution
    from demoscale.policies.ensemble import load_ensemble

    def load(num_inference_steps: int | None = None) -> Any:
        if len(args.checkpoint) == 1:
            return load_policy(args.checkpoint[0], num_inference_steps=num_inference_steps)
        try:
            return load_ensemble(args.checkpoint, num_inference_steps=num_inference_steps)
        except ValueError as error:
            raise SystemExit(f"these checkpoints do not make an ensemble: {error}") from None

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    rows, frames = [], []
    # Every combination that fits the chunk, checked before anything runs; the others are said and skipped.
    loaded = load()
    horizon = loaded.horizon
    for noise_scale in args.noise_scales:
        if noise_scale is not None:
            try:
                loaded.noise_scale = noise_scale
            except ValueError as error:
                raise SystemExit(f"--noise-scales {noise_scale:g}: {error}") from None
    for samples in args.chunk_samples:  # a bad value ends the run; a setting that does not fit is skipped
        try:
            check_chunk_samples(samples, args.coherence_decay)
        except ValueError as error:
            raise SystemExit(f"--chunk-samples {samples}: {error}") from None
    settings = []
    grid = product(
        args.inference_steps, args.noise_scales, args.n_action_steps, args.inference_delays,
        args.temporal_ensembles, args.chunk_samples, args.seeds,
    )  # fmt: skip
    for inference_steps, noise_scale, n_action_steps, delay, ensemble, samples, seed in grid:
        if ensemble is not None:
            n_action_steps = 1  # the ensembler's: one action per prediction
        try:
            check_execution(horizon, n_action_steps, delay, ensemble)
        except ValueError as error:
            what = "temporal ensembling" if ensemble is not None else f"{n_action_steps} executed"
            print(f"skipped: {what} with delay {delay}: {error}", flush=True)
            continue
        try:
            check_chunk_selection(samples, args.coherence_decay, n_action_steps, horizon, ensemble)
        except ValueError as error:
            what = "temporal ensembling" if ensemble is not None else f"{n_action_steps} executed"
            print(f"skipped: {what} with {samples} chunk samples: {error}", flush=True)
            continue
        setting = (inference_steps, noise_scale, n_action_steps, delay, ensemble, samples, seed)
        if setting not in settings:
            settings.append(setting)
    if not settings:
        raise SystemExit("no setting fits the chunk (see above)")
    from demoscale.eval.cli import parse_env_options

    env_options = {
        **parse_env_options(args.env_option),
        **({"cameras": args.cameras} if args.cameras else {}),
    }
    for inference_steps, noise_scale, n_action_steps, inference_delay, ensemble, samples, seed in settings:
        policy = load(inference_steps)
        policy.n_action_steps, policy.inference_delay = n_action_steps, inference_delay
        policy.temporal_ensemble = ensemble
        policy.chunk_samples, policy.coherence_decay = samples, args.coherence_decay
        if noise_scale is not None:
            policy.noise_scale = noise_scale
        result = evaluate(
            policy,
            task=args.task,
            split=args.split,
            n_envs=args.envs,
            n_objects=args.objects,
            pairing=args.pairing,
            episodes=args.episodes,
            env_options=env_options or None,
            seed=seed,
            batch_size=50,
            video_episodes=0,
            progress=False,
        )
        summary = result.summary
        args.task = args.task or summary["task"]
        row = {
            "n_action_steps": n_action_steps,
            "inference_delay": inference_delay,
            "temporal_ensemble": "off" if ensemble is None else ensemble,
            "chunk_samples": samples,
            "inference_steps": policy.num_inference_steps,
            "noise_scale": "n/a" if policy.noise_scale is None else policy.noise_scale,
            "seed": seed,
            "rollouts": summary["episodes"],
            "success": round(summary["success_rate"], 3),
            "success_ci": f"[{summary['success_ci_low']:.2f}, {summary['success_ci_high']:.2f}]",
            "score": round(summary["score"], 3),
        }
        if "mean_max_coverage" in summary:
            row["mean_max_coverage"] = round(summary["mean_max_coverage"], 3)
        rows.append(row)
        frames.append(
            result.rollouts.assign(
                n_action_steps=n_action_steps,
                inference_delay=inference_delay,
                temporal_ensemble="off" if ensemble is None else str(ensemble),
                chunk_samples=samples,
                inference_steps=policy.num_inference_steps,
                noise_scale="n/a" if policy.noise_scale is None else policy.noise_scale,
                eval_seed=seed,
            )
        )
        print("  ".join(f"{key} {value}" for key, value in row.items()), flush=True)
    minutes = (time.perf_counter() - started) / 60
    columns = list(rows[0])
    print("\n| " + " | ".join(columns) + " |\n|" + " --- |" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row.get(column, "")) for column in columns) + " |")
    emit_json("execution_horizon", {"checkpoint": " ".join(args.checkpoint), "rows": rows}, args.json)
    if args.record:
        write_record(Path(args.record), args, rows, pd.concat(frames, ignore_index=True), minutes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
