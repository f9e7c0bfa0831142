"""`demoscale demo`: the whole loop, end to end, with real MuJoCo, stores, Ray and fits."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from demoscale import DEFAULT_CONFIDENCE
from demoscale.demo import (
    DemoConfig,
    _fit_and_recommend,
    _report_html,
    _report_markdown,
    _Stages,
    load_demo_config,
    sweep_config,
)

REPORT_FILES = [
    "report.md",
    "report.html",
    "results.csv",
    "results.parquet",
    "rollouts.csv",
    "rollouts.parquet",
    "fit.json",
    "recommendation.json",
]


def _run_demo(out: Path, *flags: str, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "demoscale", "demo", "--out", str(out), *flags],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_quick_and_default_configs_are_consistent() -> None:
    default, quick = load_demo_config(), load_demo_config(quick=True)
    assert default.env_counts == [1, 4, 16, 32] and len(default.seeds) >= 2
    assert max(quick.env_counts) <= quick.max_envs < default.max_envs
    grid = sweep_config(default, Path("store.zarr"), Path("sweep"))["grid"]
    assert grid["n_envs"] == default.env_counts and grid["n_objects"] == [1]
    # Rollouts render the camera the demonstrations were recorded with.
    evaluation = sweep_config(default, Path("store.zarr"), Path("sweep"))["eval"]
    assert evaluation["options"]["env_options"]["cameras"] == default.cameras


def test_the_demo_states_everything_at_one_confidence_level() -> None:
    config = load_demo_config()
    assert config.confidence == DEFAULT_CONFIDENCE
    evaluation = sweep_config(config, Path("store.zarr"), Path("sweep"))["eval"]
    assert evaluation["options"]["confidence"] == config.confidence  # rollout intervals too


def test_report_decision_is_the_laws_recommend_summary(
    demo_shaped_results: Path, tmp_path: Path, capsys
) -> None:
    """The report's decision is the text `demoscale laws recommend` prints for the same table."""
    from demoscale.scaling.cli import main as laws_main

    sweep_dir = demo_shaped_results.parent
    results = pd.read_csv(demo_shaped_results)
    rollouts = []  # 60 rollouts per trial whose mean is the trial's score
    for _, row in results.iterrows():
        total = row["score"] * row["n_rollouts"]
        scores = [1.0] * int(total) + [total - int(total)] + [0.0] * (int(row["n_rollouts"]) - int(total) - 1)
        rollouts += [
            {"trial_id": row["trial_id"], "rollout_index": i, "score": v} for i, v in enumerate(scores)
        ]
    pd.DataFrame(rollouts).to_csv(sweep_dir / "rollouts.csv", index=False)
    for column in ("score_ci_low", "score_ci_high", "success_ci_low", "success_ci_high"):
        results[column] = results["score"]  # the report prints them; their values do not matter here
    config = load_demo_config()
    stages = _Stages(["fit", "plot", "recommend"])
    fit, plots, decision = _fit_and_recommend(config, sweep_dir, tmp_path / "report", stages)
    report = _report_markdown(
        config, False, results, fit, decision, plots, stages.seconds, 1.0, tmp_path / "report"
    )
    capsys.readouterr()
    argv = [str(demo_shaped_results), "--target", f"{config.target:g}", "--cost-env", f"{config.cost_env:g}",
            "--cost-object", f"{config.cost_object:g}", "--cost-demo", f"{config.cost_demo:g}",
            "--cost-unit", config.cost_unit, "--confidence", f"{config.confidence:g}"]  # fmt: skip
    assert laws_main(["recommend", *argv]) == 0
    assert capsys.readouterr().out.strip() in report
    assert decision.status == "extrapolation"  # the demo's answer: not "out of reach"
    assert "score (90% interval)" in report and "success rate (90% interval)" in report

    # The HTML page beside it: the same decision, the figure, the table, the videos in place.
    import html

    videos = {"diffusion-e4-o1-d6-s0": ["sweep/trials/diffusion-e4-o1-d6-s0/eval/videos/rollout_0.mp4"]}
    page = _report_html(config, False, results, fit, decision, plots, stages.seconds, 1.0,
                        tmp_path / "report", videos)  # fmt: skip
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert html.escape(decision.summary()) in page
    assert '<img class="figure" src="plots/scaling_laws.png"' in page
    assert page.count("<tr><td") >= len(results)  # one row per trial (and the timing rows)
    assert '<video controls muted preload="metadata" width="320" src="sweep/trials/diffusion-e4' in page
    assert "4 training environment(s), seed 0" in page


def test_demo_config_rejects_too_few_environment_counts() -> None:
    with pytest.raises(ValueError, match="at least three environment counts"):
        DemoConfig(env_counts=[1, 2], max_envs=2)


# Hang guard, not a speed limit: the quick demo takes about 2-4 minutes on a loaded 2-core machine.
QUICK_DEMO_HANG_GUARD_S = 1200


@pytest.mark.timeout(QUICK_DEMO_HANG_GUARD_S + 120)  # the run's own guard fires first, with its output
def test_quick_demo_writes_a_complete_report(tmp_path: Path, terminal) -> None:
    """Run as a newcomer runs it: in an interactive terminal (the sweep's live table draws)."""
    out = tmp_path / "demo"
    code, output = terminal(
        [sys.executable, "-m", "demoscale", "demo", "--out", str(out), "--quick"],
        timeout=QUICK_DEMO_HANG_GUARD_S,
    )
    assert code == 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert "samples/s" in output and "ETA" in output, "the live table with training progress"

    for name in REPORT_FILES:
        assert (out / name).is_file(), f"{name} missing from the report folder"
    assert list((out / "plots").glob("*.png")), "no PNG plot written"

    config = load_demo_config(quick=True)
    results = pd.read_csv(out / "results.csv")
    assert len(results) == len(config.env_counts) * len(config.seeds), "one row per trial"
    assert sorted(results["n_envs"].unique()) == sorted(config.env_counts)
    assert results["trial_id"].is_unique
    assert results["score"].between(0, 1).all()
    rollouts = pd.read_csv(out / "rollouts.csv")
    expected = config.eval_envs * config.eval_objects * config.eval_episodes_per_pair
    assert (rollouts.groupby("trial_id").size() == expected).all()

    fit = json.loads((out / "fit.json").read_text())
    assert fit["n_points"] == len(results)
    recommendation = json.loads((out / "recommendation.json").read_text())
    assert recommendation["status"] in {"ok", "uncertain", "unreachable", "extrapolation"}
    report = (out / "report.md").read_text()
    assert "Fitted law" in report and "Time per stage" in report
    assert "demoscale demo finished" in output
    # Rollout videos people can open, linked from both reports: H.264, one player per trial.
    page = (out / "report.html").read_text()
    sources = re.findall(r'<video [^>]*src="([^"]+)"', page)
    assert len(sources) == len(results), page
    for source in sources:
        assert (out / source).is_file() and f"({source})" in report
    import av

    with av.open(str(out / sources[0])) as container:
        assert container.streams.video[0].codec_context.name == "h264"


@pytest.mark.slow
def test_default_demo_shows_a_scaling_law(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    # A hang guard (3x the longest measured run, 13 min), inside the slow tests' own pytest guard of
    # an hour (tests/conftest.py), so that a hung demo is stopped with its output, not cut off.
    result = _run_demo(out, timeout=2400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    fit = json.loads((out / "fit.json").read_text())
    alpha = fit["params"]["alpha"]
    print(f"alpha = {alpha:.3f}, r = {fit['r']:.3f}")
    assert alpha < 0, f"no scaling signal: alpha = {alpha}"
    # The study's criterion for a law worth reading: a tight log-log fit, not just a negative slope.
    assert abs(fit["r"]) >= 0.8, f"weak scaling signal: alpha = {alpha:.3f}, r = {fit['r']:.3f}"


def test_sweep_yaml_is_the_sweep_the_demo_runs() -> None:
    """configs/sweeps/demo.yaml documents the demo's sweep; it must not drift from configs/demo.yaml."""
    import yaml
    from demoscale.demo import CONFIGS_DIR

    written = yaml.safe_load((CONFIGS_DIR / "sweeps" / "demo.yaml").read_text())
    built = sweep_config(load_demo_config(), Path("store.zarr"), Path("sweep"))
    for section in ("grid", "eval", "budget", "resources", "retries"):
        assert written[section] == built[section], section
    (name, policy), (built_name, built_policy) = *written["policies"].items(), *built["policies"].items()
    assert name == built_name and policy["overrides"] == built_policy["overrides"]
    assert Path(policy["config"]).name == Path(built_policy["config"]).name
