"""How much the sequential rollout rule saves on a finished study, across stopping halfwidths.

`demoscale study` replays one rule (``sequential`` in ``configs/study.yaml``) on the rollouts its
trials recorded. This replays several halfwidths on the same rollouts, side by side, and reports
for each the share of rollouts saved, every axis's fitted exponent and the width of its interval,
and the recommendation's status, so the rule's cost in evidence is visible beside its saving.

    python benchmarks/study_sequential.py runs/study [--halfwidths 0.07 0.08 0.1 0.12] [--json [PATH]]
    python benchmarks/study_sequential.py runs/study --scale log-gap --halfwidths 0.15 0.2 0.25 0.3

``--scale log-gap`` judges each trial's interval on log(1 - score), the scale the laws are fitted on:
a trial far from the target (a large gap) is then known well enough sooner than one close to it.
Halfwidth 0 (the first row) is the fixed allocation.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from demoscale.study import (
    AXES,
    SequentialRule,
    _plan_words,
    _tables,
    axis_fits,
    choose_plans,
    load_study_config,
    sequential_replay,
)
from report import add_json_option, emit_json


def replay(study: Path, halfwidths: list[float], scale: str = "score") -> list[dict]:
    """One row per halfwidth: the saving, exponents, interval widths and recommendation status (the
    first row, halfwidth 0, is the fixed allocation itself)."""
    config = load_study_config()
    tables = {axis: _tables(study / "sweeps" / axis) for axis in AXES}
    rows = []
    for halfwidth in [0.0, *halfwidths]:
        rule = SequentialRule(
            halfwidth=halfwidth,
            min_episodes=config.sequential.min_episodes,
            round_size=config.sequential.round_size,
            scale=scale,
        )
        cut, saving = sequential_replay(tables, rule, config.confidence)
        fits = {axis: axis_fits(*cut[axis], axis, config.confidence)["summary"] for axis in AXES}
        recommendation = choose_plans(config, cut["n_pairs"])[0]
        rows.append({
            "halfwidth": halfwidth,
            "scale": scale,
            "rollouts": saving["rollouts_sequential"],
            "rollouts_fixed": saving["rollouts_fixed"],
            "saved_fraction": saving["saved_fraction"],
            "alpha": {axis: fits[axis]["alpha"] for axis in AXES},
            "alpha_ci_width": {axis: fits[axis]["alpha_ci"][1] - fits[axis]["alpha_ci"][0] for axis in AXES},
            "recommendation": recommendation.status,
            "plan": _plan_words(recommendation),
        })  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("study", type=Path, help="a finished study's folder (its sweeps/<axis>/ tables)")
    parser.add_argument("--halfwidths", type=float, nargs="+", default=[0.07, 0.08, 0.09, 0.10, 0.12])
    parser.add_argument(
        "--scale", choices=["score", "log-gap"], default="score", help="where the interval is judged"
    )
    add_json_option(parser)
    args = parser.parse_args(argv)
    if not all((args.study / "sweeps" / axis / "rollouts.csv").exists() for axis in AXES):
        raise SystemExit(f"{args.study}: needs sweeps/<axis>/rollouts.csv for {', '.join(AXES)}")
    rows = replay(args.study, args.halfwidths, args.scale)
    print(f"{'halfwidth':>9} {'rollouts':>9} {'saved':>6}  " + "  ".join(f"{a + ' CI width':>22}" for a in AXES)
          + "  recommendation")  # fmt: skip
    for row in rows:
        widths = "  ".join(f"{row['alpha_ci_width'][a]:>22.3f}" for a in AXES)
        plan = row["plan"]
        print(f"{row['halfwidth']:>9.2f} {row['rollouts']:>9d} {row['saved_fraction']:>6.1%}  {widths}"
              f"  {row['recommendation']}: {plan['n_pairs']} pairs, {plan['expected_score']:.3f}")  # fmt: skip
    emit_json("study_sequential", {"study": str(args.study), "rows": rows}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
