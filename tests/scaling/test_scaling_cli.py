"""``demoscale laws``: JSON output, readable summaries, errors, and no torch on the way."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest
from demoscale.scaling import ResultsError, load_results
from demoscale.scaling.cli import main

HEAVY = ("torch", "ray", "mujoco", "lightning")


@pytest.fixture
def results_csv(tmp_path, synthetic):
    trials, rollouts = synthetic(lambda x, d: 0.05 + 0.6 * x**-0.5, [1, 2, 4, 8, 16, 32], seeds=2)
    trials.to_csv(tmp_path / "results.csv", index=False)
    rollouts.to_parquet(tmp_path / "rollouts.parquet")
    return tmp_path / "results.csv"


def test_fit_json_keys(results_csv, capsys):
    assert main(["fit", str(results_csv), "--method", "loglog", "--n-bootstrap", "200", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"alpha", "beta", "r", "conf_int", "n_points", "bootstrap_conf_int"} <= set(data)
    assert data["n_points"] == 12 and data["bootstrap"]["mode"] == "both"
    assert data["alpha"] < 0 and len(data["conf_int"]["alpha"]) == 2

    assert main(["fit", str(results_csv), "--method", "saturating", "--n-bootstrap", "200", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"E", "alpha", "beta", "conf_int", "n_points"} <= set(data)
    assert 0.0 <= data["conf_int"]["E"][0] <= data["E"] <= data["conf_int"]["E"][1]


def test_fit_summary_and_compare_are_readable(results_csv, capsys):
    argv = [
        "fit",
        str(results_csv),
        "--n-bootstrap",
        "100",
        "--predict",
        "64",
        "128",
        "--target-score",
        "0.9",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "Pearson r (log-log)" in out and "alpha" in out and "Predicted score" in out
    assert "Decision: score >= 0.9" in out and "Plans, as increments over what you have" in out
    # Over an axis no budget is planned on, the law's own answer with its extrapolation factor.
    assert (
        main(["fit", str(results_csv), "--n-bootstrap", "100", "--axis", "n_pairs", "--target-score", "0.9"])
        == 0
    )
    assert "Decision:" in capsys.readouterr().out
    assert main(["compare", str(results_csv), "--n-bootstrap", "100"]) == 0
    out = capsys.readouterr().out
    assert "loglog" in out and "saturating" in out and "aic" in out


def test_recommend_json(results_csv, capsys):
    argv = ["recommend", str(results_csv), "--target", "0.7", "--cost-env", "10", "--cost-demo", "0.1"]
    assert main([*argv, "--n-bootstrap", "200", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["status"] in {"ok", "unreachable", "extrapolation"}
    assert {
        "n_envs",
        "demos_per_pair",
        "total_cost",
        "expected_score",
        "marginal_value_env",
        "message",
    } <= set(data)
    if data["status"] == "ok":
        assert data["total_cost"] == pytest.approx(10 * data["n_envs"] + 0.1 * data["total_demos"])
    assert data["confidence"] == data["law"]["confidence"] == 0.9  # one level, the package default
    assert {"law_reason", "comparison", "have", "plans", "probability_reachable"} <= set(data)


def test_plot_writes_one_file_pair_per_axis(results_csv, tmp_path, capsys):
    out_dir = tmp_path / "figures"
    argv = ["plot", str(results_csv), "--out", str(out_dir), "--axes", "n_envs", "--methods", "loglog"]
    assert main([*argv, "--n-bootstrap", "50", "--dpi", "72"]) == 0
    printed = [line.rsplit("/", 1)[-1] for line in capsys.readouterr().out.split()]
    assert printed == [
        "scaling_laws.png",
        "scaling_laws.svg",
        "scaling_laws_n_envs.png",
        "scaling_laws_n_envs.svg",
    ]
    assert all((out_dir / name).stat().st_size > 10_000 for name in printed)


def test_clear_errors(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    pd.DataFrame({"trial_id": ["a", "b"], "n_envs": [1, 2], "score": [0.5, 1.7]}).to_csv(bad, index=False)
    assert main(["fit", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.csv" in err and "'score'" in err and "trial(s) b" in err
    with pytest.raises(ResultsError, match=r"trial\(s\) b"):
        load_results(bad)
    pd.DataFrame({"trial_id": ["a"], "score": [0.5]}).to_csv(bad, index=False)
    with pytest.raises(ResultsError, match="no axis column"):
        load_results(bad)
    pd.DataFrame({"n_envs": [1, 2]}).to_parquet(tmp_path / "noscore.parquet")
    with pytest.raises(ResultsError, match="no 'score' column"):
        load_results(tmp_path / "noscore.parquet")


def test_rollouts_found_next_to_results(results_csv):
    table = load_results(results_csv)
    assert table.has_rollout_outcomes() and len(table.rollouts) == 12 * 40
    assert table.trials["n_pairs"].equals(table.trials["n_envs"])
    orphan = table.rollouts.assign(trial_id="missing")
    with pytest.raises(ResultsError, match="missing from the results table"):
        load_results(results_csv, rollouts=orphan)


def test_imports_without_torch():
    # One interpreter: first `demoscale laws --help` (nothing heavy at all), then the whole API.
    check = (
        "import sys\nfrom demoscale.__main__ import main\n"
        "try:\n    main(['laws', '--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
        f"heavy = [m for m in {HEAVY!r} + ('matplotlib', 'scipy') if m in sys.modules]\n"
        "assert not heavy, ('laws --help imported', heavy)\n"
        "import demoscale.scaling as s\ns.fit_law, s.compare_laws, s.recommend_budget, s.plot_laws\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "assert not heavy, ('demoscale.scaling imported', heavy)\n"
    )
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "recommend" in result.stdout


def test_recommend_runs_without_torch(results_csv):
    """A whole `demoscale laws recommend` run (fits, comparison, decision) loads nothing heavy."""
    check = (
        "import sys\nfrom demoscale.__main__ import main\n"
        f"assert main(['laws', 'recommend', {str(results_csv)!r}, '--n-bootstrap', '50']) == 0\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "assert not heavy, ('laws recommend imported', heavy)\n"
    )
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "Decision: score >= 0.9" in result.stdout
