"""``demoscale laws``: fit, compare and plot scaling laws; recommend a data-collection budget.

A thin shell over :func:`fit_law`, :func:`compare_laws`, :func:`plot_laws` and
:func:`recommend_budget`. ``fit --target-score`` and ``recommend`` print the same decision summary.
One ``--confidence`` (default ``demoscale.DEFAULT_CONFIDENCE``) sets every interval and the decision
rule. Importing this module never imports torch (matplotlib loads only for ``plot``).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys

from demoscale import DEFAULT_CONFIDENCE
from demoscale.scaling.names import AXES, BOOTSTRAP_MODES, METHODS


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", help="results table (.csv or .parquet), one row per trial")
    parser.add_argument(
        "--rollouts",
        default=None,
        help="per-rollout table (default: rollouts.csv|parquet next to RESULTS, if any)",
    )
    parser.add_argument("--n-bootstrap", type=int, default=1000, help="bootstrap replicates (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    parser.add_argument(
        "--confidence",
        "--level",
        "--interval-confidence",
        dest="confidence",
        type=float,
        default=DEFAULT_CONFIDENCE,
        help="level of every interval, and the probability a recommended plan must reach the target "
        f"(default {DEFAULT_CONFIDENCE:g}; --level and --interval-confidence are older names)",
    )


def _decision_options(parser: argparse.ArgumentParser) -> None:
    """What ``fit --target-score`` and ``recommend`` share: the cost model and the search limits."""
    parser.add_argument("--cost-env", type=float, default=1.0, help="cost of one new environment (default 1)")
    parser.add_argument("--cost-object", type=float, default=0.0, help="cost of one new object (default 0)")
    parser.add_argument("--cost-demo", type=float, default=0.0, help="cost of one demonstration (default 0)")
    parser.add_argument(
        "--cost-unit", default="", help="unit of the costs for the text, e.g. '$' or 'hours' (default none)"
    )
    parser.add_argument(
        "--max-envs", type=int, default=4096, help="search cap on environments (default 4096)"
    )
    parser.add_argument(
        "--max-demos-per-pair", type=int, default=1000, help="search cap on demos per pair (default 1000)"
    )
    parser.add_argument(
        "--max-extrapolation",
        type=float,
        default=4.0,
        help="plans go up to this factor of the largest tested value (default 4)",
    )


def _fit_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--axis", default="n_envs", choices=AXES, help="x axis of the law (default n_envs)")
    parser.add_argument(
        "--bootstrap",
        default="auto",
        choices=BOOTSTRAP_MODES,
        help="what the bootstrap resamples (default auto: trials and rollouts when known)",
    )


def build_parser() -> argparse.ArgumentParser:
    from demoscale.conventions import HelpFormatter

    parser = argparse.ArgumentParser(
        prog="demoscale laws",
        description="Fit data-scaling laws of 1 - score, plot them, and recommend what data to collect.",
        formatter_class=HelpFormatter,
    )
    sub = parser.add_subparsers(dest="action", required=True, metavar="{fit,compare,plot,recommend}")
    # Every action's options show their defaults too.
    sub.add_parser = functools.partial(sub.add_parser, formatter_class=HelpFormatter)

    fit = sub.add_parser("fit", help="fit one law and print its summary")
    _common(fit)
    _fit_options(fit)
    fit.add_argument(
        "--method",
        default=None,
        choices=METHODS,
        help="law form (default loglog, the study's); with --target-score it is also the decision's law, "
        "which is otherwise chosen by model comparison",
    )
    fit.add_argument(
        "--predict",
        type=float,
        nargs="*",
        default=None,
        metavar="X",
        help="also predict the score at these axis values",
    )
    fit.add_argument(
        "--target-score",
        type=float,
        default=None,
        help="also print the decision summary for this score (as 'recommend --target' does)",
    )
    _decision_options(fit)
    fit.add_argument("--json", action="store_true", help="print JSON instead of the summary")

    compare = sub.add_parser(
        "compare", help="fit every applicable form; AIC and leave-one-out error side by side"
    )
    _common(compare)
    _fit_options(compare)
    compare.add_argument("--json", action="store_true", help="print JSON instead of the table")

    plot = sub.add_parser("plot", help="log-log panels per axis, PNG and SVG")
    _common(plot)
    plot.add_argument("--out", required=True, help="output folder")
    plot.add_argument(
        "--axes", nargs="*", default=None, choices=AXES, help="panels (default: every axis that varies)"
    )
    plot.add_argument(
        "--methods", nargs="*", default=["loglog", "saturating"], choices=["loglog", "saturating"]
    )
    plot.add_argument("--dpi", type=int, default=150, help="PNG resolution (default 150)")
    plot.add_argument(
        "--extrapolate", type=float, default=4.0, help="shade up to this factor beyond the data"
    )
    plot.add_argument("--target", type=float, default=None, help="draw this target score as a line")

    recommend = sub.add_parser(
        "recommend", help="the decision summary: what to add to reach a target score, and how sure that is"
    )
    _common(recommend)
    recommend.add_argument("--target", type=float, default=0.9, help="target score on unseen environments")
    _decision_options(recommend)
    recommend.add_argument(
        "--axis", default=None, choices=["n_envs", "n_pairs"], help="law axis (default auto)"
    )
    recommend.add_argument(
        "--method", default=None, choices=METHODS, help="law form (default: chosen by model comparison)"
    )
    recommend.add_argument(
        "--bootstrap",
        default="auto",
        choices=BOOTSTRAP_MODES,
        help="what the bootstrap resamples (default auto)",
    )
    recommend.add_argument("--json", action="store_true", help="print JSON instead of the summary")
    return parser


def _decide(results, args: argparse.Namespace, target: float, axis: str | None):
    """The one decision summary both ``fit --target-score`` and ``recommend`` print."""
    from demoscale.scaling.budget import recommend_budget

    return recommend_budget(
        results,
        target=target,
        cost_env=args.cost_env,
        cost_object=args.cost_object,
        cost_demo=args.cost_demo,
        cost_unit=args.cost_unit,
        confidence=args.confidence,
        axis=axis,
        method=args.method,
        max_envs=args.max_envs,
        max_demos_per_pair=args.max_demos_per_pair,
        max_extrapolation=args.max_extrapolation,
        n_bootstrap=args.n_bootstrap,
        seed=args.seed,
        bootstrap=args.bootstrap,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv if argv is not None else sys.argv[1:])
    from demoscale.scaling.fits import _json_safe
    from demoscale.scaling.table import ResultsError, load_results

    try:
        results = load_results(args.results, rollouts=args.rollouts)
        if args.action == "fit":
            from demoscale.scaling.fits import fit_law

            fit = fit_law(
                results,
                axis=args.axis,
                method=args.method or "loglog",
                n_bootstrap=args.n_bootstrap,
                confidence=args.confidence,
                seed=args.seed,
                bootstrap=args.bootstrap,
            )
            prediction = fit.predict(args.predict) if args.predict else None
            required = decision = None
            if args.target_score is not None:
                required = fit.required_x(args.target_score)
                if args.axis in ("n_envs", "n_pairs"):
                    decision = _decide(results, args, args.target_score, args.axis)
            if args.json:
                payload = fit.to_dict()
                if prediction is not None:
                    payload["prediction"] = prediction.to_dict()
                if required is not None:
                    payload["required_x"] = required
                if decision is not None:
                    payload["decision"] = decision.to_dict()
                print(json.dumps(payload, indent=2))
            else:
                print(fit.summary())
                if prediction is not None:
                    print(f"Predicted score ({args.confidence:.0%} bootstrap interval):")
                    print(prediction.to_frame().to_string(index=False, float_format=lambda v: f"{v:.4g}"))
                if decision is not None:
                    print(decision.summary())
                elif required is not None:
                    # No budget over this axis (objects, demos): the law's own answer, with its caveats.
                    low, high = (float("inf") if v is None else v for v in required["interval"])
                    x_needed = float("inf") if required["x"] is None else required["x"]
                    print(
                        f"{args.axis} for score {args.target_score:g}: {x_needed:.4g} "
                        f"({args.confidence:.0%} interval {low:.4g} - {high:.4g}; "
                        f"{required['extrapolation_factor'] or float('inf'):.1f}x the largest tested value; "
                        f"{required['share_of_bootstrap_laws_reaching']:.0%} of bootstrap laws get there)"
                    )
        elif args.action == "compare":
            from demoscale.scaling.fits import compare_laws

            table = compare_laws(
                results,
                axis=args.axis,
                n_bootstrap=args.n_bootstrap,
                confidence=args.confidence,
                seed=args.seed,
                bootstrap=args.bootstrap,
            )
            if args.json:
                print(json.dumps(_json_safe(table.reset_index().to_dict("records")), indent=2))
            else:
                print(f"Law forms over {args.axis} (log-gap residuals; lower AIC and LOO error are better)")
                print(table.to_string(float_format=lambda v: f"{v:.4g}"))
        elif args.action == "plot":
            from demoscale.scaling.plots import plot_laws

            paths = plot_laws(
                results,
                args.out,
                axes=args.axes,
                methods=tuple(args.methods),
                n_bootstrap=args.n_bootstrap,
                confidence=args.confidence,
                seed=args.seed,
                extrapolate=args.extrapolate,
                dpi=args.dpi,
                target=args.target,
            )
            for path in paths:
                print(path)
        else:
            recommendation = _decide(results, args, args.target, args.axis)
            print(json.dumps(recommendation.to_dict(), indent=2) if args.json else recommendation.summary())
    except (ResultsError, ValueError) as error:
        print(f"demoscale laws: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
