"""Log-log plots of the optimality gap against each data axis, with fitted laws and their bands."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a display

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from demoscale import DEFAULT_CONFIDENCE
from demoscale.scaling.fits import LawFit, fit_law
from demoscale.scaling.table import (
    AXIS_LABELS,
    ResultsError,
    ResultsTable,
    adjusted_gap,
    as_results_table,
)
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator
from scipy.stats import norm

PANEL_AXES: tuple[str, ...] = ("n_envs", "n_objects", "n_pairs", "demos_per_pair")
METHOD_STYLE = {
    "loglog": {"color": "#1f77b4", "linestyle": "-", "label": "log-log OLS"},
    "saturating": {"color": "#d62728", "linestyle": "--", "label": "saturating"},
}


def wilson_interval(
    successes: np.ndarray, trials: np.ndarray, confidence: float
) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score interval for a proportion (successes may be fractional for staged scores)."""
    z = float(norm.ppf((1 + confidence) / 2))
    p = successes / trials
    centre = (p + z**2 / (2 * trials)) / (1 + z**2 / trials)
    half = z * np.sqrt(p * (1 - p) / trials + z**2 / (4 * trials**2)) / (1 + z**2 / trials)
    return centre - half, centre + half


def _points(fit: LawFit, confidence: float) -> pd.DataFrame:
    """Mean score per axis value with an interval: Wilson on the pooled rollouts when counts are
    known, else a normal interval over the trials (none for a single trial)."""
    frame = pd.DataFrame({"x": fit.x, "score": fit.score})
    frame["n"] = fit.n_rollouts if fit.n_rollouts is not None else np.nan
    rows = []
    for x, group in frame.groupby("x"):
        mean = group["score"].mean()
        if group["n"].notna().all():
            total = group["n"].sum()
            low, high = wilson_interval(np.array([mean * total]), np.array([total]), confidence)
            low, high = float(low[0]), float(high[0])
        elif len(group) > 1:
            half = norm.ppf((1 + confidence) / 2) * group["score"].std(ddof=1) / np.sqrt(len(group))
            low, high = mean - half, mean + half
        else:
            low = high = mean
        rollouts = int(group["n"].sum()) if group["n"].notna().all() else None
        rows.append(
            {
                "x": x,
                "score": mean,
                "low": max(low, 0.0),
                "high": min(high, 1.0),
                "trials": len(group),
                "rollouts": rollouts,
            }
        )
    points = pd.DataFrame(rows)
    n_mean = None if fit.n_rollouts is None else np.nanmean(fit.n_rollouts)
    points["gap"] = adjusted_gap(
        points["score"].to_numpy(), None if n_mean is None else np.full(len(points), n_mean)
    )[0]
    return points


SCORE_TICKS = (0.0, 0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999)


def _score_axis(ax: plt.Axes) -> None:
    """A second y axis on the right reading the same curves as score = 1 − gap."""
    secondary = ax.secondary_yaxis("right", functions=(lambda gap: 1 - gap, lambda score: 1 - score))
    low, high = ax.get_ylim()
    ticks = [t for t in SCORE_TICKS if low <= 1 - t <= high]
    secondary.set_yticks(ticks)
    secondary.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    secondary.yaxis.set_minor_locator(NullLocator())
    secondary.set_ylabel("score = 1 − gap")


def _point_label(row: pd.Series) -> str:
    if row["rollouts"] is not None and not pd.isna(row["rollouts"]):
        return f"n={int(row['rollouts'])}" + (f"\n({int(row['trials'])} trials)" if row["trials"] > 1 else "")
    return f"{int(row['trials'])} trial" + ("s" if row["trials"] > 1 else "")


def _draw_panel(
    ax: plt.Axes,
    axis: str,
    fits: list[LawFit],
    extrapolate: float,
    confidence: float,
    target: float | None = None,
) -> None:
    reference = fits[0]
    points = _points(reference, confidence)
    x_min, x_max = float(points["x"].min()), float(points["x"].max())
    grid = np.geomspace(x_min, x_max * extrapolate, 200)
    ax.axvspan(x_max, x_max * extrapolate, color="0.92", zorder=0, label="extrapolation")
    for fit in fits:
        style = METHOD_STYLE.get(fit.method, {"color": "k", "linestyle": ":", "label": fit.method})
        prediction = fit.predict(grid, interval="bootstrap", confidence=confidence)
        gap_low, gap_high = 1 - prediction.high, 1 - prediction.low
        label = f"{style['label']}: {fit.equation_text(2)}"
        if fit.r is not None:
            label += f" (r = {fit.r:.2f})"
        ax.plot(
            grid,
            np.maximum(1 - prediction.score, 1e-4),
            color=style["color"],
            linestyle=style["linestyle"],
            linewidth=2,
            label=label,
        )
        ax.fill_between(
            grid,
            np.maximum(gap_low, 1e-4),
            np.maximum(gap_high, 1e-4),
            color=style["color"],
            alpha=0.15,
            linewidth=0,
            label=f"{style['label']}: {confidence:.0%} bootstrap band",
        )
    # Per-trial points faintly, means with their interval boldly.
    trial_gap = reference.gap
    ax.scatter(reference.x, trial_gap, s=12, color="0.55", alpha=0.6, zorder=3, label="trials")
    gap_low = 1 - points["high"].to_numpy()
    gap_high = 1 - points["low"].to_numpy()
    gap = points["gap"].to_numpy()
    yerr = np.vstack([np.clip(gap - np.maximum(gap_low, 1e-4), 0, None), np.clip(gap_high - gap, 0, None)])
    ax.errorbar(
        points["x"],
        gap,
        yerr=yerr,
        fmt="o",
        color="k",
        markersize=6,
        capsize=3,
        zorder=4,
        label=f"mean per value ({confidence:.0%} interval)",
    )
    # How much evidence each mean stands on: rollouts pooled (and trials), or trials alone.
    for (_, row), y in zip(points.iterrows(), gap, strict=True):
        ax.annotate(
            _point_label(row),
            (row["x"], y),
            xytext=(6, 6),
            textcoords="offset points",
            fontsize=7,
            color="0.25",
            zorder=6,
        )
    if target is not None:
        ax.axhline(1 - target, color="#2ca02c", linestyle="-.", linewidth=1.5, zorder=2,
                   label=f"target score {target:g} (gap {1 - target:.3g})")  # fmt: skip
    adjusted = points["score"].isin([0.0, 1.0]).to_numpy()
    if adjusted.any():
        ax.scatter(
            points["x"][adjusted],
            gap[adjusted],
            s=90,
            facecolors="none",
            edgecolors="#ff7f0e",
            zorder=5,
            label="score 0 or 1 (0/1 rule)",
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(f"{AXIS_LABELS.get(axis, axis)} (log scale)")
    ax.set_ylabel("optimality gap 1 − score (log scale)")
    held = ", ".join(f"{k} = {v:g}" for k, v in reference.held.items())
    ax.set_title(AXIS_LABELS.get(axis, axis).capitalize() + (f"\n({held})" if held else ""), fontsize=11)
    ax.grid(True, which="major", alpha=0.3)
    # Below the axes: inside it would hide the target line or the extrapolated bands.
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False)
    _score_axis(ax)


def plot_laws(
    table: ResultsTable | pd.DataFrame | str | Path,
    out_dir: str | Path,
    axes: list[str] | tuple[str, ...] | None = None,
    methods: tuple[str, ...] = ("loglog", "saturating"),
    rollouts: str | Path | pd.DataFrame | None = None,
    n_bootstrap: int = 1000,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
    extrapolate: float = 4.0,
    name: str = "scaling_laws",
    separate: bool = True,
    dpi: int = 150,
    target: float | None = None,
) -> list[Path]:
    """Draw one log-log panel per axis present (environments, objects, pairs, demos per pair).

    By default the pairs panel is drawn only when both environments and objects vary (otherwise it
    repeats one of them). Each panel shows the trials, the mean per axis value with a Wilson interval
    (pooled rollouts) or a normal interval over trials and the number of rollouts (and trials) behind
    it, each fitted law with its fitted equation and its labelled bootstrap band at ``confidence``,
    the extrapolation region (up to ``extrapolate`` x the largest tested value) shaded, the
    ``target`` score as a line when given, and a score axis (1 − gap) beside the gap axis. Writes
    ``<name>.png`` and ``<name>.svg`` (all panels) and, when ``separate``, ``<name>_<axis>.png/.svg``
    per panel (PNG at ``dpi``); returns the paths written.
    """
    results = as_results_table(table, rollouts)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if axes is None:
        axes = [a for a in PANEL_AXES if a in results.axes_present]
        if "n_pairs" in axes and not {"n_envs", "n_objects"} <= set(axes):
            axes.remove("n_pairs")  # pairs would only repeat the one factor that varies
    axes = list(axes)
    panels: list[tuple[str, list[LawFit]]] = []
    skipped: list[str] = []
    for axis in axes:
        fits = []
        for method in methods:
            try:
                fits.append(
                    fit_law(
                        results,
                        axis=axis,
                        method=method,
                        n_bootstrap=n_bootstrap,
                        confidence=confidence,
                        seed=seed,
                        leave_one_out=False,
                    )
                )
            except ResultsError as error:
                skipped.append(f"{axis}/{method}: {error}")
        if fits:
            panels.append((axis, fits))
    if not panels:
        raise ResultsError(f"{results.source}: nothing to plot ({'; '.join(skipped) or 'no axis varies'})")

    with plt.rc_context({"svg.fonttype": "none"}):  # SVG text stays text: smaller, searchable, faster
        return _render(panels, out_dir, name, separate, extrapolate, confidence, dpi, target)


def plot_fits(
    panels: list[tuple[str, list[LawFit]]],
    out_dir: str | Path,
    name: str = "scaling_laws",
    confidence: float = DEFAULT_CONFIDENCE,
    extrapolate: float = 4.0,
    separate: bool = True,
    dpi: int = 150,
    target: float | None = None,
    titles: list[str] | None = None,
) -> list[Path]:
    """Draw laws already fitted, one panel per ``(axis, [fits of that axis])`` — for laws of several
    tables side by side (the sub-studies of a study, a law at two training budgets), which
    :func:`plot_laws` (one table) cannot hold. The same panels, files and options as
    :func:`plot_laws`; ``titles`` (one per panel) head the panels."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    panels = [(axis, fits) for axis, fits in panels if fits]
    if not panels:
        raise ResultsError("nothing to plot: no fitted laws were given")
    with plt.rc_context({"svg.fonttype": "none"}):
        return _render(panels, out_dir, name, separate, extrapolate, confidence, dpi, target, titles)


def _render(
    panels: list[tuple[str, list[LawFit]]],
    out_dir: Path,
    name: str,
    separate: bool,
    extrapolate: float,
    confidence: float,
    dpi: int,
    target: float | None = None,
    titles: list[str] | None = None,
) -> list[Path]:
    written: list[Path] = []
    figure, grid_axes = plt.subplots(1, len(panels), figsize=(6.4 * len(panels), 6.8), squeeze=False)
    for index, (ax, (axis, fits)) in enumerate(zip(grid_axes[0], panels, strict=True)):
        _draw_panel(ax, axis, fits, extrapolate, confidence, target)
        if titles:
            ax.set_title(titles[index])
    # Two lines: one panel is 6.4 inches wide, too narrow for the title on one line.
    figure.suptitle(
        "Scaling laws of the optimality gap\n(shaded: extrapolation beyond the tested data)", fontsize=12
    )
    figure.tight_layout()
    for suffix in ("png", "svg"):
        path = out_dir / f"{name}.{suffix}"
        figure.savefig(path, dpi=dpi)
        written.append(path)
    plt.close(figure)
    for axis, fits in panels if separate else []:
        figure, ax = plt.subplots(figsize=(6.8, 6.8))
        _draw_panel(ax, axis, fits, extrapolate, confidence, target)
        figure.tight_layout()
        for suffix in ("png", "svg"):
            path = out_dir / f"{name}_{axis}.{suffix}"
            figure.savefig(path, dpi=dpi)
            written.append(path)
        plt.close(figure)
    return written
