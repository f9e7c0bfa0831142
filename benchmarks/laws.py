"""Timing of scaling-law fits: a saturating fit with 1,000 bootstrap resamples on a 24-point table.

Runs on one core (BLAS threads pinned to 1). Reports medians over several runs, and, side by side in
the same run, the batched bootstrap against refitting each replicate with ``least_squares``.

    python benchmarks/laws.py [--runs 7] [--json [PATH]]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from demoscale.scaling import fit_law, load_results  # noqa: E402
from demoscale.scaling.models import SATURATING, batched_robust_lm  # noqa: E402
from report import add_json_option, emit_json  # noqa: E402
from scipy.optimize import least_squares  # noqa: E402

TARGET_S = 2.0


def make_table(seed: int = 0) -> pd.DataFrame:
    """24 trials: 8 environment counts x 3 seeds, 40 rollouts each, from 0.05 + 0.6 x^-0.5."""
    rng = np.random.default_rng(seed)
    n_envs = np.repeat([1, 2, 4, 8, 16, 32, 64, 128], 3).astype(float)
    gap = 0.05 + 0.6 * n_envs**-0.5
    return pd.DataFrame(
        {
            "trial_id": [f"t{i}" for i in range(n_envs.size)],
            "n_envs": n_envs,
            "score": rng.binomial(40, 1 - gap) / 40,
            "n_rollouts": 40,
        }
    )


def median_time(function, runs: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs per measurement (median reported)")
    parser.add_argument("--n-bootstrap", type=int, default=1000)
    add_json_option(parser)
    args = parser.parse_args(argv)

    table = load_results(make_table())
    fit_law(table, method="saturating", n_bootstrap=10)  # warm imports and caches
    rows = []

    def record(name: str, function, runs: int) -> float:
        median, times = median_time(function, runs)
        rows.append({"case": name, "median_s": median, "min_s": min(times), "runs": runs})
        return median

    full = record(
        f"saturating fit_law, {args.n_bootstrap} bootstrap, with leave-one-out",
        lambda: fit_law(table, method="saturating", n_bootstrap=args.n_bootstrap),
        args.runs,
    )
    record(
        f"saturating fit_law, {args.n_bootstrap} bootstrap, no leave-one-out",
        lambda: fit_law(table, method="saturating", n_bootstrap=args.n_bootstrap, leave_one_out=False),
        args.runs,
    )
    record(
        f"loglog fit_law, {args.n_bootstrap} bootstrap",
        lambda: fit_law(table, method="loglog", n_bootstrap=args.n_bootstrap),
        args.runs,
    )

    # Side by side: the bootstrap refits alone, batched vs one least_squares call per replicate.
    fit = fit_law(table, method="saturating", n_bootstrap=10, leave_one_out=False)
    rng = np.random.default_rng(1)
    replicas = rng.binomial(40, table.trials["score"].to_numpy(), size=(args.n_bootstrap, 24)) / 40
    targets = np.log(np.clip(1 - replicas, 0.5 / 41, None))
    x = fit.x
    start = np.tile(fit.param_vector, (args.n_bootstrap, 1))

    def batched() -> None:
        batched_robust_lm(SATURATING, start, x, None, targets, fit.loss, fit.f_scale)

    loop_rows = min(200, args.n_bootstrap)  # the loop is slow; time a slice and scale per replicate

    def one_by_one() -> None:
        for row in targets[:loop_rows]:
            least_squares(
                lambda p, y=row: SATURATING.log_gap_and_jacobian(p[None], x)[0][0] - y,
                fit.param_vector,
                jac=lambda p: SATURATING.log_gap_and_jacobian(p[None], x)[1][0],
                bounds=(SATURATING.lower, SATURATING.upper),
                loss=fit.loss,
                f_scale=fit.f_scale,
            )

    fast = record(f"bootstrap refits only: batched LM ({args.n_bootstrap})", batched, args.runs)
    slow = record(f"bootstrap refits only: least_squares loop ({loop_rows})", one_by_one, 3)
    slow *= args.n_bootstrap / loop_rows

    width = max(len(r["case"]) for r in rows)
    print(f"{'case':<{width}}  {'median s':>9}  {'min s':>8}  runs")
    for r in rows:
        print(f"{r['case']:<{width}}  {r['median_s']:>9.3f}  {r['min_s']:>8.3f}  {r['runs']:>4}")
    print(
        f"\nsaturating fit with {args.n_bootstrap} bootstrap: median {full:.3f} s (target < {TARGET_S} s): "
        + ("met" if full < TARGET_S else "NOT met")
    )
    print(f"batched bootstrap vs least_squares loop, per replicate: {slow / fast:.1f}x faster")
    emit_json(
        "laws",
        {
            "threads": os.environ.get("OMP_NUM_THREADS"),
            "rows": rows,
            "saturating_fit_median_s": full,
            "target_s": TARGET_S,
            "batched_speedup": slow / fast,
        },
        args.json,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
