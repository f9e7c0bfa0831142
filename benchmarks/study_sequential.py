"""How much the sequential rollout rule saves on a finished study, across stopping halfwidths.

`demoscale study` replays one rule (``sequential`` in ``configs/study.yaml``) on the rollouts its
trials recorded. This replays several halfwidths on the same rollouts, side by side, and reports
for each the share of rollouts saved, every axis's fitted exponent and the width of its interval,
and the recommendation's status, so the rule's cost in evidence is visible beside its saving.

    python benchmarks/study_sequential.py runs/study [--halfwidths 0.07 0.08 0.1 0.12] [--json [PATH]]
    python benchmarks/study_sequential.py runs/study --scale log-gap --halfwidths 0.15 0.2 0.25 0.3
    python benchmarks/study_sequential.py docs/results/study --scale log-gap --halfwidths 0.35 --extra 0 48 96

``--scale log-gap`` judges each trial's interval on log(1 - score), the scale the laws are fitted on:
a trial far from the target (a large gap) is then known well enough sooner than one close to it.
Halfwidth 0 (the first row) is the fixed allocation. ``--extra N`` adds N rollouts after the stopping
rule, a round at a time, to the pairs trials whose noise most blurs the law's prediction at the
recommended plan (``sequential.extra_rollouts`` of the study config).
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
    targeted_replay,
)
from report import add_json_option, emit_json


def replay(
    study: Path, halfwidths: list[float], scale: str = "score", extras: tuple[int, ...] = (0,)
) -> list[dict]:
    """One row per halfwidth and number of extra rollouts: the saving, exponents, interval widths
    and recommendation status (the first row, halfwidth 0, is the fixed allocation itself)."""
    config = load_study_config()
    tables = {axis: _tables(study / "sweeps" / axis) for axis in AXES}
    rows = []
    settings = [(0.0, 0)] + [(h, extra) for h in halfwidths for extra in extras]
    for halfwidth, extra in settings:
        rule = SequentialRule(
            halfwidth=halfwidth,
            min_episodes=config.sequential.min_episodes,
            round_size=config.sequential.round_size,
            scale=scale,
            extra_rollouts=extra,
        )
        config.sequential = rule
        cut, saving = sequential_replay(tables, rule, config.confidence)
        if extra:
            cut, saving = targeted_replay(tables, cut, saving, config)
        fits = {axis: axis_fits(*cut[axis], axis, config.confidence)["summary"] for axis in AXES}
        recommendation = choose_plans(config, cut["n_pairs"])[0]
        rows.append({
            "halfwidth": halfwidth,
            "scale": scale,
            "extra_rollouts": extra,
            "extra_given": saving.get("extra_given", {}),
            "rollouts": saving["rollouts_sequential"],
            "rollouts_fixed": saving["rollouts_fixed"],
            "saved_fraction": saving["saved_fraction"],
            "alpha": {axis: fits[axis]["alpha"] for axis in AXES},
            "alpha_ci_width": {axis: fits[axis]["alpha_ci"][1] - fits[axis]["alpha_ci"][0] for axis in AXES},
            "recommendation": recommendation.status,
            "plan": _plan_words(recommendation),
        })  # fmt: skip
    return rows


def allocation_monte_carlo(
    study: Path, halfwidth: float, scale: str, extras: tuple[int, ...], permutations: int, seed: int = 0
) -> list[dict]:
    """Where extra rollouts should go, judged over many rollout orders of the pairs sub-study.

    Each replicate draws every pairs trial's rollouts anew, with replacement, from its recorded ones
    (as many as were recorded: the cap of every arm), applies the stopping rule, then ``extra`` more
    rollouts (targeted, uniform), and fits the log-log law; its error is the predicted score at the
    recommended plan's count (from all recorded rollouts) against that prediction from all recorded
    rollouts, the truth of this resampled world. Beside them, the fixed allocation at the same number
    of rollouts per trial, and at all of them. (Drawn with replacement, a trial given all its
    rollouts is not thereby exact, as it would be when drawing without replacement.)
    """
    import numpy as np
    from demoscale.scaling import fit_law
    from demoscale.study import _cut_tables, extra_rollouts

    config = load_study_config()
    rule = SequentialRule(halfwidth=halfwidth, min_episodes=config.sequential.min_episodes,
                          round_size=config.sequential.round_size, scale=scale)  # fmt: skip
    results, rollouts = _tables(study / "sweeps" / "n_pairs")
    at_full = choose_plans(config, (results, rollouts))[1].n_pairs

    def predicted(rows, kept_rollouts) -> float:
        fit = fit_law(
            rows, axis="n_pairs", method="loglog", rollouts=kept_rollouts, confidence=config.confidence
        )
        return float(fit.predict([at_full]).score[0])

    truth = predicted(results, rollouts)
    rng = np.random.default_rng(seed)
    arms: dict[str, dict[str, list[float]]] = {}

    def record(arm: str, kept: dict[str, int], table) -> None:
        rows, kept_rollouts = _cut_tables(results, table, kept, config.confidence)
        entry = arms.setdefault(arm, {"error": [], "rollouts": []})
        entry["error"].append(predicted(rows, kept_rollouts) - truth)
        entry["rollouts"].append(sum(kept.values()))

    trials = list(results["trial_id"])
    import pandas as pd

    recorded = {trial: rollouts[rollouts["trial_id"] == trial] for trial in trials}
    for _ in range(permutations):
        table = pd.concat(
            [rows.iloc[rng.integers(0, len(rows), len(rows))].assign(rollout_index=np.arange(len(rows)))
             for rows in recorded.values()], ignore_index=True,
        )  # fmt: skip
        record("fixed, all recorded", {t: len(recorded[t]) for t in trials}, table)
        cut, saving = sequential_replay({"n_pairs": (results, table)}, rule, config.confidence)
        stopped = saving["kept"]["n_pairs"]
        record("stopping rule", stopped, table)
        at = choose_plans(config, cut["n_pairs"])[1].n_pairs
        for extra in extras:
            for policy in ("targeted", "uniform"):
                kept, _ = extra_rollouts(results, table, stopped, at, extra, rule.round_size, policy)
                record(f"+{extra} {policy}", kept, table)
            per_trial = round((sum(stopped.values()) + extra) / len(trials))
            record(f"fixed, same rollouts as +{extra}", {t: per_trial for t in trials}, table)
    rows = []
    for arm, entry in arms.items():
        errors = np.asarray(entry["error"])
        rows.append({"arm": arm, "rmse": float(np.sqrt(np.mean(errors**2))), "mean_abs": float(np.mean(np.abs(errors))),
                     "p90_abs": float(np.quantile(np.abs(errors), 0.9)),
                     "mean_rollouts": float(np.mean(entry["rollouts"])), "rollouts_fixed": int(len(rollouts)),
                     "permutations": permutations, "at_n_pairs": int(at_full), "truth": truth})  # fmt: skip
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
    parser.add_argument(
        "--extra", type=int, nargs="+", default=[0],
        help="rollouts added after the stopping rule to the pairs trials that most blur the recommendation",
    )  # fmt: skip
    parser.add_argument(
        "--permutations", type=int, default=0,
        help="also judge the extra rollouts over this many resamplings of the pairs sub-study's rollouts "
        "(the first halfwidth; 0: skip)",
    )  # fmt: skip
    add_json_option(parser)
    args = parser.parse_args(argv)
    if not all((args.study / "sweeps" / axis / "rollouts.csv").exists() for axis in AXES):
        raise SystemExit(f"{args.study}: needs sweeps/<axis>/rollouts.csv for {', '.join(AXES)}")
    rows = replay(args.study, args.halfwidths, args.scale, tuple(args.extra))
    print(f"{'halfwidth':>9} {'extra':>5} {'rollouts':>9} {'saved':>6}  " + "  ".join(f"{a + ' CI width':>22}" for a in AXES)
          + "  recommendation")  # fmt: skip
    for row in rows:
        widths = "  ".join(f"{row['alpha_ci_width'][a]:>22.3f}" for a in AXES)
        plan = row["plan"]
        print(f"{row['halfwidth']:>9.2f} {row['extra_rollouts']:>5d} {row['rollouts']:>9d} {row['saved_fraction']:>6.1%}  {widths}"
              f"  {row['recommendation']}: {plan['n_pairs']} pairs, {plan['expected_score']:.3f}")  # fmt: skip
    result = {"study": str(args.study), "rows": rows}
    if args.permutations:
        extras = tuple(e for e in args.extra if e > 0) or (48,)
        arms = allocation_monte_carlo(args.study, args.halfwidths[0], args.scale, extras, args.permutations)
        print(f"\nPairs sub-study over {args.permutations} resamplings of its rollouts, halfwidth {args.halfwidths[0]:g} ({args.scale}): "
              f"error of the predicted score at {arms[0]['at_n_pairs']} pairs against all {arms[0]['rollouts_fixed']} rollouts "
              f"({arms[0]['truth']:.3f})")  # fmt: skip
        print(f"{'arm':<34} {'rollouts':>9} {'RMSE':>7} {'mean |err|':>11} {'90% |err|':>10}")
        for arm in arms:
            print(f"{arm['arm']:<34} {arm['mean_rollouts']:>9.1f} {arm['rmse']:>7.4f} {arm['mean_abs']:>11.4f} "
                  f"{arm['p90_abs']:>10.4f}")  # fmt: skip
        result["allocation_monte_carlo"] = arms
    emit_json("study_sequential", result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
