"""Plots: one log-log panel per axis present, written as PNG and SVG."""

from __future__ import annotations

import pandas as pd
from demoscale.scaling import plot_laws


def test_plots_written_as_png_and_svg(tmp_path, synthetic):
    by_envs, rollouts = synthetic(lambda x, d: 0.05 + 0.6 * x**-0.5, [1, 2, 4, 8, 16, 32], seeds=2)
    by_objects, _ = synthetic(lambda x, d: 0.2 + 0.4 * x**-0.3, [1, 2, 4, 8])
    by_objects = by_objects.assign(
        trial_id="o" + by_objects["trial_id"], n_objects=by_objects["n_envs"], n_envs=1.0
    )
    table = pd.concat([by_envs, by_objects], ignore_index=True)
    table.loc[len(by_envs) - 1, "score"] = 1.0  # a perfect trial goes through the 0/1 rule
    # All panels in one figure (rendering is the slow part; per-axis files are checked below).
    paths = plot_laws(table, tmp_path / "plots", n_bootstrap=100, separate=False, dpi=72)
    assert [path.name for path in paths] == ["scaling_laws.png", "scaling_laws.svg"]
    for path in paths:
        assert path.exists() and path.stat().st_size > 20_000, path
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = paths[1].read_text()
    assert "<svg" in svg and "extrapolation" in svg
    # One panel per axis that varies: environments, objects, pairs (demos per pair never varies here).
    for label in ("Training environments", "Objects per environment", "Environment-object pairs"):
        assert label in svg
    assert "Demonstrations per pair" not in svg


def test_figure_reads_as_score_too_and_shows_target_bands_and_evidence(tmp_path, demo_shaped_results):
    """Beside the gap axis a score axis; labelled bands; n per point; the target line (from the SVG text)."""
    paths = plot_laws(
        demo_shaped_results, tmp_path, axes=["n_envs"], n_bootstrap=100, separate=False, dpi=72, target=0.9
    )
    svg = paths[1].read_text()
    assert "score = 1 − gap" in svg  # the second y axis
    assert "target score 0.9 (gap 0.1)" in svg
    assert "log-log OLS: 90% bootstrap band" in svg and "saturating: 90% bootstrap band" in svg
    # Each mean stands on two trials of 60 rollouts each (the demo-shaped table).
    assert svg.count("n=120") == 4 and "(2 trials)" in svg
    untargeted = plot_laws(demo_shaped_results, tmp_path / "none", axes=["n_envs"], n_bootstrap=50,
                           separate=False, dpi=72)  # fmt: skip
    assert "target score" not in untargeted[1].read_text()


def test_laws_of_several_tables_side_by_side(tmp_path, synthetic) -> None:
    """plot_fits draws laws fitted on different tables (a study's sub-studies) in one figure."""
    from demoscale.scaling import fit_law, plot_fits

    envs, _ = synthetic(lambda x, d: 0.6 * x**-0.5, [1, 2, 4, 8, 16])
    objects, _ = synthetic(lambda x, d: 0.7 * x**-0.2, [1, 2, 4, 8, 16])
    objects = objects.assign(n_objects=objects["n_envs"], n_envs=1.0)
    panels = [
        ("n_envs", [fit_law(envs, axis="n_envs", n_bootstrap=50)]),
        ("n_objects", [fit_law(objects, axis="n_objects", n_bootstrap=50)]),
    ]
    paths = plot_fits(panels, tmp_path, name="both", separate=False, dpi=72, titles=["A", "B"])
    assert [p.name for p in paths] == ["both.png", "both.svg"]
    svg = paths[1].read_text()
    assert "training environments (log scale)" in svg and "objects per environment (log scale)" in svg
    assert ">A<" in svg and ">B<" in svg
