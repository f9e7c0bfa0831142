"""How well the PushT demonstrations themselves do the task, scored as a policy is scored.

Every recorded human episode of the diffusion_policy replay buffer is replayed in the evaluation
environment from its own initial state (``PushTEnv`` with ``replay_path``: the recorded actions
retrace the recorded states), and scored twice:

- **recorded**: over the recorded frames only, i.e. where the demonstrator stopped;
- **held to 300 steps**: as ``demoscale eval expert --task pusht --split train`` runs the replay:
  after the last recorded action the agent keeps that target until success or the task's 300 steps
  (the last commanded motion completes).

Success is the task's (coverage of the goal T >= 0.95 at any step), "mean max coverage" the
Diffusion Policy paper's (per episode, the maximum of ``min(coverage / 0.95, 1)``), so the rows stand
beside a policy's evaluation. ``--policy-rollouts CSV`` adds a policy's rollouts (an evaluation's
``rollouts.csv``) to the figure, for comparison.

    python benchmarks/pusht_demonstrations.py ../shared/data/pusht/pusht_cchi_v7_replay.zarr \\
        --record docs/results/pusht_demonstrations
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from report import add_json_option, emit_json

ROOT = Path(__file__).resolve().parents[1]
SCHEMES = {
    "recorded": "human demonstrations, recorded frames",
    "held": "human demonstrations, last action held to 300 steps",
}


def replay_episode(replay_path: str, episode: int, max_steps: int) -> dict[str, Any]:
    """One recorded episode replayed in the task environment: its coverage where the recording
    ends and the best before it, and the best within ``max_steps`` with the last action held."""
    from demoscale.eval import get_task
    from demoscale.eval.pusht import SUCCESS_COVERAGE

    env = get_task("pusht").make_env(episode, 0, images=False, replay_path=replay_path, max_steps=max_steps)
    try:
        env.reset(0)
        expert = env.expert(0)
        length = len(expert.actions)
        coverage = [env.coverage]
        deviation = 0.0
        recorded_states = env.replay.state[slice(*env.replay.bounds(episode))]
        for step in range(max(length, max_steps)):
            if step < length:
                deviation = max(
                    deviation, float(np.abs(env.observe()["state"][:4] - recorded_states[step][:4]).max())
                )
            elif step >= max_steps or max(coverage) >= SUCCESS_COVERAGE:
                break  # the held replay ends as a rollout does: at success or at the step limit
            env.step(expert.act())
            coverage.append(env.coverage)
        recorded = np.asarray(coverage[: length + 1])
        held = np.asarray(coverage[: max_steps + 1])
        return {
            "episode": episode,
            "length": length,
            "final_coverage": float(recorded[-1]),
            "recorded_max_coverage": float(recorded.max()),
            "held_max_coverage": float(held.max()),
            "max_state_deviation_px": deviation,
        }
    finally:
        env.close()


def summarise(rows: list[dict[str, Any]], success_coverage: float) -> dict[str, dict[str, Any]]:
    """Success and mean max coverage of each scheme, with the evaluator's intervals."""
    from demoscale.eval.rollout import mean_interval, wilson_interval

    out = {}
    for scheme, column in (("recorded", "recorded_max_coverage"), ("held", "held_max_coverage")):
        best = np.array([row[column] for row in rows])
        successes = int((best >= success_coverage).sum())
        paper = np.minimum(best / success_coverage, 1.0)
        out[scheme] = {
            "n": len(rows),
            "successes": successes,
            "success_rate": successes / len(rows),
            "success_ci": list(wilson_interval(successes, len(rows))),
            "mean_max_coverage": float(paper.mean()),
            "mean_max_coverage_ci": list(mean_interval(paper)),
            "raw_max_coverage_quantiles": {
                q: float(np.quantile(best, q)) for q in (0.1, 0.25, 0.5, 0.75, 0.9)
            },
        }
    return out


def write_record(out: Path, args: argparse.Namespace, rows: list[dict], pooled: dict, minutes: float) -> None:
    import matplotlib
    import pandas as pd
    from demoscale.eval.pusht import SUCCESS_COVERAGE

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(out / "rollouts.csv", index=False)
    headline = []
    for scheme, stats in pooled.items():
        base = {"task": "pusht", "policy": SCHEMES[scheme], "split": "train", "n_rollouts": stats["n"],
                "train_minutes": None}  # fmt: skip
        headline.append({**base, "metric": "success_rate", "value": stats["success_rate"],
                         "ci_low": stats["success_ci"][0], "ci_high": stats["success_ci"][1]})  # fmt: skip
        headline.append({**base, "metric": "mean_max_coverage", "value": stats["mean_max_coverage"],
                         "ci_low": stats["mean_max_coverage_ci"][0], "ci_high": stats["mean_max_coverage_ci"][1]})  # fmt: skip
    command = shlex.join(["python", "benchmarks/pusht_demonstrations.py", *sys.argv[1:]])
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    summary = {
        "name": out.name, "task": "pusht", "source": args.replay, "command": command, "commit": commit,
        "machine": {"cpus": os.cpu_count()}, "eval_minutes": round(minutes, 2),
        "max_state_deviation_px": max(row["max_state_deviation_px"] for row in rows),
        "pooled": pooled, "headline": headline,
    }  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")

    # Everything happens above 0.8: values below it are drawn in the leftmost bin.
    low = 0.78
    bins = np.linspace(low, 1.0, 45)
    series = [("demonstrations, where the recording ends", [r["final_coverage"] for r in rows]),
              ("demonstrations, best with the last action held to 300 steps", [r["held_max_coverage"] for r in rows])]  # fmt: skip
    if args.policy_rollouts:
        policy = pd.read_csv(args.policy_rollouts)
        series.append((f"{args.policy_label}: best in 300 steps", policy["raw_max_coverage"].tolist()))
    fig, axes = plt.subplots(len(series), 1, figsize=(8, 2.4 * len(series)), sharex=True, squeeze=False)
    for ax, (label, values) in zip(axes[:, 0], series, strict=True):
        values = np.asarray(values, float)
        drawn = np.clip(values, low, 1.0)
        ax.hist(drawn, bins=bins, weights=np.full(len(values), 1 / len(values)), color="#4c72b0")
        ax.axvline(
            SUCCESS_COVERAGE, color="#c44e52", linestyle="--", label=f"success: coverage {SUCCESS_COVERAGE:g}"
        )
        ax.set_title(
            f"{label} (n={len(values)}; {np.mean(values >= SUCCESS_COVERAGE):.0%} at >= {SUCCESS_COVERAGE:g})",
            fontsize=9,
        )
        ax.set_ylabel("fraction")
    axes[0, 0].legend(fontsize=8, loc="upper left")
    axes[-1, 0].set_xlabel(f"coverage of the goal T (leftmost bin: below {low + 0.005:.3g})")
    fig.tight_layout()
    fig.savefig(out / "figure.png", dpi=110)
    plt.close(fig)

    recorded, held = pooled["recorded"], pooled["held"]
    q = recorded["raw_max_coverage_quantiles"]
    lines = [
        f"# {out.name}", "",
        "The PushT human demonstrations, replayed in the evaluation environment from their own initial "
        "states and scored as a policy is scored (success: coverage >= 0.95 at any step; mean max "
        "coverage: the Diffusion Policy paper's).", "",
        "```bash", command, "```", "",
        f"Commit `{commit}`; {os.cpu_count()} CPUs; {minutes:.1f} min. The recorded actions retrace the "
        f"recorded states to {summary['max_state_deviation_px']:.2f} px at most.", "",
        "![figure](figure.png)", "",
        "| demonstrations | episodes | success | mean max coverage |", "| --- | --- | --- | --- |",
    ]  # fmt: skip
    for scheme, stats in pooled.items():
        lines.append(
            f"| {SCHEMES[scheme]} | {stats['n']} | {stats['success_rate']:.3f} [{stats['success_ci'][0]:.3f}, "
            f"{stats['success_ci'][1]:.3f}] ({stats['successes']}) | {stats['mean_max_coverage']:.3f} "
            f"[{stats['mean_max_coverage_ci'][0]:.3f}, {stats['mean_max_coverage_ci'][1]:.3f}] |"
        )
    lines += [
        "",
        f"Best coverage within the recorded frames, quantiles 10/25/50/75/90%: {q[0.1]:.3f} / {q[0.25]:.3f} / "
        f"{q[0.5]:.3f} / {q[0.75]:.3f} / {q[0.9]:.3f}. {recorded['successes']} of {recorded['n']} demonstrations "
        f"reach the success threshold before their recording ends; {held['successes']} do once their last "
        "commanded motion completes.",
    ]  # fmt: skip
    (out / "README.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out}/summary.json, rollouts.csv, README.md, figure.png")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("replay", help="diffusion_policy PushT replay buffer (pusht_cchi_v7_replay.zarr)")
    parser.add_argument("--episodes", type=int, default=None, help="the first N episodes (default: all)")
    parser.add_argument(
        "--max-steps", type=int, default=300, help="the held replay's step limit (the task's)"
    )
    parser.add_argument("--record", default=None, help="also write a results record into this folder")
    parser.add_argument("--policy-rollouts", default=None, help="a policy's rollouts.csv, drawn beside")
    parser.add_argument("--policy-label", default="policy", help="what those rollouts are, for the figure")
    add_json_option(parser)
    args = parser.parse_args(argv)

    from demoscale.eval.pusht import SUCCESS_COVERAGE, load_replay

    n_recorded = len(load_replay(args.replay))
    episodes = range(n_recorded if args.episodes is None else min(args.episodes, n_recorded))
    started = time.perf_counter()
    rows = [replay_episode(args.replay, episode, args.max_steps) for episode in episodes]
    minutes = (time.perf_counter() - started) / 60
    pooled = summarise(rows, SUCCESS_COVERAGE)
    print("| demonstrations | episodes | success | mean max coverage |\n| --- | --- | --- | --- |")
    for scheme, stats in pooled.items():
        print(
            f"| {SCHEMES[scheme]} | {stats['n']} | {stats['success_rate']:.3f} | {stats['mean_max_coverage']:.3f} |"
        )
    emit_json("pusht_demonstrations", {"replay": args.replay, "pooled": pooled, "episodes": rows}, args.json)
    if args.record:
        write_record(Path(args.record), args, rows, pooled, minutes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
